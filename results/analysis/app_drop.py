"""What upstream's Android app's default dropping (`--drop-cold-experts 0.75`, android_app.APP_DROP_COLD)
costs in output and buys in speed and flash reads, where a campaign measured it beside the lossless
setting of the same budget (the app preset runs every cache-on rung both ways: docs/campaigns.md).

One place says it in words and numbers: the device and model pages (results.site.quality_view), the
recommendations' text and the demo read it from here.
"""

from __future__ import annotations

import math
import shlex
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from engine.interface.flags import FLAGS
from results.analysis.analyze import speeds
from results.analysis.android_app import APP_DROP_COLD
from results.analysis.noise import differs
from results.analysis.quality import quality_front
from results.numbers import to_float
from results.read.columns import C
from results.read.frames import row_views
from results.read.quality import LOSSY_LEVERS, question_flags
from store.outcomes import OK

# the setting the app ships, as results.read.quality words its levers, and the drop's own switches (the
# app sends none of them: a run with one is not the app's default)
APP_LEVERS = f"drop {APP_DROP_COLD:g}"
APP_NAME = f"the app's default dropping ({APP_DROP_COLD:g})"
_DROP_SWITCHES = frozenset(s for f in FLAGS if f.field.startswith("drop_") and not f.meaning.startswith("LOSSY:")
                           for s in f.spellings)


@dataclass(frozen=True)
class AppDropCost:
    """The app's dropping at one budget of one device, model and load, against the lossless setting
    of the same budget, dense mode and other flags (None: none was measured)."""

    device: str
    model: str
    apps: str
    top_k: float                   # the runs' top-k (the model's own: the app's default pulls no other lever)
    budget: str
    speedup: float                 # median tok/s ratio, dropping over lossless (NaN: no lossless to compare)
    beyond_noise: bool
    noise_pct: float
    read_mib_per_tok: float        # flash MiB/token with the dropping (median)
    base_read_mib_per_tok: float   # … without it (NaN: no lossless to compare)
    agreement: float
    identical: int
    compared: int
    ppl_loss_pct: float
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def is_app_default(s: Mapping[str, Any]) -> bool:
    """The app's default setting (a quality_front row): the drop at APP_DROP_COLD alone (the model's
    own top-k, no other lever), without the drop's switches."""
    words = set(shlex.split(str(s[C.engine_flags]))) | set(shlex.split(str(s[C.engine_args])))
    return s[C.lossy_levers] == APP_LEVERS and not words & _DROP_SWITCHES


def _baseline(s: Mapping[str, Any], settings: Sequence[Mapping[str, Any]],
              rows: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The lossless setting of the same budget, top-k, dense mode and other flags: what a lossy
    setting's speed-up is measured against."""
    def question(t: Mapping[str, Any]) -> tuple[Any, ...]:
        first = next((rows[r] for r in t["run_ids"] if r in rows), {})
        return t["budget"], t[C.dense_weights], question_flags(first) if first else ""
    return next((t for t in settings if not t[C.lossy_levers] and question(t) == question(s)), None)


def _ok(s: Mapping[str, Any], rows: Mapping[str, Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [rows[r] for r in s["run_ids"] if r in rows and rows[r].get(C.outcome) == OK]


def _reads(s: Mapping[str, Any], rows: Mapping[str, Mapping[str, Any]]) -> float:
    values = [x for r in _ok(s, rows) if not math.isnan(x := to_float(r.get(C.read_mib_per_tok)))]
    return statistics.median(values) if values else math.nan


def app_cost(s: Mapping[str, Any], settings: Sequence[Mapping[str, Any]],
             rows: Mapping[str, Mapping[str, Any]]) -> AppDropCost:
    """The cost of one app-default setting `s` among `settings` (quality_front rows of one device,
    model and load); `rows` the run table's rows by run id."""
    base = _baseline(s, settings, rows)
    reads = _reads(s, rows)
    ratio, beyond, threshold, base_reads = math.nan, False, math.nan, math.nan
    if base is None:
        speed = f"{float(s[C.tok_s]):.3g} tok/s (no lossless setting at this budget to compare with)"
    else:
        ok, base_ok = _ok(s, rows), _ok(base, rows)
        beyond, ratio, threshold = differs(speeds(pd.DataFrame(base_ok)) if base_ok else [],
                                           speeds(pd.DataFrame(ok)) if ok else [])
        speed = f"{ratio:.2f}× tok/s" + ("" if beyond or math.isnan(ratio) else f" (within noise, {threshold:.0%})")
        base_reads = _reads(base, rows)
    parts = [speed]
    if not math.isnan(reads) and not math.isnan(base_reads):
        parts.append(f"flash {base_reads:.2f} → {reads:.2f} MiB/token")
    agreement = float(s["agreement"])
    parts.append(f"agreement {agreement:.2f}" if not math.isnan(agreement) else "agreement unknown (no --progress lines)")
    if s["compared"]:
        parts.append(f"{s['identical']} of {s['compared']} outputs identical")
    ppl = float(s[C.ppl_loss_pct])
    if not math.isnan(ppl):
        parts.append(f"ppl {ppl:+.2f}%")
    return AppDropCost(str(s[C.device]), str(s[C.model]), str(s[C.apps]), float(s["top_k"]), str(s["budget"]),
                       ratio, bool(beyond),
                       100 * threshold if not math.isnan(threshold) else math.nan, reads, base_reads, agreement,
                       int(s["identical"]), int(s["compared"]), ppl, f"{APP_NAME} at {s['budget']}: " + ", ".join(parts))


def app_costs(table: pd.DataFrame) -> list[AppDropCost]:
    """Every measured app-default setting's cost in a run table, by device, model, load and budget
    (the settings of quality_front; none worked out when no run pulled the app's lever)."""
    if LOSSY_LEVERS not in table.columns or not (table[LOSSY_LEVERS] == APP_LEVERS).any():
        return []
    front = quality_front(table)
    if front.empty:
        return []
    rows = {str(r[C.run_id]): r for r in row_views(table)}
    out = []
    for _, group in front.groupby([C.device, C.model, C.apps], sort=True):
        settings = group.to_dict("records")
        out += [app_cost(s, settings, rows) for s in settings
                if is_app_default(s) and not math.isnan(float(s["quality_loss"]))]
    return out
