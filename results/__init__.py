"""Results: what the runs say. Four rooms, one job each:

- read/      engine outputs and campaign directories into the run table;
- replay/    route traces replayed into hit curves and predictions;
- analysis/  the run table into boundaries, picks, comparisons and recommendations;
- site/      the published pages.

Shared by all four: errors, numbers (NaN-safe floats), formats (csv/md/jsonl writers) and publish
(what a published file may not say: this host's paths).
"""
