"""What the harness reads from a real phone, parsed from lines built from AOSP's own format strings
(no phone needed): logcat's `-v epoch` prefix, lmkd's kill line and killinfo event with its
Android 13+ PSI tail, the page size, thermal zones in any unit, and `df`'s free space.

The line builders below follow the sources' format strings, cited at each; none is a capture.
"""

from __future__ import annotations

import pytest

from devices import reclaim, thermal_zones
from devices.adb.files import parse_df_free
from devices.adb.phone import lmk_since, parse_page_size
from devices.base import DeviceState
from devices.lmk import KILLINFO_MEM_FIELDS, parse_line, parse_log
from harness.campaign.model import GateSettings
from harness.run.gate import unmet

EPOCH_S = 1796526581


def logcat_epoch(seconds: int, ms: int, pid: int, tid: int, tag: str, message: str, priority: str = "I") -> str:
    """One line as `logcat -v epoch` prints it: liblog logprint.cpp android_log_formatLogLine,
    epoch_output: snprintf(timeBuf, "%19lld", now), then ".%03ld" of the nanoseconds / 1e6;
    FORMAT_THREADTIME (logcat's default format): "%s %s%5d %5d %c %-8.*s: " (no uid modifier: "")."""
    stamp = f"{seconds:19d}" + f".{ms:03d}"
    return f"{stamp} {pid:5d} {tid:5d} {priority} {tag:<8}: {message}"


def lmkd_kill(name: str, pid: int, uid: int, adj: int, rss_kb: int, swap_kb: int, reason: str | None) -> str:
    """lmkd.cpp kill_one_process: ALOGI("Kill '%s' (%d), uid %d, oom_score_adj %d to free %" PRId64
    "kB rss, %" PRId64 "kB swap; reason: %s", …), or without kill_info "…%" PRId64 "kb swap" (lower-case b)."""
    if reason is None:
        return f"Kill '{name}' ({pid}), uid {uid}, oom_score_adj {adj} to free {rss_kb}kB rss, {swap_kb}kb swap"
    return f"Kill '{name}' ({pid}), uid {uid}, oom_score_adj {adj} to free {rss_kb}kB rss, {swap_kb}kB swap; reason: {reason}"


def killinfo(pid: int, uid: int, adj: int, rss_kb: int, reason: int, swap_kb: int, psi: tuple[float, ...] | None) -> str:
    """lmkd.cpp killinfo_log as logcat prints the event (logprint.cpp android_log_printBinaryEvent:
    a list is "[" items joined by "," "]", int32 as %d, float32 as "%f"): pid, uid, oomadj,
    min_oom_score, rss_kb, kill_reason, the MI_FIELD_COUNT meminfo fields in kB, lmkd's wakeup
    figures (ms since event, ms since previous wakeup, wakeups since event, skipped wakeups), the
    victim's swap_kb, GPU kB, thrashing, max thrashing, then (Android 13+) the five PSI avg10."""
    ints = [pid, uid, adj, adj, rss_kb, reason]
    ints += [1000 * (i + 1) for i in range(len(KILLINFO_MEM_FIELDS))]
    ints += [120, 80, 3, 0, swap_kb, 0, 35, 60]
    items = [f"{v:d}" for v in ints] + [f"{f:f}" for f in psi or ()]
    return "[" + ",".join(items) + "]"


# ---- logcat and lmkd ---------------------------------------------------------------------------

def test_a_padded_epoch_stamp_is_read_from_a_threadtime_line():
    line = logcat_epoch(EPOCH_S, 7, 1021, 1021, "lowmemorykiller",
                        lmkd_kill("bmoe-cli", 4321, 2000, 0, 3145728, 1024, "low watermark is breached"))
    assert line.startswith(" " * 9 + str(EPOCH_S))         # what made the ^-anchored stamp unreadable
    e = parse_line(line)
    assert (e.source, e.fmt, e.pid, e.rss_kb, e.swap_kb) == ("lmkd", "android12+", 4321, 3145728, 1024)
    assert e.timestamp == f"{EPOCH_S}.007" and e.reason == "low watermark is breached"


