"""SIGKILLs into a real adaptive sweep, and what the campaign must look like after it resumes.

Shared by the kill test (tests/harness/test_adaptive_kills.py) and the fault benchmark
(benchmarks/fault_inject.py --adaptive-kills). One chain = one adaptive campaign run with
`bmoe-fleet run`, killed with SIGKILL at random points and run again after each kill, until a run
ends by itself. The kill points, drawn at random (WEIGHTS):

- `between-rounds`: the moment every cell plan.json holds has its result, while the runner decides
  the next round (harness.run.runner: the analysis, then plan.json): a kill there used to leave a
  folder no rerun accepted;
- `mid-round`: a random moment (up to `MID_ROUND_S`) after the run's first new ledger line;
- `early`: a random moment (up to `EARLY_S`) after the process started: staging, the first plan.

What the finished campaign must be (`problems`), beside check_dir's lost / duplicated / torn over
the plan it ended with:
- `replanned`: plan.json differs from what one uninterrupted run would have planned from the same
  runs: the adaptive plan decided again from its first round, round by round, on a copy of the
  folder (`uninterrupted_plan`);
- `dropped`: a cell plan.json held at some kill that the final plan.json no longer holds (it is
  append-only);
- `open`: a bracket not closed, or `status` not complete.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from harness.campaign.file import load_campaign
from harness.plan.adaptive import adaptive_plan
from harness.plan.grid import make_plan, read_plan
from harness.run.status import campaign_status
from store import outcomes
from store.campaign_dir import CampaignDir
from store.ledger import latest_by_cell
from tests.harness.faults import _CLI, PROJECT, check_dir, write_campaign

PHONES = ("killa", "killb")
CACHE_MB, MORE_AXES = '[0, "cycle*1.2", 3]', 'apps = ["none", "cached:8MiB"]'
SHAPES = (
    # every cell misses a prediction held to 0.001 %: each group measures cache 0 again (a second
    # round of route-traced cache-0 cells, decided while other groups still run) and falls back
    # to the grid
    "resolution_mb = 1\nmax_error_pct = 0.001",
    # the predictions hold: each group measures the predicted knee and largest safe budget, then
    # steps or closes its bracket
    "resolution_mb = 1\nmax_error_pct = 1000.0",
)
KILL_POINTS = ("between-rounds", "mid-round", "early")
WEIGHTS = (1, 1, 3)          # a few round boundaries; a kill while starting costs the least
MID_ROUND_S = 1.0
EARLY_S = 2.0
RUN_TIMEOUT_S = 240.0


@dataclass
class Kill:
    point: str
    at_s: float                  # after the process started
    ledger_lines: int            # when it landed
    planned: frozenset[str]      # plan.json's cells when it landed


@dataclass
class Chain:
    kills: list[Kill] = field(default_factory=list)
    missed: Counter = field(default_factory=Counter)     # a kill point the run ended before
    runs: int = 0
    last_output: str = ""
    last_status: int | None = None


def _ledger_lines(out: Path) -> int:
    path = out / "ledger.jsonl"
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    except OSError:
        return 0


def _planned(out: Path) -> frozenset[str]:
    try:
        plan = read_plan(CampaignDir(out))
    except Exception:               # plan.json mid-rename: read again at the next poll
        return frozenset()
    return frozenset(c.cell_id for c in plan.cells) if plan is not None else frozenset()


def _round_done(out: Path) -> bool:
    """Every cell plan.json holds has its result: the runner is deciding the next round."""
    planned = _planned(out)
    if not planned:
        return False
    try:
        latest = latest_by_cell(CampaignDir(out).ledger.read())
    except Exception:
        return False
    return all(outcomes.is_done(latest.get(cid)) for cid in planned)


def _armed(point: str, out: Path, started: float, lines0: int, rng: random.Random):
    """A predicate that turns true when the kill is due."""
    if point == "early":
        due = started + rng.uniform(0.0, EARLY_S)
        return lambda: time.monotonic() >= due
    if point == "mid-round":
        delay = rng.uniform(0.0, MID_ROUND_S)
        seen: list[float] = []

        def mid() -> bool:
            if not seen and _ledger_lines(out) > lines0:
                seen.append(time.monotonic())
            return bool(seen) and time.monotonic() >= seen[0] + delay
        return mid
    # between rounds: wait for this run to finish a cell first (a resumed run's plan is already done)
    return lambda: _ledger_lines(out) > lines0 and _round_done(out)


def run_chain(campaign_file: Path, out: Path, rng: random.Random, kills: int, max_runs: int | None = None) -> Chain:
    """Run the campaign, SIGKILL it at up to `kills` kill points (drawn from KILL_POINTS by WEIGHTS),
    running it again after each, then let the last run end by itself. A kill point a run ended
    before is counted in `missed`; the chain stops when a run completes the campaign or fails, so
    it may hold fewer kills than asked (the caller runs another)."""
    chain = Chain()
    env = dict(os.environ, PYTHONPATH=str(PROJECT))
    max_runs = max_runs or 3 * kills + 2
    while chain.runs < max_runs:
        chain.runs += 1
        point = rng.choices(KILL_POINTS, weights=WEIGHTS)[0] if len(chain.kills) < kills else None
        lines0 = _ledger_lines(out)
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", _CLI, "run", str(campaign_file), "-o", str(out)],
                                cwd=PROJECT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        try:
            due = _armed(point, out, started, lines0, rng) if point else None
            while proc.poll() is None and time.monotonic() - started < RUN_TIMEOUT_S:
                if due is not None and due():
                    planned, lines = _planned(out), _ledger_lines(out)
                    proc.kill()
                    chain.kills.append(Kill(point or "", time.monotonic() - started, lines, planned))
                    break
                time.sleep(0.005)
            output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        chain.last_output = output.decode("utf-8", "replace")
        chain.last_status = proc.returncode
        if proc.returncode == -signal.SIGKILL:
            continue
        if point is not None:
            chain.missed[point] += 1
        if proc.returncode != 0 or campaign_status(out).complete:
            break
    return chain


def uninterrupted_plan(campaign_file: Path, out: Path, scratch: Path) -> tuple[set[str], list[str]]:
    """The cells one uninterrupted run would have planned from these runs: on a copy of the folder
    holding, at first, only the first round's runs and plan, the adaptive plan decided round by
    round, each round seeing the runs of the cells planned so far (as the run did), until it stops
    growing. Also the cells a round wanted that no run measured (an uninterrupted run would have
    run them)."""
    campaign = load_campaign(campaign_file)
    grid = make_plan(campaign)
    copy, stash = scratch / out.name, scratch / f"{out.name}.runs"
    for p in (copy, stash):
        shutil.rmtree(p, ignore_errors=True)
    shutil.copytree(out, copy, symlinks=True)
    cdir = CampaignDir(copy)
    records = cdir.ledger.read()
    lines = [json.dumps(r) for r in records]
    (copy / "runs").rename(stash)
    latest = latest_by_cell(records)
    planned = adaptive_plan(campaign, grid, None)
    shown: set[str] = set()
    for _ in range(200):
        ids = {c.cell_id for c in planned.plan.cells}
        unmeasured = sorted(cid for cid in ids if not outcomes.is_done(latest.get(cid)))
        if unmeasured:
            return ids, unmeasured
        for cid in sorted(ids - shown):          # the runs of what is planned so far
            if (stash / cid).exists():
                shutil.copytree(stash / cid, copy / "runs" / cid)
        shown |= ids
        cdir.ledger.path.write_text("".join(line + "\n" for line, r in zip(lines, records, strict=True)
                                            if r["cell_id"] in shown))
        cdir.write_plan_doc(planned.to_doc())
        decided = adaptive_plan(campaign, grid, cdir)
        if {c.cell_id for c in decided.plan.cells} == ids:
            return ids, []
        planned = decided
    raise AssertionError("the adaptive plan kept growing")


def problems(campaign_file: Path, out: Path, chain: Chain, scratch: Path) -> Counter:
    """What is wrong with a finished chain's campaign (module doc); empty when nothing."""
    found: Counter = Counter()
    final = read_plan(CampaignDir(out))
    if final is None:
        found["lost"] += 1
        return found
    final_ids = {c.cell_id for c in final.cells}
    found.update(check_dir(campaign_file, out, planned=final.cells))
    for kill in chain.kills:
        found["dropped"] += len(kill.planned - final_ids)
    expected, unmeasured = uninterrupted_plan(campaign_file, out, scratch)
    found["replanned"] += len(expected ^ final_ids) + len(unmeasured)
    status = campaign_status(out)
    found["open"] += (not status.complete) + sum(1 for b in status.brackets if not b.closed)
    return +found


