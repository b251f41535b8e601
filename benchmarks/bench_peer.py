"""bmoe-py against bmoe-cli, side by side (docs/lab-notes/2026-12-01-kernels.md): same model, same flags,
alternating runs.

    BMOE_CLI=…/bmoe-cli .venv/bin/python benchmarks/bench_peer.py [--runs 3] [-n 8] [-t 2]
        [--models-dir /var/tmp/bmoe-peer] [--model qwen3moe|gpt-oss ...] [--no-startup]

Writes (once; reused while their options match) two synthetic models on a real filesystem: a
1.27 GiB qwen3moe (13 layers x 16 experts, top-4, Q8_0 experts: the kernels' reference model) and a 1 GiB
gpt-oss (12 x 16, top-4, MXFP4 experts). For each model and each budget — `--cache-mb 0` and a
budget above the token cycle (the cycle x 1.25, `--force-cache` when under 1500 MiB) — it runs
bmoe-cli and bmoe-py `--runs` times each, alternating (cli, py, cli, py, …), `--moe-stream -t T
-n N`, dropping the model's pages from the page cache before every run (fsync + fadvise
DONTNEED), and prints per engine the median decode, compute and flash-I/O s/token (the engines'
own `moe-stream:` line), CPU s/token (their `compute:` line: all threads, for a busy machine)
and prefill s, then bmoe-py / bmoe-cli for each. The target:
decode <= 1.5 and compute <= 2 on both models at both budgets.

Then (unless --no-startup) the cost of starting, CPU seconds and peak RSS (VmHWM) of 4-token
runs: upstream's tiny model (its matrices are under engine.kernels.matmul.COMPILED_MIN_WEIGHTS, so the
compiled kernels are never loaded) and a small qwen3moe whose 1024x1024 matrices take them, each
with an empty kernel cache (cold: the host's C compiler builds engine/kernels/_kernels.c), then twice
warm, and bmoe-cli's same run.

bmoe-cli at -t 2 spins when the two cores are not free: run this with nothing else running, and
quote it with what was running.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.gguf.model import load_model_shape  # noqa: E402
from engine.gguf.synth import synth_options, write_model  # noqa: E402
from engine.stream.pagecache import drop_page_cache  # noqa: E402
from engine.units import GIB, MIB  # noqa: E402
from results.read.parse_console import parse_console  # noqa: E402
from results.read.run_keys import budget_label  # noqa: E402

DEFAULT_CLI = ROOT.parent / "shared/peer/bmoe-cli-0.19.0-linux-x86_64/bmoe-cli"
TINY = ROOT / "tests/fixtures/upstream/host-v2-0.19.0/tiny-qwen3moe.gguf"
MODELS = {
    "qwen3moe": dict(preset="qwen3moe", layers=13, experts=16, top_k=4, size_bytes=int(1.27 * GIB), seed=3),
    "gpt-oss": dict(preset="gpt-oss", layers=12, experts=16, top_k=4, size_bytes=GIB, seed=3),
}


@dataclass(frozen=True)
class Run:
    decode_s: float
    compute_s: float
    io_s: float
    prefill_s: float
    cpu_s: float
    peak_rss_mib: float
    # the engine's own `compute:` line: CPU seconds (all its threads) per decode token, the
    # number to compare on a busy machine, where wall-clock compute counts other processes' turns
    cpu_s_per_token: float


def model_path(name: str, models_dir: Path) -> Path:
    spec = dict(MODELS[name])
    opts = synth_options(spec.pop("preset"), **spec)
    path = models_dir / f"peer-{name}.gguf"
    stamp = path.with_suffix(".json")
    want = json.dumps(opts.to_dict(), sort_keys=True)
    if not (path.is_file() and stamp.is_file() and stamp.read_text() == want):
        print(f"writing {path} ...", flush=True)
        write_model(path, opts)
        stamp.write_text(want)
    return path


def _hwm_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def run_engine(argv: list[str], env: dict[str, str] | None = None) -> tuple[str, float, float]:
    """(stdout, CPU seconds, peak RSS MiB) of one child process. The peak is the child's VmHWM,
    polled until it exits (wait4's ru_maxrss would count this process's pages copied by fork)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        hwm_kb = 0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            hwm_kb = max(hwm_kb, _hwm_kb(proc.pid) or 0)
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text = out.read().decode("utf-8", "replace")
        if proc.returncode != 0:
            raise SystemExit(f"{argv[0]} exited {proc.returncode}: {err.read().decode(errors='replace')[-800:]}")
    return text, usage.ru_utime + usage.ru_stime, hwm_kb / 1024


def measure(argv: list[str], model: Path, env: dict[str, str] | None = None) -> Run:
    drop_page_cache(str(model))
    text, cpu_s, rss = run_engine(argv, env)
    console = parse_console(text.splitlines())
    ms, pf, cu = console.moe_stream, console.prefill, console.compute
    if ms is None or pf is None or cu is None:
        raise SystemExit(f"{argv[0]}: no moe-stream/prefill/compute line in its output:\n{text[-800:]}")
    return Run(ms.decode_s_per_token, ms.compute_s_per_token, ms.flash_io_s_per_token, pf.prefill_s, cpu_s, rss,
               cu.cpu_s_per_token if cu.cpu_s_per_token is not None else float("nan"))


def median(runs: list[Run], field: str) -> float:
    return statistics.median(getattr(r, field) for r in runs)


