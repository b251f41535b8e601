"""lmkd kills only what the phone's ActivityManager registered (devices/virtual/lmkd.py, am.py),
through the real adb server: beside a shell's engine past the phone's RAM it kills the registered
apps, never the engine, which the kernel's OOM killer takes (a kernel line, in no buffer the shell
reads); with no app left it kills nothing; an engine run as the app (`am run-as-app`) goes with its
app, by lmkd's hand; and a shell process cannot register itself. `am`, `pm` and `cmd` answer as
Android's do, for the subset a virtual phone has."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devices.virtual import logbuf, zram
from devices.virtual.lmkd import Lmkd
from devices.virtual.lmkd_registry import CONTROL_SOCKET, SYSTEM_UID, procprio_packet
from engine.units import MIB
from tests.devices.conftest import app_uid, host_pid, wait_for

# Fills MiB of anonymous memory with a same-filled pattern (zram keeps such a page in a few bytes,
# so swap, not RAM, runs out first: lmkd's low-swap kill comes before the kernel's OOM), fast up
# to FAST MiB, then 1 MiB every 60 ms (tests/devices/test_lmkd_zram.py says why), saying its pid.
ALLOC = ("import os, sys, time\nprint(os.getpid(), flush=True)\nmib, fast = int(sys.argv[1]), int(sys.argv[2])\n"
         "held = []\npage = b'bmoe' * 1024\n"
         "for i in range(mib):\n    held.append(page * 256)\n    time.sleep(0 if i < fast else 0.06)\n"
         "print('survived', flush=True)\n")
ENGINE_PACKAGE, ENGINE_UID = "io.bigmoeonedge.example", 10200    # the first block's (app_uid)


@pytest.fixture
def zram_ok():
    why = zram.available()
    if why is not None:
        pytest.skip(f"no zram on this host: {why}")


def sh(server, phone, command: str) -> subprocess.CompletedProcess:
    return server.run("-s", phone.serial, "shell", command)


def engine(phone) -> str:
    path = phone.root / "data/local/tmp/eng"
    path.write_text(f"#!{sys.executable}\n{ALLOC}")
    path.chmod(0o755)
    return "/data/local/tmp/eng"


def readable(server, phone) -> list[str]:
    """What the shell reads of lmkd: logcat's main and events buffers."""
    out = server.run("-s", phone.serial, "logcat", "-d", "-b", "main,events", "-v", "threadtime").stdout
    return out.decode().splitlines()


def lmkd_kills(server, phone) -> list[str]:
    return [ln for ln in readable(server, phone) if "lowmemorykiller: Kill " in ln]


def kernel_lines(phone) -> list[str]:
    """The kernel's buffer as the phone keeps it (the shell of a user build may not read it)."""
    return [e.message for e in logbuf.read(phone.root, ["kernel"])]



def adj_of(server, phone, package: str) -> int:
    out = sh(server, phone, f"cat /proc/$(pidof {package})/oom_score_adj").stdout
    return int(out)


