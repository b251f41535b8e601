"""The adb server dies mid-campaign (docs/decisions/adb-servers.md). One bmoe-fleet started (ensure_server) is
started again, its virtual phone `adb connect`ed again and the cell retried: the campaign completes
without a rerun, and the attempt that was lost says so. A server bmoe-fleet did not start (a user's,
a lab's) is never started: it is waited for, a bounded time, and the cells are device_lost.
"""

from __future__ import annotations

import io
import os
import signal
import threading

import pytest

from devices.adb import server as adb
from devices.adb.server import AdbServer
from devices.virtual import manager
from harness.campaign.file import load_campaign
from harness.run.runner import run_to_end
from harness.run.status import campaign_status
from tests.conftest import adb_server_pids, free_port, running_adb_server, stop_adb_server
from tests.harness import faults
from tests.harness.test_hardening_faults import _engine_in_phone
from tests.harness.test_hung_phone import _ledger

pytestmark = pytest.mark.phone

PHONE = "restart"


def _campaign(folder, port, phone_home, model, retries=2):
    return faults.write_campaign(folder / "restart.toml", "restart", [f"virtual:{PHONE}"], phone_home, port, model,
                                 "[0, 1]", f"n_predict = 60\nthreads = 1\ndevice_timeout_s = 4\nretries = {retries}\n"
                                 "retry_backoff_s = 0.1")


def _kill_server_mid_run(path, out, port, phone_home):
    """Run the campaign in a thread; SIGKILL the adb server once the engine runs on the phone."""
    ended: list = []
    runner = threading.Thread(target=lambda: ended.append(run_to_end(load_campaign(path), out,
                                                                     progress_stream=io.StringIO())))
    runner.start()
    engine = _engine_in_phone(manager.info(PHONE, phone_home).mount_namespace, 120)
    assert engine is not None, "the engine never started on the phone"
    pids = adb_server_pids(port)
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    runner.join(120)
    assert not runner.is_alive()
    (end,) = ended
    return end


def test_the_tools_own_adb_server_is_restarted_and_the_campaign_completes(tmp_path, monkeypatch, tiny_model):
    port = free_port()
    env = dict(os.environ, ANDROID_ADB_SERVER_PORT=str(port), ADB_MDNS="0", ANDROID_USER_HOME=str(tmp_path))
    for key in ("ANDROID_ADB_SERVER_PORT", "ADB_MDNS", "ANDROID_USER_HOME"):
        monkeypatch.setenv(key, env[key])
    server = AdbServer("127.0.0.1", port)
    home = tmp_path / "phones"
    try:
        adb.ensure_server(server)                   # bmoe-fleet starts it: its own
        assert adb.started_here(server)
        manager.up(PHONE, 256 << 20, home=home, adb_host="127.0.0.1", adb_port=port)
        path, out = _campaign(tmp_path, port, home, tiny_model), tmp_path / "out"
        end = _kill_server_mid_run(path, out, port, home)
        assert end.exit_status == 0, end.text()      # complete, no rerun
        lines = _ledger(out)
        lost = [r for r in lines if r["outcome"] == "device_lost"]
        assert len(lost) == 1, lines
        assert f"adb server 127.0.0.1:{port} was gone; restarted it" in lost[0]["evidence"][-1], lost[0]["evidence"]
        assert "reconnected" in lost[0]["evidence"][-1]
        assert sorted(r["outcome"] for r in lines if r["outcome"] != "device_lost") == ["ok", "ok"]
        status = campaign_status(out)
        assert status.complete
        assert "restarted it" in status.text() and "restarted it" in status.to_dict()["devices"][0]["lost"]
        assert adb_server_pids(port)                 # the server is up again
    finally:
        manager.down(PHONE, home=home, adb_host="127.0.0.1", adb_port=port)
        stop_adb_server(port, env)


def test_a_users_adb_server_is_waited_for_never_started(tmp_path, tiny_model):
    home = tmp_path / "phones"
    with running_adb_server(tmp_path / "android") as (port, _env):   # the user's: bmoe-fleet did not start it
        try:
            server = AdbServer("127.0.0.1", port)
            assert not adb.started_here(server)
            manager.up(PHONE, 256 << 20, home=home, adb_host="127.0.0.1", adb_port=port)
            path, out = _campaign(tmp_path, port, home, tiny_model, retries=0), tmp_path / "out"
            end = _kill_server_mid_run(path, out, port, home)
            assert end.exit_status == 3, end.text()
            assert not adb_server_pids(port)         # never started behind the user's back
            lost = [r for r in _ledger(out) if r["outcome"] == "device_lost" and r["attempted"]]
            assert lost and "not started by bmoe-fleet: waited, never restarted" in lost[0]["evidence"][-1], lost
            status = campaign_status(out)
            assert not status.complete and "never restarted" in status.text()
        finally:
            manager.down(PHONE, home=home, adb_host="127.0.0.1", adb_port=port)
