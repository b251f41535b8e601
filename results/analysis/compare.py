"""`bmoe-fleet compare A B`: matching cells of two campaigns (or two engine versions), side by side.

A cell is one configuration on one device (results.read.run_keys.cell_key: device, model, top-k, budget
asked, dense mode and the other knobs) — its repeats are pooled, so campaigns of the same plan
match cell for cell even when their engines differ. For each cell present in both, each metric's
median ratio B/A is judged against a noise threshold from the repeats' spread
(results.analysis.noise.differs: the ranges must not overlap and the ratio must clear
max(10 %, 3 x the larger coefficient of variation); cells without repeats use the tables' typical
variation). tok/s and hit % are better higher, flash MiB per token better lower. A cell that
finished in A but fails in B is called out as newly failing, and always counts as a regression.

`threshold_pct` (`--threshold PCT`) raises the bar: a change beyond noise is a regression or an
improvement only when it also exceeds PCT % (as max(r, 1/r) - 1 of the median ratio r, like the
noise rule). `--fail-on-regression` makes the command exit with FAIL_EXIT_STATUS when anything
regressed, for CI; `--format md` prints the comparison as a GitHub table.

`compare B --db URL` (or `--db URL --device D --model M`) takes A from the results database: the
previous release's runs on the same device and model (results.analysis.history.baseline). Its
verdicts are the U test's (`test="u"`: results.analysis.noise.u_differs, docs/decisions/history.md):
Mann-Whitney U two-sided p < 0.05 on the per-run values and the median ratio past the same noise
threshold; each change carries its p-value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from results.analysis.noise import (
    NOISE_CV_FACTOR,
    NOISE_DEFAULT,
    NOISE_MIN,
    U_ALPHA,
    cv,
    differs,
    typical_noise,
    u_differs,
)
from results.errors import ResultsError
from results.read.columns import C
from results.read.run_keys import CELL_KEYS, budget_label, cell_keys
from results.read.table import build_table
from store.outcomes import OK, RESULTS
from store.versioned import json_safe

FORMAT = "bmoe-fleet.compare"
FORMAT_VERSION = 1
NOISE_TEST, U_TEST = "noise", "u"     # the verdict's rule: ranges apart and past noise / the U test and past noise
FAIL_EXIT_STATUS = 4     # compare --fail-on-regression: 1 is an error, 2 a usage error, 3 run/sweep's "incomplete"
# metric column, label, +1 when higher is better / -1 when lower is
METRICS = ((C.tok_s, "tok/s", 1), (C.cache_hit_pct, "hit %", 1), (C.read_mib_per_tok, "flash MiB/token", -1))


@dataclass(frozen=True)
class MetricChange:
    metric: str
    a_median: float
    b_median: float
    ratio: float
    threshold: float
    verdict: str             # "regression" | "improvement" | "same"
    p_value: float = math.nan  # the U test's (test "u" only)


@dataclass(frozen=True)
class CellComparison:
    label: str
    key: tuple[str, ...]
    a_runs: int
    b_runs: int
    a_ok: int
    b_ok: int
    status: str              # "compared" | "newly_failing" | "newly_passing" | "failing_in_both" | "only_a" | "only_b"
    changes: tuple[MetricChange, ...]
    a_run_ids: tuple[str, ...]
    b_run_ids: tuple[str, ...]

    @property
    def regressions(self) -> list[MetricChange]:
        return [c for c in self.changes if c.verdict == "regression"]

    @property
    def improvements(self) -> list[MetricChange]:
        return [c for c in self.changes if c.verdict == "improvement"]


@dataclass(frozen=True)
class Comparison:
    a: str
    b: str
    cells: tuple[CellComparison, ...]
    threshold_pct: float = 0.0
    test: str = NOISE_TEST

    @property
    def regressions(self) -> list[CellComparison]:
        """Cells that got worse: a metric regressed past noise and threshold, or newly failing."""
        return [c for c in self.cells if c.regressions or c.status == "newly_failing"]

    @property
    def failed(self) -> bool:
        """What `--fail-on-regression` fails on."""
        return bool(self.regressions)

    @property
    def improvements(self) -> list[CellComparison]:
        return [c for c in self.cells if c.improvements]

    @property
    def newly_failing(self) -> list[CellComparison]:
        return [c for c in self.cells if c.status == "newly_failing"]

    def to_dict(self) -> dict[str, Any]:
        cells = [dict(asdict(c), key=dict(zip(CELL_KEYS, c.key))) for c in self.cells]
        extra: dict[str, Any] = {}
        if self.test == U_TEST:
            extra["test"] = {"name": "mann-whitney-u", "sides": 2, "alpha": U_ALPHA}
        else:                                    # the two-campaign document as it always was
            for c in cells:
                for m in c["changes"]:
                    m.pop("p_value")
        return json_safe({"format": FORMAT, "version": FORMAT_VERSION, "a": self.a, "b": self.b,
                          "noise": {"min": NOISE_MIN, "cv_factor": NOISE_CV_FACTOR, "default": NOISE_DEFAULT},
                          **extra, "threshold_pct": self.threshold_pct,
                          "summary": {"cells": len(self.cells), "regressions": len(self.regressions),
                                      "improvements": len(self.improvements), "newly_failing": len(self.newly_failing),
                                      "only_a": sum(c.status == "only_a" for c in self.cells),
                                      "only_b": sum(c.status == "only_b" for c in self.cells)},
                          "cells": cells}, 4)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False, allow_nan=False)

    def text(self) -> str:
        lines = [f"A = {self.a}", f"B = {self.b}",
                 f"{len(self.cells)} cells: {len(self.regressions)} regressed, {len(self.improvements)} improved, "
                 f"{len(self.newly_failing)} newly failing"
                 + (f" (threshold {self.threshold_pct:g} % over noise)" if self.threshold_pct else "")]
        if self.test == U_TEST:
            lines.append(f"test: Mann-Whitney U, two-sided p < {U_ALPHA:g}, and the median ratio past noise")
        for c in self.cells:
            if c.status == "newly_failing":
                lines.append(f"  NEWLY FAILING  {c.label}: ok in A ({c.a_ok}/{c.a_runs}), {c.b_ok}/{c.b_runs} ok in B")
            for m in c.changes:
                if m.verdict != "same":
                    lines.append(f"  {m.verdict.upper():<13}  {c.label}: {m.metric} {m.a_median:.4g} -> {m.b_median:.4g} "
                                 f"({m.ratio:.2f}x, noise {m.threshold:.0%}"
                                 + (f", p {m.p_value:.2g})" if self.test == U_TEST else ")"))
            if c.status in ("only_a", "only_b"):
                lines.append(f"  {c.status.replace('_', ' ')}  {c.label}")
        return "\n".join(lines)


def _label(row: Mapping[str, Any]) -> str:
    from results.read.run_keys import budget_asked
    from results.read.run_keys import text_of as _text

    k = row.get(C.n_expert_used)
    k = f"k={int(k)}" if isinstance(k, float) and not math.isnan(k) else "k=?"
    asked = budget_asked(row)
    budget = budget_label(asked)
    extra = "".join(f" {name}={_text(row.get(key))}" for key, name in ((C.dense_weights, "dense"), ("io_threads", "io"),
                                                                      ("threads", "t")) if _text(row.get(key)))
    flags = " ".join(str(row.get(key) or "") for key in (C.engine_args, C.engine_flags)).strip()
    return f"{row[C.device]} {row[C.model]} {k} {budget}{extra}" + (f" [{flags}]" if flags else "")


def _values(frame: pd.DataFrame, column: str) -> list[float]:
    return [x for x in pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64) if not math.isnan(x)]


def _fallback(frames: Sequence[pd.DataFrame]) -> float:
    cvs = []
    for f in frames:
        ok = f[f[C.outcome] == OK]
        for _, sub in ok.groupby("_cell", sort=False):
            if len(sub) > 1:
                c = cv(_values(sub, C.tok_s))
                if not math.isnan(c):
                    cvs.append(c)
    return typical_noise(cvs)


def _change(metric: str, sign: int, a: list[float], b: list[float], fallback: float,
            threshold_pct: float = 0.0, test: str = NOISE_TEST) -> MetricChange | None:
    if not a or not b:
        return None
    ma, mb = float(np.median(a)), float(np.median(b))
    p = math.nan
    if ma == 0 and mb == 0:
        return MetricChange(metric, ma, mb, 1.0, max(NOISE_MIN, threshold_pct / 100), "same",
                            1.0 if test == U_TEST else math.nan)
    if test == U_TEST:
        moved, ratio, threshold, p = u_differs(a, b, fallback)
    else:
        moved, ratio, threshold = differs(a, b, fallback)
    if ma == 0:                                  # from nothing to something: the ratio is undefined
        ratio, moved = math.inf, (max(a) < min(b)) if test == NOISE_TEST else bool(p < U_ALPHA)
    elif moved and threshold_pct > 0:
        # past the noise, and past the threshold asked for (measured the way the noise rule is)
        moved = max(ratio, 1 / ratio) - 1 > threshold_pct / 100 if ratio > 0 else moved
    threshold = max(threshold, threshold_pct / 100) if not math.isnan(threshold) else threshold
    verdict = "same"
    if moved:
        better = (ratio > 1) == (sign > 0)
        verdict = "improvement" if better else "regression"
    return MetricChange(metric, ma, mb, ratio, threshold, verdict, p)


def compare_tables(a: pd.DataFrame, b: pd.DataFrame, a_label: str = "A", b_label: str = "B",
                   threshold_pct: float = 0.0, test: str = NOISE_TEST) -> Comparison:
    """Match cells of two run tables and judge every metric's change against its noise (`test`:
    NOISE_TEST, or U_TEST for the U test as well: module doc)."""
    frames = []
    for t in (a, b):
        t = t[t[C.outcome].isin(RESULTS)]
        frames.append(t.assign(_cell=cell_keys(t)))
    a, b = frames
    fallback = _fallback(frames)
    keys = list(dict.fromkeys(list(a["_cell"]) + list(b["_cell"])))
    cells = []
    for key in keys:
        ra, rb = a[a["_cell"] == key], b[b["_cell"] == key]
        row = (ra if len(ra) else rb).iloc[0].to_dict()
        oka, okb = ra[ra[C.outcome] == OK], rb[rb[C.outcome] == OK]
        if not len(ra) or not len(rb):
            status = "only_a" if len(ra) else "only_b"
        elif len(oka) == len(ra) and len(okb) < len(rb):
            status = "newly_failing"
        elif len(oka) < len(ra) and len(okb) == len(rb):
            status = "newly_passing"
        elif not len(oka) and not len(okb):
            status = "failing_in_both"
        else:
            status = "compared"
        changes = []
        if len(oka) and len(okb):
            for column, name, sign in METRICS:
                change = _change(name, sign, _values(oka, column), _values(okb, column), fallback, threshold_pct,
                                 test)
                if change is not None:
                    changes.append(change)
        cells.append(CellComparison(_label(row), key, len(ra), len(rb), len(oka), len(okb), status, tuple(changes),
                                    tuple(ra[C.run_id]), tuple(rb[C.run_id])))
    return Comparison(a_label, b_label, tuple(cells), threshold_pct, test)


def compare(a: str | Path, b: str | Path, engine_a: str | None = None, engine_b: str | None = None,
            model_files: Mapping[str, str] | None = None, threshold_pct: float = 0.0,
            tables: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> Comparison:
    """`bmoe-fleet compare`: campaign directory A against B; with engine_a/engine_b, only the runs of
    those engine versions on each side (A and B may then be the same directory). `tables`: A's and
    B's run tables as the results database gave them."""
    if not (threshold_pct >= 0 and math.isfinite(threshold_pct)):
        raise ResultsError(f"--threshold {threshold_pct:g}: give a percentage of 0 or more")
    ta, tb = tables if tables is not None else (build_table([a], model_files), build_table([b], model_files))
    for side, t, engine in (("A", ta, engine_a), ("B", tb, engine_b)):
        if engine is not None and not (t[C.engine] == engine).any():
            have = ", ".join(sorted(set(t[C.engine])))
            raise ResultsError(f"{side}: no runs of engine {engine!r} (engines there: {have})")
    if engine_a is not None:
        ta = ta[ta[C.engine] == engine_a]
    if engine_b is not None:
        tb = tb[tb[C.engine] == engine_b]
    label_a = f"{a}" + (f" (engine {engine_a})" if engine_a else "")
    label_b = f"{b}" + (f" (engine {engine_b})" if engine_b else "")
    return compare_tables(ta, tb, label_a, label_b, threshold_pct)