def test_lmkd_kills_the_apps_never_the_shells_engine_which_the_kernel_kills(adb_server, make_phone, zram_ok):
    phone = make_phone("reg1", 256 * MIB, zram_bytes=32 * MIB, apps=("cached:24MiB:compressible",))
    eng = engine(phone)
    # two installed apps opened with am: chat goes to the back (previous, 700) when the example
    # app comes to the front (0); the engine allocates at whatever adj the shell gives it
    for package in ("com.bmoe.app.chat", ENGINE_PACKAGE):
        r = sh(adb_server, phone, f"am start -n {package}/.MainActivity")
        assert r.returncode == 0 and r.stdout == f"Starting: Intent {{ cmp={package}/.MainActivity }}\n".encode()
    assert (adj_of(adb_server, phone, "com.bmoe.app.chat"), adj_of(adb_server, phone, ENGINE_PACKAGE)) == (700, 0)
    r = sh(adb_server, phone, f"echo 900 > /proc/self/oom_score_adj; exec {eng} 512 170")
    assert r.returncode == 137 and b"survived" not in r.stdout, (r.returncode, r.stdout, r.stderr)
    pid = int(r.stdout.split()[0])
    kills = wait_for(lambda: lmkd_kills(adb_server, phone))
    # lmkd's victims: the cached app first, then the previous one, each named and at the adj
    # ActivityManager gave it; never the engine, whatever adj it wrote for itself
    assert kills and re.search(rf"Kill 'com\.bmoe\.app\.cached1' \(\d+\), uid {app_uid(phone.root, 10100)}, "
                               r"oom_score_adj 900 to free "
                               r"\d+kB rss, \d+kB swap; reason: .*swap is low", kills[0]), kills
    assert len(kills) >= 2 and "Kill 'com.bmoe.app.chat' (" in kills[1] and "oom_score_adj 700 " in kills[1], kills
    assert all("Kill 'com.bmoe.app." in k or f"Kill '{ENGINE_PACKAGE}'" in k for k in kills), kills
    assert not [ln for ln in readable(adb_server, phone) if f"({pid})" in ln or f"[{pid}," in ln]
    # the kernel's OOM killer took the engine: its line is in the kernel buffer, and only there
    line = wait_for(lambda: [ln for ln in kernel_lines(phone) if f"Killed process {pid} (eng)" in ln])
    assert line, kernel_lines(phone)[-5:]
    assert not [ln for ln in readable(adb_server, phone) if "Killed process" in ln]


def test_with_no_app_left_lmkd_kills_nothing(adb_server, make_phone, zram_ok):
    phone = make_phone("reg2", 256 * MIB, zram_bytes=32 * MIB)
    r = sh(adb_server, phone, f"{engine(phone)} 512 236")
    assert r.returncode == 137 and b"survived" not in r.stdout, (r.returncode, r.stdout, r.stderr)
    pid = int(r.stdout.split()[0])
    assert wait_for(lambda: [ln for ln in kernel_lines(phone) if f"Killed process {pid} " in ln])
    time.sleep(0.3)   # lmkd's polls after the kill: still nothing of its own
    lines = readable(adb_server, phone)
    assert not [ln for ln in lines if "lowmemorykiller" in ln or " killinfo: " in ln], lines[-5:]


def test_an_engine_run_as_the_app_goes_with_its_app_by_lmkds_hand(adb_server, make_phone, zram_ok):
    phone = make_phone("reg3", 256 * MIB, zram_bytes=32 * MIB)
    eng = engine(phone)
    r = sh(adb_server, phone, f"am run-as-app --adj 200 -- {eng} 512 236")
    assert r.returncode == 137 and b"survived" not in r.stdout, (r.returncode, r.stdout, r.stderr)
    pid = int(r.stdout.split()[0])
    kills = wait_for(lambda: lmkd_kills(adb_server, phone))
    assert len(kills) == 1, kills
    m = re.search(rf"Kill '{re.escape(ENGINE_PACKAGE)}' \((\d+)\), uid {app_uid(phone.root, ENGINE_UID)}, "
                  r"oom_score_adj 200 to free \d+kB "
                  r"rss, \d+kB swap; reason: ", kills[0])
    assert m and int(m[1]) != pid, kills
    # lmkd killed the app, ActivityManager its process group and the engine with it: not the kernel
    assert wait_for(lambda: host_pid(phone.root, pid) == -1)     # gone from the phone's pid namespace
    assert not [ln for ln in kernel_lines(phone) if f"Killed process {pid} " in ln]
    started = [e.message for e in logbuf.read(phone.root, ["system"]) if e.message.startswith("Start proc ")]
    assert started == [f"Start proc {m[1]}:{ENGINE_PACKAGE}/u0a{app_uid(phone.root, ENGINE_UID) - 10000} "
                       f"for run-as-app {eng}"]


