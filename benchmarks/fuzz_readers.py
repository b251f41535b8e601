"""Fuzz every results reader at scale: damaged copies of the real upstream files, counted.

The mutators and readers are the fuzz tests' own (tests/results/mutants.py), driven here by a
seeded random.Random instead of hypothesis, --mutants per reader (10,000 by default): metrics CSVs
of every version, `.metrics` sidecars, console captures (one run, and split into runs), driver
logs, `.state` files, route traces, replay, and the importer on a folder holding one mutant.
Per reader it prints: tried, clean errors (the project's own error type, one terminal-safe
line), accepted (parsed, every value possible, strict JSON), crashes (anything else). Warnings
count as crashes, as they do in the test suite. The target is 0 crashes.

    .venv/bin/python benchmarks/fuzz_readers.py [--mutants 10000] [--seed 14] [--readers metrics-csv,import]

Timings are printed for information only; this machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.results.mutants import IMPORT_SEEDS, READERS, import_mutant, mutate, read_mutant  # noqa: E402

MAX_OPS = 3


def fuzz_reader(name: str, n: int, rng: random.Random, folder: Path) -> tuple[Counter, list[str]]:
    counts: Counter = Counter()
    crashes: list[str] = []
    reader = next((r for r in READERS if r.name == name), None)
    for i in range(n):
        if reader is not None:
            seed = reader.seeds[rng.randrange(len(reader.seeds))]
            mutant = mutate(seed.read_bytes(), rng.randrange, rng.randrange(MAX_OPS) + 1)
            run = lambda: read_mutant(reader, seed, mutant, folder)  # noqa: E731
        else:
            files = IMPORT_SEEDS[rng.randrange(len(IMPORT_SEEDS))]
            index = rng.randrange(len(files))
            seed = files[index]
            mutant = mutate(seed.read_bytes(), rng.randrange, rng.randrange(MAX_OPS) + 1)
            run = lambda: import_mutant(files, index, mutant)  # noqa: E731
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                outcome, _ = run()
        except Exception as e:  # noqa: BLE001 - a crash is what this counts
            outcome = "crashed"
            if len(crashes) < 5:
                path = folder / f"crash-{name}-{i}-{seed.name}"
                path.write_bytes(mutant)
                last = traceback.extract_tb(e.__traceback__)[-1]
                crashes.append(f"{type(e).__name__}: {str(e)[:200]} at {Path(last.filename).name}:{last.lineno} "
                               f"(mutant of {seed.name} kept as {path})")
        counts[outcome] += 1
    return counts, crashes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", type=int, default=10_000, help="mutants per reader")
    ap.add_argument("--seed", type=int, default=14, help="random seed (the run is repeatable)")
    names = [r.name for r in READERS] + ["import"]
    ap.add_argument("--readers", default=",".join(names), help=f"comma-separated, of {','.join(names)}")
    args = ap.parse_args()
    chosen = [r for r in args.readers.split(",") if r]
    unknown = [r for r in chosen if r not in names]
    if unknown:
        ap.error(f"unknown reader {unknown[0]!r}")
    keep = Path(tempfile.mkdtemp(prefix="fuzz-readers-"))
    os.environ["BMOE_FLEET_HOME"] = str(keep / "home")  # the importer's locks, never ~/.bmoe-fleet
    print(f"{'reader':<14}{'tried':>8}{'clean errors':>14}{'accepted':>10}{'crashes':>9}{'s':>8}")
    total_crashes = 0
    for name in chosen:
        rng = random.Random(f"{args.seed}:{name}")
        t0 = time.perf_counter()
        counts, crashes = fuzz_reader(name, args.mutants, rng, keep)
        total_crashes += counts["crashed"]
        print(f"{name:<14}{sum(counts.values()):>8}{counts['refused']:>14}{counts['accepted']:>10}"
              f"{counts['crashed']:>9}{time.perf_counter() - t0:>8.1f}", flush=True)
        for line in crashes:
            print(f"    {line}")
    if total_crashes:
        print(f"crashes: {total_crashes} (the first crashing mutants of each reader are kept in {keep})")
        return 1
    shutil.rmtree(keep)
    print("crashes: 0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
