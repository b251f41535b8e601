"""Other apps on a virtual phone (`virtual up --apps`) and lmkd's ro.lmk.* properties, through the
real adb server: the apps hold real memory in the phone's cgroup at Android's oom_score_adj, as
app uids, and the one that goes when memory runs out is the cached app, not the engine."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from devices import android as apps_mod
from devices.virtual import manager
from devices.virtual.run import may_lower_oom_score_adj
from engine.errors import BmoeError
from engine.units import MIB
from harness.cli.virtual import virtual
from tests.devices.conftest import app_uid

# an engine stand-in: allocates MiB in 8 MiB steps (touching every page), then says it survived
ALLOC = ("import sys, time\nmib = int(sys.argv[1]); held = []\n"
         "for _ in range(0, mib, 8):\n    b = bytearray(8 << 20); b[::4096] = b'x' * (len(b) // 4096)\n"
         "    held.append(b); time.sleep(0.02)\nprint('survived', flush=True)\n")


def sh(server, phone, command: str):
    return server.run("-s", phone.serial, "shell", command)


def logcat(server, phone) -> list[str]:
    out = server.run("-s", phone.serial, "logcat", "-d", "-b", "main,events", "-v", "threadtime").stdout
    return out.decode().splitlines()


def test_parse_apps_and_refuse_bad_ones():
    apps = apps_mod.parse_apps("cached:300MiB,perceptible:200MiB,cached:64MiB:compressible,previous:1GiB")
    assert [(a.name, a.oom_score_adj, a.uid, a.size_bytes >> 20, a.compressible) for a in apps] == [
        ("com.bmoe.app.cached1", 900, 10100, 300, False), ("com.bmoe.app.perceptible1", 200, 10101, 200, False),
        ("com.bmoe.app.cached2", 910, 10102, 64, True), ("com.bmoe.app.previous1", 700, 10103, 1024, False)]
    both = apps_mod.parse_apps("foreground:30MiB:compressible:active,visible:8MiB:active")
    assert [(a.compressible, a.active) for a in both] == [(True, True), (False, True)]
    assert not any(a.active for a in apps)
    for bad in ("cached", "sleeping:10MiB", "cached:0MiB", "cached:lots", "cached:10MiB:zip",
                "cached:10MiB:active:active"):
        try:
            apps_mod.parse_apps(bad)
        except apps_mod.AppSpecError as e:
            assert "bad app" in str(e)
        else:
            raise AssertionError(f"{bad!r} accepted")


def test_cli_refuses_a_bad_app_in_one_line(phone_home):
    r = CliRunner().invoke(virtual, ["up", "--name", "nophone", "--ram", "256MiB", "--apps", "idle:10MiB",
                                     "--home", str(phone_home)])
    # a BmoeError: the main group prints it as one `Error: ...` line with exit status 1
    assert isinstance(r.exception, BmoeError) and "bad app 'idle:10MiB'" in str(r.exception), r.output
    assert not (phone_home / "nophone" / ".vphone" / "state.json").exists()


def test_apps_run_in_the_phone_and_the_cached_one_is_killed_before_the_engine(adb_server, make_phone, phone_home):
    phone = make_phone("apps1", 256 * MIB, apps=("cached:96MiB", "perceptible:16MiB:compressible"))
    # getprop shows lmkd's properties (Android 14's defaults)
    props = sh(adb_server, phone, "getprop ro.lmk.swap_free_low_percentage; getprop ro.lmk.thrashing_limit; "
                                  "getprop ro.lmk.kill_heaviest_task; getprop ro.lmk.psi_complete_stall_ms")
    assert props.stdout.decode().split() == ["10", "100", "false", "700"]
    listing = CliRunner().invoke(virtual, ["list", "--home", str(phone_home)]).output
    assert "app com.bmoe.app.cached1 (cached, oom_score_adj 900, 96 MiB incompressible)" in listing
    assert "app com.bmoe.app.perceptible1 (perceptible, oom_score_adj 200, 16 MiB compressible)" in listing
    # the apps are the phone's processes, as their uids, at their adj, holding their memory
    assert phone.cgroup_path is not None
    rows = {}
    for pid in Path(phone.cgroup_path, "cgroup.procs").read_text().split():
        name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        status = dict(ln.split(":", 1) for ln in Path(f"/proc/{pid}/status").read_text().splitlines())
        rows[name] = (int(Path(f"/proc/{pid}/oom_score_adj").read_text()), int(status["Uid"].split()[0]),
                      int(status["VmRSS"].split()[0]), os.readlink(f"/proc/{pid}/ns/mnt"))
    assert set(rows) == {"com.bmoe.app.cached1", "com.bmoe.app.perceptible1"}, rows
    adj, uid, rss_kb, mnt = rows["com.bmoe.app.cached1"]
    assert (adj, uid) == (900, app_uid(phone.root, 10100)) and rss_kb > 90 * 1024
    assert rows["com.bmoe.app.perceptible1"][:2] == (200, app_uid(phone.root, 10101))
    assert mnt == manager.info("apps1", phone_home).mount_namespace   # inside the phone's own `/`
    # the shell runs at adbd's -950 (at 0 where this host's root may not lower an adj: the phone
    # warns); the shell user may raise its own (an app's adj) and lower it again, to its floor
    adj = sh(adb_server, phone, "cat /proc/self/oom_score_adj; echo 900 > /proc/self/oom_score_adj && "
                                "cat /proc/self/oom_score_adj; echo -100 > /proc/self/oom_score_adj && "
                                "cat /proc/self/oom_score_adj || echo refused")
    floor_below = may_lower_oom_score_adj()
    assert adj.stdout.decode().split() == (["-950", "900", "-100"] if floor_below else ["0", "900", "refused"]), adj
    # an engine that needs more than is left: the cached app goes, the engine survives
    engine = phone.root / "data/local/tmp/eng"
    engine.write_text(f"#!{sys.executable}\n{ALLOC}")
    engine.chmod(0o755)
    r = sh(adb_server, phone, "/data/local/tmp/eng 176")
    assert r.returncode == 0 and b"survived" in r.stdout, (r.returncode, r.stdout, r.stderr, logcat(adb_server, phone))
    deadline = time.monotonic() + 5
    while True:
        kills = [ln for ln in logcat(adb_server, phone) if "lowmemorykiller: Kill " in ln]
        if kills or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert kills and all("com.bmoe.app.cached1" in ln for ln in kills), kills
    assert re.search(rf"Kill 'com\.bmoe\.app\.cached1' \(\d+\), uid {app_uid(phone.root, 10100)}, oom_score_adj 900 "
                     r"to free \d+kB rss", kills[0])
    assert "/data/local/tmp/eng" not in " ".join(kills)


def test_apps_of_a_crashed_daemon_are_reclaimed_by_the_next_up(adb_server, make_phone, phone_home):
    import signal

    phone = make_phone("apps2", 256 * MIB, apps=("cached:8MiB",))
    assert phone.cgroup_path is not None
    (app_pid,) = [int(p) for p in Path(phone.cgroup_path, "cgroup.procs").read_text().split()]
    daemon = manager.info("apps2", phone_home).pid
    assert daemon is not None
    os.kill(daemon, signal.SIGKILL)              # a crash: no stop, the app is left in the cgroup
    deadline = time.monotonic() + 5
    while manager.info("apps2", phone_home).running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Path(f"/proc/{app_pid}").exists()
    manager.up("apps2", 256 * MIB, home=phone_home, adb_host="127.0.0.1", adb_port=adb_server.port,
               apps=("cached:8MiB",))
    deadline = time.monotonic() + 5
    while Path(f"/proc/{app_pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{app_pid}").exists()
    (new_pid,) = [int(p) for p in Path(phone.cgroup_path, "cgroup.procs").read_text().split()]
    assert new_pid != app_pid