def test_without_swap_a_kernel_kill_in_the_apps_group_stands_in_for_lmkds_kill_of_the_app(adb_server, make_phone):
    phone = make_phone("reg4", 192 * MIB)
    r = sh(adb_server, phone, f"am run-as-app --adj 0 -- {engine(phone)} 512 150")
    assert r.returncode == 137, (r.returncode, r.stdout, r.stderr)
    pid = int(r.stdout.split()[0])
    kills = wait_for(lambda: lmkd_kills(adb_server, phone))
    assert len(kills) == 1 and f"Kill '{ENGINE_PACKAGE}' (" in kills[0] and \
        f"uid {app_uid(phone.root, ENGINE_UID)}, oom_score_adj 0 " \
        in kills[0] and f"({pid})" not in kills[0], kills
    assert wait_for(lambda: [ln for ln in kernel_lines(phone) if f"Killed process {pid} " in ln])


def test_run_as_app_runs_as_the_app_and_a_shell_process_cannot_register_itself(adb_server, make_phone):
    phone = make_phone("reg5", 128 * MIB)
    # the command: the app's uid and the adj asked for, a child of the app's process and in its
    # process group, in the caller's folder, on the caller's streams, its status returned
    r = sh(adb_server, phone, "cd /data/local/tmp && am run-as-app --adj 200 -- sh -c '"
                              "echo uid $(grep ^Uid: /proc/$$/status | cut -f2); echo ppid $PPID; "
                              "echo pgid $(cut -d\" \" -f5 /proc/$$/stat); echo app $(xargs -0 </proc/$PPID/cmdline); "
                              "echo adj $(cat /proc/$$/oom_score_adj); echo cwd $(pwd); echo to-stderr >&2; exit 7'")
    assert r.returncode == 7 and r.stderr == b"to-stderr\n", (r.returncode, r.stdout, r.stderr)
    said = dict(line.split(" ", 1) for line in r.stdout.decode().splitlines())
    assert said["uid"] == str(app_uid(phone.root, ENGINE_UID)) and said["ppid"] == said["pgid"], said
    assert said["app"].split()[0] == ENGINE_PACKAGE and (said["adj"], said["cwd"]) == ("200", "/data/local/tmp")
    # the lmkd socket is init's `0660 system system`: the shell cannot even connect
    ls = sh(adb_server, phone, "ls -l /dev/socket/lmkd").stdout.decode()
    assert ls.startswith("srw-rw---- ") and " system system " in ls, ls
    register = ("import os, socket, struct\ns = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
                "try:\n    s.connect('/dev/socket/lmkd')\n"
                "except PermissionError:\n    print('refused')\nelse:\n"
                "    s.send(struct.pack('!5i', 1, os.getpid(), 2000, 900, 0)); print('sent')\n")
    script = phone.root / "data/local/tmp/register"
    script.write_text(f"#!{sys.executable}\n{register}")
    script.chmod(0o755)
    r = sh(adb_server, phone, "/data/local/tmp/register")
    assert r.stdout == b"refused\n", (r.stdout, r.stderr)


@pytest.mark.root("becomes the shell user and gives lmkd's socket to system (chown)")
def test_lmkd_refuses_a_peer_that_is_neither_root_nor_system(tmp_path):
    """The second guard, behind the socket's mode: a uid-2000 peer that reached the socket (here
    opened to all) is refused, and nothing it sends is registered; root's packet is."""
    for b in logbuf.BUFFERS:
        logbuf.buffer_path(tmp_path, b).parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    lmkd = Lmkd(tmp_path, 14, 512 * MIB, lambda: [], None, lambda: None)  # type: ignore[arg-type,return-value]
    folder = os.open(tmp_path / "dev/socket", os.O_PATH)   # the way in, past this test's 0700 folders
    try:
        path = tmp_path / CONTROL_SOCKET
        assert (os.stat(path).st_uid, os.stat(path).st_mode & 0o777) == (SYSTEM_UID, 0o660)
        os.chmod(path, 0o666)
        child = os.fork()
        if child == 0:                       # the shell user, registering a process of its own
            status = 1
            try:
                os.setresgid(2000, 2000, 2000)
                os.setresuid(2000, 2000, 2000)
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                s.connect(f"/proc/self/fd/{folder}/{path.name}")
                s.send(procprio_packet(holder.pid, 2000, 900))
                status = 0
                time.sleep(0.5)
            finally:
                os._exit(status)
        time.sleep(0.2)
        lmkd.registry.serve()
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0     # it did connect and send
        assert lmkd.registry.records == {} and lmkd.registry.clients == []
        assert Path(f"/proc/{holder.pid}/oom_score_adj").read_text() == "0\n"
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:   # root (init, system_server)
            s.connect(f"/proc/self/fd/{folder}/{path.name}")
            s.send(procprio_packet(holder.pid, 10100, 900))
            deadline = time.monotonic() + 5
            while holder.pid not in lmkd.registry.records and time.monotonic() < deadline:
                lmkd.registry.serve()
                time.sleep(0.05)
        reg = lmkd.registry.records[holder.pid]
        assert (reg.uid, reg.oom_score_adj, reg.registrant) == (10100, 900, os.getpid())
        assert Path(f"/proc/{holder.pid}/oom_score_adj").read_text() == "900\n"   # lmkd wrote it
    finally:
        os.close(folder)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        lmkd.close()
    assert not (tmp_path / CONTROL_SOCKET).exists()


