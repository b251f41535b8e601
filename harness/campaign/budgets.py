"""The budget grammar of `axes.cache_mb`: what a value means, and how a relative one becomes MiB.

A value is 0 (no cache), a whole MiB number, "auto" (the engine sizes it; `axes.cache_ceil_mb`
caps it), "cycle*F" (F times the model's token cycle, priced from its header), "knee*F" (F times
the knee of the LRU curve replayed from a route-traced probe on the device, harness.plan.probe),
"planner" (the engine's own planner picks it: `--auto`, where the engine has it), "mmap" or
"resident" (no expert streaming at all). docs/campaigns.md is the reference.
"""

from __future__ import annotations

import json
import math
import re

from engine.contract.flags import PLANNER_BUDGET
from harness.campaign.model import INT_MAX, describe_value, number_text

# cache_mb values that are not a budget: no --moe-stream (the mmap baseline), or no --moe-stream
# and --no-mmap (every weight resident in anonymous memory; bmoe-py only).
NO_STREAM_MODES = ("mmap", "resident")
# the engine's own planner picks the budget (`--auto`, bmoe-cli after 0.24 and bmoe-py claiming it)
PLANNER = PLANNER_BUDGET
MAX_FACTOR = 1000.0             # cycle*F, knee*F
# budgets relative to a measure of the model: its token cycle (from the header) or the knee of the
# LRU curve replayed from a route-traced probe run on the device (harness.plan.probe)
# ASCII digits only: Python's [0-9] also takes ١ or ９, which no engine or person means here
_RELATIVE_RE = re.compile(r"^(cycle|knee)\s*(?:\*\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+))?$", re.ASCII)


def parse_cache_value(value: int | str) -> int | str:
    """One cache_mb axis value, normalised: an int MiB, "auto", "cycle*F", "knee*F", "mmap" or "resident".
    Raises ValueError, whose text is the problem, for anything else (the caller adds the key)."""
    if isinstance(value, bool):
        raise ValueError(f"expected 0, a MiB number, \"auto\", \"cycle*F\", \"mmap\" or \"resident\", "
                         f"got {describe_value(value)}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a budget cannot be negative, got {number_text(value)}")
        if value > INT_MAX:
            raise ValueError(f"a budget is at most {INT_MAX} MiB (the engine's int), got {number_text(value)}")
        return value
    if isinstance(value, float):
        raise ValueError(f"budgets are whole MiB, got {value:g}; write an integer or \"cycle*F\"")
    if not isinstance(value, str):
        raise ValueError(f"expected a budget, got {describe_value(value)}")
    text = value.strip().lower()
    if "auto" in text and re.search(r"[0-9]", text):
        raise ValueError(f"{json.dumps(value)} mixes auto with a number (the engine refuses both at once); "
                         "write \"auto\" (with cache_ceil_mb for a cap) or the number alone")
    if text in ("auto", PLANNER) or text in NO_STREAM_MODES:
        return text
    if re.fullmatch(r"[0-9]{1,12}", text):
        return parse_cache_value(int(text))
    m = _RELATIVE_RE.match(text) if len(text) <= 40 else None
    if m:
        factor = float(m[2]) if m[2] else 1.0
        if factor > MAX_FACTOR:
            raise ValueError(f"{json.dumps(value)}: the factor is at most {MAX_FACTOR:g}")
        if factor == 0:  # a relative budget is never 0 (docs/campaigns.md): 0 is written as 0
            raise ValueError(f"{json.dumps(value)}: a {m[1]} budget needs a factor above 0 (write 0 for no cache)")
        return f"{m[1]}*{format(factor, '.12g')}"
    raise ValueError(f"{json.dumps(value[:40] + ('…' if len(value) > 40 else ''))} is not a budget: use 0, a MiB number, \"auto\", \"cycle*F\" "
                     "(F times the model's token cycle), \"knee*F\" (F times the knee of the replayed LRU "
                     "curve), \"planner\" (the engine's own pick), \"mmap\" or \"resident\"")


def cycle_factor(spec: str) -> float:
    """The F of a "cycle*F" or "knee*F" budget."""
    return float(spec.split("*", 1)[1])


def is_knee(spec: int | str) -> bool:
    """Is this cache_mb value a "knee*F" budget (one that needs the probe's knee)?"""
    return isinstance(spec, str) and spec.startswith("knee")


def budget_from_cycle(cycle_mib: float, factor: float) -> int:
    """Whole MiB on the side of the cycle the factor asks for: under it rounds down, at or over it
    rounds up (so cycle*0.9 is really under and cycle*1.0 really holds a cycle). Never 0 (off)
    unless the factor is 0."""
    if factor == 0:
        return 0
    raw = cycle_mib * factor
    mib = math.floor(raw) if factor < 1 else math.ceil(raw - 1e-9)
    return max(1, mib)
