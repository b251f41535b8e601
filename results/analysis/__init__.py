"""From the run table to answers: per-device analysis (boundary, dense modes, tells), the planner's
picks beside it, comparisons, and the recommendations with their command lines and fleet rules."""
