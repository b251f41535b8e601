"""Contamination tells (docs/method.md rule 6): runs whose numbers say the device was not in the
state the method asks for, each naming its runs: compute s/token that rises as top-k falls;
majflt/token MAJFLT_FACTOR x the same config's other runs; a gate that gave up; engines that
oversubscribed the cores; a config whose result moves with run order between the passes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from results.analysis.noise import cv, differs, median, typical_noise
from results.read.columns import C
from results.read.frames import row_views
from results.read.run_keys import CELL_KEYS, cell_keys, column_of, numbers_of, text_of
from store.outcomes import OK

COMPUTE_RISE = 0.10
MAJFLT_FACTOR = 10.0
MAJFLT_MIN_PER_TOK = 1.0


@dataclass(frozen=True)
class Tell:
    """One contamination tell: its kind, the runs it names, and why."""

    kind: str
    run_ids: tuple[str, ...]
    message: str


def find_tells(table: pd.DataFrame) -> list[Tell]:
    """Every tell of a run table (its knee probes left out by the caller)."""
    ok = table[table[C.outcome] == OK].copy()
    out: list[Tell] = []
    if not len(ok):
        return out
    keys = cell_keys(ok)
    ok["_cell"] = keys

    # compute s/token that rises as top-k falls (same device, model, budget, dense, knobs)
    k_index = CELL_KEYS.index(C.n_expert_used)
    ok["_nok"] = [key[:k_index] + key[k_index + 1:] for key in keys]
    for _, sub in ok.groupby("_nok", sort=False):
        per_k = {}
        for k, part in sub.groupby(numbers_of(sub, C.n_expert_used), sort=True):
            c = median(numbers_of(part, C.compute_s_per_tok))
            if not math.isnan(k) and not math.isnan(c):
                per_k[float(k)] = (c, tuple(part[C.run_id]))
        ks = sorted(per_k)
        for lo, hi in itertools.pairwise(ks):
            c_lo, ids_lo = per_k[lo]
            c_hi, ids_hi = per_k[hi]
            if c_lo > c_hi * (1 + COMPUTE_RISE):
                out.append(Tell("compute_rises_as_topk_falls", ids_lo + ids_hi,
                                f"compute {c_lo:.4g} s/token at top-k {lo:g} is above {c_hi:.4g} at top-k {hi:g}: "
                                "fewer experts cannot cost more compute — the device was not in the same state"))

    # majflt/token an order of magnitude above the same config's other runs
    for _, sub in ok.groupby("_cell", sort=False):
        if len(sub) < 2:
            continue
        faults = numbers_of(sub, C.majflt_per_tok)
        for i, rid in enumerate(sub[C.run_id]):
            others = np.delete(faults, i)
            others = others[np.isfinite(others)]
            if not len(others) or math.isnan(faults[i]):
                continue
            norm = float(np.median(others))
            if faults[i] > MAJFLT_FACTOR * max(norm, MAJFLT_MIN_PER_TOK):
                out.append(Tell("majflt_outlier", (rid,),
                                f"{faults[i]:.1f} major faults/token against {norm:.2f} in the same config's other "
                                f"{len(others)} run(s): something else took the page cache"))

    # a gate that gave up (the device was not cool or not free when the run started)
    for rec in row_views(table[table[C.gate_gave_up] == True]):  # noqa: E712
        out.append(Tell("gate_gave_up", (rec[C.run_id],),
                        f"the cooling gate gave up before this run ({rec.get(C.gate_reason) or 'no reason recorded'})"))

    # engines sharing the cores ran more compute threads than there were cores (harness.run.cpushare)
    for rec in row_views(table[column_of(table, C.oversubscribed) == True]):  # noqa: E712
        sharing = rec.get(C.cpu_engines) or ""
        out.append(Tell("oversubscribed", (rec[C.run_id],),
                        f"{text_of(rec.get(C.threads_sum))} compute threads on {text_of(rec.get(C.cores))} cores (this "
                        f"run {text_of(rec.get(C.cpu_threads)) or '?'}" + (f"; with {sharing}" if sharing else ", alone")
                        + "): threads waited for cores (ggml's pool spins), so its speed measured the contention, not "
                        "its configuration"))

    # a result that moves with run order between the passes
    fallback = _fallback_noise(ok)
    for _, sub in ok.groupby("_cell", sort=False):
        passes = sorted(set(sub[C.pass_]))
        if len(passes) < 2:
            continue
        first = sub[sub[C.pass_] == passes[0]]
        for p in passes[1:]:
            later = sub[sub[C.pass_] == p]
            moved, ratio, threshold = differs(list(numbers_of(first, C.tok_s)), list(numbers_of(later, C.tok_s)), fallback)
            if moved:
                out.append(Tell("moves_with_order", tuple(first[C.run_id]) + tuple(later[C.run_id]),
                                f"tok/s in pass {p} is {ratio:.2f}x pass {passes[0]} (noise {threshold:.0%}): the "
                                "result depends on when it ran, not only on its config"))
    return out


def _fallback_noise(ok: pd.DataFrame) -> float:
    """The typical repeat-to-repeat variation of this table's cells, for cells without repeats."""
    return typical_noise([cv(list(numbers_of(sub, C.tok_s))) for _, sub in ok.groupby("_cell", sort=False)
                          if len(sub) > 1])
