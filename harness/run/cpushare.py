"""Which engines share a CPU while a campaign runs, and whether a run's threads fit its cores.

ggml's thread pool spins when an engine's threads exceed the cores it gets: bmoe-cli 0.19.0 with
`-t 4` on a 2-core host decodes a tiny model at 0.754 s/token instead of 0.001, and two engines
with `-t 2` each at 0.42 s/token. Such a run measured the contention, not its configuration, so
the harness records for every run what it saw and results flag it (`oversubscribed`).

- **Cores**, read on the device right before each run: `/sys/devices/system/cpu/online` (the
  cores its kernel runs) and `nproc` (those a process started there may use: its affinity). The
  usable count is what `-t auto` takes (at most harness.campaign.model.THREADS_AUTO_MAX).
- **Who shares them**: devices whose kernels are one kernel — the same boot id
  (`/proc/sys/kernel/random/boot_id`, one value per booted kernel, the same in every namespace) —
  and whose CPU sets meet: `Cpus_allowed_list` of a process started there (a virtual phone's
  cpuset, `virtual up --cpus`), so two phones on cores of their own do not count each other, nor
  does an engine outside the campaign pinned elsewhere (its affinity). A set not reported is
  taken to meet every set.
  This host and every virtual phone on it report this host's boot id (a virtual phone runs its
  commands on this host's kernel); a real phone reports its own, and a device that cannot tell is
  counted alone. (An emulator with its own kernel, e.g. QEMU, looks like a phone of its own.)
- **Engines counted**: the campaign's own runs on devices of one kernel, and on this host's
  kernel any other engine process on this host (`bmoe-cli`, `bmoe-py` by process name: another
  campaign, a user's own run), polled every POLL_S while a run of this host's kernel lives.
- **Threads of an engine**: its `-t` (the default, 4, when absent), bmoe-cli's and bmoe-py's alike:
  bmoe-py's quantized kernels compute on `-t` threads (docs/decisions/compute-threads.md).

A run is **oversubscribed** when, at some moment while it ran, the threads of the engines sharing
its cores summed to more than its cores.
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from engine.interface.flags import THREADS
from engine.units import is_digits

ENGINE_NAMES = ("bmoe-cli", "bmoe-py")
PYTHON_ENGINE_NAME = "bmoe-py"
CLI_DEFAULT_THREADS = int(THREADS.default)   # bmoe-cli's -t when none is given
POLL_S = 0.5
_MARK = "@@BMOE-CPU"
# one shell line, so a phone answers in one adb round trip; each part may fail on its own
CPU_SCRIPT = (f"cat /sys/devices/system/cpu/online 2>/dev/null; echo {_MARK}; nproc 2>/dev/null; echo {_MARK}; "
              f"cat /proc/sys/kernel/random/boot_id 2>/dev/null; echo {_MARK}; "
              "grep -E '^Cpus_allowed_list' /proc/self/status 2>/dev/null")
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
ONLINE_PATH = "/sys/devices/system/cpu/online"


@dataclass(frozen=True)
class CpuSeen:
    """What a device said about its CPU just before a run (None: it did not say)."""

    cores_online: int | None
    cores_usable: int | None
    boot_id: str | None
    cpus: frozenset[int] | None = None     # the CPUs a process started there may run on

    @property
    def cores(self) -> int | None:
        """The cores an engine started there can run on."""
        return self.cores_usable or self.cores_online


MAX_CPUS = 4096                       # a CPU list naming more is no list a kernel wrote


def cpu_set(text: str) -> frozenset[int] | None:
    """The CPUs of a kernel CPU list such as `0-3,6,8-9` (None: not such a list)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        if not (is_digits(lo) and (not hi or is_digits(hi))):
            return None
        first, last = int(lo), int(hi or lo)
        if last < first or last >= MAX_CPUS:
            return None
        cpus.update(range(first, last + 1))
    return frozenset(cpus) or None


def count_cpu_list(text: str) -> int | None:
    """The number of CPUs in a kernel CPU list such as `0-3,6,8-9`."""
    cpus = cpu_set(text)
    return len(cpus) if cpus else None


def parse_cpu_report(text: str) -> CpuSeen:
    """CPU_SCRIPT's output."""
    parts = (text.split(_MARK) + ["", "", "", ""])[:4]
    usable = parts[1].strip()
    boot = parts[2].strip().lower()
    _, _, allowed = parts[3].partition(":")
    return CpuSeen(count_cpu_list(parts[0]) if parts[0].strip() else None,
                   int(usable) if is_digits(usable) and int(usable) > 0 else None,
                   boot if len(boot) >= 16 else None,
                   cpu_set(allowed) if allowed.strip() else None)


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def host_boot_id() -> str | None:
    boot = _read(BOOT_ID_PATH).strip().lower()
    return boot or None


def local_cpu() -> CpuSeen:
    """This host's CPU, as the engines the harness starts here see it (the harness's affinity)."""
    online = _read(ONLINE_PATH)
    affinity = frozenset(os.sched_getaffinity(0))
    return CpuSeen(count_cpu_list(online) if online.strip() else os.cpu_count(), len(affinity),
                   host_boot_id(), affinity)


def meet(a: frozenset[int] | None, b: frozenset[int] | None) -> bool:
    """Whether two CPU sets share a core (an unknown set may share any)."""
    return a is None or b is None or not a.isdisjoint(b)


