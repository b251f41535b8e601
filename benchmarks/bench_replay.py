"""How fast `bmoe-fleet replay` is, and what the one-pass LRU curve saves over simulating.

Replays upstream's gpt-oss-120b route trace (tests/fixtures/upstream/2026-07-15-route-trace):
stack distances on the trace repeated --repeat times (as consecutive turns, so the cache carries
over like a long session), then a --budgets-point curve on the trace itself, against the peer that
curve replaces: one direct LRU simulation per budget (which must agree with it everywhere).

    .venv/bin/python benchmarks/bench_replay.py [--repeat 100] [--budgets 1000]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np

from engine.units import MIB
from results.read.route_trace import RouteTrace, TraceRows, read_route_trace
from results.replay.lru_replay import access_sequence, lru_curve, mib_to_bytes, stack_distances
from results.replay.policy_replay import simulate

TRACE = Path(__file__).resolve().parent.parent / "tests/fixtures/upstream/2026-07-15-route-trace/gptoss.route.csv"


def repeated(trace: RouteTrace, times: int) -> RouteTrace:
    """The trace `times` over, each copy a later turn."""
    r = trace.rows
    turn_offset = np.repeat(np.arange(times) * (int(r.turn.max()) + 1), len(r))
    columns = {f.name: np.tile(getattr(r, f.name), times) for f in dataclasses.fields(TraceRows)}
    columns["turn"] = columns["turn"] + turn_offset
    return dataclasses.replace(trace, rows=TraceRows(**columns))


def best_of(n: int, fn) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(n):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=100, help="copies of the trace for the throughput runs")
    ap.add_argument("--budgets", type=int, default=1000, help="budgets in the curve and direct simulations")
    args = ap.parse_args()

    trace = read_route_trace(TRACE)
    seq = access_sequence(trace)
    print(f"trace     {TRACE.name}: {len(trace.rows):,} rows, {len(seq):,} lookups, "
          f"T = {trace.cycle_bytes / MIB:.1f} MiB")

    big = repeated(trace, args.repeat)
    t_seq, big_seq = best_of(3, lambda: access_sequence(big))
    t_sd, _ = best_of(3, lambda: stack_distances(big_seq))
    t_sim, _ = best_of(1, lambda: simulate(big_seq, "lru", mib_to_bytes(3000)))
    n = len(big_seq)
    print(f"repeated  x{args.repeat}: {len(big.rows):,} rows -> {n:,} lookups")
    print(f"  rows -> lookups           {t_seq:8.3f} s  {len(big.rows) / t_seq:12,.0f} rows/s")
    print(f"  stack distances           {t_sd:8.3f} s  {n / t_sd:12,.0f} lookups/s (every budget at once)")
    print(f"  direct LRU, one budget    {t_sim:8.3f} s  {n / t_sim:12,.0f} lookups/s")

    budgets_mib = np.linspace(0, 4000, args.budgets).tolist()
    t_curve, curve = best_of(5, lambda: lru_curve(seq, budgets_mib, trace.cycle_bytes, stack_distances(seq)))
    t0 = time.perf_counter()
    direct = [simulate(seq, "lru", mib_to_bytes(b)) for b in budgets_mib]
    t_direct = time.perf_counter() - t0
    agree = all(round(100 * hits.mean(), 9) == round(p.hit_pct_cum, 9) for hits, p in zip(direct, curve))
    print(f"curve     {args.budgets:,} budgets 0..4000 MiB on the trace itself")
    print(f"  one pass (distances+curve) {t_curve:8.4f} s")
    print(f"  {args.budgets:,} direct LRU sims    {t_direct:8.3f} s")
    print(f"  speed-up                   {t_direct / t_curve:8.0f} x   (identical hit rates at every budget: {agree})")


if __name__ == "__main__":
    main()
