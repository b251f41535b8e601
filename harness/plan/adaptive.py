"""The adaptive sweep (`[plan] adaptive = true`, `sweep --adaptive`; docs/decisions/adaptive-sweep.md): spend cells
only where the prediction (results.replay.predict) is unsure.

Per group, the analysis' own (device, model, top-k, other apps), every series of it (dense mode,
lanes, threads, flags) at each budget, every repeat:

1. cache 0 with a route trace: the probe and the cache-0 run of the prediction in one cell;
2. predict; measure the replayed LRU curve's knee and the budget the model expects to be the
   largest safe one (the smallest of: the working set the trace reaches, past which a cache never
   fills and proves nothing; what the phone's RAM had left while cache 0 ran, zram left out (past
   the RAM the cache is fought over before lmkd kills); the
   grid's largest budget, so both sweeps answer the same question);
3. step from the predicted safe budget by the resolution, doubling each step (up while it holds,
   down while lmkd kills it; a fought one hands over to where the swap-in rate, between the knee
   and it, crosses the fought rule's, and the search steps from there: the model predicts where
   the RAM runs out, not where reclaim starts to fight), then bisect between the largest budget
   that held and the smallest
   measured above it: "held" is the
   analysis' own largest safe budget (results.analysis.analyze.LmkBoundary: every run finished, the
   cache filled, neither killed nor fought), so the bracket only ever rests on measured budgets;
   until the two are `plan.resolution_mb` apart, or the grid's largest budget held, or nothing from
   the cycle up did;
4. a group with a measured cell that held (or cache 0) further than `plan.max_error_pct` from its
   predicted s/token, or with no prediction at all, falls back to the grid: the axes' cells. A
   miss is measured again first (a second round of that budget's cells, repeats R..2R-1): the
   group falls back only when every run of the budget missed, so one run that something else on
   the device slowed does not cost the grid.

The plan is a function of the campaign, plan.json and the runs on disk: each round adds the cells
the results so far decide (the runner runs them, then asks again), a group whose cells are not all
done waits, and a rerun after Ctrl-C or a lost device recomputes the same decisions. Each round's
brackets go to plan.json's `adaptive` list, which `status` shows.

Long because: it is one decision procedure, `_Group`'s rounds (probe, predict, measure a miss
again, step, bisect), whose steps share one group's measured points, its search top and its
resolution; the numbered steps above are its outline, and split by step they would pass that
state between modules.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.campaign.model import Campaign
from harness.plan.grid import Cell, Plan, budget_config, new_cell, plan_from_dict, probes_for
from store import outcomes
from store.campaign_dir import CampaignDir
from store.cells import CellConfig
from store.ledger import latest_by_cell

MEASURING_GRID = "; measuring the grid"
GroupKey = tuple[str, str, int, str]         # device, model, top-k, other apps: the analysis' group

PROBING, PREDICTING, BISECTING, BRACKETED, GRID, WAITING, CONFIRMING = (
    "probing", "measuring the prediction", "bisecting", "bracketed", "grid", "waiting", "measuring a miss again")


@dataclass(frozen=True)
class Bracket:
    """Where one group's kill-or-fight boundary stands: the largest budget that held, the smallest
    measured above it, and what the plan does next."""

    device: str
    model: str
    top_k: int
    apps: str
    state: str
    held_mib: float | None = None            # the analysis' largest safe budget (measured)
    failed_mib: float | None = None          # the smallest budget measured above it (did not hold)
    resolution_mib: int = 0
    predicted_knee_mib: int | None = None
    predicted_safe_mib: int | None = None
    next_mib: tuple[int, ...] = ()
    reason: str = ""

    @property
    def closed(self) -> bool:
        """The ceiling is bracketed to the resolution (or the grid answers it)."""
        return self.state in (BRACKETED, GRID) and not self.next_mib

    def to_dict(self) -> dict[str, Any]:
        """As plan.json's `adaptive` list holds it."""
        return {"device": self.device, "model": self.model, "top_k": self.top_k, "apps": self.apps,
                "state": self.state, "held_mib": self.held_mib, "failed_mib": self.failed_mib,
                "resolution_mib": self.resolution_mib, "predicted_knee_mib": self.predicted_knee_mib,
                "predicted_safe_mib": self.predicted_safe_mib, "next_mib": list(self.next_mib),
                "reason": self.reason}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Bracket:
        """A bracket from plan.json."""
        return cls(str(d["device"]), str(d["model"]), int(d["top_k"]), str(d.get("apps") or ""), str(d["state"]),
                   d.get("held_mib"), d.get("failed_mib"), int(d.get("resolution_mib") or 0),
                   d.get("predicted_knee_mib"), d.get("predicted_safe_mib"), tuple(d.get("next_mib") or ()),
                   str(d.get("reason") or ""))

    def text(self) -> str:
        """One line for `status`."""
        held = f"{self.held_mib:g} MiB" if self.held_mib is not None else "none"
        failed = f"{self.failed_mib:g} MiB" if self.failed_mib is not None else "none yet"
        width = f", width {self.failed_mib - self.held_mib:g}" if self.held_mib is not None and \
            self.failed_mib is not None else ""
        load = f" with {self.apps}" if self.apps else ""
        predicted = (f"; predicted knee {self.predicted_knee_mib} MiB, largest safe {self.predicted_safe_mib} MiB"
                     if self.predicted_safe_mib is not None or self.predicted_knee_mib is not None else "")
        nxt = f"; next {', '.join(map(str, self.next_mib))} MiB" if self.next_mib else ""
        why = f" ({self.reason})" if self.reason else ""
        return (f"{self.device} {self.model} k={self.top_k}{load}: {self.state}{why}: held {held}, did not hold "
                f"{failed}{width} (resolution {self.resolution_mib} MiB){predicted}{nxt}")