def bench_model(name: str, path: Path, cli: Path, args) -> list[tuple[str, str, float, float]]:
    shape = load_model_shape(path)
    cycle_mib = shape.cycle_bytes(shape.top_k) / MIB
    above = int(cycle_mib * 1.25) + 1
    budgets = [(budget_label(0), ["--cache-mb", "0"]),
               (f"{budget_label(above)} (cycle {cycle_mib:.1f})",
                ["--cache-mb", str(above)] + (["--force-cache"] if above < 1500 else []))]
    py = [sys.executable, "-m", "engine"]
    rows = []
    print(f"\n== {name}: {path.name}, {shape.file_bytes / GIB:.2f} GiB, {shape.n_layer} layers x "
          f"{shape.n_expert} experts, top-{shape.top_k}, token cycle {cycle_mib:.1f} MiB", flush=True)
    for label, flags in budgets:
        common = ["-m", str(path), "-t", str(args.threads), "-n", str(args.tokens), "--moe-stream", *flags]
        runs: dict[str, list[Run]] = {"bmoe-cli": [], "bmoe-py": []}
        for i in range(args.runs):
            for engine, argv in (("bmoe-cli", [str(cli), *common]), ("bmoe-py", [*py, *common])):
                r = measure(argv, path)
                runs[engine].append(r)
                print(f"  {label:34} {engine:8} run {i + 1}: decode {r.decode_s:.3f} compute {r.compute_s:.3f} "
                      f"io {r.io_s:.3f} cpu {r.cpu_s_per_token:.3f} s/token, prefill {r.prefill_s:.2f} s, "
                      f"cpu {r.cpu_s:.1f} s, peak RSS {r.peak_rss_mib:.0f} MiB", flush=True)
        print(f"  {label}: medians of {args.runs}")
        print(f"    {'':9} {'decode':>8} {'compute':>8} {'flash I/O':>9} {'cpu':>8} {'prefill':>8}  (s/token; prefill s)")
        fields = ("decode_s", "compute_s", "io_s", "cpu_s_per_token", "prefill_s")
        for engine in runs:
            d, c, io, cpu, pf = (median(runs[engine], f) for f in fields)
            print(f"    {engine:9} {d:8.3f} {c:8.3f} {io:9.3f} {cpu:8.3f} {pf:8.2f}")
        ratios = {f: median(runs["bmoe-py"], f) / max(median(runs["bmoe-cli"], f), 1e-9) for f in fields}
        print(f"    {'py / cli':9} {ratios['decode_s']:8.2f} {ratios['compute_s']:8.2f} {ratios['io_s']:9.2f} "
              f"{ratios['cpu_s_per_token']:8.2f} {ratios['prefill_s']:8.2f}   (target: decode <= 1.5, compute <= 2)")
        rows.append((name, label, ratios["decode_s"], ratios["compute_s"]))
    return rows


def startup(cli: Path, models_dir: Path) -> None:
    """Cold and warm starts of 4-token runs, with and without the compiled kernels."""
    small = models_dir / "peer-startup-qwen3moe.gguf"
    if not small.is_file():
        write_model(small, synth_options("qwen3moe", layers=2, experts=4, top_k=2, hidden=1024, expert_ffn=1024,
                                         vocab=300, seed=3))
    print("\n== start-up: 4 tokens, -t 1, cache 0 (CPU s = user + sys of the process, peak = VmHWM)")
    for name, model in (("tiny (numpy path)", TINY), ("1024x1024 Q8_0 (kernels)", small)):
        common = ["-m", str(model), "-n", "4", "-t", "1", "--moe-stream", "--cache-mb", "0"]
        cache = Path(tempfile.mkdtemp(prefix="bmoe-peer-cache-"))
        env = {**os.environ, "BMOE_PY_CACHE_DIR": str(cache)}
        try:
            for label, argv, run_env in (("bmoe-py cold", [sys.executable, "-m", "engine", *common], env),
                                         ("bmoe-py warm", [sys.executable, "-m", "engine", *common], env),
                                         ("bmoe-py warm", [sys.executable, "-m", "engine", *common], env),
                                         ("bmoe-cli", [str(cli), *common], None)):
                t0 = time.perf_counter()
                _, cpu_s, rss = run_engine(argv, run_env)
                print(f"  {name:25} {label:13} wall {time.perf_counter() - t0:5.2f} s  cpu {cpu_s:5.2f} s  "
                      f"peak RSS {rss:5.0f} MiB")
        finally:
            shutil.rmtree(cache, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", type=Path, default=Path(os.environ.get("BMOE_CLI") or DEFAULT_CLI))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("-n", "--tokens", type=int, default=8)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--models-dir", type=Path, default=Path("/var/tmp/bmoe-peer"))
    ap.add_argument("--model", action="append", choices=sorted(MODELS))
    ap.add_argument("--no-startup", action="store_true")
    args = ap.parse_args()
    if not args.cli.is_file():
        raise SystemExit(f"no bmoe-cli at {args.cli} (set BMOE_CLI or --cli)")
    args.models_dir.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    print(f"bench_peer: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start; "
          f"bmoe-cli {args.cli}")
    rows = []
    for name in args.model or ("qwen3moe", "gpt-oss"):
        rows += bench_model(name, model_path(name, args.models_dir), args.cli, args)
    print("\n== summary: bmoe-py / bmoe-cli, medians")
    for name, label, decode, compute in rows:
        verdict = "ok" if decode <= 1.5 and compute <= 2.0 else "NOT MET"
        print(f"  {name:9} {label:34} decode {decode:5.2f}  compute {compute:5.2f}  {verdict}")
    if not args.no_startup:
        startup(args.cli, args.models_dir)
    load = os.getloadavg()
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end "
          f"(self: {resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime:.0f} s of children CPU)")


if __name__ == "__main__":
    main()