def test_am_pm_and_cmd_answer_as_androids_do(adb_server, make_phone):
    phone = make_phone("reg6", 256 * MIB, apps=("perceptible:8MiB",))
    r = sh(adb_server, phone, "pm list packages")
    assert r.stdout.decode().split() == ["package:com.bmoe.app.browser", "package:com.bmoe.app.chat",
                                         "package:com.bmoe.app.maps", "package:com.bmoe.app.perceptible1",
                                         f"package:{ENGINE_PACKAGE}"]
    r = sh(adb_server, phone, "cmd package resolve-activity --brief com.bmoe.app.maps")
    assert r.stdout.decode().splitlines()[-1] == "com.bmoe.app.maps/.MainActivity"
    r = sh(adb_server, phone, "am start -W -n com.bmoe.app.maps/.MainActivity")
    assert r.returncode == 0 and "LaunchState: COLD" in r.stdout.decode() and r.stdout.endswith(b"Complete\n")
    r = sh(adb_server, phone, "am start -n com.bmoe.app.maps/.MainActivity")
    assert r.stderr == b"Warning: Activity not started, its current task has been brought to the front\n"
    r = sh(adb_server, phone, "am start -n com.bmoe.app.chat/.MainActivity; "
                              "am start-foreground-service -n com.bmoe.app.browser/.RunService")
    assert r.returncode == 0 and r.stdout.decode().splitlines()[-1] == \
        "Starting service: Intent { cmp=com.bmoe.app.browser/.RunService }"
    adjs = {p: adj_of(adb_server, phone, p) for p in ("com.bmoe.app.maps", "com.bmoe.app.chat",
                                                      "com.bmoe.app.browser", "com.bmoe.app.perceptible1")}
    assert adjs == {"com.bmoe.app.maps": 700, "com.bmoe.app.chat": 0, "com.bmoe.app.browser": 200,
                    "com.bmoe.app.perceptible1": 200}
    # bad input: Android's lines and statuses; one clear line for what the subset lacks
    r = sh(adb_server, phone, "am start -n com.nope/.Main")
    assert r.returncode == 1 and r.stderr == b"Error type 3\nError: Activity class {com.nope/com.nope.Main} " \
                                             b"does not exist.\n"
    for bad in ("am start -a android.intent.action.VIEW", "am run-as-app --adj -5 -- true", "am run-as-app",
                "am run-as-app --package com.nope -- true", "am fly"):
        r = sh(adb_server, phone, bad)
        assert r.returncode == 255 and r.stdout == b"" and len(r.stderr.splitlines()) == 1, (bad, r)
    r = sh(adb_server, phone, "cmd nothing")
    assert (r.returncode, r.stderr) == (20, b"cmd: Can't find service: nothing\n")
    # force-stop: the app and its process group are gone
    r = sh(adb_server, phone, "am force-stop com.bmoe.app.chat; pidof com.bmoe.app.chat || echo gone")
    assert r.stdout == b"gone\n"
