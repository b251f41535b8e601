"""Fault injection into real campaigns: a virtual phone's daemon stopped with SIGTERM or SIGKILL,
the `bmoe-fleet run` process killed with SIGKILL or interrupted with SIGINT, each at a random
moment of the run; then the phone is brought back, the campaign rerun, and its directory checked.

Shared by the fault test (tests/harness/test_hardening_faults.py) and the fault benchmark
(benchmarks/fault_inject.py). One episode = one fault into a fresh campaign on two devices (the
phone `victim` and this host), then a rerun in this process. What the checks count:
- lost: a planned cell without a final result (an outcome that is not device_lost/push_failed)
  after the rerun;
- duplicated: a cell with more than one final result (a run measured twice);
- torn: an attempt folder without a readable run.json matching its ledger line, a ledger line
  without its folder, a `.tmp-` attempt left behind, or a ledger that does not parse.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from devices.virtual import manager
from harness.campaign.file import load_campaign
from harness.plan.grid import make_plan
from harness.run.runner import run_to_end
from store.campaign_dir import CampaignDir
from store.errors import StoreError
from store.outcomes import INFRA

PROJECT = Path(__file__).resolve().parents[2]
VICTIM = "victim"
KINDS = ("phone-sigterm", "phone-sigkill", "sweep-sigkill", "sweep-sigint")
# Ctrl-C as on a terminal even when the suite runs in the background (a shell starts background
# jobs with SIGINT ignored, and Python then installs no KeyboardInterrupt handler)
_CLI = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from harness.cli.main import main; sys.argv[0] = 'bmoe-fleet'; main()")


@dataclass
class Rig:
    adb_port: int
    phone_home: Path
    model: Path
    folder: Path
    rng: random.Random
    episodes: int = 0
    missed: Counter = field(default_factory=Counter)

    def phone_up(self) -> None:
        manager.up(VICTIM, 256 << 20, home=self.phone_home, adb_host="127.0.0.1", adb_port=self.adb_port)

    def phone_down(self) -> None:
        """Stop the phone and clear what a killed daemon leaves (its cgroup, its state file)."""
        manager.down(VICTIM, home=self.phone_home, adb_host="127.0.0.1", adb_port=self.adb_port)

    def campaign(self, name: str) -> Path:
        return write_campaign(self.folder / f"{name}.toml", name, [f"virtual:{VICTIM}", "local"], self.phone_home,
                              self.adb_port, self.model, '[0, "cycle*1.2"]',
                              "n_predict = 16\nretries = 1\nretry_backoff_s = 0.1")


def write_campaign(path: Path, name: str, devices: list[str], phone_home: Path, adb_port: int, model: Path,
                   cache_mb: str, run: str, more_axes: str = "", plan: str = "") -> Path:
    """A campaign file of one tiny model on virtual phones of one adb server: `cache_mb`, the other
    axes' lines, the [run] and [plan] lines as TOML text, the gate never waiting long."""
    path.write_text(f"""version = 1
name = "{name}"
[fleet]
devices = {json.dumps(devices)}
virtual_home = "{phone_home}"
[[fleet.adb]]
host = "127.0.0.1"
port = {adb_port}
[models]
tiny = "{model}"
[axes]
cache_mb = {cache_mb}
{more_axes}
[run]
{run}
[gate]
max_wait_s = 1
[plan]
{plan}
""")
    return path


@dataclass(frozen=True)
class Episode:
    kind: str
    fault_at_s: float           # after the campaign directory held its plan
    exit_status: int | None     # the faulted run's (None: it was SIGKILLed)
    output: str                 # its stdout and stderr
    problems: Counter           # lost / duplicated / torn, after the rerun
    rerun_status: int


def _daemon_pid(rig: Rig) -> int:
    pid = manager.info(VICTIM, rig.phone_home).pid
    assert pid, "the victim phone is down"
    return pid


def run_episode(rig: Rig, kind: str) -> Episode | None:
    """One fault of `kind` into a fresh campaign, at a random moment while it runs; None when the
    run ended before the fault could land (the caller tries again)."""
    rig.episodes += 1
    name = f"ep{rig.episodes}"
    path = rig.campaign(name)
    out = rig.folder / name
    env = dict(os.environ, PYTHONPATH=str(PROJECT))
    proc = subprocess.Popen([sys.executable, "-c", _CLI, "run", str(path), "-o", str(out)], cwd=PROJECT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    delay = rig.rng.uniform(0.0, 1.2)
    fault_at = None
    try:
        deadline = time.monotonic() + 120
        while not (out / "plan.json").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < delay:
            time.sleep(0.01)
        if proc.poll() is None:
            fault_at = time.monotonic() - t0
            if kind == "phone-sigterm":
                os.kill(_daemon_pid(rig), signal.SIGTERM)
            elif kind == "phone-sigkill":
                os.kill(_daemon_pid(rig), signal.SIGKILL)
            elif kind == "sweep-sigkill":
                proc.kill()
            else:
                proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = output.decode("utf-8", "replace")
    if kind.startswith("phone"):
        rig.phone_down()            # a SIGKILLed daemon left its cgroup: cleared here
        rig.phone_up()
    if fault_at is None:
        rig.missed[kind] += 1
        return None
    code = proc.returncode
    end = run_to_end(load_campaign(path), out, progress_stream=io.StringIO())
    return Episode(kind, fault_at, None if code == -signal.SIGKILL else code, text, check_dir(path, out),
                   end.exit_status)


def check_dir(campaign_file: Path, out: Path, planned=None) -> Counter:
    """lost, duplicated and torn in a campaign directory after a completed rerun; `planned`: the
    cells it should hold (the campaign's grid when not given)."""
    problems: Counter = Counter()
    cells = planned if planned is not None else make_plan(load_campaign(campaign_file)).cells
    cdir = CampaignDir(out)
    try:
        records = cdir.ledger.read()
    except StoreError:
        problems["torn"] += 1
        return problems
    raw_lines = [line for line in cdir.ledger.path.read_text().split("\n") if line.strip()]
    problems["torn"] += len(raw_lines) - len(records)                 # a line that is not a record
    finals = Counter(r["cell_id"] for r in records if r["outcome"] not in INFRA)
    for cell in cells:
        if finals[cell.cell_id] == 0:
            problems["lost"] += 1
        elif finals[cell.cell_id] > 1:
            problems["duplicated"] += finals[cell.cell_id] - 1
    problems["lost"] += sum(1 for cid in finals if cid not in {c.cell_id for c in cells})
    by_folder = {(r["cell_id"], int(r["attempt"])): r for r in records}
    folders = set()
    for sub in (out / "runs").glob("*/*"):
        if sub.name.startswith(".tmp-"):
            problems["torn"] += 1
            continue
        folders.add((sub.parent.name, int(sub.name)))
        try:
            run = json.loads((sub / "run.json").read_text())
            ok = run["outcome"] == by_folder[(sub.parent.name, int(sub.name))]["outcome"]
        except (OSError, ValueError, KeyError):
            ok = False
        problems["torn"] += not ok
    problems["torn"] += len(set(by_folder) - folders)                 # a ledger line whose folder is gone
    return +problems


def stop_phone_when(done, name: str, home: Path, adb_port: int, timeout_s: float = 120.0):
    """A started thread that stops virtual phone `name` as soon as `done()` holds (or after
    timeout_s): a phone lost mid-campaign, at the moment a test chooses. Join it after the run."""
    import threading

    def stop() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not done():
            time.sleep(0.02)
        manager.down(name, home=home, adb_host="127.0.0.1", adb_port=adb_port)

    thread = threading.Thread(target=stop)
    thread.start()
    return thread
