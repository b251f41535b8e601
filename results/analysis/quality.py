"""Quality as an axis: what a setting's lossy levers cost in output, its place on the front of speed,
quality and memory, and the lossy alternative `recommend --max-quality-loss` may name beside the
lossless default (docs/results.md "Quality", docs/decisions/quality-measure.md).

A setting's **quality loss** is one number: the median perplexity loss in % (`ppl_loss_pct`) where
its runs and their reference have a `ppl:` line, else 100 × (1 − agreement), agreement being the
mean over its runs of agree_frac (the share of decode tokens equal to the reference's before the
first that differs). `basis` says which; the share of identical outputs is kept beside it.

The front, per (device, model, other apps, budget): a setting is on it when no other setting of
that budget is at least as fast, at least as good and at most as big (median peak RSS), and better
in one. Speeds are compared as the recommendation compares them (results.analysis.analyze.speeds).

The bound (`--max-quality-loss`): `ppl+P%` (perplexity at most P % over the reference's),
`agreement>=A` (A in 0..1), or both joined by a comma; each at most once, ASCII decimals, no spaces.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from results.analysis.analyze import BudgetPoint, GroupAnalysis, speeds
from results.analysis.noise import differs, median
from results.analysis.recommend_argv import argv_of_runs
from results.errors import ResultsError
from results.numbers import to_float
from results.read import quality as q
from results.read.columns import C
from results.read.frames import row_views
from results.read.run_keys import budget_asked, budget_label, cell_keys, numbers_of, text_of
from store.outcomes import OK

PPL, AGREEMENT = "ppl", "agreement"          # the two bases of a quality loss, and the bound's two terms
_NUMBER = r"(0|[1-9][0-9]*)(\.[0-9]+)?"
_TERMS = {PPL: re.compile(rf"ppl\+({_NUMBER})%"), AGREEMENT: re.compile(rf"agreement>=({_NUMBER})")}


@dataclass(frozen=True)
class QualityBound:
    """The most quality a lossy setting may lose: perplexity % over the reference's, and the least
    agreement; None where the bound says nothing."""

    text: str
    ppl_pct: float | None = None
    agreement: float | None = None

    def admits(self, quality: SettingQuality) -> tuple[bool, str]:
        """(the setting is within the bound, why not). Unknown is never within."""
        if self.ppl_pct is not None:
            if math.isnan(quality.ppl_loss_pct):
                return False, "no perplexity measured"
            if quality.ppl_loss_pct > self.ppl_pct:
                return False, f"ppl +{quality.ppl_loss_pct:.2f}% > +{self.ppl_pct:g}%"
        if self.agreement is not None:
            if math.isnan(quality.agreement):
                return False, "no token agreement measured (no --progress lines)"
            if quality.agreement < self.agreement:
                return False, f"agreement {quality.agreement:.2f} < {self.agreement:g}"
        return True, ""


def parse_bound(text: str) -> QualityBound:
    """`--max-quality-loss`: `ppl+2%`, `agreement>=0.95`, or `ppl+2%,agreement>=0.95` (strict: ASCII
    decimals, no spaces, each term at most once). ResultsError, one line, on anything else."""
    usage = "expected ppl+P% (e.g. ppl+2%), agreement>=A with A in 0..1 (e.g. agreement>=0.95), or both joined by ','"
    found: dict[str, float] = {}
    for term in str(text).split(","):
        kind = next((k for k, pattern in _TERMS.items() if pattern.fullmatch(term)), None)
        if kind is None:
            raise ResultsError(f"--max-quality-loss {text!r}: {term!r} is not a bound: {usage}")
        if kind in found:
            raise ResultsError(f"--max-quality-loss {text!r}: {kind} given twice")
        m = _TERMS[kind].fullmatch(term)
        assert m is not None
        found[kind] = float(m[1])
    if AGREEMENT in found and found[AGREEMENT] > 1:
        raise ResultsError(f"--max-quality-loss {text!r}: agreement is a share, 0..1")
    return QualityBound(str(text), found.get(PPL), found.get(AGREEMENT))


# ── a setting's quality ──────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class SettingQuality:
    """What one setting's ok runs generated against their references."""

    runs: int                      # ok runs
    compared: int                  # of them, with a reference to compare with
    identical: int                 # of those, outputs identical to the reference's
    agreement: float               # mean agree_frac (NaN without --progress lines)
    agree_tokens: float            # mean agree_tokens
    tokens: float                  # mean output_tokens of the runs with agree_tokens
    ppl_loss_pct: float            # median ppl_loss_pct (NaN without ppl lines)
    levers: str                    # the lossy levers ("" lossless)

    @property
    def loss(self) -> float:
        """The one number: perplexity + % where measured, else 100 × (1 − agreement)."""
        if not math.isnan(self.ppl_loss_pct):
            return self.ppl_loss_pct
        return 100.0 * (1.0 - self.agreement) if not math.isnan(self.agreement) else math.nan

    @property
    def basis(self) -> str:
        """What `loss` rests on: ppl, agreement, or "" (nothing measured)."""
        return PPL if not math.isnan(self.ppl_loss_pct) else AGREEMENT if not math.isnan(self.agreement) else ""

    def text(self) -> str:
        """The cost in words: agreement (and where the first divergence fell), identical outputs, ppl."""
        parts = []
        if not math.isnan(self.agreement):
            where = ("no divergence" if self.identical == self.compared and self.agree_tokens >= self.tokens else
                     f"first divergence after {self.agree_tokens:.3g} of {self.tokens:.3g} tokens on average")
            parts.append(f"agreement {self.agreement:.2f} ({where})")
        elif self.compared:
            parts.append("token agreement unknown (no --progress lines)")
        if self.compared:
            parts.append(f"{self.identical} of {self.compared} outputs identical")
        if not math.isnan(self.ppl_loss_pct):
            parts.append(f"ppl {self.ppl_loss_pct:+.2f}%")
        return ", ".join(parts) or "quality not measured (no reference run to compare with)"


