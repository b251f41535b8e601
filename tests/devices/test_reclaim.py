"""Reclaim measured in every run (docs/decisions/reclaim-sampling.md): the engine's VmSwap, RssAnon, RssFile and major
faults, the device's vmstat counters, PSI and zram, sampled on this host and, through the real adb
server, on a virtual phone with zram that really swaps."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from devices import reclaim
from devices.adb.phone import AdbPhone
from devices.adb.server import AdbServer as Server
from devices.local import LocalDevice
from devices.virtual import zram
from engine.units import MIB

# Maps FILE_MIB of a file (read through: RssFile) and holds ANON_MIB of anonymous memory
# (RssAnon), same-filled so zram stores it in a few bytes, taken 1 MiB every 10 ms (so the
# samples see it grow and swap), then waits HOLD_S.
HOLDER = ("import mmap, os, sys, time\nanon_mib, file_mib, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])\n"
          "held = []\nfor _ in range(anon_mib):\n    held.append(b'bmoe' * 262144)\n    time.sleep(0.01)\n"
          "if file_mib:\n    with open(sys.argv[4], 'wb') as f:\n        f.write(os.urandom(file_mib << 20))\n"
          "    fd = os.open(sys.argv[4], os.O_RDONLY)\n    m = mmap.mmap(fd, file_mib << 20, prot=mmap.PROT_READ)\n"
          "    s = sum(m[i] for i in range(0, file_mib << 20, 4096))\n"
          "time.sleep(hold)\nprint('held', flush=True)\n")


def test_parse_reads_every_file_and_names_what_was_refused():
    text = ("junk before\n" f"{reclaim.MARK}STATUS\nVmSwap:\t  2048 kB\nRssAnon:\t  100 kB\nRssFile:\t   50 kB\n"
            f"{reclaim.MARK}STAT\n4242 (a (b) c) S 1 2 3 4 5 6 7 8 917 10 11 12\n"
            f"{reclaim.MARK}VMSTAT\npswpin 10\npswpout 20\npgmajfault 5\nallocstall_dma32 1\nallocstall_normal 2\n"
            "pgsteal_direct 7\nworkingset_refault_anon 3\nworkingset_refault_file 4\n"
            f"{reclaim.MARK}PSI\n{reclaim.MARK}ZRAM\n")
    r = reclaim.parse(reclaim.split(text))
    assert (r.vm_swap_kb, r.rss_anon_kb, r.rss_file_kb, r.maj_flt) == (2048, 100, 50, 917)
    assert (r.pswpin, r.pswpout, r.pgmajfault, r.allocstall, r.pgsteal_direct, r.workingset_refault) == \
        (10, 20, 5, 3, 7, 7)
    assert r.psi_some_avg10 is None and r.zram_used_kb is None
    assert r.refused() == ["/proc/pressure/memory", "/sys/block/zram*/mm_stat"]
    later = reclaim.Reclaim(vm_swap_kb=4096, rss_anon_kb=80, rss_file_kb=60, maj_flt=1017, pswpin=15, pswpout=120,
                            psi_some_avg10=12.5)
    m = reclaim.metrics([r, later])
    assert (m["vm_swap_max_kb"], m["rss_anon_min_kb"], m["rss_anon_max_kb"], m["rss_file_max_kb"]) == (4096, 80, 100, 60)
    assert (m["maj_flt"], m["swap_in_kb"], m["swap_out_kb"], m["psi_some_avg10_max"]) == (100, 20, 400, 12.5)
    assert m["refused"] == ["/sys/block/zram*/mm_stat"] and "pgmajfault" not in m   # only one sample had it


def test_this_host_samples_the_engines_anon_and_file_memory_and_its_faults(tmp_path):
    out = LocalDevice(str(tmp_path)).run([sys.executable, "-c", HOLDER, "48", "16", "1.5", str(tmp_path / "f")],
                                         sample_period_s=0.25)
    assert out.exit_status == 0 and b"held" in out.stdout, out.stderr
    m = reclaim.metrics([s.reclaim for s in out.samples])
    assert m["rss_anon_max_kb"] > 48 * 1024 and m["rss_file_max_kb"] > 16 * 1024, m
    assert m["rss_anon_min_kb"] < m["rss_anon_max_kb"]        # sampled while it grew, not once
    assert "/proc/vmstat" not in m["refused"] and "/proc/PID/stat" not in m["refused"]
    assert all(s.reclaim.pswpout is not None for s in out.samples)


def dev_swap(p_root) -> str:
    """The phone's own zram device (/dev/zramN), from what its daemon recorded."""
    import json

    return f"/dev/zram{json.loads((p_root / '.vphone' / 'zram.json').read_text())['num']}"


@pytest.fixture
def zram_ok():
    why = zram.available()
    if why is not None:
        pytest.skip(f"no zram on this host: {why}")


def test_a_swapping_phone_shows_vmswap_and_swap_out_through_adb(adb_server, make_phone, zram_ok):
    phone = make_phone("rc1", 96 * MIB, zram_bytes=96 * MIB)
    dev = AdbPhone(phone.serial, Server("127.0.0.1", adb_server.port))
    # 140 MiB of same-filled pages on a 96 MiB phone: the kernel swaps them to the phone's zram
    before = dev.state()
    out = dev.run([sys.executable, "-c", HOLDER, "140", "0", "2"], sample_period_s=0.3)
    after = dev.state()
    assert out.exit_status == 0 and b"held" in out.stdout, (out.exit_status, out.stderr)
    m = reclaim.metrics([s.reclaim for s in out.samples], before.vmstat, after.vmstat)   # as the harness does
    assert m["vm_swap_max_kb"] > 20 * 1024, m
    # the phone's pswpout is its own zram device's; a swap device of anyone else (another zram
    # phone) takes pages round-robin at the same priority, so the count is the phone's alone only
    # when no other swap is in use (docs/virtual-phones.md)
    others = [ln.split()[0] for ln in Path("/proc/swaps").read_text().splitlines()[1:]
              if ln.split() and ln.split()[0] != dev_swap(p_root=phone.root)]
    if not others:
        assert m["swap_out_kb"] > 20 * 1024, m
    assert m.get("zram_used_max_kb") is not None or "/sys/block/zram*/mm_stat" in m["refused"]
    # what the phone's shell could not read is named, and its own vmstat always is readable
    assert set(m["refused"]) <= set(reclaim.SOURCES) and "/proc/vmstat" not in m["refused"]

