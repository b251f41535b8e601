"""Each zram phone's swap counters are its own, with two zram phones up (docs/virtual-phones.md,
"How a phone's swap counters are derived"; docs/decisions/vphone-swap-counters.md).

Swap areas are the kernel's: the two phones' devices have one priority and take turns, so the
swapping phone's pages land in both devices. Still:
- the swapping phone's pswpin/pswpout, as its shell reads /proc/vmstat and as the harness turns
  them into a run's swap_in_kb/swap_out_kb (devices.reclaim.metrics around AdbPhone.state), are its
  process's own traffic: swapped in = the process's major faults, swapped out = what it still has
  in swap (VmSwap) plus what came back; the idle phone reads none of it;
- what zram holds for the swapping phone is charged to its RAM, not to the idle phone's.

Both phones: 192 MiB of RAM and 128 MiB of zram, so the swapping takes seconds.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devices import reclaim
from devices.adb.phone import AdbPhone
from devices.adb.server import AdbServer as Server
from devices.virtual import manager
from engine.units import MIB
from tests.devices.conftest import ADB, needs_zram, start_phone

pytestmark = pytest.mark.phone   # its phones come from this module's own fixture

PAGE = 4096                 # the phones' page size (PhoneSpec's default) and this host's
RAM, ZRAM = 192 * MIB, 128 * MIB
FILL_MIB = 256              # past the RAM: 60+ MiB go to swap while it fills, more while it reads back
# The swapping process: same-filled pages (zram keeps each in a few bytes, so its charge to the RAM
# stays ~0), then every page read again, oldest first: what went to swap comes back and pushes
# others out. It prints its own VmSwap (kB) and major faults, then holds a moment, so the phone's
# counters (refreshed at 10 Hz) see its swap before the exit frees it.
SWAPPER = ("import sys, time\n"
           "held = [bytes([1 + i % 250]) * (1 << 20) for i in range(int(sys.argv[1]))]\n"
           "total = sum(sum(chunk[::4096]) for chunk in held)\n"
           "vmswap_kb = int(open('/proc/self/status').read().split('VmSwap:')[1].split()[0])\n"
           "majflt = int(open('/proc/self/stat').read().rpartition(')')[2].split()[9])\n"
           "print(vmswap_kb, majflt, flush=True)\n"
           "time.sleep(0.5)\n")
# Random bytes (zram stores them uncompressed: a page in zram costs a page of RAM), paged out at once
# (MADV_PAGEOUT, 21 in linux/mman.h), held in swap until the file `go` exists.
PAGER = ("import ctypes, mmap, os, sys, time\n"
         "n = int(sys.argv[1]) << 20\n"
         "m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)\n"
         "m.write(os.urandom(n))\n"
         "libc = ctypes.CDLL(None, use_errno=True)\n"
         "addr = ctypes.addressof(ctypes.c_char.from_buffer(m))\n"
         "if libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(n), 21) != 0:\n"
         "    sys.exit(f'madvise: {os.strerror(ctypes.get_errno())}')\n"
         "print(open('/proc/self/status').read().split('VmSwap:')[1].split()[0], flush=True)\n"
         "while not os.path.exists(sys.argv[2]):\n"
         "    time.sleep(0.05)\n")
PAGED_MIB = 48
# The idle phone may swap only under this host's own memory pressure: 1 MiB allows for that.
IDLE_PAGES = MIB // PAGE


def tolerance(pages: int) -> int:
    """The swapping phone's counters against its process's: 5 % and 2 MiB (what the phone's shell
    and adbd's child swap beside it, memory.stat's batched flush, the 10 Hz refresh)."""
    return pages // 20 + 2 * MIB // PAGE


@pytest.fixture(scope="module")
def two_zram_phones(adb_server, phone_home):
    """Two phones with zram up at once: `a` swaps, `b` stays idle."""
    tag = f"sc{os.getpid()}"
    started = {}
    try:
        for key in ("b", "a"):
            started[key] = start_phone(adb_server, phone_home, f"{tag}{key}", RAM, zram_bytes=ZRAM)
        yield started
    finally:
        for phone in started.values():
            manager.down(phone.name, home=phone_home, adb_host="127.0.0.1", adb_port=adb_server.port)
        leftovers = [p.cgroup_path for p in started.values() if p.cgroup_path and Path(p.cgroup_path).exists()]
        assert not leftovers, f"cgroups left behind: {leftovers}"


def device_writes_pages(phone) -> int:
    """Pages written to the phone's own zram device (its block stat, 512-byte sectors)."""
    num = json.loads((phone.root / ".vphone" / "zram.json").read_text())["num"]
    return int(Path(f"/sys/block/zram{num}/stat").read_text().split()[6]) * 512 // PAGE


def meminfo(adb_server, phone) -> dict[str, int]:
    out = adb_server.run("-s", phone.serial, "shell", "cat /proc/meminfo").stdout.decode()
    return {f[0].rstrip(":"): int(f[1]) for f in (line.split() for line in out.splitlines()) if len(f) == 3}


def unevictable_bytes(phone) -> int:
    """What the phone's memory cgroup holds unevictable: the zram charge's ramfs pages (zram_charge.py)."""
    stat = Path(phone.cgroup_path, "memory.stat").read_text().split()
    return int(stat[stat.index("total_unevictable") + 1])


