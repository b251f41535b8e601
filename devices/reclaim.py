"""What reclaim does to a running engine, read the same way on every device kind (docs/decisions/reclaim-sampling.md).

One ~1 Hz sample reads, besides MemAvailable and VmHWM/VmRSS (devices.base.PressureSample):

- the engine's own `/proc/PID/status` VmSwap, RssAnon and RssFile, and its major faults
  (`/proc/PID/stat` field 12, majflt): upstream saw a second turn slowed with swap flat because
  reclaim dropped the mmap'd dense weights, which only RssFile and major faults show;
- the device's `/proc/vmstat` counters pswpin, pswpout, pgmajfault, allocstall_* (summed),
  pgsteal_direct and workingset_refault_* (anon + file, or the older single counter); a virtual
  phone's are generated from its memory cgroup, so another phone's swapping is not in them
  (docs/virtual-phones.md, "How a phone's swap counters are derived");
- `/proc/pressure/memory`'s some/full avg10 (percent), where the reader may open it;
- what every zram device holds in RAM (`/sys/block/zram*/mm_stat` mem_used_total), where readable
  (a virtual phone sees this host's devices: every zram phone's pool, not its own share).

On a phone all of it is one shell call as the shell user (`command`, split at markers); this
host reads the files directly (`read_local`). A file the reader may not open gives no value
(None), never 0: `refused()` names what a device withheld, so the run says it.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from devices import sections
from engine.units import is_digits

MARK = "@@RECLAIM"
VMSTAT_KEYS = ("pswpin", "pswpout", "pgmajfault", "allocstall", "pgsteal_direct", "workingset_refault")
SOURCES = {  # each value of a Reclaim, by the file it comes from (refused() names these)
    "/proc/PID/status": ("vm_swap_kb", "rss_anon_kb", "rss_file_kb"),
    "/proc/PID/stat": ("maj_flt",),
    "/proc/vmstat": VMSTAT_KEYS,
    "/proc/pressure/memory": ("psi_some_avg10", "psi_full_avg10"),
    "/sys/block/zram*/mm_stat": ("zram_used_kb",),
}


@dataclass(frozen=True)
class Reclaim:
    """One sample's reclaim values; None where the file was not readable (or the kernel lacks it)."""

    vm_swap_kb: int | None = None
    rss_anon_kb: int | None = None
    rss_file_kb: int | None = None
    maj_flt: int | None = None            # the engine's major faults since it started
    pswpin: int | None = None             # device-wide counters (pages), cumulative
    pswpout: int | None = None
    pgmajfault: int | None = None
    allocstall: int | None = None
    pgsteal_direct: int | None = None
    workingset_refault: int | None = None
    psi_some_avg10: float | None = None   # % of the last 10 s some task stalled on memory
    psi_full_avg10: float | None = None
    zram_used_kb: int | None = None       # RAM every zram device takes (mm_stat mem_used_total)

    def refused(self) -> list[str]:
        """The files this sample had no value from (a phone's SELinux policy may withhold some)."""
        return [path for path, keys in SOURCES.items() if all(getattr(self, k) is None for k in keys)]


COLUMNS = tuple(f.name for f in fields(Reclaim))


# the lines of /proc/vmstat a sample and a device state read (vmstat_counters)
VMSTAT_GREP = "grep -E '^(pswp|pgmajfault |allocstall|pgsteal_direct |workingset_refault)' /proc/vmstat 2>/dev/null"


def command(pid: int) -> str:
    """One shell line printing every file a sample reads, each after its marker (`parse`)."""
    return (f"echo {MARK}STATUS; grep -E '^(VmSwap|RssAnon|RssFile):' /proc/{pid}/status 2>/dev/null; "
            f"echo {MARK}STAT; cat /proc/{pid}/stat 2>/dev/null; "
            f"echo {MARK}VMSTAT; {VMSTAT_GREP}; "
            f"echo {MARK}PSI; cat /proc/pressure/memory 2>/dev/null; "
            f"echo {MARK}ZRAM; for z in /sys/block/zram*/mm_stat; do [ -r \"$z\" ] && cat \"$z\"; done 2>/dev/null")


def split(text: str) -> dict[str, str]:
    """`command`'s output by marker ("": what came before the first)."""
    return sections.split(text, MARK)


def _kb(text: str, key: str) -> int | None:
    m = re.search(rf"^{key}:\s+([0-9]+)\s*kB", text, re.MULTILINE)
    return int(m[1]) if m else None


def _majflt(stat: str) -> int | None:
    # comm may hold spaces and parentheses: the fields after it start past the last ')'
    rest = stat.rpartition(")")[2].split()
    return int(rest[9]) if len(rest) > 9 and is_digits(rest[9]) else None


