"""Benchmark `model synth`: size accuracy, peak RSS and write speed against a plain file write.

    .venv/bin/python benchmarks/bench_synth.py [--size 1GiB] [--dir /var/tmp]

For each preset it writes a model of the target size in a child process (so the child's own
peak RSS is measured by wait4), then writes the same number of bytes with plain 4 MiB writes
(the peer: what the disk and page cache allow) and prints the ratio.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.units import GIB, MIB


def _run_child(argv: list[str]) -> tuple[float, int]:
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, rusage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed")
    return time.monotonic() - started, rusage.ru_maxrss


def _plain_write(path: str, n_bytes: int) -> float:
    block = os.urandom(4 * MIB)
    started = time.monotonic()
    with open(path, "wb") as fh:
        for _ in range(n_bytes // len(block)):
            fh.write(block)
    return time.monotonic() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    bin_dir = os.path.dirname(sys.executable)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for preset in ("qwen3moe", "gpt-oss"):
            out = os.path.join(tmp, f"{preset}.gguf")
            wall_s, peak_kb = _run_child([os.path.join(bin_dir, "bmoe-fleet"), "model", "synth", out,
                                          "--preset", preset, "--size", args.size, "--quiet"])
            n_bytes = os.path.getsize(out)
            target = int(args.size[:-3]) * GIB if args.size.endswith("GiB") else None
            os.unlink(out)
            plain_s = _plain_write(os.path.join(tmp, "plain.bin"), n_bytes)
            os.unlink(os.path.join(tmp, "plain.bin"))
            err = f"{100 * (n_bytes / target - 1):+.2f} %" if target else "n/a"
            print(f"{preset:9s} {n_bytes / MIB:8.1f} MiB (vs target {err}), peak RSS {peak_kb / 1024:6.1f} MiB, "
                  f"{n_bytes / MIB / wall_s:7.1f} MiB/s; plain write {n_bytes / MIB / plain_s:7.1f} MiB/s; "
                  f"ratio {plain_s / wall_s:.2f}")


if __name__ == "__main__":
    main()
