"""The replay under `--drop-cold-experts` against real runs: predicted flash MiB/token per budget.

Writes a synthetic qwen3moe (F32 weights, a skewed router: engine.gguf.synth, as the drop
differential's model, so bmoe-cli and bmoe-py route alike) and runs the engine (bmoe-cli from
$BMOE_CLI at -t 1 if set, else bmoe-py) per sampler seed:

- one lossless run with `--route-trace` (the lossless trace);
- per F, a drop run with `--route-trace` at each probe budget (`--probe-budgets`, default the second
  and the last measured budget, about 1.5 and 2.75 times the token cycle): the lossy traces;
- per (F, budget), the drop run measured, untraced as a sweep runs it.

It prints per (F, budget) the measured decode flash MiB/token (the CSV's read_bytes) and the replay
(results.replay.drop_replay.drop_curve_from): every budget from the lossy trace taken at the
lowest probe budget, residency and drops re-simulated from its routing (the probe's residency and
dropped columns are not used); its error, the error of each lossy trace alone ("from N MiB"), of
the lossless trace, and the drop % measured and replayed. The replay counts entry bytes; O_DIRECT
reads whole 4 KiB windows, so every replay is scaled by one alignment factor, the lossless run's
measured reads over its own replay (exact without drops: docs/replay.md). The 'probe' line checks
the replay on each lossy trace at its own budget, as the probe ran (traced: it drops from its first
decode): exact, so what is left elsewhere is routing. The verdict is on the mean over the seeds;
'median err %' is the per-seed errors' median, which one run whose sampled text turned read-heavy
does not move. 64 seeds by default: with four, eight or 32, one such run decided the verdict
(docs/lab-notes/2026-12-06-drop-replay.md); '95 % interval' is a
bootstrap interval of the pooled error over the seeds, so a cell whose interval straddles the 5 %
line is undecided by this many seeds, not a miss or a pass.

    BMOE_CLI=… .venv/bin/python benchmarks/bench_replay_drop.py [--tokens 192] [--fracs 0.75,0.5]
        [--sample-seeds 1,2,…] [--probe-budgets MiB,MiB]
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

import numpy as np

from engine.gguf.model import load_model_shape
from engine.gguf.synth import synth_options, write_model
from engine.units import MIB
from results.read.parse import read_metrics_csv
from results.read.route_trace import read_route_trace
from results.replay.drop_replay import DropLever, LossyTrace, drop_curve, drop_curve_from

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

    per_seed: list[tuple[float, float]] = field(default_factory=list)   # (measured, replayed) MiB/token
    lossless: float = 0.0
    by_probe: dict[int, float] = field(default_factory=dict)
    drop_measured: float = 0.0
    drop_replayed: float = 0.0

    @property
    def measured(self) -> float:
        return sum(m for m, _ in self.per_seed)

    @property
    def lossy(self) -> float:
        return sum(r for _, r in self.per_seed)

    @property
    def errors(self) -> list[float]:
        return [pct(r, m) for m, r in self.per_seed]

    def interval(self, draws: int = 4000, level: float = 0.95) -> tuple[float, float]:
        """A bootstrap interval of the pooled error (Σ replayed / Σ measured), resampling the seeds."""
        pairs = np.array(self.per_seed)
        rng = np.random.default_rng(0)
        picks = rng.integers(0, len(pairs), size=(draws, len(pairs)))
        errs = 100.0 * (pairs[picks, 1].sum(axis=1) / pairs[picks, 0].sum(axis=1) - 1.0)
        tail = (1.0 - level) / 2 * 100
        return float(np.percentile(errs, tail)), float(np.percentile(errs, 100 - tail))


def pct(got: float, want: float) -> float:
    return 100.0 * (got - want) / want


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=192, help="tokens generated per run")
    ap.add_argument("--fracs", default="0.75,0.5", help="drop thresholds F, comma separated")
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--experts", type=int, default=64, help="experts per layer")
    ap.add_argument("--seed", type=int, default=1, help="the synthetic model's seed")
    ap.add_argument("--skew", type=float, default=3.0, help="the synthetic router's skew")
    ap.add_argument("--temp", type=float, default=1.0, help="sampling temperature (0: greedy)")
    ap.add_argument("--sample-seeds", default=",".join(str(s) for s in range(1, 65)),
                    help="the sampler's seeds: each gives its own traces and runs, and the table pools them")
    ap.add_argument("--probe-budgets", default=None,
                    help="MiB of the traced drop runs (the lossy traces), comma separated; default the second and "
                         "the last measured budget")
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
        probes = ([int(x) for x in args.probe_budgets.split(",")] if args.probe_budgets
                  else [budgets[1], budgets[-1]])
        cells = {(f, b): Cell() for f in fracs for b in budgets}
        probe_own = {(f, p): [0.0, 0.0] for f in fracs for p in probes}   # measured, replayed at its own budget
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
                lossy_traces = []
                for pb in probes:
                    probe_path = root / f"s{seed}-f{frac}-p{pb}.route.csv"
                    probe_measured, _ = run(argv, model, root / f"s{seed}-f{frac}-p{pb}", pb, args.tokens,
                                            args.top_k, *flags, trace=probe_path)
                    probe = read_route_trace(probe_path)
                    (own,) = drop_curve(probe, DropLever(frac, traced=True), [pb])
                    probe_own[(frac, pb)][0] += probe_measured
                    probe_own[(frac, pb)][1] += own.decode_read_mib_per_token * alignment
                    lossy_traces.append(LossyTrace(probe, pb))
                # the sweep's runs are untraced: replay the probes' routing as one
                lever = DropLever(frac)
                from_lossy = drop_curve_from(trace, lever, budgets, lossy_traces)
                from_lossless = drop_curve(trace, lever, budgets)
                alone = {t.budget_mib: drop_curve(t.trace, lever, budgets) for t in lossy_traces}
                for i, (budget, lossy, lossless) in enumerate(zip(budgets, from_lossy, from_lossless)):
                    c = cells[(frac, budget)]
                    measured, drop_m = run(argv, model, root / f"s{seed}-f{frac}-b{budget}", budget, args.tokens,
                                           args.top_k, *flags)
                    replayed = lossy.decode_read_mib_per_token * alignment
                    c.lossless += lossless.decode_read_mib_per_token * alignment
                    for pb, curve in alone.items():
                        c.by_probe[int(pb)] = c.by_probe.get(int(pb), 0.0) + curve[i].decode_read_mib_per_token * alignment
                    c.drop_measured += drop_m
                    c.drop_replayed += lossy.drop_pct
                    c.per_seed.append((measured, replayed))
        n = len(seeds)
        print(f"engine  {name}; model qwen3moe F32, 6 layers x {args.experts} experts, top-{args.top_k}, router skew "
              f"{args.skew}, seed {args.seed}; {args.tokens} tokens at temp {args.temp}, sampler seeds {args.sample_seeds}")
        print(f"cycle   T = {cycle:.2f} MiB; working set {working:.1f} MiB; lossless traces at {lossless_budget} MiB, "
              f"lossy traces (traced drop runs) at {', '.join(map(str, probes))} MiB; alignment factor "
              f"{min(alignments):.4f}-{max(alignments):.4f}")
        print("means over the seeds; 'replayed' = from the lossy trace of the same F taken at the lowest budget; "
              "'from N' = from the one at N MiB alone")
        print("probe   each lossy trace replayed at its own budget, traced: "
              + ", ".join(f"F {f:g} at {pb} {pct(r, m):+.2f} %" for (f, pb), (m, r) in probe_own.items()))
        print()
        probe_heads = "".join(f"{'from ' + str(pb):>8}" for pb in probes)
        probe_units = "".join(f"{'err %':>8}" for _ in probes)
        print(f"{'F':>5} {'budget':>7} {'measured':>9} {'replayed':>9} {'err %':>7} {'95 % interval':>15} {'per seed':>15} {'median':>6}{probe_heads} "
              f"{'lossless':>9} {'drop% m':>8} {'drop% r':>8}")
        print(f"{'':>5} {'MiB':>7} {'MiB/tok':>9} {'MiB/tok':>9} {'':>7} {'err %':>15} {'err %':>15} {'err %':>6}{probe_units} "
              f"{'err %':>9} {'':>8} {'':>8}")
        worst = worst_lossless = 0.0
        inside = outside = above = 0          # cells above the cycle whose interval lies within / outside the target
        worst_one = dict.fromkeys(probes, 0.0)
        for (frac, budget), c in cells.items():
            err, err_lossless = pct(c.lossy, c.measured), pct(c.lossless, c.measured)
            by_probe = {pb: pct(c.by_probe[pb], c.measured) for pb in probes}
            if budget > cycle:
                worst, worst_lossless = max(worst, abs(err)), max(worst_lossless, abs(err_lossless))
                for pb, e in by_probe.items():
                    worst_one[pb] = max(worst_one[pb], abs(e))
            spread = f"{min(c.errors):+.1f}..{max(c.errors):+.1f}"
            lo, hi = c.interval()
            if budget > cycle:
                above += 1
                inside += lo >= -TOLERANCE_PCT and hi <= TOLERANCE_PCT
                outside += hi < -TOLERANCE_PCT or lo > TOLERANCE_PCT
            median = float(np.median(c.errors))
            print(f"{frac:>5.2f} {budget:>7d} {c.measured / n:>9.3f} {c.lossy / n:>9.3f} {err:>+7.1f} {f'{lo:+.1f}..{hi:+.1f}':>15} {spread:>15} {median:>+6.1f}"
                  f"{''.join(f'{e:>+8.1f}' for e in by_probe.values())} {err_lossless:>+9.1f} "
                  f"{c.drop_measured / n:>8.1f} {c.drop_replayed / n:>8.1f}")
        print()
        alone = ", ".join(f"from {pb} MiB alone {worst_one[pb]:.1f} %" for pb in probes)
        print(f"every budget above the cycle within {TOLERANCE_PCT:g} % (mean over seeds), from the lowest lossy "
              f"trace: {'yes' if worst <= TOLERANCE_PCT else 'no'} (worst {worst:.1f} %; {alone}; from the lossless "
              f"trace {worst_lossless:.1f} %); {time.monotonic() - t_start:.0f} s")
        print(f"95 % bootstrap intervals over the {n} seeds, of the {above} cells above the cycle: {inside} lie within "
              f"±{TOLERANCE_PCT:g} %, {outside} outside it, {above - inside - outside} straddle it (more seeds or tokens decide those)")


if __name__ == "__main__":
    main()
