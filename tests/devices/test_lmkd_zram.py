"""lmkd's policy on a virtual phone with its own zram, through the real adb server: silent while
swap is free (the phone swaps instead), a kill with Android's low-swap reason once zram is nearly
full, of the app the engine runs in (lmkd kills only registered apps: a shell's engine is the
kernel's, tests/devices/test_lmkd_registry.py); a cached app goes before the engine."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from devices import lmk
from devices.virtual import zram
from engine.units import MIB
from tests.devices.conftest import app_uid

# Fills MiB of anonymous memory with a same-filled pattern (zram keeps such a page in a few bytes,
# so swap, not RAM, runs out first), fast up to FAST MiB, then 1 MiB every 60 ms: the last 10 % of
# a 32 MiB zram lasts ~190 ms, more than lmkd's 100 ms poll (a late poll on a loaded host aside).
ALLOC = ("import os, sys, time\nprint(os.getpid(), flush=True)\nmib, fast = int(sys.argv[1]), int(sys.argv[2])\n"
         "held = []\npage = b'bmoe' * 1024\n"
         "for i in range(mib):\n    held.append(page * 256)\n    time.sleep(0 if i < fast else 0.06)\n"
         "print('survived', flush=True)\n")


@pytest.fixture
def zram_ok():
    why = zram.available()
    if why is not None:
        pytest.skip(f"no zram on this host: {why}")


def logcat(server, phone) -> list[str]:
    out = server.run("-s", phone.serial, "logcat", "-d", "-b", "main,events", "-v", "threadtime").stdout
    return out.decode().splitlines()


def swap_line(server, phone) -> str:
    out = server.run("-s", phone.serial, "shell", "grep -E '^Swap(Total|Free)' /proc/meminfo").stdout.decode()
    return " ".join(out.split())


def test_silent_while_swap_is_free_then_killed_with_the_low_swap_reason(adb_server, make_phone, zram_ok):
    phone = make_phone("zr1", 256 * MIB, zram_bytes=32 * MIB)
    engine = phone.root / "data/local/tmp/eng"
    engine.write_text(f"#!{sys.executable}\n{ALLOC}")
    engine.chmod(0o755)
    # 250 MiB and the interpreters: the phone's cgroup (its daemon's ~20 MiB RSS included) peaks at
    # 271 MiB of RAM and swap, about 15 MiB in zram, half of it and well clear of lmkd's low-swap
    # line at 90 % (264 MiB here put the peak at 28.8 MiB, on that line, and lmkd sometimes caught it)
    r = adb_server.run("-s", phone.serial, "shell", "am run-as-app --adj 0 -- /data/local/tmp/eng 250 236")
    kills = [ln for ln in logcat(adb_server, phone) if "lowmemorykiller" in ln or "killinfo" in ln]
    assert r.returncode == 0 and b"survived" in r.stdout and not kills, (r.returncode, r.stderr, kills,
                                                                        swap_line(adb_server, phone))
    cgroup = Path(phone.cgroup_path)
    swapped = int((cgroup / "memory.memsw.max_usage_in_bytes").read_text()) - int(
        (cgroup / "memory.max_usage_in_bytes").read_text())
    assert 4 * MIB < swapped < 24 * MIB, swapped / MIB    # it swapped, and stayed clear of the low-swap line
    # more than RAM and zram together: lmkd kills the engine's app (the foreground app, adj 0) when
    # SwapFree falls under 10 % of SwapTotal with the min watermark breached
    r = adb_server.run("-s", phone.serial, "shell", "am run-as-app --adj 0 -- /data/local/tmp/eng 512 236")
    assert r.returncode == 137, (r.returncode, r.stdout, r.stderr)
    pid = int(r.stdout.split()[0])
    deadline = time.monotonic() + 5
    while True:
        kills = [ln for ln in logcat(adb_server, phone) if "lowmemorykiller: Kill " in ln]
        if kills or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert kills, f"no lmkd line for {pid}'s app: {logcat(adb_server, phone)[-6:]}; {swap_line(adb_server, phone)}"
    m = re.search(rf"Kill 'io\.bigmoeonedge\.example' \((\d+)\), uid {app_uid(phone.root, 10200)}, oom_score_adj 0 to "
                  r"free \d+kB rss, (\d+)kB "
                  r"swap; reason: min watermark is breached and swap is low \((\d+)kB < (\d+)kB\)$", kills[0])
    assert m, kills[0]
    assert int(m[2]) >= 0 and int(m[3]) < int(m[4]) == 32 * 1024 // 10
    app = int(m[1])
    events = lmk.parse_log(logcat(adb_server, phone))
    mine = lmk.kills_of(events, pids=[app])
    assert {e.source for e in mine} == {"lmkd", "killinfo"} and all(e.reason for e in mine)
    assert next(e for e in mine if e.source == "killinfo").reason == "low mem and swap"
    assert not lmk.kills_of(events, pids=[pid])     # the engine went with its app: lmkd named the app


def test_a_cached_app_goes_before_the_engine_on_low_swap(adb_server, make_phone, zram_ok):
    phone = make_phone("zr2", 256 * MIB, zram_bytes=32 * MIB, apps=("cached:48MiB:compressible",))
    engine = phone.root / "data/local/tmp/eng"
    engine.write_text(f"#!{sys.executable}\n{ALLOC}")
    engine.chmod(0o755)
    r = adb_server.run("-s", phone.serial, "shell", "/data/local/tmp/eng 240 190")
    assert r.returncode == 0 and b"survived" in r.stdout, (r.returncode, r.stderr, logcat(adb_server, phone)[-5:])
    kills = [ln for ln in logcat(adb_server, phone) if "lowmemorykiller: Kill " in ln]
    assert kills and "com.bmoe.app.cached1" in kills[0] and "oom_score_adj 900" in kills[0], kills
    assert "swap is low" in kills[0]
