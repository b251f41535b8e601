"""Fuzz every reader at scale: damaged copies of real inputs, counted.

The mutators and readers are the fuzz tests' own, driven here by a seeded random.Random instead
of hypothesis, --mutants per reader (10,000 by default): from tests/results/mutants.py the metrics
CSVs of every version, `.metrics` sidecars, console captures (one run, and split into runs; the
newer releases' lines among them), driver logs, `.state` files, route traces, replay, session
captures and their gap logs, and the importer on a folder holding one mutant (numbers spelled in
other digits, bools and parts over their wholes among the mutations); campaign files and their
plans, app sizes among them (tests/harness/campaign_mutants.py); GGUF headers through
`model inspect` (tests/engine/gguf_mutants.py); and the virtual adbd over a real socket, sync
requests and transport messages (tests/devices/sync_mutants.py; a phone is started for them).
Per reader it prints: tried, clean errors (the project's own error type, one terminal-safe
line; for the adbd: FAIL or closed), accepted (parsed, every value possible, strict JSON; for
the adbd: served), crashes (anything else; for the adbd: dead, hung, or no answer to a fresh
STAT). Warnings count as crashes, as they do in the test suite. The target is 0 crashes. For
the adbd, `service exc` counts the tracebacks its log gained: a service that raised, which
adbd.py contains by closing that stream (so "closed", not a crash).

    .venv/bin/python benchmarks/fuzz_readers.py [--mutants 10000] [--seed 14] [--readers metrics-csv,import]

Timings are printed for information only; this machine may be shared.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
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

from engine.units import MIB
from tests.results.mutants import IMPORT_SEEDS, READERS, import_mutant, mutate, read_mutant

MAX_OPS = 3
MORE = ("campaign-toml", "gguf-header", "adb-sync", "adb-wire")   # readers outside results/


class Inputs:
    """What the readers outside results/ need, made once: a model, seeds, a virtual phone."""

    def __init__(self, folder: Path, stack: contextlib.ExitStack, chosen: list[str]):
        from tests.engine import gguf_mutants
        from tests.harness import campaign_mutants

        self.folder = folder
        self.model = folder / "tiny.gguf"
        self.gguf_seeds = gguf_mutants.make_seeds(folder) if "gguf-header" in chosen else []
        self.campaign_seeds = campaign_mutants.seed_texts(self._model()) if "campaign-toml" in chosen else []
        self.port = self.log = None
        if {"adb-sync", "adb-wire"} & set(chosen):
            self.port, self.log = stack.enter_context(_phone(folder))

    def _model(self) -> Path:
        from engine.gguf.synth import synth_options, write_model

        if not self.model.exists():
            write_model(self.model, synth_options("qwen3moe", layers=3, experts=8, top_k=2, hidden=64, expert_ffn=96,
                                                  vocab=300, seed=7))
        return self.model

    def mutant(self, name: str, rng: random.Random):
        """(what to run, the mutant's bytes, the seed's name) for one reader outside results/."""
        from tests.devices import sync_mutants
        from tests.engine import gguf_mutants
        from tests.harness import campaign_mutants

        pick, n_ops = rng.randrange, rng.randrange(MAX_OPS) + 1
        if name == "campaign-toml":
            i = rng.randrange(len(self.campaign_seeds))
            data = campaign_mutants.mutate(self.campaign_seeds[i], pick, n_ops)
            return lambda: campaign_mutants.load_mutant(data, self.folder), data, f"campaign-{i}.toml"
        if name == "gguf-header":
            seed = self.gguf_seeds[rng.randrange(len(self.gguf_seeds))]
            header, size = gguf_mutants.mutate(seed, pick, n_ops)
            return lambda: gguf_mutants.inspect_mutant(header, size, self.folder), header, seed.name
        kind = "wire" if name == "adb-wire" else "sync"
        i = rng.randrange(len(sync_mutants.SEEDS))
        seed = sync_mutants.SEEDS[i] if kind == "sync" else sync_mutants.wire_seed(sync_mutants.SEEDS[i])
        data = sync_mutants.mutate(seed, pick, n_ops, kind)
        return lambda: sync_mutants.run_mutant(self.port, kind, data, pick), data, f"{kind}-{i}"


@contextlib.contextmanager
def _phone(folder: Path):
    """A virtual phone on a private adb server (both stopped afterwards): (its daemon's port, log)."""
    from devices.virtual import manager
    from tests.conftest import running_adb_server
    from tests.devices import sync_mutants

    # a daemon on an idle machine answers in milliseconds; the waits only sort refused from served
    sync_mutants.STALL_S = sync_mutants.QUIET_S = 0.05
    home = folder / "phones"
    with running_adb_server(folder / "android") as (port, _env):
        manager.up("fuzz", 128 * MIB, home=home, adb_host="127.0.0.1", adb_port=port)
        try:
            info = manager.info("fuzz", home)
            yield info.port, info.root / ".vphone" / "daemon.log"
        finally:
            manager.down("fuzz", home=home, adb_host="127.0.0.1", adb_port=port)


def fuzz_reader(name: str, n: int, rng: random.Random, folder: Path,
                inputs: Inputs | None = None) -> tuple[Counter, list[str]]:
    counts: Counter = Counter()
    crashes: list[str] = []
    reader = next((r for r in READERS if r.name == name), None)
    for i in range(n):
        if name in MORE:
            run, mutant, seed_name = inputs.mutant(name, rng)
            seed = Path(seed_name)
            run = (lambda r: lambda: (r(), None))(run)
        elif reader is not None:
            seed = reader.seeds[rng.randrange(len(reader.seeds))]
            mutant = mutate(seed.read_bytes(), rng.randrange, rng.randrange(MAX_OPS) + 1)
            run = functools.partial(read_mutant, reader, seed, mutant, folder)
        else:
            files = IMPORT_SEEDS[rng.randrange(len(IMPORT_SEEDS))]
            index = rng.randrange(len(files))
            seed = files[index]
            mutant = mutate(seed.read_bytes(), rng.randrange, rng.randrange(MAX_OPS) + 1)
            run = functools.partial(import_mutant, files, index, mutant)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                outcome, _ = run()
        except Exception as e:
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
    names = [r.name for r in READERS] + ["import", *MORE]
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
    with contextlib.ExitStack() as stack:
        inputs = Inputs(keep, stack, chosen) if set(MORE) & set(chosen) else None
        for name in chosen:
            rng = random.Random(f"{args.seed}:{name}")
            t0 = time.perf_counter()
            raised_before = len(_service_exceptions(inputs)) if name.startswith("adb-") else 0
            counts, crashes = fuzz_reader(name, args.mutants, rng, keep, inputs)
            total_crashes += counts["crashed"]
            extra = ""
            if name.startswith("adb-"):
                raised = _service_exceptions(inputs)[raised_before:]
                kinds = Counter(raised).most_common(3)
                extra = f"  service exc {len(raised)}" + (f" ({'; '.join(f'{k} x{v}' for k, v in kinds)})"
                                                        if kinds else "")
            print(f"{name:<14}{sum(counts.values()):>8}{counts['refused']:>14}{counts['accepted']:>10}"
                  f"{counts['crashed']:>9}{time.perf_counter() - t0:>8.1f}{extra}", flush=True)
            for line in crashes:
                print(f"    {line}")
    if total_crashes:
        print(f"crashes: {total_crashes} (the first crashing mutants of each reader are kept in {keep})")
        return 1
    shutil.rmtree(keep)
    print("crashes: 0")
    return 0


def _service_exceptions(inputs: Inputs) -> list[str]:
    from tests.devices.sync_mutants import service_exceptions

    return service_exceptions(inputs.log)


if __name__ == "__main__":
    sys.exit(main())