@dataclass(frozen=True)
class AdaptivePlan:
    """The cells decided so far and each group's bracket."""

    plan: Plan
    brackets: tuple[Bracket, ...] = field(default=())

    def to_doc(self) -> dict[str, Any]:
        """plan.json: the plan, with the brackets under `adaptive`."""
        return {**self.plan.to_dict(), "adaptive": [b.to_dict() for b in self.brackets]}

    def to_dict(self) -> dict[str, Any]:
        """As `--dry-run --json` prints it: plan.json."""
        return self.to_doc()

    def text(self) -> str:
        """The dry-run listing: the cells decided so far, then each group's bracket."""
        return "\n".join([self.plan.text(), "", "adaptive: the next cells are decided from these runs' results"]
                         + [f"  {b.text()}" for b in self.brackets])


def brackets_of(doc: Mapping[str, Any] | None) -> tuple[Bracket, ...]:
    """The brackets a plan.json holds (none for a grid's)."""
    return tuple(Bracket.from_dict(b) for b in (doc or {}).get("adaptive") or ())


def group_key(cell: Cell) -> GroupKey:
    """The analysis group a cell belongs to."""
    return (cell.device, cell.model, int(cell.config.n_expert_used or 0), cell.config.apps or "")


def _series_key(config: CellConfig) -> str:
    """A configuration without its budget: the series it is a point of."""
    d = config.to_dict()
    for k in ("cache_mb", "cache_auto", "cache_ceil_mb", "force_cache", "force_cache_auto", "budget_spec",
              "route_trace", "moe_stream", "no_mmap"):
        d.pop(k, None)
    return json.dumps(d, sort_keys=True)


def _streamed(cell: Cell) -> bool:
    """A grid cell of a series the plan can set a budget in: streamed (auto included), not the
    planner's, nor a quality reference (one lossless cell at its group's smallest grid budget,
    planned as the grid has it: harness.plan.grid.with_quality)."""
    c = cell.config
    return bool(c.moe_stream) and not c.planner and not c.probe and not c.quality_reference


def _fixed(cell: Cell) -> bool:
    """A streamed cell at a budget the plan knows (not auto, not a knee before its probe)."""
    return _streamed(cell) and not cell.config.cache_auto and cell.config.cache_mb is not None