def engine_threads(name: str, argv: Sequence[str]) -> int:
    """The compute threads an engine process runs: its -t/--threads, CLI_DEFAULT_THREADS without one
    (bmoe-py's kernels run on -t threads too, and its default is bmoe-cli's)."""
    args = list(argv)
    for i, arg in enumerate(args[:-1]):
        if arg in THREADS.spellings and is_digits(args[i + 1]):
            return max(1, int(args[i + 1]))
    return CLI_DEFAULT_THREADS


@dataclass(frozen=True)
class EngineProcess:
    pid: int
    name: str
    threads: int
    argv: tuple[str, ...]
    cpus: frozenset[int] | None = None     # its affinity


def host_engines() -> list[EngineProcess]:
    """Engine processes running on this host (zombies and stopped ones use no CPU)."""
    out = []
    for p in psutil.process_iter(["pid", "name", "cmdline", "status", "cpu_affinity"]):
        info = p.info
        if info.get("name") not in ENGINE_NAMES or info.get("status") in (
                psutil.STATUS_ZOMBIE, psutil.STATUS_STOPPED, psutil.STATUS_DEAD):
            continue
        argv = tuple(info.get("cmdline") or ())
        if not argv:
            # an exiting process (its memory, and so its cmdline, already gone) or one mid-exec:
            # it cannot be told from this campaign's own engine, and it is about to run no more
            continue
        affinity = info.get("cpu_affinity")
        out.append(EngineProcess(info["pid"], info["name"], engine_threads(info["name"], argv), argv,
                                 frozenset(affinity) if affinity else None))
    return out


@dataclass(eq=False)
class ActiveRun:
    """One run while it lives, as the share ledger tracks it."""

    device: str
    cell_id: str
    seen: CpuSeen
    domain: str
    threads: int
    marker: str                       # an argv element only this run's process has (its CSV path)
    on_host: bool                     # this host's kernel (so this host's processes count)
    peak: int = 0
    peers: dict[str, dict[str, Any]] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """run.json's `cpu` (docs/campaign-dir.md)."""
        cores = self.seen.cores
        return {"cores": cores, "cores_online": self.seen.cores_online, "cores_usable": self.seen.cores_usable,
                "boot_id": self.seen.boot_id,
                "cpu_list": None if self.seen.cpus is None else sorted(self.seen.cpus),
                "shares_host": self.on_host, "threads": self.threads,
                "threads_sum": self.peak, "engines": list(self.peers.values()),
                "oversubscribed": None if cores is None else self.peak > cores}


class CpuShare:
    """The campaign's ledger of running engines per kernel. Workers call begin() right before they
    start an engine and end() when it is gone; a poller adds this host's other engines."""

    def __init__(self, scan: Callable[[], list[EngineProcess]] = host_engines, poll_s: float = POLL_S):
        self.scan = scan
        self.poll_s = poll_s
        self.host_boot = host_boot_id()
        self._lock = threading.Lock()
        self._active: list[ActiveRun] = []
        self._poller: threading.Thread | None = None

    def domain_of(self, device: str, seen: CpuSeen) -> str:
        return f"boot:{seen.boot_id}" if seen.boot_id else f"device:{device}"

    def begin(self, device: str, cell_id: str, seen: CpuSeen, threads: int, marker: str) -> ActiveRun:
        on_host = seen.boot_id is not None and seen.boot_id == self.host_boot
        run = ActiveRun(device, cell_id, seen, self.domain_of(device, seen), threads, marker, on_host)
        with self._lock:
            self._active.append(run)
            self._account(run.domain)
            if on_host and (self._poller is None or not self._poller.is_alive()):
                self._poller = threading.Thread(target=self._poll, name="bmoe-cpushare", daemon=True)
                self._poller.start()
        if on_host:
            self._scan_host()                # engines already running when this one starts
        return run

    def end(self, run: ActiveRun) -> dict[str, Any]:
        with self._lock:
            if run in self._active:
                self._active.remove(run)
        return run.record()

    # -- accounting ---------------------------------------------------------------------------
    def _account(self, domain: str, outside: Sequence[EngineProcess] = ()) -> None:
        """One moment: every run of the domain sees the others whose CPU sets meet its own (and this
        host's outside engines whose affinity meets it)."""
        runs = [r for r in self._active if r.domain == domain]
        for r in runs:
            mine = r.seen.cpus
            others = [o for o in runs if o is not r and meet(mine, o.seen.cpus)]
            near = [p for p in outside if meet(mine, p.cpus)]
            r.peak = max(r.peak, r.threads + sum(o.threads for o in others) + sum(p.threads for p in near))
            for other in others:
                r.peers[f"{other.device}/{other.cell_id}"] = {
                    "device": other.device, "cell_id": other.cell_id, "threads": other.threads}
            for p in near:
                r.peers[f"pid:{p.pid}"] = {"pid": p.pid, "name": p.name, "threads": p.threads, "outside": True,
                                           "command": shlex.join(p.argv)[:300]}

    def _scan_host(self) -> None:
        found = self.scan()
        with self._lock:
            host_runs = [r for r in self._active if r.on_host]
            if not host_runs:
                return
            ours = {r.marker for r in host_runs}
            outside = [p for p in found if not ours.intersection(p.argv)]
            self._account(host_runs[0].domain, outside)

    def _poll(self) -> None:
        while True:
            with self._lock:
                if not any(r.on_host for r in self._active):
                    self._poller = None
                    return
            self._scan_host()
            time.sleep(self.poll_s)
