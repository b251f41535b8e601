"""Session runs: what their turns say about the idle gaps between them (docs/method.md, "Turns
after an idle gap").

A session cell (harness/run/turns.py) repeats one prompt for N turns with an idle gap between them;
run.json's `turns` holds per turn the engine's `BMOE_DONE` figures and, for each turn after the
first, the engine's VmSwap / VmRSS / RssFile over the gap before it. Routing is greedy and the
prompt the same, so every turn asks for the experts the first one did: a warm cache needs the
same reads each turn after the first, and a turn that reads more than that after a gap had its
cache (or its dense pages) taken while it idled.

- **Warm need** (`warm_need_mib`): what a turn after the first should read with nothing taken
  in the gap: the first turn's reads when it had no cache (budget 0, hit % -1: no gap can take a cache
  that is not there, and every turn reads the same); 0 when the first turn evicted nothing (its
  CSV summary's `evictions` is 0: the cache held every expert the prompt routes to), else the
  least any later turn read (an LRU smaller than the prompt's working set re-reads the same share
  every turn).
- **Gap re-read** (`gap_rereads`): per turn after the first, its read MiB above the warm need.
- **Taken in the gap** (`gap_taken`): a turn after a gap re-read GAP_REREAD_MIN_MIB or more and at
  least GAP_REREAD_FRACTION of the first turn's reads; or it faulted GAP_MAJFLT_PER_TOK major faults
  per token or more (dense pages dropped in the gap); or the device swapped in
  GAP_SWAP_IN_MIB_PER_TOK per token or more while it ran. The reason names the first such turn.

Limits: when every gap takes the same share, the least later turn is no warm baseline (the
warm need is then only exact for a cache that held the whole working set); the swap-in is the
device's, not the engine's alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from results.numbers import to_float

GAP_REREAD_MIN_MIB = 1.0
GAP_REREAD_FRACTION = 0.10
GAP_MAJFLT_PER_TOK = 1.0
GAP_SWAP_IN_MIB_PER_TOK = 1.0     # the same rate that makes a budget fought during decode (results.analysis.analyze)


def _f(turn: Mapping[str, Any], key: str) -> float:
    return to_float(turn.get(key))


def demand_hit_pct(turn: Mapping[str, Any]) -> float:
    """The share of a turn's own expert demand (tokens x the engine's token demand) it did not read
    from flash, in %: the turn's hit rate by bytes (the engine's `cache_hit_pct` is the session's
    cumulative rate)."""
    tokens, demand, read = _f(turn, "tokens"), _f(turn, "token_demand_mib"), _f(turn, "read_mib")
    if any(math.isnan(x) for x in (tokens, demand, read)) or tokens <= 0 or demand <= 0:
        return math.nan
    return round(max(0.0, min(100.0, 100.0 * (1 - read / (tokens * demand)))), 2)


def warm_need_mib(turns: Sequence[Mapping[str, Any]]) -> float:
    """What a turn after the first should read when nothing was taken in the gap (module docstring)."""
    later = [r for r in (_f(t, "read_mib") for t in turns[1:]) if not math.isnan(r)]
    if turns and _f(turns[0], "cache_hit_pct") < 0:
        return _f(turns[0], "read_mib")     # no cache (budget 0: hit -1): every turn reads what the first did
    if turns and _f(turns[0], "evictions") == 0:
        return 0.0
    return min(later) if later else math.nan


def gap_rereads(turns: Sequence[Mapping[str, Any]]) -> list[float]:
    """Per turn after the first: its read MiB above the warm need (NaN where unknown)."""
    need = warm_need_mib(turns)
    return [round(max(0.0, _f(t, "read_mib") - need), 3) if not math.isnan(need + _f(t, "read_mib")) else math.nan
            for t in turns[1:]]


def gap_taken(turns: Sequence[Mapping[str, Any]]) -> str:
    """'taken in the gap: turn 2 re-read 12.3 MiB' for the first turn after a gap past a threshold
    (module docstring), or ""."""
    if len(turns) < 2:
        return ""
    first_read = _f(turns[0], "read_mib")
    floor = max(GAP_REREAD_MIN_MIB, GAP_REREAD_FRACTION * (0.0 if math.isnan(first_read) else first_read))
    for turn, extra in zip(turns[1:], gap_rereads(turns)):
        k, tokens = turn.get("turn"), _f(turn, "tokens")
        why = []
        if not math.isnan(extra) and extra >= floor:
            why.append(f"turn {k} re-read {extra:.3g} MiB")
        faults = _f(turn, "majflt_per_tok")
        if not math.isnan(faults) and faults >= GAP_MAJFLT_PER_TOK:
            why.append(f"turn {k} had {faults:.3g} major faults/token")
        swap = _f(turn, "swap_in_mib") / tokens if tokens and not math.isnan(tokens) and tokens > 0 else math.nan
        if not math.isnan(swap) and swap >= GAP_SWAP_IN_MIB_PER_TOK:
            why.append(f"turn {k} swapped in {swap:.3g} MiB/token")
        if why:
            return "taken in the gap: " + "; ".join(why)
    return ""


def _extreme(turns: Sequence[Mapping[str, Any]], key: str, pick) -> float:
    values = [to_float((t.get("gap") or {}).get(key)) for t in turns[1:]]
    values = [v for v in values if not math.isnan(v)]
    return pick(values) / 1024 if values else math.nan


def _listed(values: Sequence[float]) -> str:
    return json.dumps([None if math.isnan(v) else v for v in values])


def turn_columns(turns: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """The run table's columns of a session run (docs/results.md); NaN / "" for a one-shot run."""
    turns = list(turns or ())
    if not turns:
        return {"turns": math.nan, "turn_hit_pct": "", "turn_demand_hit_pct": "", "turn_read_mib": "",
                "turn_s_per_tok": "", "turn_majflt_per_tok": "", "gap_reread_mib": math.nan,
                "gap_vm_swap_max_mib": math.nan, "gap_rss_file_min_mib": math.nan, "gap_vm_rss_min_mib": math.nan,
                "gap_taken": ""}
    rereads = [x for x in gap_rereads(turns) if not math.isnan(x)]
    return {
        "turns": float(len(turns)),
        "turn_hit_pct": _listed([_f(t, "cache_hit_pct") for t in turns]),
        "turn_demand_hit_pct": _listed([demand_hit_pct(t) for t in turns]),
        "turn_read_mib": _listed([_f(t, "read_mib") for t in turns]),
        "turn_s_per_tok": _listed([_f(t, "s_per_token") for t in turns]),
        "turn_majflt_per_tok": _listed([_f(t, "majflt_per_tok") for t in turns]),
        "gap_reread_mib": max(rereads) if rereads else math.nan,
        "gap_vm_swap_max_mib": _extreme(turns, "vm_swap_max_kb", max),
        "gap_rss_file_min_mib": _extreme(turns, "rss_file_min_kb", min),
        "gap_vm_rss_min_mib": _extreme(turns, "vm_rss_min_kb", min),
        "gap_taken": gap_taken(turns),
    }