def _bases(grid: Plan) -> dict[GroupKey, list[Cell]]:
    """Per group, one streamed grid cell per series, in plan order."""
    out: dict[GroupKey, dict[str, Cell]] = {}
    for cell in grid.cells:
        if _streamed(cell) and cell.pass_no == 0:
            out.setdefault(group_key(cell), {}).setdefault(_series_key(cell.config), cell)
    return {k: list(v.values()) for k, v in out.items()}


def foreign_cells(grid: Plan, cells: Sequence[Cell]) -> list[Cell]:
    """The cells no round of this campaign can plan: neither the grid's nor a point of one of its
    groups' series (at any budget, any repeat, traced or not). A folder holding one holds another
    campaign (harness.run.runner refuses it)."""
    ours = {c.cell_id for c in grid.cells}
    series = {(k, _series_key(b.config)) for k, bases in _bases(grid).items() for b in bases}
    return [c for c in cells if c.cell_id not in ours and (group_key(c), _series_key(c.config)) not in series]


def _analysis(cdir: CampaignDir):
    """The analysis of the runs so far (None before any)."""
    from results.analysis.analyze import analyze
    from results.read.rundir import read_campaigns
    from results.read.table import build_table

    if not cdir.has_runs():
        return None
    campaigns = read_campaigns([cdir.root])
    if not any(c.runs for c in campaigns):     # a runs folder with no attempt in it yet (one killed mid-way)
        return None
    table = build_table(campaigns)
    return analyze(table) if len(table) else None


def resolution_mib(campaign: Campaign, cycle_mib: float) -> int:
    """plan.resolution_mb, or a quarter of the token cycle (whole MiB, at least 1)."""
    return campaign.plan.resolution_mb or max(1, math.ceil(cycle_mib / 4))


def adaptive_plan(campaign: Campaign, grid: Plan, cdir: CampaignDir | None) -> AdaptivePlan:
    """The cells the results on disk decide, added to those plan.json already holds (module doc);
    without a directory, the first round."""
    doc = cdir.read_plan_doc() if cdir is not None and cdir.has_plan() else None
    old = plan_from_dict(doc).cells if doc is not None else ()
    latest = latest_by_cell(cdir.ledger.read()) if cdir is not None and doc is not None else {}
    analysis = _analysis(cdir) if cdir is not None and doc is not None else None
    # a group that fell back to the grid stays there (its grid cells are planned; plan.json says so)
    fallen = {(b.device, b.model, b.top_k, b.apps): b.reason for b in brackets_of(doc) if b.state == GRID}
    cells: dict[str, Cell] = {c.cell_id: c for c in old}
    runs = RunIndex.of(analysis)
    brackets = []
    for key, series in _bases(grid).items():
        group = _Group(campaign, grid, key, series, latest, analysis, [c for c in old if group_key(c) == key],
                       fallen.get(key), runs)
        wanted, bracket = group.decide()
        for cell in wanted:
            cells.setdefault(cell.cell_id, cell)
        brackets.append(bracket)
    # a device and model with no streamed series (baselines only) has nothing to bisect: its grid;
    # a quality reference is run as the grid has it, from the first round
    bases = {k[:2] for k in _bases(grid)}
    for cell in grid.cells:
        if (cell.device, cell.model) not in bases or cell.config.quality_reference:
            cells.setdefault(cell.cell_id, cell)
    ordered: list[Cell] = []
    for device in dict.fromkeys(c.device for c in cells.values()):
        mine = [c for c in cells.values() if c.device == device]
        ordered += [Cell(c.cell_id, c.device, c.model, c.engine, c.config, c.repeat, c.pass_no, i, c.argv)
                    for i, c in enumerate(mine)]
    plan = Plan(campaign.name, tuple(ordered), grid.models, grid.top_ks, probes_for(campaign, ordered))
    return AdaptivePlan(plan, tuple(brackets))