def test_the_kill_line_without_a_reason_says_kb_swap():
    e = parse_line(logcat_epoch(EPOCH_S, 0, 1021, 1021, "lowmemorykiller",
                                lmkd_kill("com.app", 5000, 10123, 900, 2048, 512, None)))
    assert (e.fmt, e.pid, e.rss_kb, e.swap_kb, e.reason) == ("android12+", 5000, 2048, 512, None)


def test_killinfo_with_the_psi_tail_of_android_13_and_later():
    psi = (12.34, 3.21, 0.0, 0.0, 45.5)
    line = logcat_epoch(EPOCH_S, 240, 1021, 1021, "killinfo", killinfo(4321, 2000, 0, 3145728, 8, 4096, psi))
    assert "12.340000,3.210000,0.000000,0.000000,45.500000]" in line
    e = parse_line(line)
    assert (e.source, e.pid, e.uid, e.oom_score_adj, e.rss_kb, e.reason) == ("killinfo", 4321, 2000, 0, 3145728,
                                                                                "low mem")
    assert e.swap_kb == 4096 and e.timestamp == f"{EPOCH_S}.240"
    assert e.memory_kb["free_kb"] == 1000 and len(e.memory_kb) == len(KILLINFO_MEM_FIELDS)
    assert e.psi_avg10 == {"mem_some": 12.34, "mem_full": 3.21, "io_some": 0.0, "io_full": 0.0, "cpu_some": 45.5}
    # Android 12's list (no floats) still reads, without PSI
    e12 = parse_line(logcat_epoch(EPOCH_S, 0, 1021, 1021, "killinfo", killinfo(77, 10001, 900, 100, 3, 64, None)))
    assert (e12.pid, e12.swap_kb, e12.psi_avg10) == (77, 64, {})


@pytest.mark.parametrize("fields", ["[1,2,3,4,5.5,6]", "[1,2,3.0]", "[1,2,3,4,5,6,7.0,8]"])
def test_a_killinfo_list_with_a_float_among_its_integers_is_no_kill(fields):
    assert parse_line(logcat_epoch(EPOCH_S, 0, 1, 1, "killinfo", fields)) is None


def test_kills_before_the_run_are_left_out_by_their_padded_stamps():
    """lmk_events' filter: only kills stamped at or after the run's start (phone epoch) count; a
    kill from before (a previous cell's) is dropped by its stamp."""
    before = logcat_epoch(EPOCH_S - 60, 0, 1021, 1021, "lowmemorykiller",
                          lmkd_kill("old.app", 100, 10100, 900, 10, 0, "low mem"))
    after = logcat_epoch(EPOCH_S + 5, 0, 1021, 1021, "lowmemorykiller",
                         lmkd_kill("bmoe-py", 200, 2000, 0, 20, 0, "low mem"))
    info = logcat_epoch(EPOCH_S + 5, 3, 1021, 1021, "killinfo", killinfo(200, 2000, 0, 20, 8, 0, (1.0,) * 5))
    head = f"{EPOCH_S + 10}\n1000.5\n--------- beginning of main\n{before}\n{after}\n{info}"
    events = lmk_since(head, "", since_phone=EPOCH_S)
    assert [(e.source, e.pid) for e in events] == [("lmkd", 200), ("killinfo", 200)]
    assert len(parse_log([before, after])) == 2


# ---- the page size -----------------------------------------------------------------------------

@pytest.mark.parametrize(("said", "size"), [
    ("4096\n", 4096), ("16384", 16384),
    # /proc/self/smaps (Documentation/filesystems/proc.rst): "KernelPageSize:        4 kB"
    ("KernelPageSize:       16 kB\n", 16384), ("KernelPageSize:        4 kB", 4096),
    ("getconf: unknown name\n", None), ("", None), ("12345", None), ("1024", None),
])
def test_the_page_size_from_getconf_or_smaps(said, size):
    assert parse_page_size(said) == size


def test_swap_counted_in_pages_of_the_phones_size():
    """pswpin/pswpout count pages: on a 16 KiB-page phone 100 pages are 1600 KiB, not 400."""
    samples = [reclaim.Reclaim(pswpin=0, pswpout=10), reclaim.Reclaim(pswpin=100, pswpout=60)]
    assert reclaim.metrics(samples)["swap_in_kb"] == 400
    m = reclaim.metrics(samples, page_bytes=16384)
    assert (m["swap_in_kb"], m["swap_out_kb"]) == (1600, 800)
    m = reclaim.metrics(samples, {"pswpin": 5}, {"pswpin": 15}, page_bytes=16384)
    assert m["swap_in_kb"] == 160


