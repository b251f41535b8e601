"""The replay under `--drop-cold-experts` against real runs: predicted flash MiB/token per budget.

Writes a synthetic qwen3moe (F32 weights, a skewed router: engine.gguf.synth, as the drop
differential's model, so bmoe-cli and bmoe-py route alike), records one lossless route trace, then
runs the engine (bmoe-cli from $BMOE_CLI at -t 1 if set, else bmoe-py) with `--drop-cold-experts F`
at budgets above the token cycle, untraced as a sweep runs them, and prints per budget: the
measured decode flash MiB/token (the CSV's read_bytes), the replay of the lossless trace
(results.replay.drop_replay) at that budget, the error, and the drop % both ways. The replay counts
entry bytes; O_DIRECT reads whole 4 KiB windows, so the replay is scaled by one alignment factor,
the lossless run's measured reads over its own replay (exact without drops: docs/replay.md).

It also runs each cell again with `--route-trace` and replays that run's own trace at its own
budget ("own trace"): that replay sees the run's real routing, so what is left there is the
replay's own error, and the difference to the first column is what the lossless trace's routing
costs (a drop changes the hidden state, and later tokens route differently).

    BMOE_CLI=… .venv/bin/python benchmarks/bench_replay_drop.py [--tokens 48] [--fracs 0.75,0.5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.gguf.model import load_model_shape
from engine.gguf.synth import synth_options, write_model
from engine.units import MIB
from results.read.parse import read_metrics_csv
from results.read.route_trace import read_route_trace
from results.replay.drop_replay import DropLever, drop_curve

PROMPT = ("The harbour master counted the boats that came back before the storm, wrote each name in the "
          "ledger and asked the keeper to light the lamp early")
TOLERANCE_PCT = 5.0


def engine_argv() -> tuple[str, list[str]]:
    cli = os.environ.get("BMOE_CLI")
    if cli:
        return "bmoe-cli", [cli, "-t", "1"]
    return "bmoe-py", [sys.executable, "-m", "engine", "-t", "1"]


SAMPLING: list[str] = []   # --temp/--seed/--top-p of every run (main sets them)


def run(argv: list[str], model: Path, out: Path, budget: int, tokens: int, top_k: int, *extra: str,
        trace: Path | None = None) -> tuple[float, float]:
    """One run: (decode flash MiB/token, drop %)."""
    csv = out.with_suffix(".csv")
    cmd = [*argv, "-m", str(model), "-p", PROMPT, "-n", str(tokens), "--n-expert-used", str(top_k),
           "--moe-stream", "--force-cache", "--cache-mb", str(budget), "--csv", str(csv), *SAMPLING, *extra]
    if trace is not None:
        cmd += ["--route-trace", str(trace)]
    r = subprocess.run(cmd, capture_output=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"engine failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr.decode()[-2000:]}")
    metrics = read_metrics_csv(csv)
    rows = metrics.rows
    mib_per_tok = float(rows["read_bytes"].astype(float).mean()) / MIB
    s = metrics.summary
    routed, dropped = float(s.get("experts_routed", 0) or 0), float(s.get("experts_dropped", 0) or 0)
    return mib_per_tok, 100.0 * dropped / routed if routed else 0.0


@dataclass
class Cell:
    """One (F, budget), summed over the sampler seeds."""

    measured: float = 0.0
    replayed: float = 0.0
    lossless: float = 0.0
    drop_measured: float = 0.0
    drop_replayed: float = 0.0
    own_measured: float = 0.0
    own_replayed: float = 0.0
    own_lossless: float = 0.0
    errors: list[float] = field(default_factory=list)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=192, help="tokens generated per run")
    ap.add_argument("--fracs", default="0.75,0.5", help="drop thresholds F, comma separated")
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--experts", type=int, default=64, help="experts per layer")
    ap.add_argument("--seed", type=int, default=1, help="the synthetic model's seed")
    ap.add_argument("--skew", type=float, default=3.0, help="the synthetic router's skew")
    ap.add_argument("--temp", type=float, default=1.0, help="sampling temperature (0: greedy)")
    ap.add_argument("--sample-seeds", default="7,11,13,17",
                    help="the sampler's seeds: each gives its own lossless trace and runs, and the table pools them")
    args = ap.parse_args()
    fracs = [float(f) for f in args.fracs.split(",")]
    seeds = [int(x) for x in args.sample_seeds.split(",")]
    name, argv = engine_argv()
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-replay-drop-") as tmp:
        root = Path(tmp)
        model = root / "m.gguf"
        write_model(model, synth_options("qwen3moe", layers=6, experts=args.experts, top_k=args.top_k, hidden=128,
                                         expert_ffn=256, vocab=300, quant="F32", seed=args.seed,
                                         router_skew=args.skew))
        shape = load_model_shape(model)
        cycle = shape.cycle_mib(args.top_k)
        working = shape.cycle_mib(shape.n_expert)
        budgets = sorted({int(cycle) + 1, int(cycle * 1.5) + 1, int(cycle * 2) + 1, int(cycle * 2.75) + 1})
        lossless_budget = budgets[len(budgets) // 2]
        cells = {(f, b): Cell() for f in fracs for b in budgets}
        alignments = []
        for seed in seeds:
            SAMPLING[:] = ["--temp", str(args.temp), "--seed", str(seed), "--top-p", "1.0", "--top-k", "0"]
            trace_path = root / f"s{seed}-lossless.route.csv"
            measured0, _ = run(argv, model, root / f"s{seed}-lossless", lossless_budget, args.tokens, args.top_k,
                               trace=trace_path)
            trace = read_route_trace(trace_path)
            (at0,) = drop_curve(trace, DropLever(0.0), [lossless_budget])
            alignment = measured0 / at0.decode_read_mib_per_token
            alignments.append(alignment)
            for frac in fracs:
                flags = ("--drop-cold-experts", str(frac))
                for budget, point in zip(budgets, drop_curve(trace, DropLever(frac), budgets)):
                    c = cells[(frac, budget)]
                    measured, drop_m = run(argv, model, root / f"s{seed}-f{frac}-b{budget}", budget, args.tokens,
                                           args.top_k, *flags)
                    own_trace = root / f"s{seed}-f{frac}-b{budget}.route.csv"
                    measured_t, _ = run(argv, model, root / f"s{seed}-f{frac}-b{budget}-t", budget, args.tokens,
                                        args.top_k, *flags, trace=own_trace)
                    (own,) = drop_curve(read_route_trace(own_trace), DropLever(frac, traced=True), [budget])
                    replayed = point.decode_read_mib_per_token * alignment
                    c.measured += measured
                    c.replayed += replayed
                    c.lossless += point.lossless_decode_read_mib_per_token * alignment
                    c.drop_measured += drop_m
                    c.drop_replayed += point.drop_pct
                    c.own_measured += measured_t
                    c.own_replayed += own.decode_read_mib_per_token * alignment
                    c.own_lossless += own.lossless_decode_read_mib_per_token * alignment
                    c.errors.append(100.0 * (replayed - measured) / measured)
        n = len(seeds)
        print(f"engine  {name}; model qwen3moe F32, 6 layers x {args.experts} experts, top-{args.top_k}, router skew "
              f"{args.skew}, seed {args.seed}; {args.tokens} tokens at temp {args.temp}, sampler seeds {args.sample_seeds}")
        print(f"cycle   T = {cycle:.2f} MiB; working set {working:.1f} MiB; lossless traces at {lossless_budget} MiB; "
              f"alignment factor {min(alignments):.4f}-{max(alignments):.4f}")
        print("means over the seeds; 'own' = the drop run traced, replayed at its own budget (err %) and without "
              "dropping (F=0)")
        print()
        print(f"{'F':>5} {'budget':>7} {'measured':>9} {'replayed':>9} {'err %':>7} {'per seed':>15} {'lossless':>9} "
              f"{'drop% m':>8} {'drop% r':>8} {'own err %':>10} {'own F=0':>9}")
        print(f"{'':>5} {'MiB':>7} {'MiB/tok':>9} {'MiB/tok':>9} {'':>7} {'err %':>15} {'MiB/tok':>9} {'':>8} {'':>8} "
              f"{'':>10} {'MiB/tok':>9}")
        worst = 0.0
        for (frac, budget), c in cells.items():
            err = 100.0 * (c.replayed - c.measured) / c.measured
            own_err = 100.0 * (c.own_replayed - c.own_measured) / c.own_measured
            worst = max(worst, abs(err))
            spread = f"{min(c.errors):+.1f}..{max(c.errors):+.1f}"
            print(f"{frac:>5.2f} {budget:>7d} {c.measured / n:>9.3f} {c.replayed / n:>9.3f} {err:>+7.1f} {spread:>15} "
                  f"{c.lossless / n:>9.3f} {c.drop_measured / n:>8.1f} {c.drop_replayed / n:>8.1f} {own_err:>+10.2f} "
                  f"{c.own_lossless / n:>9.3f}")
        print()
        print(f"every budget above the cycle within {TOLERANCE_PCT:g} % (mean over seeds): "
              f"{'yes' if worst <= TOLERANCE_PCT else 'no'} (worst {worst:.1f} %); {time.monotonic() - t_start:.0f} s")


if __name__ == "__main__":
    main()