def measured_bracket(g) -> tuple[float | None, float | None, list[float]]:
    """An analysis group's bracket as measured: its largest safe budget (LmkBoundary), the smallest
    budget measured above it, and the fixed budgets (> 0) it has points at, every run of them
    finished or killed."""
    if g is None:
        return None, None, []
    held = g.boundary.largest_safe_mib
    measured = sorted({p.budget_mib for p in g.points if not p.auto and not math.isnan(p.budget_mib)
                       and p.budget_mib > 0 and (p.ok or p.killed)})
    above = [m for m in measured if held is None or m > held]
    return held, min(above) if above else None, measured


@dataclass(frozen=True)
class RunIndex:
    """Each analysed run's cell and its own error against its prediction (%), by run id: made once
    per round for every group."""

    errors: Mapping[str, float] = field(default_factory=dict)
    cells: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, analysis) -> RunIndex:
        if analysis is None:
            return cls()
        runs = analysis.table["run_id"].astype(str)
        return cls(dict(zip(runs, analysis.table["prediction_error_pct"].astype(float))),
                   dict(zip(runs, analysis.table["cell_id"].astype(str))))


class _Group:
    """One group's decision (adaptive_plan)."""

    def __init__(self, campaign: Campaign, grid: Plan, key: GroupKey, series: Sequence[Cell],
                 latest: Mapping[str, Mapping[str, Any]], analysis, planned: Sequence[Cell], fallen: str | None = None,
                 runs: RunIndex | None = None):
        self.campaign, self.grid, self.key, self.series = campaign, grid, key, series
        self.latest, self.planned, self.fallen = latest, list(planned), fallen
        self.g = None
        self.runs = runs if runs is not None else RunIndex()
        if analysis is not None:
            with contextlib.suppress(KeyError):     # no run of it finished yet
                self.g = analysis.group(key[0], key[1], key[2], key[3])
        self.cycle_mib = float(series[0].config.cycle_mb or 0.0)
        self.resolution = resolution_mib(campaign, self.cycle_mib)
        self.lowest = max(1, math.ceil(self.cycle_mib))      # the least budget a ceiling can rest on
        grid_budgets = [float(c.config.cache_mb or 0) for c in self._grid_cells() if _fixed(c)]
        # the largest budget to search: the grid's (so both sweeps answer one question), at most the
        # largest that can fill (set once predicted)
        self.top = math.floor(max(grid_budgets)) if grid_budgets and max(grid_budgets) > 0 else None
        self.top_why = "the largest budget asked held"

    # -- cells --------------------------------------------------------------------------------
    def _grid_cells(self) -> list[Cell]:
        return [c for c in self.grid.cells if group_key(c) == self.key]

    def at(self, budget_mib: int, route_trace: bool = False, round_no: int = 0) -> list[Cell]:
        """Every series of the group at a budget, every repeat (round 1: the repeats after them,
        which measure a miss again)."""
        out = []
        repeats = self.campaign.run.repeats
        for base in self.series:
            config = budget_config(self.campaign, base.config, budget_mib)
            if route_trace:
                config = config.with_(route_trace=True)
            out += [new_cell(self.campaign, base.device, base.model, config, r, 0)
                    for r in range(round_no * repeats, (round_no + 1) * repeats)]
        return out

    def _done(self, cells: Sequence[Cell]) -> bool:
        return all(outcomes.is_done(self.latest.get(c.cell_id)) for c in cells)

    def _bracket(self, state: str, reason: str = "", next_mib: Sequence[int] = (), knee: int | None = None,
                 safe: int | None = None) -> Bracket:
        held, failed, _ = measured_bracket(self.g)
        return Bracket(*self.key, state=state, held_mib=held, failed_mib=failed,
                       resolution_mib=self.resolution, predicted_knee_mib=knee, predicted_safe_mib=safe,
                       next_mib=tuple(next_mib), reason=reason)

    # -- the decision -------------------------------------------------------------------------
    def decide(self) -> tuple[list[Cell], Bracket]:
        """The cells this group needs so far, and its bracket."""
        base = self.at(0, route_trace=True)
        wanted = base + self.planned
        if not self._done(wanted):
            return wanted, self._bracket(PROBING if not self._done(base) else WAITING)
        g = self.g
        if g is None:
            return self._grid(wanted, "no cache-0 run finished")
        predictions = g.predictions
        if self.fallen is not None:
            return self._grid(wanted, self.fallen.removesuffix(MEASURING_GRID))
        if not predictions:
            return self._grid(wanted, "no prediction: the cache-0 route-traced run did not finish")
        miss, again = self._missed(self.campaign.plan.max_error_pct)
        have = {c.cell_id for c in wanted}
        wanted += [c for c in again if c.cell_id not in have]
        if miss:
            return self._grid(wanted, miss)
        if not self._done(again):
            return wanted, self._bracket(CONFIRMING, "it missed its prediction in every run",
                                         next_mib=sorted({int(c.config.cache_mb or 0) for c in again}))
        from results.analysis.analyze import BudgetPoint

        entry = min((p.entry_mib for p in g.points if not math.isnan(p.entry_mib)), default=math.nan)
        fillable = math.floor(BudgetPoint.fillable_mib(min(p.working_set_mib for p in predictions), entry))
        if self.top is None or fillable < self.top:
            self.top = fillable
            self.top_why = (f"held at {fillable} MiB, the largest budget a cache fills in these tokens (the probe's "
                            "working set): a larger one survives without filling, which proves nothing")
        if self.top is not None and self.top < self.lowest:
            return wanted, self._bracket(BRACKETED, f"no whole MiB from the {self.lowest} MiB cycle up to {self.top} "
                                                    "MiB, the largest budget to search")
        knee = self._clamp(math.ceil(g.replay.knee_mib)) if g.replay is not None and g.replay.knee_mib else None
        safe = self._predicted_safe(predictions)
        targets = [self.at(b) for b in dict.fromkeys(x for x in (knee, safe) if x is not None)]
        wanted += [c for cells in targets for c in cells]
        if not self._done(wanted):
            return wanted, self._bracket(PREDICTING, next_mib=[b for b in (knee, safe) if b is not None],
                                         knee=knee, safe=safe)
        nxt, why = self._next(safe, knee)
        if nxt is None:
            return wanted, self._bracket(BRACKETED, why, knee=knee, safe=safe)
        return wanted + self.at(nxt), self._bracket(BISECTING, next_mib=[nxt], knee=knee, safe=safe)

    def _grid(self, wanted: list[Cell], reason: str) -> tuple[list[Cell], Bracket]:
        """The grid's cells of this group, less the budgets already measured in each series."""
        have = {(_series_key(c.config), c.config.cache_mb, c.repeat) for c in wanted}
        grid = [c for c in self._grid_cells() if not _fixed(c)
                or (_series_key(c.config), c.config.cache_mb, c.repeat) not in have]
        pending = not self._done(wanted + grid)
        return wanted + grid, self._bracket(GRID, reason + (MEASURING_GRID if pending else ""))

    def _missed(self, max_error_pct: float) -> tuple[str, list[Cell]]:
        """The first measured point that held (or cache 0) further from its prediction than allowed
        in every run of it, measured again ("" when none), and the cells that measure a miss again:
        a budget whose every run missed gets a second round of cells, and misses only if those do too."""
        g = self.g
        held = g.boundary.largest_safe_mib if g is not None else None
        again: list[Cell] = []
        for p in g.points if g is not None else ():
            if p.auto or math.isnan(p.budget_mib):
                continue
            if p.budget_mib > 0 and (held is None or p.budget_mib > held):
                continue                  # killed, fought or unfilled: the model does not describe a fight
            errors = [self.runs.errors.get(r, math.nan) for r in p.run_ids]
            if not errors or any(math.isnan(e) or abs(e) <= max_error_pct for e in errors):
                continue
            miss = (f"{p.label} ({p.series or 'all'}) measured {p.s_per_token:.4g} s/token, predicted "
                    f"{p.predicted_s_per_tok:.4g} ({p.prediction_error_pct:+.0f} %, over {max_error_pct:g} % "
                    f"in all {len(errors)} run(s))")
            if not float(p.budget_mib).is_integer():
                return miss, again        # no budget the search plans: nothing to measure again
            second = self.at(int(p.budget_mib), route_trace=p.budget_mib == 0, round_no=1)
            if self._done(second) and {c.cell_id for c in second} <= {self.runs.cells.get(r) for r in p.run_ids}:
                return miss, again
            again += second
        return "", again

    def _clamp(self, budget_mib: int) -> int:
        b = max(self.lowest, budget_mib)
        return min(b, self.top) if self.top is not None else b

    def _predicted_safe(self, predictions) -> int | None:
        """The largest budget the model expects to hold: what the phone's RAM had left while cache 0
        ran (its MemAvailable floor, results.replay.predict.PhoneRam with no zram), at most the top
        of the search. zram is left out on purpose: past the RAM the kernel swaps the cache's cold
        entries to zram and each token faults them back, a fight (docs/method.md), which comes
        before the kill that zram's room postpones."""
        from results.replay.predict import PhoneRam

        floor_mib = self._floor_at(0)
        budgets = []
        for pred in predictions:
            # the top of the search is the largest budget that fills (decide): the same bound here
            most = pred.working_set_mib if self.top is None else self.top
            b: float | None = most
            anon = pred.rates.rss_anon_peak_mib
            if floor_mib is not None and not math.isnan(anon):
                fit, fits_all = pred.ram_budget_for(PhoneRam(mem_total_mib=floor_mib + anon))
                # the whole working set fits: so does every budget up to the top (the cache never
                # holds more than the working set, and the top is the largest it still fills)
                b = None if fit is None else most if fits_all else min(fit, most)
            budgets.append(b)
        if any(b is None for b in budgets):
            return None                  # not even cache 0 fits: measure from the cycle up
        return self._clamp(math.floor(min(b for b in budgets if b is not None)))

    def _floor_at(self, budget_mib: float) -> float | None:
        """The least MemAvailable the runs at one budget left (MiB)."""
        rows = self._points_at(budget_mib)
        floors = [p.mem_avail_floor_kb for p in rows if not math.isnan(p.mem_avail_floor_kb)]
        return min(floors) / 1024 if floors else None

    def _points_at(self, budget_mib: float) -> list:
        """The analysis' fixed-budget points at one budget (every series)."""
        return [p for p in self.g.points if not p.auto and p.budget_mib == budget_mib] if self.g is not None else []

    def _fought_at(self, budget_mib: float) -> bool:
        """The measured budget survived but was fought (docs/method.md), not killed."""
        points = self._points_at(budget_mib)
        return any(p.fought for p in points) and not any(p.killed for p in points)

    def _swap_in_at(self, budget_mib: float) -> float | None:
        """The largest swap-in rate (MiB/token) the runs at one budget measured, None when a run of it
        was killed or none has the rate."""
        points = self._points_at(budget_mib)
        rates = [p.swap_in_mib_per_tok for p in points if p.ok and not math.isnan(p.swap_in_mib_per_tok)]
        return max(rates) if rates and not any(p.killed for p in points) else None

    def _crossing(self, low_mib: float, high_mib: float) -> int | None:
        """Where the swap-in rate crosses the fought rule's (FOUGHT_SWAP_IN_MIB_PER_TOK) on a straight
        line between two measured budgets, the lower under it and the higher over it; a whole MiB
        strictly between them. None when either is not so (a fight for another reason, a kill)."""
        from results.analysis.analyze import FOUGHT_SWAP_IN_MIB_PER_TOK as LIMIT

        low, high = self._swap_in_at(low_mib), self._swap_in_at(high_mib)
        if low is None or high is None or not low < LIMIT <= high or high_mib - low_mib < 2:
            return None
        at = math.ceil(low_mib + (LIMIT - low) / (high - low) * (high_mib - low_mib))
        return min(max(at, math.floor(low_mib) + 1), math.ceil(high_mib) - 1)

    def _fight_estimate(self, anchor: int, knee: int | None) -> int | None:
        """Where the device's swap-in rate crosses the fought rule's, between the knee (held, under
        it) and the predicted safe budget (fought, over it): `_crossing`. The fight is the rule on a
        measured rate that rises with the budget, which the model does not predict: the two cells
        measured anyway place it (docs/lab-notes/2026-12-05-prediction-anchor.md: 292 MiB from 0.09 MiB/token
        at 139 and 1.86 at 437,
        the boundary between 269 and 288)."""
        if knee is None or knee >= anchor:
            return None
        return self._crossing(knee, anchor)

    def _next(self, anchor: int | None = None, knee: int | None = None) -> tuple[int | None, str]:
        """The next budget to measure, or None and why the bracket is closed. From the predicted
        largest safe budget (`anchor`, measured) the search steps away by the resolution, doubling
        each step (up while it holds, down while it does not), so a boundary the model put within
        one resolution is bracketed by one cell; a bracket wider than the next step is bisected. A
        step up goes no further than the MemAvailable the largest budget that held left (at least
        one resolution): the model's own RAM term, measured again where the cache is larger
        (docs/lab-notes/2026-12-05-adaptive-demo-phones.md: bmoe-py's 640 MiB phone held 541 MiB with 17 MiB
        left, and the doubled step
        went to 669, fought, then bisected twice).
        When the predicted budget was fought, the model (which places the RAM's end, not a fight's
        start: the 640 MiB phone fought from ~280 MiB under a predicted 437) gives way to
        `_fight_estimate`, or, without one, to bisection; and each step from it goes no further than
        where the swap-in rate crosses the rule's between the bracket's two ends (`_crossing`), when
        that is nearer: the rate rises steeply at the fight's start and flattens past it, so a
        doubled step overshoots (the same lab note: 294 and 262 fought, the doubled step 198 held, 230
        held; the crossing from 262 was 240)."""
        held, failed, measured = measured_bracket(self.g)
        fight = False                      # the predicted budget was fought
        if anchor is not None and self._fought_at(anchor):
            fight = True
            # the model's budget was fought: step from where the swap-in rate says the fight starts
            estimate = self._fight_estimate(anchor, knee)
            anchor = estimate if estimate is not None and estimate < anchor else None
        if held is None:
            if self.lowest not in measured:
                return self.lowest, ""
            return None, f"nothing from the {self.lowest} MiB cycle up held: cache 0"
        if failed is not None and failed - held <= self.resolution:
            return None, f"bracketed to {failed - held:g} MiB"
        step = None
        if anchor is not None and anchor not in measured and held < anchor:     # the anchor itself first
            step = anchor
        elif anchor is not None and held >= anchor:           # up from the anchor while it holds
            taken = len([m for m in measured if anchor <= m <= held]) - 1
            step = math.floor(held) + self.resolution * 2 ** taken
            room = self._floor_at(held)
            if room is not None:      # no further than the RAM the budget that held left (a resolution at least)
                step = min(step, math.floor(held) + max(self.resolution, math.floor(room)))
            if fight and failed is not None and (at := self._crossing(held, failed)) is not None:
                step = min(step, at)
        elif anchor is not None and failed is not None and failed <= anchor:     # down while it does not
            taken = len([m for m in measured if failed <= m <= anchor]) - 1
            step = math.ceil(failed) - self.resolution * 2 ** taken
            if fight and (at := self._crossing(held, failed)) is not None:
                step = max(step, at)
        if failed is None:
            if self.top is None or held >= self.top:
                return None, self.top_why
            if self.top - held <= self.resolution:
                return None, f"bracketed to {self.top - held:g} MiB under the top of the search ({self.top} MiB)"
            nxt = self.top if step is None else min(self.top, step)
            return (nxt if nxt not in measured else self.top), ""
        mid = math.floor((held + failed) / 2)
        nxt = step if step is not None and held < step < failed else mid
        if nxt <= held or nxt in measured:
            return None, f"bracketed to {failed - held:g} MiB (no whole MiB between)"
        return nxt, ""
