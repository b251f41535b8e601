"""A phone that hangs mid-cell (docs/decisions/lost-devices.md): its adb daemon frozen with SIGSTOP, as a USB stall
or a wedged adbd leaves a real phone (the server still lists it, its TCP link stays up, nothing
answers). The transport watch makes the cell `device_lost` within run.device_timeout_s, not a
`timeout` (run.timeout_s is longer) and not a wait for the thaw; the other phone finishes; SIGINT
during the freeze ends the sweep within 5 s with exit 130; after SIGCONT a rerun completes the
plan with nothing lost or duplicated. (run.retries is high so that the sweep is still retrying
the frozen phone, each attempt hung for the watch's time, when SIGINT comes.)
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from devices.virtual import manager
from harness.campaign.file import load_campaign
from harness.run.runner import run_to_end
from tests.harness import faults
from tests.harness.test_hardening_faults import _engine_in_phone

DEVICE_TIMEOUT_S = 5


def _ledger(out: Path) -> list[dict]:
    """The ledger's lines so far, each with its run.json's device and evidence."""
    path = out / "ledger.jsonl"
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
            run = json.loads((out / rec["run_dir"] / "run.json").read_text())
        except (ValueError, OSError):
            continue            # a line being appended
        lines.append({**rec, "device": run["device"], "evidence": run["evidence"], "timed_out": run["timed_out"]})
    return lines


def _wait(predicate, limit_s: float, proc: subprocess.Popen) -> float | None:
    """Seconds until predicate() held (None: it never did, or the sweep ended first)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if predicate():
            return time.monotonic() - t0
        if proc.poll() is not None:
            return None
        time.sleep(0.1)
    return None


def test_a_frozen_phone_is_device_lost_in_bounded_time_and_ctrl_c_ends_the_sweep(phones, adb_port, phone_home,
                                                                                 tiny_model, tmp_path):
    victim, other = "tight", "roomy"
    path = faults.write_campaign(tmp_path / "hung.toml", "hung", [f"virtual:{victim}", f"virtual:{other}"],
                                 phone_home, adb_port, tiny_model, "[0, 1]",
                                 f"n_predict = 150\nthreads = 1\ntimeout_s = 20\n"
                                 f"device_timeout_s = {DEVICE_TIMEOUT_S}\nretries = 20\nretry_backoff_s = 0.1")
    out = tmp_path / "hung"
    env = dict(os.environ, PYTHONPATH=str(faults.PROJECT))
    proc = subprocess.Popen([sys.executable, "-c", faults._CLI, "run", str(path), "-o", str(out)], cwd=faults.PROJECT,
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    daemon = manager.info(victim, phone_home).pid
    frozen = False
    try:
        engine = _engine_in_phone(manager.info(victim, phone_home).mount_namespace, 120)
        assert engine is not None, "the engine never started on the frozen phone"
        os.kill(daemon, signal.SIGSTOP)
        frozen = True
        lost_after = _wait(lambda: any(r["outcome"] == "device_lost" and r["device"] == f"virtual:{victim}"
                                       for r in _ledger(out)), 60, proc)
        assert lost_after is not None, "the frozen phone's cell was never device_lost"
        # the watch's stated time, plus its beat and the commit, with room for a loaded machine
        assert lost_after < DEVICE_TIMEOUT_S + 8, lost_after
        lost = next(r for r in _ledger(out) if r["outcome"] == "device_lost")
        assert "no answer from the adb transport" in lost["evidence"][0], lost["evidence"]
        assert not lost["timed_out"]
        # the other phone goes on and finishes its cells while the victim stays frozen
        done = _wait(lambda: sum(r["outcome"] == "ok" and r["device"] == f"virtual:{other}"
                                 for r in _ledger(out)) == 2, 120, proc)
        assert done is not None, ("the other phone did not finish", [(r["device"], r["outcome"], r["evidence"])
                                                                     for r in _ledger(out)], proc.poll(),
                                  proc.communicate()[0][-1500:] if proc.poll() is not None else "")
        # every retry of the victim's cell hangs on the frozen phone and is device_lost in its turn
        assert proc.poll() is None
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
        ended_s = time.monotonic() - t0
        text = output.decode("utf-8", "replace")
        assert ended_s < 5, (ended_s, text[-800:])
        assert proc.returncode == 130, text[-800:]
        assert "interrupted" in text and "Traceback" not in text, text[-800:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if frozen:
            os.kill(daemon, signal.SIGCONT)
    # no cell of the victim was recorded a timeout (a result, never retried), all of it reruns
    assert not [r for r in _ledger(out) if r["outcome"] == "timeout"]
    end = run_to_end(load_campaign(path), out, progress_stream=io.StringIO())
    assert end.exit_status == 0
    assert faults.check_dir(path, out) == Counter()