def vmstat_counters(text: str) -> dict[str, int]:
    """VMSTAT_KEYS from /proc/vmstat's text (allocstall_* and workingset_refault_* summed)."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) != 2 or not is_digits(f[1]):
            continue
        name, value = f[0], int(f[1])
        key = next((k for k in ("allocstall", "workingset_refault") if name.startswith(k)), name)
        if key == "workingset_refault" and name not in ("workingset_refault", "workingset_refault_anon",
                                                        "workingset_refault_file"):
            continue
        if key in VMSTAT_KEYS:
            found[key] = found.get(key, 0) + value
    return found


def _psi(text: str, kind: str) -> float | None:
    m = re.search(rf"^{kind} avg10=([0-9]+(?:\.[0-9]+)?)", text, re.MULTILINE)
    return float(m[1]) if m else None


def _zram_kb(text: str) -> int | None:
    used = [int(f[2]) for f in (line.split() for line in text.splitlines()) if len(f) >= 3 and is_digits(f[2])]
    return sum(used) // 1024 if used else None


def parse(sections: Mapping[str, str]) -> Reclaim:
    """A Reclaim from the files' texts, keyed as `command` marks them."""
    status, vm = sections.get("STATUS", ""), vmstat_counters(sections.get("VMSTAT", ""))
    psi = sections.get("PSI", "")
    return Reclaim(vm_swap_kb=_kb(status, "VmSwap"), rss_anon_kb=_kb(status, "RssAnon"),
                   rss_file_kb=_kb(status, "RssFile"), maj_flt=_majflt(sections.get("STAT", "")),
                   **{k: vm.get(k) for k in VMSTAT_KEYS},
                   psi_some_avg10=_psi(psi, "some"), psi_full_avg10=_psi(psi, "full"),
                   zram_used_kb=_zram_kb(sections.get("ZRAM", "")))


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def read_process(pid: int) -> Reclaim:
    """Only the process's own values (VmSwap, RssAnon, RssFile, majflt), from its /proc files:
    what a watcher of one phone's processes on this host may read (the host-wide files below
    are every phone's at once)."""
    return parse({"STATUS": _read(f"/proc/{pid}/status"), "STAT": _read(f"/proc/{pid}/stat")})


def read_local(pid: int) -> Reclaim:
    """The same sample on this host, from the files themselves."""
    return parse({"STATUS": _read(f"/proc/{pid}/status"), "STAT": _read(f"/proc/{pid}/stat"),
                  "VMSTAT": _read("/proc/vmstat"), "PSI": _read("/proc/pressure/memory"),
                  "ZRAM": "".join(_read(p) for p in sorted(glob.glob("/sys/block/zram*/mm_stat")))})


PAGE_BYTES = 4096   # pswpin/pswpout count pages: 4 KiB unless the device says (DeviceIdentity.page_size_bytes)


def metrics(samples: Sequence[Reclaim], entry: Mapping[str, int] | None = None,
            exit: Mapping[str, int] | None = None, page_bytes: int = PAGE_BYTES) -> dict[str, Any]:
    """A run's reclaim figures from its samples (run.json `reclaim`): the engine's VmSwap high,
    RssAnon and RssFile low and high, PSI avg10 high, zram's high; the engine's major faults (first
    sample to last); and the device's counters' deltas (swap-in/out in KiB, pgmajfault, allocstall,
    pgsteal_direct, workingset_refault) from the device state read before the run (`entry`, the
    gate's) to the one after it (`exit`), or, where those lack a counter, from the first sample to the last.
    `refused` names the files no sample could read. Keys whose values no sample had are left out.
    `page_bytes`: the device's page size (its identity's), in which pswpin/pswpout count."""
    out: dict[str, Any] = {"samples": len(samples)}

    def values(name: str) -> list:
        return [v for v in (getattr(s, name) for s in samples) if v is not None]

    for name, key, pick in (("vm_swap_kb", "vm_swap_max_kb", max), ("rss_anon_kb", "rss_anon_min_kb", min),
                            ("rss_anon_kb", "rss_anon_max_kb", max), ("rss_file_kb", "rss_file_min_kb", min),
                            ("rss_file_kb", "rss_file_max_kb", max), ("psi_some_avg10", "psi_some_avg10_max", max),
                            ("psi_full_avg10", "psi_full_avg10_max", max), ("zram_used_kb", "zram_used_max_kb", max)):
        if vals := values(name):
            out[key] = pick(vals)
    for name, key, scale in (("maj_flt", "maj_flt", 1), ("pswpin", "swap_in_kb", page_bytes // 1024),
                             ("pswpout", "swap_out_kb", page_bytes // 1024), ("pgmajfault", "pgmajfault", 1),
                             ("allocstall", "allocstall", 1), ("pgsteal_direct", "pgsteal_direct", 1),
                             ("workingset_refault", "workingset_refault", 1)):
        around = [v for v in ((entry or {}).get(name), (exit or {}).get(name)) if v is not None]
        vals = around if len(around) == 2 and name in VMSTAT_KEYS else values(name)
        if len(vals) >= 2:
            out[key] = max(0, vals[-1] - vals[0]) * scale
    seen = [set(s.refused()) for s in samples]
    out["refused"] = sorted(set.intersection(*seen)) if seen else sorted(SOURCES)
    return out
