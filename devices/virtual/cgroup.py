"""A virtual phone's memory cgroup (v1 or v2): its RAM limit, usage, OOM-kill counter and members.

Layout. v1: `<memory mount>/<our own memory cgroup>/bmoe-vphone-NAME-XXXXXX` with memory.limit_in_bytes =
RAM (memory.memsw.limit_in_bytes = RAM + the phone's zram when swap accounting exists,
memory.swappiness Android's where the phone has zram, else memsw = RAM and swappiness 0), plus the
same path under the cpuacct hierarchy for CPU time when it is mounted. Nesting under the cgroup the
daemon was started in keeps the phone inside whatever limit and bookkeeping its caller has. v2:
`<cgroup2 mount>/<own cgroup or root>/bmoe-vphone-NAME-XXXXXX` with memory.max = RAM, memory.swap.max = 0;
v2 forbids controllers below a cgroup that holds processes, so we nest under our own cgroup only
when memory is already delegated there, else under the root. The daemon itself never joins: an
OOM kill must never hit the phone's adbd, and its memory is not the phone's. XXXXXX is a hash of
the phone's folder: two homes may both have a phone "pixel", and a new phone kills whatever is
left in its cgroup, so two phones must never share one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from devices.virtual import host_records
from engine.fsutil import atomic_write
from engine.units import is_digits

PREFIX = "bmoe-vphone-"
# one file per group made here, named by its leaf: the making daemon's pid, then the group's folders,
# so a group whose daemon died before its stop (and whose phone folder may be gone) is found
REGISTRY = Path("/run/bmoe-vphone-cgroups")


class CgroupUnavailable(Exception):
    """No writable memory cgroup hierarchy here (not root, or none mounted)."""


@dataclass(frozen=True)
class MemStat:
    """The cgroup's memory.stat, normalised to bytes and v2 names (v1 `total_*` keys map here)."""
    usage_bytes: int
    anon_bytes: int = 0
    file_bytes: int = 0
    shmem_bytes: int = 0
    active_anon_bytes: int = 0
    inactive_anon_bytes: int = 0
    active_file_bytes: int = 0
    inactive_file_bytes: int = 0
    mapped_bytes: int = 0
    unevictable_bytes: int = 0
    slab_reclaimable_bytes: int = 0
    slab_unreclaimable_bytes: int = 0
    kernel_stack_bytes: int = 0
    pagetables_bytes: int = 0
    swap_cached_bytes: int = 0


_V1_KEYS = {"total_rss": "anon_bytes", "total_cache": "file_bytes", "total_shmem": "shmem_bytes",
            "total_active_anon": "active_anon_bytes", "total_inactive_anon": "inactive_anon_bytes",
            "total_active_file": "active_file_bytes", "total_inactive_file": "inactive_file_bytes",
            "total_mapped_file": "mapped_bytes", "total_unevictable": "unevictable_bytes",
            "total_swapcached": "swap_cached_bytes"}
_V2_KEYS = {"anon": "anon_bytes", "file": "file_bytes", "shmem": "shmem_bytes",
            "active_anon": "active_anon_bytes", "inactive_anon": "inactive_anon_bytes",
            "active_file": "active_file_bytes", "inactive_file": "inactive_file_bytes",
            "file_mapped": "mapped_bytes", "unevictable": "unevictable_bytes",
            "slab_reclaimable": "slab_reclaimable_bytes", "slab_unreclaimable": "slab_unreclaimable_bytes",
            "kernel_stack": "kernel_stack_bytes", "pagetables": "pagetables_bytes",
            "swapcached": "swap_cached_bytes"}


def leaf_name(name: str, root: os.PathLike | str) -> str:
    digest = hashlib.sha1(str(Path(root).resolve()).encode()).hexdigest()[:6]
    return f"{PREFIX}{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{digest}"


def _mounts() -> list[tuple[str, str, set[str]]]:
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] in ("cgroup", "cgroup2"):
            out.append((fields[1].replace("\\040", " "), fields[2], set(fields[3].split(","))))
    return out


