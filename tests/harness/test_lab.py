"""A lab whose phones hang off several adb servers, one controller driving them all
(docs/lab.md). A second real adb server on another port of 127.0.0.1 stands for another host: it has
its own virtual phone, and one campaign (`[[fleet.adb]]` listing both servers, devices named by
their serials as a lab names USB phones) runs over the phones of both. That server is stopped
mid-campaign: only its phone's cells end `device_lost` while the other phone finishes; with the
server back (and its phone attached to it again, as a USB phone re-enumerates) a rerun runs
exactly the missing cells, on the phone they belong to."""

from __future__ import annotations

import io
import json
import os
import subprocess
import threading
import time
from pathlib import Path

from devices.adb.server import AdbServer, adb_binary, connect
from devices.virtual import manager
from harness.campaign.file import parse_campaign
from harness.run.runner import run_campaign
from tests.conftest import free_port, stop_adb_server

CELLS = [0, "auto", "cycle*1.2", "cycle*4"]


def adb_server_env(home: Path) -> dict:
    return dict(os.environ, ADB_MDNS="0", ANDROID_USER_HOME=str(home))


def start_server(port: int, home: Path) -> None:
    """`adb -P PORT start-server`, as on the lab's other host (`adb -a -P PORT server` there)."""
    started = subprocess.run([adb_binary(), "-P", str(port), "start-server"], env=adb_server_env(home),
                             capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert started.returncode == 0, started.stderr


def stop_server(port: int, home: Path) -> None:
    stop_adb_server(port, adb_server_env(home))


def test_one_campaign_over_two_adb_servers_survives_one_going_away(tmp_path, adb_port, phone_home, tiny_model):
    port_b, home_b = free_port(), tmp_path / "host-b"
    home_b.mkdir()
    start_server(port_b, home_b)
    try:
        serial_a = manager.up("laba", 256 << 20, home=phone_home, adb_host="127.0.0.1", adb_port=adb_port,
                              model="Pixel 8")
        serial_b = manager.up("labb", 256 << 20, home=phone_home, adb_host="127.0.0.1", adb_port=port_b,
                              model="Galaxy S24")
        server_a, server_b = AdbServer("127.0.0.1", adb_port), AdbServer("127.0.0.1", port_b)
        # each phone is attached to its own server only, as USB phones are to their host's
        assert {d.serial for d in server_a.client().list()} >= {serial_a}
        assert serial_a not in {d.serial for d in server_b.client().list()}
        assert serial_b not in {d.serial for d in server_a.client().list()}
        c = parse_campaign({
            "version": 1, "name": "lab",
            "fleet": {"devices": [serial_a, serial_b],
                      "adb": [{"host": "127.0.0.1", "port": adb_port}, {"host": "127.0.0.1", "port": port_b}]},
            "models": {"tiny": str(tiny_model)}, "axes": {"cache_mb": CELLS},
            "run": {"n_predict": 48, "threads": 1, "retries": 1, "retry_backoff_s": 0.1, "device_timeout_s": 5},
            "gate": {"max_wait_s": 2}}, source="lab.toml")
        out = tmp_path / "out"

        def ledger() -> list[dict]:
            path = out / "ledger.jsonl"
            return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

        def device_of(entry: dict) -> str:
            return json.loads((out / entry["run_dir"] / "run.json").read_text())["device"]

        def stop_b_after_its_first_run() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not any(device_of(e) == serial_b for e in ledger()):
                time.sleep(0.02)
            stop_server(port_b, home_b)

        killer = threading.Thread(target=stop_b_after_its_first_run)
        killer.start()
        first = run_campaign(c, out, progress_stream=io.StringIO())
        killer.join(120)
        by_device = {d.device: d for d in first.devices}
        assert by_device[serial_a].outcomes == {"ok": len(CELLS)} and by_device[serial_a].pending == 0
        runs_b = sorted((json.loads(p.read_text()) for p in out.glob("runs/*/*/run.json")
                         if json.loads(p.read_text())["device"] == serial_b), key=lambda r: r["started_at"])
        outcomes = [r["outcome"] for r in runs_b]
        n_ok = outcomes.count("ok")
        assert n_ok >= 1 and outcomes[:n_ok] == ["ok"] * n_ok
        lost = {r["cell_id"] for r in runs_b[n_ok:]}
        assert set(outcomes[n_ok:]) == {"device_lost"} and len(lost) == len(CELLS) - n_ok >= 1
        assert any(f"127.0.0.1:{port_b}" in " ".join(r["evidence"]) for r in runs_b[n_ok:])
        assert by_device[serial_b].pending == len(CELLS) - n_ok

        # the host is back: its server runs again and its phone is attached to it again
        start_server(port_b, home_b)
        connect(server_b, serial_b)
        before = ledger()
        second = run_campaign(c, out, progress_stream=io.StringIO())
        assert second.complete and second.outcomes == {"ok": 2 * len(CELLS)}
        new = ledger()[len(before):]
        assert {e["cell_id"] for e in new} == lost and all(device_of(e) == serial_b for e in new)
        assert ledger()[:len(before)] == before
    finally:
        manager.down("laba", home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)
        if manager.info("labb", phone_home).running:
            manager.down("labb", home=phone_home, adb_host="127.0.0.1", adb_port=port_b)
        stop_server(port_b, home_b)
