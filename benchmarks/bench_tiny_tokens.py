"""Benchmark bmoe-py's per-token cost against bmoe-cli's on upstream's tiny model (docs/decisions/fused-decode.md).

    BMOE_CLI=…/bmoe-cli .venv/bin/python benchmarks/bench_tiny_tokens.py [--tokens 64] [--pairs 5]

The tiny model is tests/fixtures/upstream/host-v2-0.19.0/tiny-qwen3moe.gguf (qwen3moe, F32, 4
layers x 8 experts, top-2; 7 MiB): on it a token is almost all per-token overhead, no arithmetic.
Both engines run the same greedy decode at -t 1, in pairs (bmoe-py, then bmoe-cli, --pairs times,
so a drift of the machine's speed hits both); a run's s/token is the mean of its CSV's per-token
wall_ms rows (the summary's s/tok has three decimals: bmoe-cli's is ~0.0001). Both engines' wall_ms
is the same span: the decode call alone (llama_decode in upstream's Session::generate; Model.decode
in engine/app/session.py), sampling, detokenizing, /proc reads and the CSV row outside it, in each
row's loop_overhead_ms. Prints each engine's median ms/token, the min-max, the load average, and
bmoe-py / bmoe-cli (aim <= 3).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "upstream" / "host-v2-0.19.0" / "tiny-qwen3moe.gguf"


def s_per_token(argv: list[str], csv: str) -> float:
    subprocess.run(argv + ["--csv", csv], check=True, capture_output=True, cwd=ROOT)
    with open(csv) as fh:
        rows = [line.split(",") for line in fh if line[:1].isascii() and line[:1].isdigit()]
    return sum(float(r[2]) for r in rows) / len(rows) / 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=5)
    args = ap.parse_args()
    cli = os.environ.get("BMOE_CLI", "")
    if not cli:
        sys.exit("Error: BMOE_CLI is not set (the bmoe-cli binary to compare with)")
    common = ["-m", str(TINY), "-n", str(args.tokens), "-t", "1", "-p", "Once upon a time", "--temp", "0"]
    py: list[float] = []
    native: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        csv = os.path.join(tmp, "run.csv")
        for _ in range(args.pairs):
            py.append(s_per_token([sys.executable, "-m", "engine", *common], csv))
            native.append(s_per_token([cli, *common], csv))
    ratios = sorted(p / n for p, n in zip(py, native, strict=True))
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"model    {TINY.name}, {args.tokens} tokens, -t 1, {args.pairs} pairs; load average {load}")
    for name, runs in (("bmoe-py ", py), ("bmoe-cli", native)):
        print(f"{name} ms/token median {statistics.median(runs) * 1e3:.3f} "
              f"(min {min(runs) * 1e3:.3f}, max {max(runs) * 1e3:.3f})")
    print(f"ratio    bmoe-py / bmoe-cli s/token, pair by pair: median {statistics.median(ratios):.2f} "
          f"(min {ratios[0]:.2f}, max {ratios[-1]:.2f})   (aim <= 3)")


if __name__ == "__main__":
    main()
