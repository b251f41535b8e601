"""The Device protocol: the only thing the campaign runner knows about where an engine runs.

This host, a phone over adb and a virtual phone (reached through adb, like a real one) all
satisfy it. Records are immutable and carry units in their names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from devices import thermal_zones
from devices.lmk import LmkEvent
from devices.lmkd_inputs import LmkdSample
from devices.reclaim import Reclaim
from engine.errors import BmoeError
from engine.procfs import parse_kb_fields
from engine.units import KIB

# read_range offsets are multiples of this: a phone reads them with dd's block skip (toybox dd
# has no byte-granular skip), and a GGUF header is read in whole pieces of it anyway.
RANGE_ALIGN = 64 * KIB
# the page size a device that cannot say its own is taken to have: arm64 Android and x86 kernels
# before 16 KiB pages (developer.android.com, "Support 16 KB page sizes")
PAGE_SIZE_DEFAULT_BYTES = 4096


class DeviceError(BmoeError):
    """A device refused or failed an operation (push failed, command could not start…)."""


class PushRefused(DeviceError):
    """The device refused a push for a reason another try cannot change: no room, no permission, a
    read-only or impossible path (adbd's `couldn't create file: …`/`write failed: …` answers). The
    runner does not retry it (a rerun does, after the user freed space or chose another folder)."""


class DeviceLost(DeviceError):
    """The device went away (unplugged, adb connection dropped, virtual phone stopped)."""


class RunInterrupted(DeviceLost):
    """A run ended because the campaign was stopped (Ctrl-C, SIGTERM), not by the device: the
    attempt is discarded, never recorded. A DeviceLost so that code not expecting it treats the
    run's result as unknown."""


@dataclass(frozen=True)
class DeviceIdentity:
    serial: str
    backend: str                 # local | adb
    model: str
    manufacturer: str
    soc: str
    abi: str
    android_release: str         # "" for a Linux host
    sdk: int | None
    ram_total_kb: int
    swap_total_kb: int
    kernel: str = ""
    # The ABI of the binaries this device really executes when they are this host's: this host
    # itself, or a virtual phone (it reports a phone ABI but runs host programs; getprop
    # ro.bmoe.host_abi). Empty on a real phone, which runs only builds for `abi`.
    host_abi: str = ""
    # the kernel's page size (`getconf PAGESIZE`): counters kept in pages (pswpin, pswpout) are in
    # pages of this size; Android 15 phones may run 16 KiB pages
    page_size_bytes: int = PAGE_SIZE_DEFAULT_BYTES

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class CpuFreqPolicy:
    name: str                    # policy0, policy4 …
    scaling_max_khz: int | None
    cpuinfo_max_khz: int | None

    @property
    def capped(self) -> bool:
        """A policy whose scaling maximum sits under the hardware maximum (thermal or power cap)."""
        return bool(self.scaling_max_khz and self.cpuinfo_max_khz and self.scaling_max_khz < self.cpuinfo_max_khz)


@dataclass(frozen=True)
class DeviceState:
    """A snapshot of the conditions a measurement depends on (docs/method.md rules 1-2)."""

    taken_at_s: float            # epoch seconds on the host
    mem_available_kb: int | None
    mem_free_kb: int | None
    swap_free_kb: int | None
    thermal_mc: Mapping[str, int] = field(default_factory=dict)   # zone type -> milli-°C (devices.thermal_zones.to_mc)
    battery_temp_dc: int | None = None                            # deci-°C, dumpsys battery
    thermal_status: int | None = None                             # dumpsys thermalservice
    cpufreq: tuple[CpuFreqPolicy, ...] = ()
    vmstat: Mapping[str, int] = field(default_factory=dict)        # reclaim counters (devices.reclaim.VMSTAT_KEYS)
    # the zones the device's history found constant up to this read (devices.thermal_zones.ZoneHistory),
    # and those whose value was no temperature (zone -> why)
    constant_zones: tuple[str, ...] = ()
    unreadable_zones: Mapping[str, str] = field(default_factory=dict)

    @property
    def cpu_zone(self) -> str | None:
        """The CPU sensor to gate on (devices.thermal_zones.cpu_zone: the hottest CPU zone that is
        neither a trip point nor constant; upstream reads the first `cpu-*` zone, the hottest is
        the conservative choice when there are several)."""
        return thermal_zones.cpu_zone(self.thermal_mc, self.constant_zones)[0]

    @property
    def cpu_temp_mc(self) -> int | None:
        """The temperature of `cpu_zone` (m°C), None without one."""
        zone = self.cpu_zone
        return self.thermal_mc[zone] if zone is not None else None

    def zones_ignored(self) -> dict[str, str]:
        """The CPU zones left out of `cpu_zone` and the zones that read no temperature, each with why."""
        return {**thermal_zones.cpu_zone(self.thermal_mc, self.constant_zones)[1], **self.unreadable_zones}

    def to_dict(self) -> dict:
        return {
            "taken_at_s": self.taken_at_s, "mem_available_kb": self.mem_available_kb,
            "mem_free_kb": self.mem_free_kb, "swap_free_kb": self.swap_free_kb,
            "thermal_mc": dict(self.thermal_mc), "cpu_temp_mc": self.cpu_temp_mc, "cpu_zone": self.cpu_zone,
            "zones_ignored": self.zones_ignored(),
            "battery_temp_dc": self.battery_temp_dc, "thermal_status": self.thermal_status,
            "cpufreq": [p.__dict__ | {"capped": p.capped} for p in self.cpufreq],
            "vmstat": dict(self.vmstat),
        }


@dataclass(frozen=True)
class PressureSample:
    """One ~1 Hz sample taken while the engine lives."""

    t_s: float                   # seconds since the process started
    mem_available_kb: int | None
    vm_hwm_kb: int | None
    vm_rss_kb: int | None
    cpu_temp_mc: int | None
    battery_temp_dc: int | None = None
    reclaim: Reclaim = field(default_factory=Reclaim)   # swap, RSS split, faults, PSI (devices/reclaim.py)
    lmkd: LmkdSample = field(default_factory=LmkdSample)  # what an lmkd wakeup reads (devices/lmkd_inputs.py; phones)


@dataclass(frozen=True)
class RunOutcome:
    """What running one command on a device produced. Nothing here is interpreted yet."""

    argv: tuple[str, ...]
    exit_status: int | None      # None when it could not be learned (device lost)
    pid: int | None
    timed_out: bool
    wall_s: float
    stdout: bytes
    stderr: bytes
    samples: tuple[PressureSample, ...]
    started_at_s: float

    @property
    def killed_by_sigkill(self) -> bool:
        return self.exit_status in (137, -9)


def pressure_metrics(before: DeviceState, samples: Sequence[PressureSample], after: DeviceState) -> dict[str, int]:
    """Upstream bench-run.sh's `.metrics` keys, from a run's samples and its entry/exit state."""
    out: dict[str, int] = {}

    def put(key: str, value: int | None) -> None:
        if value is not None:
            out[key] = int(value)

    hwm = [s.vm_hwm_kb for s in samples if s.vm_hwm_kb is not None]
    put("peak_rss_kb", max(hwm) if hwm else None)
    put("mem_avail_before_kb", before.mem_available_kb)
    avail = [s.mem_available_kb for s in samples if s.mem_available_kb is not None]
    floor_candidates = avail + [v for v in (before.mem_available_kb, after.mem_available_kb) if v is not None]
    put("mem_avail_floor_kb", min(avail) if avail else (min(floor_candidates) if floor_candidates else None))
    put("mem_avail_after_kb", after.mem_available_kb)
    put("batt_temp_before_dC", before.battery_temp_dc)
    batt = [s.battery_temp_dc for s in samples if s.battery_temp_dc is not None]
    batt_all = batt + [v for v in (before.battery_temp_dc, after.battery_temp_dc) if v is not None]
    put("batt_temp_max_dC", max(batt_all) if batt_all else None)
    put("batt_temp_after_dC", after.battery_temp_dc)
    put("cpu_temp_before_mC", before.cpu_temp_mc)
    cpu = [s.cpu_temp_mc for s in samples if s.cpu_temp_mc is not None]
    cpu_all = cpu + [v for v in (before.cpu_temp_mc, after.cpu_temp_mc) if v is not None]
    put("cpu_temp_max_mC", max(cpu_all) if cpu_all else None)
    put("cpu_temp_after_mC", after.cpu_temp_mc)
    return out


OutputFn = Callable[[bytes], None]


@runtime_checkable
class StdinFeeder(Protocol):
    """What writes a run's stdin while it runs (a `--session` engine's requests): the same object
    for every device kind, given to Device.run(). run() calls `attach` once the process is
    started, with how to write to its stdin, how to close it (EOF) and the monotonic time its
    samples' t_s count from; then every stdout chunk goes to `on_stdout` as it arrives (the feeder
    decides what to send and when: it may block in its own thread, never in on_stdout); and
    `finish` once the process has ended (or the run was given up), so a feeder waiting for output
    stops waiting. Without a feeder a run's stdin is /dev/null."""

    def attach(self, write: Callable[[bytes], None], close: Callable[[], None], t0_monotonic: float) -> None: ...

    def on_stdout(self, data: bytes) -> None: ...

    def finish(self) -> None: ...


@runtime_checkable
class Device(Protocol):
    serial: str

    def identity(self) -> DeviceIdentity:
        """Who the device is: serial, model, SoC, ABI, Android release, RAM."""
        ...

    def state(self) -> DeviceState:
        """A fresh snapshot of what a measurement depends on (docs/method.md rule 2)."""
        ...

    def push(self, local_path: str, remote_path: str, progress: Callable[[int, int], None] | None = None) -> bool:
        """Copy a file to the device; False when it was already there (same size and sha256)."""
        ...

    def pull(self, remote_path: str, local_path: str) -> None:
        """Copy a device file here; the local file appears whole or not at all."""
        ...

    def file_size(self, remote_path: str) -> int | None:
        """A file's size in bytes on the device; None when there is no such file."""
        ...

    def read_range(self, remote_path: str, offset: int, nbytes: int) -> bytes:
        """Up to `nbytes` bytes of a device file from `offset` (a multiple of RANGE_ALIGN), without
        copying the rest of it: a model's header from a phone that already holds the model."""
        ...

    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout_s: float | None = None,
            cwd: str | None = None, on_stdout: OutputFn | None = None, on_stderr: OutputFn | None = None,
            sample_period_s: float = 1.0, feeder: StdinFeeder | None = None) -> RunOutcome:
        """Run `argv` to its end (or the timeout), streaming its output and sampling its pressure;
        `feeder` writes its stdin (else /dev/null)."""
        ...

    def lmk_events(self, since_s: float) -> list[LmkEvent]:
        """The low-memory kills the device logged since `since_s` (epoch seconds on the host)."""
        ...

    def stop_strays(self, names: Sequence[str]) -> int:
        """Kill leftover engine processes by name; returns how many were killed."""
        ...

    def work_dir(self) -> str:
        """Where models and engines are staged (a real filesystem: O_DIRECT must work there)."""
        ...


OOM_SCORE_ADJ_MAX = 1000        # the kernel's OOM_SCORE_ADJ_MAX


def at_oom_score_adj(argv: Sequence[str], adj: int | None) -> list[str]:
    """`argv` started at oom_score_adj `adj` (None: as it is): a POSIX shell writes its own
    /proc/self/oom_score_adj, then execs the command in its place (same pid, the command's own
    command line, so lmkd names the engine). Raising one's own adj needs no privilege; lowering it
    does (CAP_SYS_RESOURCE): the shell user can only raise it, and a refusal stops the command."""
    if adj is None:
        return list(argv)
    if not 0 <= adj <= OOM_SCORE_ADJ_MAX:
        raise ValueError(f"oom_score_adj {adj} is outside 0..{OOM_SCORE_ADJ_MAX}")
    return ["sh", "-c", 'echo "$0" > /proc/self/oom_score_adj && exec "$@"', str(adj), *argv]


# ---- parsers shared by every backend (they read the same Linux/Android files) ------------------

parse_meminfo_kb = parse_kb_fields
parse_status_kb = parse_kb_fields  # VmHWM / VmRSS … from /proc/PID/status


def parse_battery_temp_dc(dumpsys_battery: str) -> int | None:
    m = re.search(r"^\s*temperature:\s*(-?[0-9]+)", dumpsys_battery, re.MULTILINE)
    return int(m[1]) if m else None


def parse_thermal_status(dumpsys_thermal: str) -> int | None:
    m = re.search(r"Thermal Status:\s*([0-9]+)", dumpsys_thermal)
    return int(m[1]) if m else None


def parse_getprop(text: str) -> dict[str, str]:
    """`getprop` with no argument: `[key]: [value]` lines."""
    return {m[1]: m[2] for m in re.finditer(r"^\[([^\]]+)\]: \[(.*)\]\s*$", text, re.MULTILINE)}
