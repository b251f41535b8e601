"""Faults injected into real campaigns at scale: --faults of them (20 by default), the four kinds
in turn — a virtual phone's adbd stopped with SIGTERM, with SIGKILL, the `bmoe-fleet run`
process killed with SIGKILL, interrupted with SIGINT — each at a random moment of a fresh
campaign on the phone and this host; after each, the phone comes back and the campaign is rerun.

The machinery is the fault test's (tests/harness/faults.py). Per kind it prints:
- tried: faults that landed while the run was going (one that missed is tried again);
- clean: the faulted run ended as it should — a lost phone: the run went on and exited 3 (or 0
  when the phone had nothing left), SIGINT: exit 130 saying how to resume, SIGKILL: nothing to
  say; never a traceback or click's `Aborted!`;
- crashes: anything else from the faulted run, or a rerun that did not complete;
- lost / duplicated / torn after the rerun (tests/harness/faults.py says what each counts).
The target is 0 crashes, 0 lost, 0 duplicated, 0 torn.

    .venv/bin/python benchmarks/fault_inject.py [--faults 20] [--seed 14] [--adaptive-kills 0]

`--adaptive-kills N`: then N SIGKILLs into real adaptive sweeps on two virtual phones, each
campaign resumed after every kill until it completes (tests/harness/adaptive_kills.py: between
rounds, mid-round, while starting). Per kill point it prints the kills, and per campaign what its
folder held that one uninterrupted run would not have needed (replanned, dropped, open, lost,
duplicated, torn). The target is 0 of each.

Runs as root (virtual phones need memory cgroups). Timings are printed for information only; this
machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def clean(episode) -> bool:
    out = episode.output
    if "Traceback" in out or "Aborted!" in out or episode.rerun_status != 0:
        return False
    if episode.kind.startswith("phone"):
        return episode.exit_status in (0, 3)
    if episode.kind == "sweep-sigint":
        return episode.exit_status == 130 and "rerun the same command to resume" in out
    return episode.exit_status is None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", type=int, default=20, help="faults to inject (the four kinds in turn)")
    ap.add_argument("--seed", type=int, default=14, help="random seed for the moments")
    ap.add_argument("--adaptive-kills", type=int, default=0, metavar="N",
                    help="then N SIGKILLs into adaptive sweeps, each resumed to completion")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="fault-inject-"))
    os.environ["BMOE_FLEET_HOME"] = str(folder / "home")     # locks and staged engines, never ~/.bmoe-fleet

    from devices.virtual import manager
    from engine.gguf.synth import synth_options, write_model
    from tests.conftest import running_adb_server
    from tests.harness import faults

    model = folder / "tiny.gguf"
    write_model(model, synth_options("qwen3moe", layers=3, experts=8, top_k=2, hidden=64, expert_ffn=96, vocab=300,
                                     seed=7))
    per_kind: dict[str, Counter] = {k: Counter() for k in faults.KINDS}
    adaptive_bad = 0
    t0 = time.perf_counter()
    with running_adb_server(folder / "android") as (port, _env):
        rig = faults.Rig(port, folder / "phones", model, folder, random.Random(args.seed))
        rig.phone_up()
        try:
            injected = attempts = 0
            while injected < args.faults and attempts < 4 * args.faults:
                attempts += 1
                kind = faults.KINDS[injected % len(faults.KINDS)]
                episode = faults.run_episode(rig, kind)
                if episode is None:
                    continue
                injected += 1
                c = per_kind[kind]
                c["tried"] += 1
                c["clean" if clean(episode) else "crashes"] += 1
                c.update(episode.problems)
                print(f"  fault {injected:>2}: {kind:<14} at {episode.fault_at_s:4.2f} s  exit "
                      f"{'SIGKILL' if episode.exit_status is None else episode.exit_status:<7} rerun "
                      f"{episode.rerun_status}  {dict(episode.problems) or 'nothing lost, duplicated or torn'}",
                      flush=True)
        finally:
            manager.down(faults.VICTIM, home=folder / "phones", adb_host="127.0.0.1", adb_port=port)
        if args.adaptive_kills:
            adaptive_bad = _adaptive_kills(folder, port, model, random.Random(args.seed), args.adaptive_kills)
    print(f"{'fault':<15}{'tried':>6}{'clean':>7}{'crashes':>9}{'lost':>6}{'duplicated':>12}{'torn':>6}")
    total = Counter()
    for kind, c in per_kind.items():
        total.update(c)
        print(f"{kind:<15}{c['tried']:>6}{c['clean']:>7}{c['crashes']:>9}{c['lost']:>6}{c['duplicated']:>12}"
              f"{c['torn']:>6}")
    print(f"{'all':<15}{total['tried']:>6}{total['clean']:>7}{total['crashes']:>9}{total['lost']:>6}"
          f"{total['duplicated']:>12}{total['torn']:>6}   ({time.perf_counter() - t0:.0f} s, "
          f"{sum(rig.missed.values())} faults landed after their run ended and were tried again)")
    bad = total["crashes"] + total["lost"] + total["duplicated"] + total["torn"] + adaptive_bad
    if bad or total["tried"] < args.faults:
        print(f"kept for a look: {folder}")
        return 1
    shutil.rmtree(folder, ignore_errors=True)
    return 0


def _adaptive_kills(folder: Path, port: int, model: Path, rng: random.Random, kills: int) -> int:
    """Chains of SIGKILLs into adaptive sweeps (module doc); the number of problems found."""
    from tests.harness import adaptive_kills

    t0 = time.perf_counter()
    points: Counter = Counter()
    bad = 0
    print(f"{'campaign':<10}{'kills':>6}{'runs':>6}   problems")
    (folder / "adaptive").mkdir()
    adaptive_kills.phones_up(folder / "phones", port)
    try:
        for path, out, chain in adaptive_kills.chains(folder / "adaptive", folder / "phones", port, model, rng, kills):
            points.update(k.point for k in chain.kills)
            found = adaptive_kills.problems(path, out, chain, folder / "scratch")
            if chain.last_status != 0:
                found["failed"] += 1
            bad += sum(found.values())
            print(f"{out.name:<10}{len(chain.kills):>6}{chain.runs:>6}   {dict(found) or 'none'}", flush=True)
    finally:
        adaptive_kills.phones_down(folder / "phones", port)
    print(f"adaptive kills: {sum(points.values())} ({', '.join(f'{p} {n}' for p, n in points.items())}), "
          f"{bad} problems ({time.perf_counter() - t0:.0f} s)")
    return bad


if __name__ == "__main__":
    sys.exit(main())
