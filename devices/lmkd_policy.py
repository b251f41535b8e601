"""Android 14 lmkd's kill decision, as a pure function of what the phone's files say.

Modelled on AOSP system/memory/lmkd/lmkd.cpp, function mp_event_psi() (the PSI-driven path every
Android 10+ phone with `ro.lmk.use_psi` runs), of the Android 14 release, and its
find_and_kill_process() for the victim. One call of `Policy.decide` is one lmkd wakeup:

- swap is low when SwapFree < SwapTotal * swap_free_low_percentage / 100 (no swap at all: never
  low, as in lmkd, whose threshold is then 0);
- the watermark is the lowest of min/low/high breached by MemFree; the phone's watermarks are what
  the kernel computes from its RAM (`watermarks`);
- thrashing is the file workingset refaults since the reclaim cycle began, in percent of the file
  LRU at its start (vmstat workingset_refault_file against nr_active_file + nr_inactive_file);
- critical pressure is a PSI `full` stall over psi_complete_stall_ms within one second.

Then, in lmkd's order: PRESSURE_AFTER_KILL (a kill did not lift free memory above low),
NOT_RESPONDING (critical PSI), LOW_SWAP_AND_THRASHING, LOW_MEM_AND_SWAP, LOW_MEM_AND_THRASHING
(with thrashing_limit cut by thrashing_limit_decay after each such kill). Anything else: silent,
which is how a phone that still has free swap swaps instead of killing. The reason strings are
lmkd's kill_desc texts; the codes its kill_reasons enum (statslog.h), carried by killinfo.

Victims (find_and_kill_process): from oom_score_adj 1000 down to min_score_adj, the first adj with
a registered process (lmkd's per-adj lists hold only what ActivityManager registered with
LMK_PROCPRIO); within it the heaviest (RSS) when ro.lmk.kill_heaviest_task or at
PERCEPTIBLE_APP_ADJ and under, else the oldest, which is the tail of lmkd's per-adj list.
min_score_adj is 0, raised to 201 (PERCEPTIBLE_APP_ADJ + 1) while the min watermark still holds and
thrashing is under twice the limit.

Pure: the virtual phone's lmkd (devices/virtual/lmkd.py) and the harness's replay of a real phone's
samples give it the numbers. Its one reading helper, read_psi_full_total_us, is kept apart at the end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from devices.android import PERCEPTIBLE_APP_ADJ
from engine.units import ascii_int

# enum kill_reasons (lmkd statslog.h, Android 14)
PRESSURE_AFTER_KILL, NOT_RESPONDING, LOW_SWAP_AND_THRASHING, LOW_MEM_AND_SWAP, LOW_MEM_AND_THRASHING = 0, 1, 2, 3, 4

WMARK_MIN, WMARK_LOW, WMARK_HIGH, WMARK_NONE = 0, 1, 2, 3
PSI_WINDOW_S = 1.0
# lmkd's polling periods: PSI_POLL_PERIOD_SHORT_MS while swap is low or after a kill, else LONG
POLL_SHORT_S, POLL_LONG_S = 0.010, 0.100


@dataclass(frozen=True)
class LmkProps:
    """The ro.lmk.* properties lmkd reads, with Android 14's defaults for a non-low-RAM phone."""
    low: int = 1001
    medium: int = 800
    critical: int = 0
    critical_upgrade: bool = False
    upgrade_pressure: int = 100
    downgrade_pressure: int = 100
    kill_heaviest_task: bool = False
    kill_timeout_ms: int = 100
    use_minfree_levels: bool = False
    use_psi: bool = True
    swap_free_low_percentage: int = 10
    psi_partial_stall_ms: int = 70
    psi_complete_stall_ms: int = 700
    thrashing_limit: int = 100
    thrashing_limit_decay: int = 10
    swap_util_max: int = 100

    def props(self) -> dict[str, str]:
        """As getprop shows them (booleans as "true"/"false")."""
        out = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[f"ro.lmk.{name}"] = ("true" if value else "false") if isinstance(value, bool) else str(value)
        out["ro.lmk.thrashing_limit_critical"] = str(self.thrashing_limit * 2)
        return out

    @classmethod
    def from_json(cls, data: dict | None) -> LmkProps:
        return cls(**{k: v for k, v in (data or {}).items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Watermarks:
    min_kb: int
    low_kb: int
    high_kb: int


def watermarks(ram_kb: int, watermark_scale_factor: int = 10) -> Watermarks:
    """The zone watermarks the kernel would set for a phone of `ram_kb` (one zone):
    min_free_kbytes = sqrt(16 * lowmem kB) clamped to [128, 262144] (mm/page_alloc.c
    init_per_zone_wmark_min), low = min + max(min/4, RAM * scale/10000), high = min + 2 * that
    (__setup_per_zone_wmarks). lmkd sums these from /proc/zoneinfo; here they are computed."""
    min_kb = min(262144, max(128, int(math.sqrt(ram_kb * 16))))
    gap = max(min_kb // 4, ram_kb * watermark_scale_factor // 10000)
    return Watermarks(min_kb, min_kb + gap, min_kb + 2 * gap)


def lowest_breached(free_kb: int, w: Watermarks) -> int:
    if free_kb < w.min_kb:
        return WMARK_MIN
    if free_kb < w.low_kb:
        return WMARK_LOW
    if free_kb < w.high_kb:
        return WMARK_HIGH
    return WMARK_NONE


@dataclass(frozen=True)
class Reading:
    """One wakeup's numbers (kB, and cumulative counters)."""
    free_kb: int
    swap_total_kb: int
    swap_free_kb: int
    file_lru_kb: int = 0               # Active(file) + Inactive(file)
    workingset_refault_file: int = 0   # pages, cumulative (0: not known)
    psi_full_total_us: int | None = None  # /proc/pressure/memory "full total=", cumulative
    now_s: float = 0.0
    available_kb: int = 0              # MemAvailable: what reclaim could still free without swap


@dataclass(frozen=True)
class Decision:
    reason: int
    text: str
    min_score_adj: int


@dataclass
class Policy:
    """lmkd's state between wakeups (its statics in mp_event_psi)."""
    props: LmkProps
    marks: Watermarks
    killing: bool = False
    in_reclaim: bool = False
    base_file_lru_kb: int = 0
    init_refault: int = 0
    thrashing_limit: int = 0
    psi_window: list[tuple[float, int]] = field(default_factory=list)
    swap_is_low: bool = False

    def __post_init__(self) -> None:
        self.thrashing_limit = self.props.thrashing_limit

    def decide(self, r: Reading) -> Decision | None:
        p = self.props
        cycle_after_kill = self.killing
        self.killing = False
        if cycle_after_kill:
            self.base_file_lru_kb, self.init_refault = r.file_lru_kb, r.workingset_refault_file
        threshold_kb = r.swap_total_kb * p.swap_free_low_percentage // 100 if p.swap_free_low_percentage else 0
        swap_is_low = r.swap_free_kb < threshold_kb
        self.swap_is_low = swap_is_low
        wmark = lowest_breached(r.free_kb, self.marks)
        # A phone's memory cgroup reclaims when it is full: free under the high watermark is the
        # reclaim lmkd's vmstat pgscan check looks for.
        if wmark == WMARK_NONE:
            self.in_reclaim = False
            return None
        thrashing = 0
        if not self.in_reclaim:
            self.base_file_lru_kb, self.init_refault = r.file_lru_kb, r.workingset_refault_file
            self.thrashing_limit = p.thrashing_limit
        else:
            refault_kb = max(0, r.workingset_refault_file - self.init_refault) * 4
            thrashing = refault_kb * 100 // max(1, self.base_file_lru_kb)
        self.in_reclaim = True
        # System PSI is this host's, not the phone's: a stall counts only while the phone itself
        # has nothing left to reclaim but swap (MemAvailable under the high watermark).
        critical = self._critical(r) and r.available_kb < self.marks.high_kb
        name = "min" if wmark < WMARK_LOW else "low"
        thrashing_critical = p.thrashing_limit * 2
        soft = PERCEPTIBLE_APP_ADJ + 1 if wmark > WMARK_MIN and thrashing < thrashing_critical else 0
        if cycle_after_kill and wmark < WMARK_LOW:
            return Decision(PRESSURE_AFTER_KILL, "min watermark is breached even after kill", 0)
        if critical:
            return Decision(NOT_RESPONDING, "device is not responding", 0)
        if swap_is_low and thrashing > p.thrashing_limit:
            return Decision(LOW_SWAP_AND_THRASHING, f"device is low on swap ({r.swap_free_kb}kB < {threshold_kb}kB) "
                            f"and thrashing ({thrashing}%)", soft)
        if swap_is_low and wmark < WMARK_HIGH:
            return Decision(LOW_MEM_AND_SWAP, f"{name} watermark is breached and swap is low "
                            f"({r.swap_free_kb}kB < {threshold_kb}kB)", soft)
        if thrashing > self.thrashing_limit:
            self.thrashing_limit = self.thrashing_limit * (100 - p.thrashing_limit_decay) // 100
            return Decision(LOW_MEM_AND_THRASHING, f"{name} watermark is breached and thrashing ({thrashing}%)",
                            PERCEPTIBLE_APP_ADJ)
        return None

    def _critical(self, r: Reading) -> bool:
        """A `full` stall of psi_complete_stall_ms within the last second (lmkd's critical PSI
        trigger)."""
        if r.psi_full_total_us is None:
            return False
        self.psi_window = [(t, v) for t, v in self.psi_window if r.now_s - t <= PSI_WINDOW_S]
        self.psi_window.append((r.now_s, r.psi_full_total_us))
        stalled_ms = (r.psi_full_total_us - self.psi_window[0][1]) / 1000
        return stalled_ms >= self.props.psi_complete_stall_ms

    @property
    def poll_interval_s(self) -> float:
        """lmkd polls fast while swap is low or a kill is pending, else at the long period."""
        return POLL_SHORT_S if self.swap_is_low or self.killing else POLL_LONG_S

    def killed(self) -> None:
        """A kill was made: the next wakeup is a cycle after a kill."""
        self.killing = True


@dataclass(frozen=True)
class Candidate:
    pid: int
    oom_score_adj: int
    rss_kb: int
    started: float  # start time (older first)


def choose_victim(procs: Sequence[Candidate], min_score_adj: int, heaviest: bool) -> Candidate | None:
    """find_and_kill_process: the highest oom_score_adj >= min_score_adj that has a process with
    memory; within it the heaviest, or the oldest. At PERCEPTIBLE_APP_ADJ and under, always the
    heaviest, "to hopefully minimize the number of victims" (Android 12+). `procs` are lmkd's
    registered processes, never every process of the phone."""
    eligible = [c for c in procs if c.oom_score_adj >= min_score_adj and c.rss_kb > 0]
    if not eligible:
        return None
    top = max(c.oom_score_adj for c in eligible)
    level = [c for c in eligible if c.oom_score_adj == top]
    if heaviest or top <= PERCEPTIBLE_APP_ADJ:
        return max(level, key=lambda c: (c.rss_kb, -c.started))
    return min(level, key=lambda c: (c.started, c.pid))


def read_psi_full_total_us(path: str = "/proc/pressure/memory") -> int | None:
    """The `full` line's cumulative stall (µs) of system memory PSI; None where PSI is missing."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("full"):
                    return ascii_int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None
    return None