def setting_quality(rows: pd.DataFrame) -> SettingQuality:
    """The quality of one setting's runs (run-table rows)."""
    ok = rows[rows[C.outcome] == OK] if C.outcome in rows.columns else rows
    compared = ok[[bool(text_of(v)) for v in ok.get(q.QUALITY_REF_RUN, pd.Series([""] * len(ok), index=ok.index))]]
    identical = [v for v in compared.get(q.AGREE_IDENTICAL, pd.Series([], dtype=object)) if v is not None]
    fracs = numbers_of(compared, q.AGREE_FRAC)
    agree = numbers_of(compared, q.AGREE_TOKENS)
    tokens = numbers_of(compared, q.OUTPUT_TOKENS)
    has = np.isfinite(fracs)
    levers = next((str(v) for v in ok.get(q.LOSSY_LEVERS, pd.Series([], dtype=object)) if text_of(v)), "")
    return SettingQuality(
        runs=len(ok), compared=len(identical), identical=sum(1 for v in identical if v is True),
        agreement=float(np.mean(fracs[has])) if has.any() else math.nan,
        agree_tokens=float(np.mean(agree[has])) if has.any() else math.nan,
        tokens=float(np.mean(tokens[has])) if has.any() and np.isfinite(tokens[has]).all() else math.nan,
        ppl_loss_pct=median(numbers_of(compared, q.PPL_LOSS_PCT)), levers=levers)


# ── the front ────────────────────────────────────────────────────────────────────────────────

FRONT_KEYS = (C.device, C.model, C.apps, "budget")


def _speed(rows: pd.DataFrame) -> list[float]:
    return speeds(rows[rows[C.outcome] == OK])


