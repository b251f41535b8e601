"""`bmoe-fleet replay`: route traces replayed through expert-cache policies, and the report.

The curves come from results.replay.lru_replay (exact global LRU at every budget from one set of stack
distances) and results.replay.policy_replay (the other policies, simulated); this module checks the
options, replays each trace, and writes the text table, the JSON and upstream's curve CSV
(route-replay.py --csv). See docs/replay.md.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.fsutil import STDOUT, write_output, write_target
from engine.gguf.model import cycle_price_mib
from engine.safetext import printable
from engine.units import MIB
from results.errors import ReplayError
from results.read.route_trace import RouteTrace, read_route_trace
from results.replay.choices import PHASES, POLICIES
from results.replay.drop_replay import DropLever, DropPoint, LossyTrace, check_lossy, drop_curve_from
from results.replay.lru_replay import (
    MAX_TRACE_BYTES,
    CurvePoint,
    access_sequence,
    default_budgets_mib,
    first_decode_hit_mib,
    knee_mib,
    lru_curve,
    mib_to_bytes,
    stack_distances,
)
from results.replay.policy_replay import simulated_point

FORMAT = "bmoe-fleet.replay"
FORMAT_VERSION = 1
CSV_HEADER = "budget_mib,policy,hit_pct_cum,hit_pct_decode,read_mib"


@dataclass(frozen=True)
class TraceReplay:
    """One trace's replay: its shape, its token cycle T, and the curve points."""

    path: str
    model: str
    arch: str
    n_layer: int
    n_moe_layers: int
    n_expert: int
    n_expert_used: int
    cycle_bytes: int
    lookups: int
    decode_lookups: int
    batches: int
    decode_batches: int
    dropped_rows: int
    # the smallest budget at which any decode lookup hits under global LRU (None: no reuse at all)
    first_decode_hit_mib: float | None
    knee_mib: int | None             # knee_mib(): where more MiB start buying fewer hits (decode)
    budgets_mib: tuple[float, ...]
    points: tuple[CurvePoint, ...]
    # --drop-cold-experts replayed (results.replay.drop_replay): the lever and a point per budget
    drop: DropLever | None = None
    drop_points: tuple[DropPoint, ...] = ()

    @property
    def cycle_mib(self) -> float:
        """The token cycle in MiB."""
        return self.cycle_bytes / MIB

    def to_dict(self) -> dict[str, Any]:
        """The replay as the JSON output holds it."""
        return {
            "path": self.path, "model": self.model, "arch": self.arch, "n_layer": self.n_layer,
            "n_moe_layers": self.n_moe_layers, "n_expert": self.n_expert, "n_expert_used": self.n_expert_used,
            "cycle_mib": cycle_price_mib(self.cycle_bytes), "cycle_bytes": self.cycle_bytes,
            "lookups": self.lookups, "decode_lookups": self.decode_lookups, "batches": self.batches,
            "decode_batches": self.decode_batches, "dropped_rows": self.dropped_rows,
            "first_decode_hit_mib": self.first_decode_hit_mib, "knee_mib": self.knee_mib,
            "budgets_mib": list(self.budgets_mib),
            "points": [p.to_dict() for p in self.points],
            **({"drop": {**self.drop.to_dict(), "points": [p.to_dict() for p in self.drop_points]}}
               if self.drop is not None else {}),
        }


def _check_options(budgets_mib: Sequence[float] | None, policies: Sequence[str]) -> None:
    if not policies:
        raise ReplayError(f"no cache policy given (known: {', '.join(POLICIES)})")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ReplayError(f"unknown cache policy {unknown[0]!r} (known: {', '.join(POLICIES)})")
    if budgets_mib is not None and (not budgets_mib or any(not math.isfinite(b) or b < 0 for b in budgets_mib)):
        raise ReplayError("budgets must be one or more finite MiB values >= 0")