@needs_zram
def test_each_zram_phone_reads_its_own_swap_traffic(adb_server, two_zram_phones):
    a, b = two_zram_phones["a"], two_zram_phones["b"]
    server = Server("127.0.0.1", adb_server.port)
    dev_a, dev_b = AdbPhone(a.serial, server), AdbPhone(b.serial, server)
    before_a, before_b, b_device_before = dev_a.state(), dev_b.state(), device_writes_pages(b)
    out = dev_a.run([sys.executable, "-c", SWAPPER, str(FILL_MIB)], sample_period_s=0.3, timeout_s=120)
    after_a, after_b = dev_a.state(), dev_b.state()
    assert out.exit_status == 0, (out.exit_status, out.stderr)
    vmswap_kb, majflt = (int(v) for v in out.stdout.split())
    swapped_in, swapped_out = majflt, vmswap_kb * 1024 // PAGE + majflt   # the process's own, in pages
    assert swapped_in > 16 * MIB // PAGE and swapped_out > 48 * MIB // PAGE, (vmswap_kb, majflt)
    # the setting this is about: the kernel put some of a's pages into b's device
    assert device_writes_pages(b) - b_device_before > swapped_out // 10

    def delta(before, after, key: str) -> int:
        return after.vmstat[key] - before.vmstat[key]

    # what each phone's shell reads in /proc/vmstat (AdbPhone.state greps it through adb shell)
    shown_in, shown_out = delta(before_a, after_a, "pswpin"), delta(before_a, after_a, "pswpout")
    assert abs(shown_in - swapped_in) <= tolerance(swapped_in), (shown_in, swapped_in)
    assert abs(shown_out - swapped_out) <= tolerance(swapped_out), (shown_out, swapped_out)
    assert 0 <= delta(before_b, after_b, "pswpin") <= IDLE_PAGES
    assert 0 <= delta(before_b, after_b, "pswpout") <= IDLE_PAGES
    # and what the harness makes of them: a run's swap-in and swap-out (the fight's swap_in_mib_per_tok)
    m_a = reclaim.metrics([s.reclaim for s in out.samples], before_a.vmstat, after_a.vmstat)
    m_b = reclaim.metrics([], before_b.vmstat, after_b.vmstat)
    kb = PAGE // 1024
    assert abs(m_a["swap_in_kb"] - swapped_in * kb) <= tolerance(swapped_in) * kb, m_a
    assert abs(m_a["swap_out_kb"] - swapped_out * kb) <= tolerance(swapped_out) * kb, m_a
    assert m_b["swap_in_kb"] <= IDLE_PAGES * kb and m_b["swap_out_kb"] <= IDLE_PAGES * kb, m_b
    # the counters only grow between samples too
    sampled = [s.reclaim.pswpout for s in out.samples if s.reclaim.pswpout is not None]
    assert sampled and sampled == sorted(sampled)


def _paged_out(adb_server, a, b, proc) -> tuple[int, int, int, dict[str, int], dict[str, int]]:
    """While a's PAGER holds its pages in swap: their size (its VmSwap), what a's and b's cgroups hold
    for zram (once a's charge has followed, at lmkd's pace), and both phones' /proc/meminfo."""
    line = proc.stdout.readline()
    assert line.strip().isdigit(), line
    vmswap = int(line) * 1024
    assert vmswap > (PAGED_MIB - 4) * MIB, vmswap        # paged out, into either phone's device
    deadline = time.monotonic() + 10                      # a bound on the wait, not a speed
    while unevictable_bytes(a) < vmswap - 4 * MIB and time.monotonic() < deadline:
        time.sleep(0.1)
    return vmswap, unevictable_bytes(a), unevictable_bytes(b), meminfo(adb_server, a), meminfo(adb_server, b)


@needs_zram
def test_what_zram_holds_for_a_phone_is_charged_to_that_phone_alone(adb_server, two_zram_phones):
    a, b = two_zram_phones["a"], two_zram_phones["b"]
    go = a.root / "data/local/tmp/go"
    go.unlink(missing_ok=True)
    (a.root / "data/local/tmp/pager.py").write_text(PAGER)
    free_b_before = meminfo(adb_server, b)["MemFree"]
    command = shlex.join([sys.executable, "/data/local/tmp/pager.py", str(PAGED_MIB), "/data/local/tmp/go"])
    with subprocess.Popen([str(ADB), "-P", str(adb_server.port), "-s", a.serial, "shell", command],
                          env=adb_server.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL) as proc:
        try:
            vmswap, held_a, held_b, info_a, info_b = _paged_out(adb_server, a, b, proc)
        finally:
            go.touch()
            proc.wait(timeout=30)
            go.unlink(missing_ok=True)
    # random bytes cost their size in zram: a's charge is its own pages', b holds nothing for them
    assert abs(held_a - vmswap) <= 4 * MIB, (held_a, vmswap)
    assert held_b <= 2 * MIB, held_b
    assert abs(free_b_before - info_b["MemFree"]) <= 4 * 1024, (free_b_before, info_b["MemFree"])
    # SwapFree: the phone's own swap, whichever device holds it
    assert info_b["SwapFree"] == info_b["SwapTotal"] == ZRAM // 1024
    assert abs(info_a["SwapTotal"] - info_a["SwapFree"] - vmswap // 1024) <= 2 * 1024, info_a
