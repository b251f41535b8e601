"""Import time against the number of runs in one capture: linear, not quadratic
(tests/harness/test_import_linear.py counts it).

Two captures are grown from the real upstream fixtures, 1x to 1,000x:
- a driver log (tests/fixtures/upstream/2026-07-17/driver-lanes.log): its `==== TAG ====`
  sections repeated with fresh tags;
- a v2 capture without separators (host-v2-0.19.0/tiny_auto.err + .out) repeated back to back,
  so runs are split where one run's end-of-run block is followed by the next run's start.

For each it times `import_runs` in this process (no interpreter start-up) into a fresh campaign
folder and prints seconds per run and the ratio to the previous size's time (10 for linear
growth, 100 for quadratic). The import fsyncs two files per run, so the per-run figure includes
disk latency; this machine may be shared, so figures are for information only.

    .venv/bin/python benchmarks/bench_readers.py [--max 1000] [--kinds driver,v2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.importer import import_runs
from tests.harness.big_captures import driver_log, v2_capture

KINDS = {"driver": (driver_log, "driver-x.log"), "v2": (v2_capture, "capture.log")}


def time_import(kind: str, n: int, scratch: Path) -> tuple[float, int]:
    make, name = KINDS[kind]
    source = scratch / f"{kind}-{n}"
    source.mkdir()
    (source / name).write_bytes(make(n))
    start = time.perf_counter()
    report = import_runs([source], scratch / f"out-{kind}-{n}")
    return time.perf_counter() - start, report.added


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int, default=1000, help="largest multiple (1, 10, 100, ... up to this)")
    ap.add_argument("--kinds", default="driver,v2")
    args = ap.parse_args()
    sizes = [1]
    while sizes[-1] * 10 <= args.max:
        sizes.append(sizes[-1] * 10)
    with tempfile.TemporaryDirectory(prefix="bench-readers-") as folder:
        for kind in args.kinds.split(","):
            print(f"{kind}: runs  seconds  s/run   x previous size's time")
            previous = None
            for n in sizes:
                seconds, imported = time_import(kind, n, Path(folder))
                assert imported == n, (kind, n, imported)
                ratio = f"{seconds / previous:6.1f}" if previous else "     -"
                print(f"  {n:>9}  {seconds:7.2f}  {seconds / n:.4f}  {ratio}", flush=True)
                previous = seconds


if __name__ == "__main__":
    main()