def _dominates(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """a is at least as fast, as good and as small as b, and better in one."""
    if any(math.isnan(a[k]) or math.isnan(b[k]) for k in (C.tok_s, "quality_loss", "peak_rss_mib")):
        return False
    ge = a[C.tok_s] >= b[C.tok_s] and a["quality_loss"] <= b["quality_loss"] and a["peak_rss_mib"] <= b["peak_rss_mib"]
    gt = a[C.tok_s] > b[C.tok_s] or a["quality_loss"] < b["quality_loss"] or a["peak_rss_mib"] < b["peak_rss_mib"]
    return ge and gt


def quality_front(table: pd.DataFrame) -> pd.DataFrame:
    """One row per setting (a cell key: budget, top-k, flags …) with its speed, quality and memory,
    and `on_front` per (device, model, other apps, budget). A setting with no quality measured
    (no reference) or no finished run is never on the front."""
    records = row_views(table)
    by_setting: dict[tuple[str, ...], list[int]] = {}
    for i, key in enumerate(cell_keys(table)):
        by_setting.setdefault(key, []).append(i)
    out: list[dict[str, Any]] = []
    for idx in by_setting.values():
        rows = table.iloc[idx]
        first = records[idx[0]]
        sq = setting_quality(rows)
        tok = _speed(rows)
        rss = numbers_of(rows[rows[C.outcome] == OK], C.peak_rss_kb) / 1024
        out.append({
            C.device: str(first.get(C.device) or ""), C.model: str(first.get(C.model) or ""),
            C.apps: text_of(first.get(C.apps)), "budget": budget_label(budget_asked(first)),
            "top_k": to_float(first.get(C.n_expert_used)), C.engine_flags: text_of(first.get(C.engine_flags)),
            C.engine_args: text_of(first.get(C.engine_args)), C.dense_weights: text_of(first.get(C.dense_weights)),
            C.lossy_levers: sq.levers, "runs": len(rows), "ok": sq.runs, C.tok_s: median(tok),
            "peak_rss_mib": median(rss), "quality_loss": sq.loss, "quality_basis": sq.basis,
            "agreement": sq.agreement, "identical": sq.identical, "compared": sq.compared,
            C.ppl_loss_pct: sq.ppl_loss_pct, "run_ids": tuple(str(records[i][C.run_id]) for i in idx)})
    front = pd.DataFrame(out)
    if front.empty:
        return front
    on = []
    for i, a in enumerate(out):
        mine = [b for j, b in enumerate(out) if j != i and all(b[k] == a[k] for k in FRONT_KEYS)]
        known = not any(math.isnan(float(a[k])) for k in (C.tok_s, "quality_loss", "peak_rss_mib"))
        on.append(known and not any(_dominates(b, a) for b in mine))
    return front.assign(on_front=on)


# ── the lossy alternative ────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class LossyAlternative:
    """What `recommend --max-quality-loss` names beside the lossless default: the fastest measured
    lossy setting within the bound that is faster than the default beyond noise, its measured argv,
    and its cost in words and numbers; `argv` is None when none qualifies (`why` says why)."""

    bound: str
    argv: tuple[str, ...] | None
    why: str
    levers: str = ""
    cache_mb: int | None = None
    run_ids: tuple[str, ...] = ()
    argv_source: str = ""
    tok_s: float = math.nan
    speedup: float = math.nan           # median tok/s over the lossless default's
    noise_pct: float = math.nan         # the noise threshold the speed-up cleared
    agreement: float = math.nan
    agree_tokens: float = math.nan
    tokens: float = math.nan
    identical: int = 0
    compared: int = 0
    ppl_loss_pct: float = math.nan
    quality_loss: float = math.nan
    quality_basis: str = ""
    text: str = ""

    def to_dict(self) -> dict[str, Any]:
        """As recommendations.json holds it (`lossy_alternative`)."""
        d = asdict(self)
        d["argv"] = list(self.argv) if self.argv is not None else None
        d["run_ids"] = list(self.run_ids)
        return d


@dataclass(frozen=True)
class Candidate:
    """A lossy setting measured on the same device and model: its runs (all finished), the budget
    they asked, and the extra lever of its group (a top-k under the default's)."""

    run_ids: tuple[str, ...]
    tok_s_values: tuple[float, ...]
    cache_mb: int
    levers: str


def lossy_alternative(bound: QualityBound, default_tok_s: Sequence[float], candidates: Sequence[Candidate],
                      rows: Mapping[str, Mapping[str, Any]]) -> LossyAlternative:
    """The fastest candidate within the bound and faster than the default beyond noise
    (results.analysis.noise.differs), with the argv its own runs ran (recommend_argv)."""
    if not default_tok_s:
        return LossyAlternative(bound.text, None, "no lossless fixed budget measured to compare with")
    if not candidates:
        return LossyAlternative(bound.text, None, "no lossy setting measured on this device and model")
    passed: list[tuple[float, Candidate, SettingQuality, float, float]] = []
    refused: list[str] = []
    for c in candidates:
        frame = pd.DataFrame([rows[r] for r in c.run_ids if r in rows])
        sq = setting_quality(frame) if len(frame) else None
        name = f"{c.levers} at {budget_label(c.cache_mb)}"
        if sq is None or not sq.compared:
            refused.append(f"{name}: no lossless reference to compare with")
            continue
        within, why = bound.admits(sq)
        if not within:
            refused.append(f"{name}: {why}")
            continue
        beyond, ratio, threshold = differs(list(default_tok_s), list(c.tok_s_values))
        if not beyond or not ratio > 1:
            refused.append(f"{name}: not faster beyond noise ({ratio:.2f}×)")
            continue
        passed.append((median(c.tok_s_values), c, sq, ratio, threshold))
    if not passed:
        return LossyAlternative(bound.text, None, "none qualifies: " + "; ".join(refused))
    tok, c, sq, ratio, threshold = max(passed, key=lambda t: (t[0], -t[2].loss if not math.isnan(t[2].loss) else 0))
    m = argv_of_runs(c.run_ids, rows)
    text = f"{c.levers}: {ratio:.2f}× tok/s, {sq.text()}"
    return LossyAlternative(
        bound.text, m.fixed(c.cache_mb), f"within {bound.text} and faster beyond noise ({threshold:.0%})",
        c.levers, c.cache_mb, m.run_ids, m.source, tok, ratio, 100 * threshold, sq.agreement, sq.agree_tokens,
        sq.tokens, sq.identical, sq.compared, sq.ppl_loss_pct, sq.loss, sq.basis, text)


def candidates(g: GroupAnalysis, lower: Sequence[GroupAnalysis],
               in_dense: Callable[[Sequence[BudgetPoint]], list[BudgetPoint]], ceiling: float | None,
               rows: Mapping[str, Mapping[str, Any]]) -> list[Candidate]:
    """The lossy settings a default of group `g` may be set beside: among the fixed budgets it could
    have used ({0} ∪ [cycle, ceiling], every run finished, its dense mode: `in_dense`), those of `g`
    run with a lossy flag and every one of the `lower` top-k groups of the same device, model and apps."""
    out = []
    for group in (g, *lower):
        for p in in_dense(group.points):
            if (group is g and not p.lossy) or p.auto or not (p.ok == p.runs and p.ok > 0) or math.isnan(p.budget_mib):
                continue
            if p.budget_mib != 0 and (ceiling is None or p.budget_mib > ceiling + 1e-9 or
                                      (not math.isnan(group.cycle_mib) and p.budget_mib < group.cycle_mib)):
                continue
            asked = argv_of_runs(p.run_ids, rows).asked_mib
            levers = p.lossy if group is g else levers_of(p.run_ids, rows) or f"top-k {group.top_k}"
            out.append(Candidate(p.run_ids, p.tok_s_values, int(asked if asked is not None else p.budget_mib), levers))
    return out


def levers_of(run_ids: Sequence[str], rows: Mapping[str, Mapping[str, Any]]) -> str:
    """The lossy levers these runs pulled (the run table's, from results.read.quality)."""
    return next((str(rows[r].get(q.LOSSY_LEVERS)) for r in run_ids if r in rows and text_of(rows[r].get(q.LOSSY_LEVERS))),
                "")
