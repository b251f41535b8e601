"""The engine's own planner against what the sweep measured (docs/decisions/planner.md).

A "planner" cell runs the engine with `--auto --plan-explain` and none of the harness's budget
flags: the plan it prints (regime, the budget it chose, its predicted cost) and what became of the
run (held, fought, killed, or a baseline where it declined to stream) are set here beside the
device's measured boundary (results.analysis.analyze LmkBoundary). Pure: its inputs are analyze's points.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from engine.interface.flags import AUTO
from results.read.run_keys import ALL_RUNS, MMAP, budget_label
from store.versioned import json_safe


class Point(Protocol):
    """What this module reads of a budget point (results.analysis.analyze BudgetPoint)."""

    @property
    def series(self) -> str: ...

    @property
    def budget_mib(self) -> float: ...

    @property
    def runs(self) -> int: ...

    @property
    def ok(self) -> int: ...

    @property
    def killed(self) -> int: ...

    @property
    def run_ids(self) -> tuple[str, ...]: ...

    @property
    def fought(self) -> str: ...

    @property
    def s_per_token(self) -> float: ...


@dataclass(frozen=True)
class PlannerPick:
    """What the planner chose for one series on one device, and how it fared."""

    series: str
    budget_mib: float                  # the cache it chose; NaN when it declined to stream
    regime: str                        # fits | experts-stream | dense-oversized | not-moe | unknown ("" unread)
    declined: str                      # why it declined streaming ("" when it streamed)
    flags: str                         # its `plan: reproduce with` flags
    runs: int
    ok: int
    killed: int
    run_ids: tuple[str, ...]
    predicted_s_per_tok: float         # the plan's cost model (NaN: it priced nothing)
    measured_s_per_tok: float          # the finished runs' median
    fought: str                        # results.analysis.analyze fought_reason ("" when not fought)
    refused: str                       # the engine refused the planner's flags ("" when it ran them)
    verdict: str                       # one line: the pick against the measured boundary

    @property
    def error_pct(self) -> float:
        """(predicted / measured - 1) x 100, as the engine's own `plan: predicted` line prints it."""
        if math.isnan(self.predicted_s_per_tok) or math.isnan(self.measured_s_per_tok) or self.measured_s_per_tok <= 0:
            return math.nan
        return 100.0 * (self.predicted_s_per_tok / self.measured_s_per_tok - 1.0)

    def text(self) -> str:
        """`planner (anon): 900 MiB (experts-stream) — killed …; predicted 0.05 s/token, measured 0.04 (+25%)`
        (`planner: mmap (fits) — …` where it declined streaming, `planner: ? — …` where no plan was read)."""
        chose = budget_label(MMAP if self.declined else self.budget_mib)
        regime = f" ({self.regime})" if self.regime else ""
        series = f" ({self.series})" if self.series and self.series != ALL_RUNS else ""
        out = f"planner{series}: {chose}{regime} — {self.verdict}"
        if not math.isnan(self.error_pct):
            out += (f"; predicted {self.predicted_s_per_tok:.3f} s/token, measured {self.measured_s_per_tok:.3f} "
                    f"({self.error_pct:+.0f}%)")
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["run_ids"] = list(self.run_ids)
        d["error_pct"] = self.error_pct
        d["text"] = self.text()
        return json_safe(d, 3)


def verdict(point: Point, safe: float | None, declined: str, refused: bool) -> str:
    """The pick against the boundary (`safe`: the largest budget the sweep proved safe), in one clause."""
    if refused:
        return f"the engine has no planner: it refused {AUTO.name} (bmoe-cli has it after 0.24)"
    b = point.budget_mib
    if point.killed:
        where = f", above the largest budget the sweep proved safe ({safe:g} MiB)" if safe is not None and \
            not math.isnan(b) and b > safe else ""
        return f"killed ({point.killed} of {point.runs} runs){where}"
    if not point.ok:
        return "no run finished"
    if declined:
        return "ran as a baseline (mmap): nothing to set against the boundary"
    if point.fought:
        return f"survived but {point.fought}"
    if safe is None:
        return "held; the sweep proved no fixed budget safe to set it against"
    if not math.isnan(b) and b > safe:
        return f"held, above the largest budget the sweep proved safe ({safe:g} MiB): proven by this run alone"
    return f"held, within the measured boundary (safe up to {safe:g} MiB)"


def pick(point: Point, safe: float | None, regime: str, declined: str, flags: str,
         predicted_s_per_tok: float, refused: bool) -> PlannerPick:
    """One series' planner runs (as a budget point, its fought reason judged) set against the
    largest budget the sweep proved safe."""
    return PlannerPick(
        series=point.series, budget_mib=point.budget_mib, regime=regime, declined=declined, flags=flags,
        runs=point.runs, ok=point.ok, killed=point.killed, run_ids=point.run_ids,
        predicted_s_per_tok=predicted_s_per_tok, measured_s_per_tok=point.s_per_token, fought=point.fought,
        refused=f"the engine refused {AUTO.name}" if refused else "",
        verdict=verdict(point, safe, declined, refused))