# ── output ───────────────────────────────────────────────────────────────────────────────────

ROW_COLUMNS = ("device", "model", "top_k", "budget", "settings", "status", "metric", "a", "b", "change_pct",
               "noise_pct", "verdict")
_ROW_HEADERS = ("device", "model", "k", "budget", "settings", "status", "metric", "A", "B", "change %",
                "noise %", "verdict")
_NUMERIC = ("top_k", "a", "b", "change_pct", "noise_pct")


def comparison_rows(c: Comparison) -> list[dict[str, Any]]:
    """One row per cell and metric (a cell with nothing to compare gets one row for its status)."""
    rows: list[dict[str, Any]] = []
    for cell in c.cells:
        key = dict(zip(CELL_KEYS, cell.key))
        budget = key["budget_asked"]
        base = {"device": key[C.device], "model": key[C.model], "top_k": key[C.n_expert_used],
                "budget": budget_label(budget), "settings": " ".join(x for x in (
                    f"dense={key[C.dense_weights]}" if key[C.dense_weights] else "", key[C.engine_args],
                    key[C.engine_flags]) if x),
                "status": "newly failing" if cell.status == "newly_failing" else cell.status.replace("_", " ")}
        if not cell.changes:
            rows.append({**base, "metric": "", "a": f"{cell.a_ok}/{cell.a_runs} ok", "b": f"{cell.b_ok}/{cell.b_runs} ok",
                         "verdict": "regression" if cell.status == "newly_failing" else ""})
        for m in cell.changes:
            change = (m.ratio - 1) * 100 if m.ratio and math.isfinite(m.ratio) else math.nan
            rows.append({**base, "metric": m.metric, "a": m.a_median, "b": m.b_median, "change_pct": change,
                         "noise_pct": m.threshold * 100, "verdict": m.verdict})
    return rows


def render(c: Comparison, fmt: str) -> str:
    from results import formats

    if fmt == "json":
        return c.to_json() + "\n"
    if fmt == "jsonl":
        return formats.to_jsonl(c.to_dict()["cells"])
    rows = comparison_rows(c)
    if fmt == "csv":
        return formats.to_csv(rows, ROW_COLUMNS)
    if fmt == "md":
        head = (f"**{len(c.cells)} cells: {len(c.regressions)} regressed, {len(c.improvements)} improved, "
                f"{len(c.newly_failing)} newly failing**"
                + (f" (threshold {c.threshold_pct:g} % over noise)" if c.threshold_pct else "")
                + f" — A = {formats.md_code(c.a)}, B = {formats.md_code(c.b)}\n\n")
        return head + formats.to_md(rows, ROW_COLUMNS, _ROW_HEADERS, _NUMERIC)
    return c.text() + "\n"
