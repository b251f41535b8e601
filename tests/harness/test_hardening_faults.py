"""Faults injected into real campaigns (docs/decisions/lost-devices.md): a phone's adbd stopped with SIGTERM and with
SIGKILL, the `bmoe-fleet run` process killed with SIGKILL and interrupted with SIGINT, twice at a
random moment (the sweep's SIGKILL once: tests/harness/test_adaptive_kills.py kills sweeps 20 times). After every rerun each planned cell has exactly one final result, no
attempt folder is torn and the ledger parses; the faulted run itself never aborts on a lost phone
(exit 3, its cells device_lost) and ends an interrupt as one (exit 130, no click `Aborted!`).

The machinery (tests/harness/faults.py) is the fault benchmark's too (benchmarks/fault_inject.py).
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import threading
import time
from collections import Counter

import psutil
from click.testing import CliRunner

from devices.virtual import manager
from harness.campaign.file import load_campaign
from tests.harness import faults

# each kind of fault at two random moments (3 took 49 s of the suite; an episode 19 s on a loaded
# CI host); once the sweep's SIGKILL (tests/harness/test_adaptive_kills.py kills a sweep 20 times)
# and the phone's SIGTERM (test_an_adbd_stopped_with_sigterm_mid_run… below stops it mid-decode)
EPISODES = {"phone-sigterm": 1, "phone-sigkill": 2, "sweep-sigkill": 1, "sweep-sigint": 2}


def test_faults_at_random_moments_lose_duplicate_and_tear_nothing(adb_port, phone_home, tiny_model, tmp_path):
    rig = faults.Rig(adb_port, phone_home, tiny_model, tmp_path, random.Random(14))
    rig.phone_up()
    try:
        done: Counter = Counter()
        for _ in range(30):                   # bounded: a fault that lands after the run ended is tried again
            kind = next((k for k in faults.KINDS if done[k] < EPISODES[k]), None)
            if kind is None:
                break
            episode = faults.run_episode(rig, kind)
            if episode is None:
                continue
            done[kind] += 1
            where = f"{kind} at {episode.fault_at_s:.2f} s: {episode.output[-800:]}"
            assert episode.problems == Counter(), where
            assert episode.rerun_status == 0, where
            assert "Traceback" not in episode.output and "Aborted!" not in episode.output, where
            if kind.startswith("phone"):
                # the sweep went on without the phone: the other device finished, the phone's cells wait
                assert episode.exit_status in (0, 3), where
                if episode.exit_status == 3:
                    assert "incomplete:" in episode.output and "rerun the same command to resume" in episode.output
            elif kind == "sweep-sigint":
                assert episode.exit_status == 130, where
                assert "interrupted" in episode.output and "rerun the same command to resume" in episode.output
        assert done == {k: EPISODES[k] for k in faults.KINDS}, (done, rig.missed)
    finally:
        manager.down(faults.VICTIM, home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)


def _engine_in_phone(ns: str, deadline_s: float) -> int | None:
    """The pid of a bmoe-py running inside the phone's mount namespace `ns`, once one starts (the
    phone's daemon stays in the host's namespace; its commands run in the phone's)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for p in psutil.process_iter(["name", "pid"]):
            if p.info["name"] == "bmoe-py":
                try:
                    if os.readlink(f"/proc/{p.info['pid']}/ns/mnt") == ns:
                        return p.info["pid"]
                except OSError:
                    pass
        time.sleep(0.05)
    return None


def test_an_adbd_stopped_with_sigterm_mid_run_is_device_lost_not_an_abort(adb_port, phone_home, tiny_model,
                                                                            tmp_path, cli):
    """adbutils' EOFError ("Expected 5 bytes, got 0") from a phone whose adbd
    got SIGTERM while the engine ran stopped the whole sweep (`stopped by an error`, click's
    `Aborted!`, exit 1). Now: device_lost, retried, the phone's later cells recorded as such, the
    other device's cells run, a summary and exit 3; back up, a rerun completes the plan."""
    rig = faults.Rig(adb_port, phone_home, tiny_model, tmp_path, random.Random(1))
    rig.phone_up()
    try:
        path = rig.campaign("term")
        text = path.read_text().replace("n_predict = 16", "n_predict = 200")    # the engine is mid-run
        path.write_text(text)
        out = tmp_path / "term"
        result: list = []
        worker = threading.Thread(target=lambda: result.append(
            CliRunner().invoke(cli, ["run", str(path), "-o", str(out)], catch_exceptions=False)))
        worker.start()
        engine = _engine_in_phone(manager.info(faults.VICTIM, phone_home).mount_namespace, 120)
        assert engine is not None, "the engine never started on the phone"
        os.kill(manager.info(faults.VICTIM, phone_home).pid, signal.SIGTERM)     # no `adb disconnect` first
        worker.join(300)
        assert not worker.is_alive()
        (invoked,) = result
        assert invoked.exit_code == 3, invoked.output
        assert "Aborted!" not in invoked.output and "stopped by an error" not in invoked.output
        assert "incomplete: 2 cells pending (device_lost 2); rerun the same command to resume" in invoked.output
        recs = sorted((json.loads(p.read_text()) for p in out.glob("runs/*/*/run.json")),
                      key=lambda r: r["started_at"])
        phone = [(r["outcome"], r["attempted"]) for r in recs if r["device"] == f"virtual:{faults.VICTIM}"]
        assert phone == [("device_lost", True)] * 2 + [("device_lost", False)]       # retried once, then the rest
        assert [r["outcome"] for r in recs if r["device"] == "local"] == ["ok", "ok"]
        assert "device lost" in next(r for r in recs if r["outcome"] == "device_lost")["evidence"][0]
    finally:
        rig.phone_down()
    rig.phone_up()
    try:
        again = CliRunner().invoke(cli, ["run", str(path), "-o", str(out)], catch_exceptions=False)
        assert again.exit_code == 0 and "complete: every planned cell has a result" in again.output
        assert faults.check_dir(path, out) == Counter()
        assert load_campaign(path).name == "term"
    finally:
        rig.phone_down()


def test_the_summary_says_complete_incomplete_or_interrupted(tmp_path):
    """The exit statuses of `run` and `sweep` (README "Exit statuses")."""
    from harness.run.status import CampaignStatus, DeviceStatus, RunEnd

    def status(pending: int, outcomes: dict) -> CampaignStatus:
        return CampaignStatus(str(tmp_path), "c", 4, 4 - pending, pending, 4, outcomes,
                              (DeviceStatus("local", 4, 4 - pending, pending, 4, outcomes),), None, None)

    done = RunEnd(str(tmp_path), status(0, {"ok": 4}))
    assert done.exit_status == 0 and done.text().endswith("complete: every planned cell has a result")
    lost = RunEnd(str(tmp_path), status(2, {"ok": 2, "device_lost": 2}))
    assert lost.exit_status == 3 and "incomplete: 2 cells pending (device_lost 2)" in lost.text()
    stopped = RunEnd(str(tmp_path), status(3, {"ok": 1}), interrupted=True)
    assert stopped.exit_status == 130 and "interrupted (3 cells pending): rerun the same command" in stopped.text()
    assert json.loads(stopped.to_json())["exit_status"] == 130
    early = RunEnd(str(tmp_path), None, interrupted=True)
    assert early.exit_status == 130 and json.loads(early.to_json())["dir"] == str(tmp_path)
    assert io.StringIO(early.text()).read().startswith("interrupted: rerun the same command to resume")
