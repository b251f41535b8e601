"""devices.lmk reads every low-memory-killer format of the engine contract."""

from __future__ import annotations

import pytest

from devices.lmk import kills_of, parse_line, parse_log

A14 = ("11-29 21:00:01.234  1021  1021 I lowmemorykiller: Kill 'bmoe-cli' (4321), uid 2000, oom_score_adj 0 "
       "to free 3145728kB rss, 1024kB swap; reason: low watermark is breached and swap is low (100kB < 209715kB)")
A11 = ("11-29 21:00:01.234 I/lowmemorykiller( 1021): Kill 'com.example.app' (5000), uid 10123, oom_adj 900 "
       "to free 123456kB; reason: min watermark is breached")
A10 = "I/lowmemorykiller( 1021): Kill 'com.example.app' (5001), uid 10124, oom_adj 800 to free 65432kB"
A9 = ["11-29 21:00:01.234  1021  1021 I lowmemorykiller: Killing 'com.old.app' (5002), uid 10125, adj 906",
      "11-29 21:00:01.234  1021  1021 I lowmemorykiller:    to free 45678kB because system is under medium memory "
      "pressure oom_adj 800"]
KILLINFO = "11-29 21:00:01.240  1021  1021 I killinfo: [4321,2000,0,0,3145728,8,10240,20480,0,512,64,0,0,0,1,2,3,4]"
DMESG_LMK = ["[ 5123.456789] lowmemorykiller: Killing 'bmoe-cli' (4321), adj 0,",
             "[ 5123.456790]    to free 3000000kB on behalf of 'kswapd0' (120) because"]
KERNEL_OOM = ("[ 7001.000001] Memory cgroup out of memory: Killed process 777 (python3) total-vm:2048000kB, "
              "anon-rss:1500000kB, file-rss:4000kB, shmem-rss:0kB, UID:0 pgtables:3000kB oom_score_adj:0")


def test_android_12_to_14():
    e = parse_line(A14)
    assert (e.source, e.fmt, e.name, e.pid, e.uid, e.oom_score_adj) == ("lmkd", "android12+", "bmoe-cli", 4321, 2000, 0)
    assert (e.rss_kb, e.swap_kb) == (3145728, 1024)
    assert e.reason.startswith("low watermark is breached") and e.timestamp == "11-29 21:00:01.234"


def test_android_11_and_10():
    e11, e10 = parse_line(A11), parse_line(A10)
    assert (e11.fmt, e11.pid, e11.uid, e11.oom_score_adj, e11.rss_kb) == ("android11", 5000, 10123, 900, 123456)
    assert e11.reason == "min watermark is breached" and e11.swap_kb is None
    assert (e10.fmt, e10.name, e10.pid, e10.rss_kb, e10.reason) == ("android10", "com.example.app", 5001, 65432, None)


def test_android_9_joins_the_continuation_line():
    (e,) = parse_log(A9)
    assert (e.fmt, e.name, e.pid, e.uid, e.oom_score_adj, e.rss_kb) == ("android9", "com.old.app", 5002, 10125, 906, 45678)


def test_killinfo_event():
    e = parse_line(KILLINFO)
    assert (e.source, e.pid, e.uid, e.oom_score_adj, e.rss_kb, e.reason) == ("killinfo", 4321, 2000, 0, 3145728, "low mem")
    assert e.memory_kb["free_kb"] == 10240 and e.memory_kb["cached_kb"] == 20480
    assert len(e.memory_kb) == 12


def test_old_kernel_lowmemorykiller_in_dmesg():
    (e,) = parse_log(DMESG_LMK)
    assert (e.source, e.name, e.pid, e.oom_score_adj, e.rss_kb, e.timestamp) == (
        "kernel-lmk", "bmoe-cli", 4321, 0, 3000000, "5123.456789")


def test_kernel_oom_killer():
    e = parse_line(KERNEL_OOM)
    assert (e.source, e.name, e.pid, e.uid, e.rss_kb, e.reason) == (
        "kernel-oom", "python3", 777, 0, 1504000, "memory cgroup out of memory")


@pytest.mark.parametrize("line", [
    "11-29 21:00:01.234  1021  1021 I lowmemorykiller: Using psi monitors for memory pressure detection",
    "11-29 21:00:01.234  1021  1021 I ActivityManager: Killing 5000:com.example.app/u0a123 (adj 900): empty",
    "killinfo: [1,2]",
    "",
])
def test_other_lines_are_not_kills(line):
    assert parse_line(line) is None


def test_a_mixed_capture_and_selection_by_pid_and_name():
    capture = "\n".join(["--------- beginning of main", A14, A11, *A9, KILLINFO, "noise", A10])
    events = parse_log(capture)
    assert [e.pid for e in events] == [4321, 5000, 5002, 4321, 5001]
    ours = kills_of(events, pids=[4321])
    assert [e.source for e in ours] == ["lmkd", "killinfo"]
    by_name = kills_of(events, names=["com.example.application.with.long.name"])
    assert {e.pid for e in by_name} == {5000, 5001}