# ---- thermal zones -----------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "mc"), [
    (45000, 45000), (95000, 95000), (1500, 1500),        # m°C
    (452, 45200), (150, 15000), (1499, 149900),           # tenths of a degree
    (45, 45000), (-5, -5000), (0, 0),                     # °C
    (-273000, None), (2000000, None),                     # no temperature a phone has
])
def test_a_zones_unit_is_decided_by_magnitude(raw, mc):
    assert thermal_zones.to_mc(raw) == mc


def test_the_cpu_zone_skips_trip_points_and_constant_zones_and_reads_any_unit():
    zones, bad = thermal_zones.parse_zones("cpu-hw-trip-0=95000\ncpu-0-0=41000\ncpuss-1=43\nbattery=300\n"
                                           "cpu-dead=-273000\nskin=x\n")
    assert zones == {"cpu-hw-trip-0": 95000, "cpu-0-0": 41000, "cpuss-1": 43000, "battery": 30000}
    assert list(bad) == ["cpu-dead"]
    state = DeviceState(0.0, 1 << 20, None, None, thermal_mc=zones, unreadable_zones=bad)
    assert (state.cpu_zone, state.cpu_temp_mc) == ("cpuss-1", 43000)
    assert set(state.zones_ignored()) == {"cpu-hw-trip-0", "cpu-dead"}
    assert state.to_dict()["cpu_zone"] == "cpuss-1"
    assert unmet(state, GateSettings(cpu_temp_max_c=45.0)) == []       # the trip's 95 °C never held the gate
    # a zone found constant is left out too; with no CPU zone left there is no CPU temperature
    constant = DeviceState(0.0, 1 << 20, None, None, thermal_mc={"cpu-x": 90000}, constant_zones=("cpu-x",))
    assert constant.cpu_temp_mc is None and "constant" in constant.zones_ignored()["cpu-x"]


def test_a_zone_is_constant_only_after_enough_reads_over_enough_time():
    history = thermal_zones.ZoneHistory()
    step = thermal_zones.CONSTANT_MIN_SPAN_S / (thermal_zones.CONSTANT_MIN_READS - 1)
    for i in range(thermal_zones.CONSTANT_MIN_READS - 1):
        assert history.observe({"cpu-stuck": 95000, "cpu-0": 40000 + i * 1000}, i * step) == ()
    n = thermal_zones.CONSTANT_MIN_READS - 1
    assert history.observe({"cpu-stuck": 95000, "cpu-0": 40000 + n}, n * step) == ("cpu-stuck",)
    # many reads in a short span are not enough (a steady sensor on an idle phone)
    quick = thermal_zones.ZoneHistory()
    for i in range(50):
        found = quick.observe({"cpu-0": 46000}, i * 0.5)
    assert found == ()
    # a zone that moved once is a sensor for good
    history.observe({"cpu-stuck": 95001}, 1000.0)
    assert history.observe({"cpu-stuck": 95000}, 2000.0) == ()


# ---- df ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "free"), [
    # toybox df.c: header "%-*s %*s %*s %*s %*s Mounted on" with 1K-blocks (-k), then the row
    ("Filesystem      1K-blocks    Used Available Use% Mounted on\n"
     "/dev/block/dm-5 115404840 9215480 106058288   9% /data\n", 106058288 * 1024),
    ("Filesystem     512-blocks     Used Available Capacity Mounted on\n"
     "/dev/vda        528424168 62091384 466332784      12% /\n", 466332784 * 512),
    ("Filesystem     1024-blocks     Used Available Capacity Mounted on\n"
     "/dev/fuse         1000 200 800  20% /storage/emulated dir\n", 800 * 1024),
    # toolbox df (Android 5 and older): Size Used Free Blksize, human sizes
    ("Filesystem               Size     Used     Free   Blksize\n/data                   12.5G     3.2G     9.3G   4096\n",
     int(9.3 * 1024 ** 3)),
    ("df: /nowhere: No such file or directory\n", None), ("", None),
])
def test_free_space_from_dfs_formats(text, free):
    assert parse_df_free(text) == free