def replay_trace(trace: RouteTrace, budgets_mib: Sequence[float] | None = None,
                 policies: Sequence[str] = ("lru",), drop: DropLever | None = None,
                 lossy: Sequence[LossyTrace] = ()) -> TraceReplay:
    """Curve points for one parsed trace: `lru` from stack distances, the others simulated; with
    `drop`, the engine's LRU under --drop-cold-experts at the same budgets (drop_replay), every
    budget from the lowest of `lossy` (drop runs' traces of that F) where given."""
    _check_options(budgets_mib, policies)
    seq = access_sequence(trace)
    if len(seq) == 0:
        raise ReplayError(f"{trace.path}: no expert lookups to replay (no rows of a streamed layer)")
    if len(seq) * int(seq.entry_bytes.max()) >= MAX_TRACE_BYTES:
        raise ReplayError(f"{trace.path}: {len(seq)} lookups of up to {int(seq.entry_bytes.max())} bytes: too many "
                          f"bytes to replay (2^62 or more)")
    cycle = trace.cycle_bytes
    if budgets_mib is None:
        budgets_mib = default_budgets_mib(cycle / MIB)
    budgets = tuple(dict.fromkeys(float(b) for b in budgets_mib))
    distance = stack_distances(seq)
    points: list[CurvePoint] = []
    for policy in policies:
        if policy == "lru":
            points += lru_curve(seq, budgets, cycle, distance)
        else:
            points += [simulated_point(seq, policy, b, cycle) for b in budgets]
    return TraceReplay(
        path=trace.path, model=trace.model, arch=trace.arch, n_layer=trace.n_layer,
        n_moe_layers=len(trace.expert_bytes_by_layer), n_expert=trace.n_expert, n_expert_used=trace.n_expert_used,
        cycle_bytes=cycle, lookups=len(seq), decode_lookups=int(seq.decode.sum()), batches=seq.n_batches,
        decode_batches=seq.n_decode_batches, dropped_rows=int(trace.rows.dropped.sum()),
        first_decode_hit_mib=first_decode_hit_mib(seq, distance),
        knee_mib=knee_mib(seq, distance), budgets_mib=budgets, points=tuple(points), drop=drop,
        drop_points=tuple(drop_curve_from(trace, drop, budgets, lossy)) if drop is not None else ())


@dataclass(frozen=True)
class ReplayReport:
    """Every trace's replay, plus the choices that shape the text table."""

    traces: tuple[TraceReplay, ...]
    policies: tuple[str, ...]
    phase: str

    def to_dict(self) -> dict[str, Any]:
        """The replay as the JSON output holds it."""
        return {"format": FORMAT, "version": FORMAT_VERSION, "phase": self.phase, "policies": list(self.policies),
                "traces": [t.to_dict() for t in self.traces]}

    def to_json(self) -> str:
        """The report as `replay --json` prints it."""
        return json.dumps(self.to_dict(), indent=2)

    @property
    def text(self) -> str:
        """The report as text tables, one per trace."""
        return "\n\n".join(_trace_text(t, self.policies, self.phase) for t in self.traces)


def _trace_text(t: TraceReplay, policies: Sequence[str], phase: str) -> str:
    k = min(t.n_expert_used, t.n_expert)
    per_layer = t.cycle_bytes / MIB / max(1, t.n_moe_layers * k)
    lines = [
        f"trace   {printable(t.path)}",
        # model and arch are the trace's own text: shown with control characters escaped
        f"model   {printable(os.path.basename(t.model)) or '?'} ({printable(t.arch) or '?'}), "
        f"{t.n_moe_layers} MoE layers, {t.n_expert} experts, top-{t.n_expert_used}",
        f"T       {t.cycle_mib:.1f} MiB token cycle ({t.n_moe_layers} layers x {per_layer:.2f} MiB x top-{k}); "
        f"budgets under T marked <T",
        f"lookups {t.lookups} in {t.batches} load_layer batches "
        f"({t.lookups - t.decode_lookups} prefill in {t.batches - t.decode_batches}, "
        f"{t.decode_lookups} decode in {t.decode_batches})",
    ]
    if t.first_decode_hit_mib is not None:
        lines.append(f"LRU     first decode hit at {t.first_decode_hit_mib:.1f} MiB; below it decode hit is 0.0 %")
    if t.knee_mib is not None:
        lines.append(f"knee    {t.knee_mib} MiB: past it each MiB buys fewer hits than on average (LRU "
                     f"{'decode' if t.decode_lookups else 'all lookups'}, Kneedle)")
    if t.dropped_rows:
        lines.append(f"note    {t.dropped_rows} dropped routings replayed as reads in the table below (the lossless "
                     f"cache); --drop-cold-experts replays the lever")
    label = "decode hit%" if phase == "decode" else "hit% (all)"
    head1 = f"{'budget':>12}" + "".join(f"{p:>22}" for p in policies)
    head2 = f"{'MiB':>12}" + "".join(f"{label:>12}{'read MiB':>10}" for _ in policies)
    lines += ["", head1, head2]
    by_key = {(p.budget_mib, p.policy): p for p in t.points}
    for b in t.budgets_mib:
        row = f"{b:>9.1f}{' <T' if mib_to_bytes(b) < t.cycle_bytes else '   '}"
        for policy in policies:
            p = by_key[(b, policy)]
            hit = p.hit_pct_decode if phase == "decode" else p.hit_pct_cum
            row += f"{hit:>12.1f}{p.read_mib:>10.1f}"
        lines.append(row)
    if t.drop is not None:
        lines += ["", _drop_text(t)]
    return "\n".join(lines)