def _own_path(controller: str | None) -> str:
    """Our cgroup path in the v1 hierarchy holding `controller` (None: the v2 hierarchy)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _hid, controllers, path = line.split(":", 2)
        names = controllers.split(",") if controllers else []
        if (controller is None and controllers == "") or (controller and controller in names):
            return path
    return "/"


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_int(path: Path) -> int:
    return int(path.read_text().split()[0])


def _keyed(path: Path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and is_digits(parts[1].removeprefix("-")):
            out[parts[0]] = int(parts[1])
    return out


class MemoryCgroup:
    def __init__(self, version: int, path: Path, cpu_path: Path | None):
        self.version = version
        self.path = path
        self.cpu_path = cpu_path
        self.extra: list[Path] = []   # the phone's cpuset group (cpuinfo.py), joined and removed alike

    # -- creation ---------------------------------------------------------------------------
    @classmethod
    def create(cls, name: str, root: os.PathLike | str, ram_bytes: int, swap_bytes: int = 0,
               swappiness: int = 100) -> MemoryCgroup:
        leaf = leaf_name(name, root)
        mounts = _mounts()
        v1_memory = next((m for m in mounts if m[1] == "cgroup" and "memory" in m[2]), None)
        try:
            if v1_memory:
                cg = cls._create_v1(v1_memory[0], leaf, mounts)
            else:
                v2 = next((m for m in mounts if m[1] == "cgroup2"), None)
                if v2 is None or "memory" not in Path(v2[0], "cgroup.controllers").read_text().split():
                    raise CgroupUnavailable("no memory cgroup hierarchy is mounted")
                cg = cls._create_v2(Path(v2[0]), leaf)
            cg.kill_all()  # a stale group from a daemon that died keeps no stragglers
            cg.record()
            cg.set_limit(ram_bytes, swap_bytes, swappiness)
            return cg
        except OSError as e:
            raise CgroupUnavailable(f"memory cgroup not usable: {e}") from None

    @classmethod
    def _create_v1(cls, mount: str, leaf: str, mounts) -> MemoryCgroup:
        path = Path(mount + _own_path("memory").rstrip("/"), leaf)
        path.mkdir(exist_ok=True)
        cpu_path = None
        cpuacct = next((m for m in mounts if m[1] == "cgroup" and "cpuacct" in m[2]), None)
        if cpuacct:
            try:
                cpu_path = Path(cpuacct[0] + _own_path("cpuacct").rstrip("/"), leaf)
                cpu_path.mkdir(exist_ok=True)
            except OSError:
                cpu_path = None
        return cls(1, path, cpu_path)

    @classmethod
    def _create_v2(cls, mount: Path, leaf: str) -> MemoryCgroup:
        own = Path(str(mount) + _own_path(None).rstrip("/"))
        for parent in (own, mount):
            enabled = Path(parent, "cgroup.subtree_control").read_text().split()
            if "memory" not in enabled:
                try:
                    _write(Path(parent, "cgroup.subtree_control"), "+memory")
                except OSError:
                    continue
            path = Path(parent, leaf)
            path.mkdir(exist_ok=True)
            return cls(2, path, path)
        raise CgroupUnavailable("cannot enable the memory controller for a child cgroup")

    def set_limit(self, ram_bytes: int, swap_bytes: int = 0, swappiness: int = 100) -> None:
        """The phone's RAM: the group's memory limit, with swap (its own zram's size, 0: none) and
        the OOM killer as a phone has them."""
        if self.version == 1:
            memsw = self.path / "memory.memsw.limit_in_bytes"
            if swap_bytes and not memsw.exists():
                raise CgroupUnavailable("no swap accounting (memory.memsw.*): a phone's zram would be "
                                        "every process's swap (boot with swapaccount=1)")
            # memsw must stay >= the plain limit: raise it first when growing, lower it last.
            if memsw.exists():
                _write(memsw, "-1")
            _write(self.path / "memory.limit_in_bytes", str(ram_bytes))
            if memsw.exists():
                _write(memsw, str(ram_bytes + swap_bytes))
            for knob, value in (("memory.swappiness", str(swappiness if swap_bytes else 0)),
                                ("memory.oom_control", "0")):
                with contextlib.suppress(OSError):
                    _write(self.path / knob, value)
        else:
            _write(self.path / "memory.max", str(ram_bytes))
            for knob, value in (("memory.swap.max", str(swap_bytes)), ("memory.oom.group", "0")):
                if (self.path / knob).exists():
                    _write(self.path / knob, value)
            if swap_bytes and (self.path / "memory.swappiness").exists():   # some v2 kernels only
                with contextlib.suppress(OSError):
                    _write(self.path / "memory.swappiness", str(swappiness))

    def pressure_events(self) -> int | None:
        """An eventfd that the kernel signals whenever it reclaims in this group (v1 vmpressure,
        `memory.pressure_level` at "low": every reclaim window of the group); None where there is none
        (v2). What wakes the phone's lmkd during reclaim, as PSI's triggers wake a phone's."""
        if self.version != 1:
            return None
        efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            level = os.open(self.path / "memory.pressure_level", os.O_RDONLY | os.O_CLOEXEC)
            try:
                _write(self.path / "cgroup.event_control", f"{efd} {level} low")
            finally:
                os.close(level)
        except OSError:
            os.close(efd)
            return None
        return efd

    # -- reading ----------------------------------------------------------------------------
    def procs_files(self) -> list[Path]:
        files = [self.path / "cgroup.procs"]
        if self.cpu_path is not None and self.cpu_path != self.path:
            files.append(self.cpu_path / "cgroup.procs")
        files.extend(p / "cgroup.procs" for p in self.extra)
        return files

    def limit_bytes(self) -> int:
        raw = (self.path / ("memory.limit_in_bytes" if self.version == 1 else "memory.max")).read_text().strip()
        return -1 if raw == "max" else int(raw)

    def mem_stat(self) -> MemStat:
        usage = _read_int(self.path / ("memory.usage_in_bytes" if self.version == 1 else "memory.current"))
        raw = _keyed(self.path / "memory.stat")
        keys = _V1_KEYS if self.version == 1 else _V2_KEYS
        return MemStat(usage_bytes=usage, **{field: raw.get(key, 0) for key, field in keys.items()})

    def swap_bytes(self) -> int:
        """What the group has in swap now (v1: memsw usage - usage; v2: memory.swap.current)."""
        try:
            if self.version == 1:
                memsw = self.path / "memory.memsw.usage_in_bytes"
                if not memsw.exists():
                    return 0
                return max(0, _read_int(memsw) - _read_int(self.path / "memory.usage_in_bytes"))
            return _read_int(self.path / "memory.swap.current")
        except (OSError, ValueError):
            return 0

    def stat_counters(self) -> dict[str, int]:
        """The group's counters from memory.stat (v1: its hierarchical total_* keys, prefix dropped):
        pgfault, pgmajfault, workingset_refault_anon/file, swap (bytes), swapcached; v2's own names
        (among them pswpin and pswpout, which v1 never shows: mm/memcontrol-v1.c memcg1_events)."""
        raw = _keyed(self.path / "memory.stat")
        if self.version == 1:
            return {k[len("total_"):]: v for k, v in raw.items() if k.startswith("total_")}
        return raw

    def oom_kills(self) -> int:
        if self.version == 1:
            return _keyed(self.path / "memory.oom_control").get("oom_kill", 0)
        return _keyed(self.path / "memory.events").get("oom_kill", 0)

    def cpu_usage_ns(self) -> int | None:
        try:
            if self.version == 1:
                return _read_int(self.cpu_path / "cpuacct.usage") if self.cpu_path else None
            return _keyed(self.path / "cpu.stat")["usage_usec"] * 1000
        except (OSError, KeyError, ValueError):
            return None

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    # -- teardown ---------------------------------------------------------------------------
    def kill_all(self, timeout_s: float = 3.0) -> None:
        """SIGKILL every process in the group until none is left or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        while True:
            pids = self.pids()
            if not pids or time.monotonic() > deadline:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def folders(self) -> list[Path]:
        return list(dict.fromkeys([self.path, *self.extra, *([self.cpu_path] if self.cpu_path is not None else [])]))

    def add_extra(self, path: Path) -> None:
        """Join another controller's group (the phone's cpuset) to this one: removed with it."""
        self.extra.append(path)
        self.record()

    def record(self) -> None:
        """Write this group's registry entry (REGISTRY): this process owns it, and these are its folders."""
        host_records.write_entry(REGISTRY, self.path.name, lambda entry: atomic_write(
            entry, "\n".join([str(os.getpid()), *map(str, self.folders())]) + "\n"))

    def remove(self) -> None:
        """Kill what is left and remove the group's folders (retrying while the kernel still holds them)."""
        self.kill_all()
        for path in self.folders():
            for _ in range(40):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
        if not any(p.exists() for p in self.folders()):
            host_records.remove_entry(REGISTRY, self.path.name)


