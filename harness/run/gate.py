"""Cool on a condition, not a timer (docs/method.md rule 1).

Before each cell: kill by pid the engines lost runs left (a device lost or an interrupt cut the
run's stream; devices.adb.runs reap_lost), stop stray engine processes, `sync`, then poll the device's state until the CPU
temperature is under the threshold AND MemAvailable is over the threshold, or the bounded wait
runs out. Giving up is allowed (a phone that never cools still gets measured) but recorded on the
run, with the condition that failed. The CPU sensor is `DeviceState.cpu_zone` (devices.thermal_zones:
the hottest CPU zone that is neither a trip point nor constant, the same zone the run's sampler
reads), recorded as the gate's `cpu_zone` with the zones left out and why; the battery sensor lags
by minutes, so it is recorded, never gated on. A device with no CPU sensor passes the temperature
half of the gate, and the result says so.

Stray stopping is scoped to the device's own processes: a virtual phone shares the host's /proc
(it has its own mount namespace, not its own pid namespace), so killing every `bmoe-py` by name
from one phone — or from this host — would kill the engine another phone is measuring.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from devices.adb.phone import AdbPhone
from devices.adb.runs import reaped_pids, strays_killed
from devices.base import Device, DeviceState
from devices.lmk import LmkEvent
from harness.campaign.model import GateSettings

_STRAYS_END = "@@BMOE-STRAYS-END"


@dataclass(frozen=True)
class GateResult:
    waited_s: float
    gave_up: bool
    reason: str                       # why it passed or gave up, in words
    polls: int
    strays_stopped: int
    cpu_temp_max_mc: int              # the thresholds in force
    mem_available_min_kb: int
    entry_state: DeviceState          # the last poll: the state the run starts from
    extra: str = ""                   # what the caller's `extra` commands printed (a phone only)
    baseline: list[LmkEvent] | None = None   # a phone's lmk lines just before the run (lmk_since_s)
    reaped: tuple[int, ...] = ()      # engines lost runs left, killed by pid (devices.adb.runs reap_lost)

    def to_dict(self) -> dict:
        s = self.entry_state
        return {"waited_s": round(self.waited_s, 3), "gave_up": self.gave_up, "reason": self.reason,
                "polls": self.polls, "strays_stopped": self.strays_stopped, "reaped_pids": list(self.reaped),
                "cpu_temp_max_mc": self.cpu_temp_max_mc, "mem_available_min_kb": self.mem_available_min_kb,
                "cpu_temp_mc": s.cpu_temp_mc, "cpu_zone": s.cpu_zone, "zones_ignored": s.zones_ignored(),
                "mem_available_kb": s.mem_available_kb}


def unmet(state: DeviceState, gate: GateSettings) -> list[str]:
    """The gate conditions this state fails, in words (empty: the device may run)."""
    problems = []
    cpu = state.cpu_temp_mc
    if cpu is not None and cpu >= gate.cpu_temp_max_mc:
        problems.append(f"CPU {cpu / 1000:.1f} °C is not under {gate.cpu_temp_max_c:g} °C")
    avail = state.mem_available_kb
    if gate.mem_available_min_kb:
        if avail is None:
            problems.append("MemAvailable is unknown")
        elif avail <= gate.mem_available_min_kb:
            problems.append(f"MemAvailable {avail} kB is not over {gate.mem_available_min_kb} kB")
    return problems


def cool(device: Device, gate: GateSettings, engine_names: Sequence[str], stop: threading.Event | None = None,
         on_wait: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic,
         extra: str = "", lmk_since_s: float | None = None, services_from: DeviceState | None = None) -> GateResult:
    """Stop strays, sync, then wait (bounded) for a cool CPU and free memory. On a phone the
    strays, the sync and the first poll are one shell call (AdbPhone.reads), with the caller's
    `extra` command line after the sync (its output in GateResult.extra) and, given lmk_since_s,
    the lmk lines of the poll that passes (GateResult.baseline); elsewhere `extra` is not run.
    `services_from`: a phone state read moments ago whose battery temperature and thermal status
    (two dumpsys calls: the battery sensor lags by minutes) the first poll takes instead of
    reading them again; a later poll reads everything."""
    stop = stop or threading.Event()
    first = None
    if isinstance(device, AdbPhone):
        first = device.reads(f"{device.strays_command(engine_names)}; echo {_STRAYS_END}; sync; {extra or ':'}",
                             lmk_since_s=lmk_since_s, timeout_s=120, services=services_from is None)
        if services_from is not None:
            first = dataclasses.replace(first, state=dataclasses.replace(
                first.state, battery_temp_dc=services_from.battery_temp_dc, thermal_status=services_from.thermal_status))
        killed, _, extra_out = first.before.partition(_STRAYS_END + "\n")
        strays, reaped = strays_killed(killed), tuple(reaped_pids(killed))
    else:
        strays, extra_out, reaped = stop_strays(device, engine_names), "", ()
        device.run(["sync"], timeout_s=120)
    t0 = clock()
    polls = 0
    baseline = first.lmk_events if first is not None else None
    while True:
        if first is not None:
            state, first = first.state, None
        elif isinstance(device, AdbPhone) and lmk_since_s is not None:
            again = device.reads(lmk_since_s=time.time())   # the baseline as the run starts
            state, baseline = again.state, again.lmk_events
        else:
            state = device.state()
        polls += 1
        problems = unmet(state, gate)
        waited = clock() - t0
        if not problems:
            reason = "met" if state.cpu_temp_mc is not None else "met (no CPU temperature sensor: not gated on it)"
            return GateResult(waited, False, reason, polls, strays, gate.cpu_temp_max_mc, gate.mem_available_min_kb,
                              state, extra_out, baseline, reaped)
        if waited >= gate.max_wait_s or stop.is_set():
            why = "gave up" if not stop.is_set() else "interrupted"
            return GateResult(waited, True, f"{why} after {waited:.1f} s: " + "; ".join(problems), polls, strays,
                              gate.cpu_temp_max_mc, gate.mem_available_min_kb, state, extra_out, baseline, reaped)
        if on_wait:
            on_wait("; ".join(problems))
        stop.wait(min(gate.poll_s, max(0.0, gate.max_wait_s - waited)))


# ── stray engines, scoped to the device ────────────────────────────────────────────────────────


def stop_strays(device: Device, names: Sequence[str]) -> int:
    """Kill leftover engine processes on the device; returns how many were killed. A phone
    (devices.adb.AdbPhone.stop_strays) kills only the processes of its own mount namespace."""
    from devices.local import LocalDevice

    if isinstance(device, LocalDevice):
        return _stop_local_strays(names)
    return device.stop_strays(names)


def _stop_local_strays(names: Sequence[str]) -> int:
    import psutil

    me = os.getpid()
    try:
        my_ns = os.readlink("/proc/self/ns/mnt")
    except OSError:
        my_ns = None
    # Only engines staged by this fleet home: a bmoe-py the user started by hand, or another
    # campaign's under another $BMOE_FLEET_HOME, is not a stray of ours.
    from harness.campaign.model import fleet_home

    staged = str(fleet_home() / "local")
    killed = 0
    for p in psutil.process_iter(["name", "pid"]):
        if p.info["pid"] == me or p.info["name"] not in names:
            continue
        try:
            if my_ns is not None and os.readlink(f"/proc/{p.info['pid']}/ns/mnt") != my_ns:
                continue  # a virtual phone's engine: not ours to stop
            if not any(staged in arg for arg in p.cmdline()):
                continue
            p.kill()
            killed += 1
        except (OSError, psutil.Error):
            pass
    return killed