def phones_up(phone_home: Path, adb_port: int) -> None:
    """The two phones the chains run on (256 MiB each)."""
    from devices.virtual import manager

    for name in PHONES:
        manager.up(name, 256 << 20, home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)


def phones_down(phone_home: Path, adb_port: int) -> None:
    from devices.virtual import manager

    for name in PHONES:
        if manager.info(name, phone_home).running:
            manager.down(name, home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)


def chains(folder: Path, phone_home: Path, adb_port: int, model: Path, rng: random.Random, kills: int,
           max_campaigns: int = 1000):
    """Fresh campaigns on the two phones (PHONES, up), of the SHAPES in turn, each a chain of kills,
    until `kills` kills landed: per campaign (its file, its folder, its Chain)."""
    landed = 0
    for n in range(max_campaigns):
        if landed >= kills:
            return
        name = f"chain{n}"
        path = write_campaign(folder / f"{name}.toml", name, [f"virtual:{p}" for p in PHONES], phone_home, adb_port,
                              model, CACHE_MB, "n_predict = 4\nretries = 0\nretry_backoff_s = 0.1", MORE_AXES,
                              "adaptive = true\n" + SHAPES[n % len(SHAPES)])
        chain = run_chain(path, folder / name, rng, kills - landed)
        landed += len(chain.kills)
        yield path, folder / name, chain


def describe(chain: Chain) -> str:
    """The kills of a chain, one line each: for an assertion's message."""
    return "\n".join(f"{k.point} at {k.at_s:.2f} s ({k.ledger_lines} ledger lines, {len(k.planned)} planned)"
                     for k in chain.kills) + f"\nmissed: {dict(chain.missed)}; last run: {chain.last_output[-600:]}"
