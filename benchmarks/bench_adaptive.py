"""One question both ways: the grid sweep and the adaptive sweep (docs/decisions/adaptive-sweep.md) on the same
virtual phones, the same model, the same engine.

The question: each phone's recommended cache ceiling. By default the demo's phones and model
(harness/demo.py: 640 MiB and 2 GiB of RAM, zram of half that where this host can make it, one core
each; the 1 GiB qwen3moe and its long prompt), 12 tokens. The grid is ten budgets from the cycle past
the small phone's RAM; the adaptive sweep gets the same axes as its fallback (`--adaptive`,
`--resolution-mb`, `--max-error-pct`). One cell per phone runs first, so the engine and model are
on each phone before either sweep. Prints, for each sweep: cells and device time spent
(`status`), each phone's recommended ceiling (the largest budget measured to hold, and the auto
`--cache-ceil-mb` shipped), and the adaptive sweep's brackets; whether each phone's adaptive
ceiling lies in the grid's bracket (within the resolution); then the prediction error table of
every measured budget (measured and predicted s/token, error %). Needs root (virtual phones).

    .venv/bin/python benchmarks/bench_adaptive.py [--dir /var/tmp/bench-adaptive] [--engine bmoe-py|native]
        [--tokens 12] [--resolution-mb 32] [--max-error-pct 25] [--storage-mbps 300] [--small]

Each phone has its own flash, as the demo's do (harness/demo.py STORAGE_MBPS, 300 MiB/s; `--storage-mbps R`
sets another rate, virtual up --storage-mbps); `--storage-mbps 0` shares this host's disk between
the phones, and one phone's reads slow the other's (docs/virtual-phones.md).

`--engine native` runs the real bmoe-cli from $BMOE_CLI (used where it is, never copied), at -t 1
(both engines run -t 1: each phone has one core of this 2-core host). `--small` is a check that the
benchmark works, in a few minutes: a 64 MiB model on phones of 72 and 256 MiB, 8 tokens. Quote
`uptime` and what else ran with any number.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devices.adb.server import adb_binary, free_server_port
from devices.virtual import manager
from engine.gguf.synth import synth_options, write_model
from engine.units import MIB
from harness import demo
from harness.campaign.options import campaign_from_options
from harness.plan.adaptive import measured_bracket
from harness.run.runner import run_campaign
from results.analysis.analyze import analyze
from results.analysis.recommend import recommend
from results.read.table import build_table

# ten budgets: under and over the cycle, then steps past the small phone's RAM
GRID_MB = ["0", "cycle*0.9", "cycle*1.2", "150", "250", "350", "450", "550", "700", "1000", "1400"]
SMALL_GRID_MB = ["0", "cycle*0.9", "cycle*1.2", "20", "25", "30", "35", "40", "50", "60"]
SMALL_PHONES = {"small": (72 * MIB, "Bench 72MB", "sm6375"), "large": (256 * MIB, "Bench 256MB", "sm8550")}


def sweep(name: str, model: Path, devices: list[str], grid: list[str], port: int, home: Path, args, adaptive: bool):
    engine = os.environ.get("BMOE_CLI", "") if args.engine == "native" else "bmoe-py"
    if not engine:
        raise SystemExit("--engine native: set BMOE_CLI to the bmoe-cli binary")
    return campaign_from_options(
        devices, [str(model)], grid, repeats=1, n_predict=args.tokens, adb=[f"127.0.0.1:{port}"], name=name,
        timeout_s=600, engine=engine, threads="1", adaptive=adaptive,
        # the grid takes neither: a campaign refuses them without an adaptive plan
        resolution_mb=args.resolution_mb if adaptive else None, max_error_pct=args.max_error_pct if adaptive else None,
        # the grid writes route traces too, so its budgets get predictions for the error table
        extra={"fleet": {"virtual_home": str(home)}, "run": {"prompt": demo.PROMPT, "route_trace": not adaptive},
               "gate": {"cpu_temp_max_c": 95.0, "max_wait_s": 10}})


def report(name: str, out: Path, wall_s: float, status) -> None:
    print(f"\n== {name}: {status.spent.cells} cells, {status.spent.device_s:.0f} s of device time "
          f"({wall_s:.0f} s wall), {status.attempts} attempts, outcomes {dict(status.outcomes)}")
    for d in status.devices:
        print(f"  {d.device}: {d.spent.text()}")
    for b in status.brackets:
        print(f"  bracket {b.text()}")
    for r in recommend([out]).all():
        ceiling = r.auto.cache_ceil_mb if r.auto is not None else None
        safe = r.auto.largest_safe_mib if r.auto is not None else None
        print(f"  {r.device} {r.model}: largest safe {safe} MiB, ships --cache-ceil-mb {ceiling}"
              + (" (--cache-mb 0)" if r.cache_off else "") + f"; {r.lmk['text']}")


def error_table(name: str, out: Path) -> None:
    print(f"\n-- prediction error, {name}")
    print(f"  {'device':<16} {'budget MiB':>10} {'runs':>5} {'measured s/tok':>15} {'predicted':>10} {'error %':>8}  note")
    for g in analyze(build_table([out])).groups:
        for p in g.points:
            if p.auto or math.isnan(p.budget_mib) or not p.ok:
                continue
            note = "under the cycle" if p.under_cycle else (p.fought or ("unfilled" if not p.filled else ""))
            err = p.prediction_error_pct
            print(f"  {g.device:<16} {p.budget_mib:>10g} {p.ok:>5} {p.s_per_token:>15.4f} "
                  f"{p.predicted_s_per_tok:>10.4f} {err:>+8.1f}  {note}" if not math.isnan(err) else
                  f"  {g.device:<16} {p.budget_mib:>10g} {p.ok:>5} {p.s_per_token:>15.4f} {'-':>10} {'-':>8}  {note}")


def _brackets(out: Path) -> dict[str, tuple[float | None, float | None]]:
    """Per device: the largest budget measured to hold and the smallest measured above it."""
    return {g.device: measured_bracket(g)[:2] for g in analyze(build_table([out])).groups}


def agreement(grid: Path, adaptive: Path, resolution_mb: int) -> None:
    """Whether each phone's adaptive ceiling lies in the grid's own bracket (its step there), within
    the adaptive resolution: the grid cannot place a ceiling finer than its budgets."""
    print("\n-- the same ceiling? (the grid's bracket: its largest budget that held, the next it measured)")
    g, a = _brackets(grid), _brackets(adaptive)
    for device in sorted(g):
        (gh, ga), (ah, _) = g[device], a.get(device, (None, None))
        lo = (gh or 0) - resolution_mb
        hi = math.inf if ga is None else ga + resolution_mb
        same = (ah is not None and gh is not None and lo <= ah <= hi) or (ah is None and gh is None)
        print(f"  {device}: grid held {gh} MiB, next measured {ga} MiB; adaptive held {ah} MiB: "
              + ("same" if same else "DIFFERENT"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/bench-adaptive"))
    ap.add_argument("--engine", choices=["bmoe-py", "native"], default="bmoe-py")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per run (default 12; --small: 8)")
    ap.add_argument("--resolution-mb", type=int, default=None, help="default 32 (--small: 4)")
    ap.add_argument("--max-error-pct", type=float, default=25.0)
    ap.add_argument("--storage-mbps", type=int, default=demo.STORAGE_MBPS,
                    help=f"each phone's own flash rate (virtual up --storage-mbps; default the demo's, "
                         f"{demo.STORAGE_MBPS}); 0: the host's disk, shared")
    ap.add_argument("--small", action="store_true", help="a quick check: a 64 MiB model, phones of 72 and 256 MiB")
    args = ap.parse_args()
    args.tokens = args.tokens or (8 if args.small else 12)
    args.resolution_mb = args.resolution_mb if args.resolution_mb is not None else (4 if args.small else 32)
    out = args.dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.small:
        model = out / "bench-mid.gguf"
        if not model.exists():
            write_model(model, synth_options("qwen3moe", size_bytes=64 * MIB, seed=1))
        phones, grid = SMALL_PHONES, SMALL_GRID_MB
    else:
        model, phones, grid = demo._model(out, print), demo.PHONES, GRID_MB
    home = out / "phones"
    port = free_server_port()
    env = dict(os.environ, ANDROID_ADB_SERVER_PORT=str(port), ADB_MDNS="0")
    print(f"engine {args.engine}, {args.tokens} tokens, -t 1, resolution {args.resolution_mb} MiB, "
          f"max error {args.max_error_pct:g} %; load {os.getloadavg()[0]:.2f}")
    results = []
    try:
        devices = [f"virtual:{n}" for n in demo._start_phones(home, port, env, print, phones, args.storage_mbps)]
        # one cell per phone first, so the engine and the model are on each phone (and their sha256
        # stamped) before either sweep: neither pays the one-time push or check in its device time
        prime = out / f"prime-{args.engine}"
        shutil.rmtree(prime, ignore_errors=True)
        run_campaign(sweep("prime", model, devices, ["0"], port, home, args, False), prime,
                     progress_stream=io.StringIO())
        for name, adaptive in (("grid", False), ("adaptive", True)):
            camp_dir = out / f"{name}-{args.engine}"
            shutil.rmtree(camp_dir, ignore_errors=True)
            t0 = time.monotonic()
            status = run_campaign(sweep(name, model, devices, grid, port, home, args, adaptive), camp_dir,
                                  progress_stream=io.StringIO())
            results.append((name, camp_dir, time.monotonic() - t0, status))
    finally:
        manager.down(all_phones=True, home=home, adb_host="127.0.0.1", adb_port=port)
        subprocess.run([adb_binary(), "-P", str(port), "kill-server"], env=env, capture_output=True, timeout=60)
    for name, camp_dir, wall_s, status in results:
        report(name, camp_dir, wall_s, status)
    (_, _, _, g), (_, _, _, a) = results
    print(f"\nadaptive / grid: cells {a.spent.cells}/{g.spent.cells} = {a.spent.cells / max(1, g.spent.cells):.2f}, "
          f"device time {a.spent.device_s:.0f}/{g.spent.device_s:.0f} s = "
          f"{a.spent.device_s / max(1e-9, g.spent.device_s):.2f}")
    agreement(results[0][1], results[1][1], args.resolution_mb)
    for name, camp_dir, _, _ in results:
        error_table(name, camp_dir)


if __name__ == "__main__":
    main()
