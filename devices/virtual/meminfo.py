"""The phone's /proc/meminfo, computed from its memory cgroup's real usage.

MemTotal is the phone's RAM. MemFree = RAM - cgroup usage. MemAvailable adds back what the
kernel would reclaim without swapping, the way si_mem_available() does: file pages beyond shmem
minus the part the low watermark keeps, plus half of reclaimable slab. SwapTotal is the phone's
own zram size, SwapFree that minus what its cgroup has swapped out (memsw usage - usage),
SwapCached its cgroup's swapcached; all 0 on a phone without zram (its memsw = RAM forbids swap).
Each is the phone's cgroup's, whichever zram device holds its pages; so are /proc/vmstat's
pswpin/pswpout (cgroup.SwapTraffic; docs/virtual-phones.md, "How a phone's swap counters are derived").
/proc/meminfo is in kB on every phone; the generated /proc/vmstat shows its page counters in the
phone's pages (`--page-size 16k`: in_phone_pages).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from devices.virtual.cgroup import HOST_PAGE_BYTES, MemStat

MEMINFO_PATH = Path("proc/meminfo")  # under the phone's root
VMSTAT_PATH = Path("proc/vmstat")
ZONEINFO_PATH = Path("proc/zoneinfo")
# /proc/vmstat's counters a phone shows (VirtualPhone.vmstat says where each comes from), in the kernel's order
VMSTAT_KEYS = ("pgpgin", "pgpgout", "pswpin", "pswpout", "pgfault", "pgmajfault", "workingset_refault_anon",
               "workingset_refault_file")
# the counters in pages, by name (in_phone_pages)
PAGE_COUNTER_PREFIXES = ("pswpin", "pswpout", "pgfault", "pgmajfault", "workingset_", "pgsteal_", "pgscan_")


@dataclass(frozen=True)
class MemInfo:
    total_kb: int
    free_kb: int
    available_kb: int
    cached_kb: int
    shmem_kb: int
    active_anon_kb: int
    inactive_anon_kb: int
    active_file_kb: int
    inactive_file_kb: int
    anon_kb: int
    mapped_kb: int
    unevictable_kb: int
    sreclaimable_kb: int
    sunreclaim_kb: int
    kernel_stack_kb: int
    pagetables_kb: int
    swap_total_kb: int = 0
    swap_free_kb: int = 0
    swap_cached_kb: int = 0

    @property
    def fields(self) -> dict[str, int]:
        return {
            "MemTotal": self.total_kb, "MemFree": self.free_kb, "MemAvailable": self.available_kb,
            "Buffers": 0, "Cached": self.cached_kb, "SwapCached": self.swap_cached_kb,
            "Active": self.active_anon_kb + self.active_file_kb,
            "Inactive": self.inactive_anon_kb + self.inactive_file_kb,
            "Active(anon)": self.active_anon_kb, "Inactive(anon)": self.inactive_anon_kb,
            "Active(file)": self.active_file_kb, "Inactive(file)": self.inactive_file_kb,
            "Unevictable": self.unevictable_kb, "Mlocked": 0, "SwapTotal": self.swap_total_kb,
            "SwapFree": self.swap_free_kb,
            "Dirty": 0, "Writeback": 0, "AnonPages": self.anon_kb, "Mapped": self.mapped_kb,
            "Shmem": self.shmem_kb, "KReclaimable": self.sreclaimable_kb,
            "Slab": self.sreclaimable_kb + self.sunreclaim_kb, "SReclaimable": self.sreclaimable_kb,
            "SUnreclaim": self.sunreclaim_kb, "KernelStack": self.kernel_stack_kb,
            "PageTables": self.pagetables_kb, "NFS_Unstable": 0, "Bounce": 0, "WritebackTmp": 0,
            "CommitLimit": self.total_kb // 2 + self.swap_total_kb, "Committed_AS": self.anon_kb + self.shmem_kb,
            "VmallocTotal": 263061440, "VmallocUsed": 0, "VmallocChunk": 0,
        }

    def text(self) -> str:
        # seq_printf(m, "MemTotal:       %8lu kB\n"): label and colon in 16 columns, value in 8.
        return "".join(f"{k + ':':<16}{v:>8} kB\n" for k, v in self.fields.items())


def compute(ram_bytes: int, st: MemStat, swap_total_bytes: int = 0, swap_used_bytes: int = 0) -> MemInfo:
    kb = lambda b: max(0, int(b) // 1024)  # noqa: E731
    total = ram_bytes
    free = max(0, total - st.usage_bytes)
    pagecache = max(0, st.active_file_bytes + st.inactive_file_bytes)
    low_wmark = total // 200
    available = free + pagecache - min(pagecache // 2, low_wmark) + st.slab_reclaimable_bytes // 2
    available = min(total, max(0, available))
    return MemInfo(total_kb=kb(total), free_kb=kb(free), available_kb=kb(available), cached_kb=kb(st.file_bytes),
                   shmem_kb=kb(st.shmem_bytes), active_anon_kb=kb(st.active_anon_bytes),
                   inactive_anon_kb=kb(st.inactive_anon_bytes), active_file_kb=kb(st.active_file_bytes),
                   inactive_file_kb=kb(st.inactive_file_bytes), anon_kb=kb(st.anon_bytes),
                   mapped_kb=kb(st.mapped_bytes), unevictable_kb=kb(st.unevictable_bytes),
                   sreclaimable_kb=kb(st.slab_reclaimable_bytes), sunreclaim_kb=kb(st.slab_unreclaimable_bytes),
                   kernel_stack_kb=kb(st.kernel_stack_bytes), pagetables_kb=kb(st.pagetables_bytes),
                   swap_total_kb=kb(swap_total_bytes), swap_free_kb=kb(max(0, swap_total_bytes - swap_used_bytes)),
                   swap_cached_kb=kb(st.swap_cached_bytes) if swap_total_bytes else 0)


def write_in_place(path: Path, text: str) -> None:
    """Rewrite without changing the inode: /proc/meminfo in the phone's namespace is a bind mount
    of this very file, and a rename would leave the mount on the old inode."""
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o444)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def vmstat_text(counters: dict[str, int], page_size_bytes: int = HOST_PAGE_BYTES) -> str:
    """The phone's /proc/vmstat: VMSTAT_KEYS first (0 where unknown), then the host-wide rest given.
    `counters` are this host's (its pages); what counts pages is shown in the phone's pages."""
    keys = list(VMSTAT_KEYS) + sorted(k for k in counters if k not in VMSTAT_KEYS)
    return "".join(f"{k} {in_phone_pages(k, int(counters.get(k, 0)), page_size_bytes)}\n" for k in keys)


def in_phone_pages(key: str, host_value: int, page_size_bytes: int) -> int:
    """A /proc/vmstat counter of this host as a phone of `page_size_bytes` pages shows it. Counted
    in pages (mm/vmstat.c vmstat_text): pswpin/pswpout, the workingset_*, pgsteal_*, pgscan_*
    counters, and the faults pgfault/pgmajfault (each fault maps one page, so a 16 KiB kernel takes
    a quarter as many for the same bytes). Not pages: pgpgin/pgpgout (KiB), allocstall_* (events).
    Whole pages, rounded down: a counter still only grows."""
    if page_size_bytes == HOST_PAGE_BYTES or not key.startswith(PAGE_COUNTER_PREFIXES):
        return host_value
    return host_value * HOST_PAGE_BYTES // page_size_bytes


def zoneinfo_text(ram_kb: int, free_kb: int, page_size_bytes: int = HOST_PAGE_BYTES) -> str:
    """The phone's /proc/zoneinfo: one present zone, Normal, of its RAM, with the watermarks the
    kernel computes for that RAM (devices.lmkd_policy.watermarks, which the phone's lmkd decides
    with) and its free pages, in mm/vmstat.c zoneinfo_show_print's layout (the lines lmkd's
    zoneinfo_parse and calc_zone_meminfo read: pages free, min, low, high, present, managed,
    protection). Not the host's, whose zones are this host's RAM."""
    from devices.lmkd_policy import watermarks

    kb = page_size_bytes // 1024
    marks = watermarks(ram_kb)
    pages = ram_kb // kb
    return (f"Node 0, zone   Normal\n  pages free     {max(0, free_kb) // kb}\n        boost    0\n"
            f"        min      {marks.min_kb // kb}\n        low      {marks.low_kb // kb}\n"
            f"        high     {marks.high_kb // kb}\n        spanned  {pages}\n        present  {pages}\n"
            f"        managed  {pages}\n        cma      0\n        protection: (0, 0, 0)\n"
            f"      nr_free_pages {max(0, free_kb) // kb}\n")