def _drop_text(t: TraceReplay) -> str:
    d = t.drop
    assert d is not None
    switches = "".join((", in prefill" if d.in_prefill else "", ", traced" if d.traced else ""))
    lines = [f"drop    --drop-cold-experts {d.frac:g}{switches}: the engine's LRU at each budget, a dropped miss "
             f"neither read nor cached", "        " + _drop_routing_text(t),
             f"{'budget':>12}{'decode hit%':>12}{'MiB/token':>11}{'lossless':>10}{'drop %':>8}  routing",
             f"{'MiB':>12}{'':>12}{'decode':>11}{'MiB/token':>10}"]
    for p in t.drop_points:
        mark = " <T" if p.under_cycle else "   "
        off = "  (cache off: the engine refuses the lever)" if p.budget_mib == 0 and d.frac > 0 else ""
        source = f"drop run at {p.routing_budget_mib:g} MiB" if p.routing_path else "this trace"
        lines.append(f"{p.budget_mib:>9.1f}{mark}{p.hit_pct_decode:>12.1f}{p.decode_read_mib_per_token:>11.2f}"
                     f"{p.lossless_decode_read_mib_per_token:>10.2f}{p.drop_pct:>8.1f}  {source}{off}")
    return "\n".join(lines)


def _drop_routing_text(t: TraceReplay) -> str:
    """Which routing the drop table replays, and so what its reads are (docs/replay.md, "Under dropping")."""
    lossy = {(p.routing_path, p.routing_budget_mib) for p in t.drop_points if p.routing_path}
    if lossy:
        where = ", ".join(f"{path} at {budget:g} MiB" for path, budget in sorted(lossy, key=lambda x: x[1]))
        return (f"(every budget from the drop run's trace taken at the lowest budget: {where}; a lossy run's "
                f"routing, so a prediction)")
    if t.dropped_rows:
        return (f"(this trace is a drop run's, {t.dropped_rows} routings dropped: exact at its run's budget, a "
                f"prediction at the others; say which with --drop-trace MIB:PATH)")
    return ("(from this lossless trace: a lower bound on the reads, as a lossy run routes after a drop as the trace "
            "did not; a drop run's trace of this F, --drop-trace MIB:PATH, predicts them: docs/replay.md)")


def _csv_number(value: float, digits: int) -> str:
    text = f"{value:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def write_curve_csv(t: TraceReplay, path: str | Path) -> None:
    """Upstream's curve format (route-replay.py --csv), written as engine.fsutil writes (`-` is stdout)."""
    path = Path(path)
    lines = [CSV_HEADER] + [
        f"{_csv_number(p.budget_mib, 1)},{p.policy},{p.hit_pct_cum:.3f},{p.hit_pct_decode:.3f},{p.read_mib:.1f}"
        for p in t.points
    ]
    write_output(path, "\n".join(lines) + "\n")


def replay_traces(paths: Iterable[str | Path], budgets_mib: Sequence[float] | None = None,
                  policies: Sequence[str] = ("lru",), phase: str = "decode",
                  csv_path: str | Path | None = None, drop: DropLever | None = None,
                  lossy_paths: Sequence[tuple[float, str | Path]] = ()) -> ReplayReport:
    """`bmoe-fleet replay`: parse each trace, replay it, optionally write the curve CSV. `lossy_paths`
    are (budget MiB, route trace) of drop runs of `drop`'s F: the drop table replays each budget from
    the one taken at the lowest budget (drop_replay.drop_curve_from)."""
    paths = [str(p) for p in paths]
    if not paths:
        raise ReplayError("no route trace given")
    if phase not in PHASES:
        raise ReplayError(f"unknown phase {phase!r} (known: {', '.join(PHASES)})")
    if csv_path is not None and len(paths) != 1:
        raise ReplayError("--csv writes upstream's one-trace curve format: pass exactly one trace (or use --json)")
    if csv_path is not None and str(csv_path) != STDOUT:
        try:
            write_target(csv_path)           # a FIFO or a device refused before the replay, not after
        except OSError as e:
            raise ReplayError(f"cannot write {csv_path}: {e.strerror or e}") from None
    policies = tuple(dict.fromkeys(policies))
    _check_options(budgets_mib, policies)
    if lossy_paths and drop is None:
        raise ReplayError("--drop-trace is a drop run's trace for --drop-cold-experts F: give F too")
    lossy = tuple(LossyTrace(read_route_trace(p), float(b)) for b, p in lossy_paths)
    traces = [read_route_trace(p) for p in paths]
    if drop is not None:
        for trace in traces:
            for one in lossy:
                check_lossy(one, drop, like=trace)
    replays = tuple(replay_trace(trace, budgets_mib, policies, drop, lossy) for trace in traces)
    if csv_path is not None:
        try:
            write_curve_csv(replays[0], csv_path)
        except OSError as e:
            raise ReplayError(f"cannot write {csv_path}: {e.strerror or e}") from None
    return ReplayReport(traces=replays, policies=policies, phase=phase)