def daemon_alive(pid: int) -> bool:
    """Whether `pid` is a running phone daemon (`python -m devices.virtual.run`)."""
    try:
        return b"devices.virtual.run" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def reclaim_orphans() -> list[str]:
    """Remove every group made here whose daemon is gone (killed before its stop), with what is left
    in it: the names of the groups removed. A group whose folders the kernel will not let go of yet
    keeps its registry entry (`remove`), so a later start removes it."""
    removed: list[str] = []
    if not REGISTRY.is_dir():
        return removed
    for entry in REGISTRY.iterdir():
        if entry.name.startswith("."):
            continue
        with contextlib.suppress(OSError, ValueError):
            pid, *folders = entry.read_text().split()
            if int(pid) == os.getpid() or daemon_alive(int(pid)):
                continue
            cg = MemoryCgroup(1, Path(folders[0]), None)
            cg.extra = [Path(p) for p in folders[1:]]
            cg.remove()
            if not any(p.exists() for p in cg.folders()):
                removed.append(entry.name)
    return removed


HOST_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class SwapTraffic:
    """A memory cgroup's own swap traffic, in this host's pages, cumulative: what a phone's
    /proc/vmstat shows as pswpin and pswpout, whichever swap area the pages went to
    (docs/virtual-phones.md, "How a phone's swap counters are derived").

    Where memory.stat counts them (cgroup v2: Documentation/admin-guide/cgroup-v2.rst), the kernel's
    own per-group pswpin and pswpout. cgroup v1 has neither, so here:
    - swapped in = workingset_refault_anon: every anonymous page read back from swap into the group
      whose eviction left a shadow entry, as reclaim's always does (mm/workingset.c
      workingset_refault, called for each swap-in in mm/memory.c do_swap_page);
    - swapped out = the rises of (in swap now + swapped in), added up read by read. A page swapped
      out adds to the group's `swap` (mm/memcontrol-v1.c memcg1_swapout); one swapped back in leaves
      `swap` (memcg1_swapin) and adds a refault, so the sum stays; one freed while in swap (its
      process exited, or unmapped it) leaves `swap` alone, which is no traffic and no rise. A
      swap-out and such a free between two reads hide each other: swapped out can only be short,
      never more than the group wrote.
    """

    def __init__(self, cgroup: MemoryCgroup) -> None:
        self.cgroup = cgroup
        self._held_pages: int | None = None    # in swap + swapped in, at the last read
        self._in_pages = 0
        self._out_pages = 0

    def read(self, counters: dict[str, int] | None = None) -> tuple[int, int]:
        """(pages swapped in, pages swapped out) so far. `counters`: the group's stat_counters()
        when the caller has just read them; the last values where memory.stat cannot be read."""
        try:
            stat = self.cgroup.stat_counters() if counters is None else counters
        except OSError:
            return self._in_pages, self._out_pages
        if "pswpin" in stat and "pswpout" in stat:
            self._in_pages, self._out_pages = stat["pswpin"], stat["pswpout"]
            return self._in_pages, self._out_pages
        swap_bytes = stat["swap"] if "swap" in stat else self.cgroup.swap_bytes()
        self._in_pages = max(self._in_pages, stat.get("workingset_refault_anon", 0))
        held = swap_bytes // HOST_PAGE_BYTES + self._in_pages
        # the first read: what is in swap, or came back from it, went out at some point
        self._out_pages += held if self._held_pages is None else max(0, held - self._held_pages)
        self._held_pages = held
        return self._in_pages, self._out_pages


def remove_path(path: Path) -> None:
    """Kill what is left in a phone's cgroup folder and remove it."""
    MemoryCgroup(1, path, None).remove()
