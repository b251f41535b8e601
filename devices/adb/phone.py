"""One Android phone behind one adb server (adbutils), as the runner sees it: who it is, its state, and
the low-memory killer's evidence, on top of its shell (devices/adb/link.py), files (devices/adb/files.py)
and runs (devices/adb/runs.py) — virtual phones included.

Everything sent to `adb shell` is quoted with shlex.quote. Commands run (PhoneRuns.run) under a
small device-side wrapper that reports the engine's pid and exit status on stderr and leaves a pid
file while the engine lives; they need adbd's shell protocol v2 (the `shell_v2` feature, Android
7.0+): its exit packet is the shell's status, the wrapper's line the engine's. A phone without it
is refused in one line, there is no pre-v2 fallback (docs/decisions/shell-protocol.md). One-off
shell commands (PhoneLink.shell) go through adbutils, which falls back to the v1 shell itself. The
server side (its address, adb's environment variables, starting one) is devices.adb.server.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from devices import lmkd_inputs, reclaim, thermal_zones
from devices.adb.files import PhoneFiles
from devices.adb.link import MARK, WORK_DIR, int_or_none, sections_of
from devices.adb.runs import ZONES_COMMAND, PhoneRuns
from devices.adb.server import TRANSPORT_ERRORS, AdbServer
from devices.base import (
    PAGE_SIZE_DEFAULT_BYTES,
    CpuFreqPolicy,
    DeviceError,
    DeviceIdentity,
    DeviceState,
    parse_battery_temp_dc,
    parse_getprop,
    parse_meminfo_kb,
    parse_thermal_status,
)
from devices.lmk import LmkEvent, parse_log
from engine.safetext import one_line
from engine.units import ascii_float


@dataclass(frozen=True)
class PhoneReads:
    """What AdbPhone.reads() read in its one shell call."""

    before: str                                # the output of its `before` commands
    state: DeviceState
    lmk_events: list[LmkEvent] | None          # None: not asked for


class AdbPhone(PhoneRuns, PhoneFiles):
    """One phone behind one adb server."""

    def __init__(self, serial: str, server: AdbServer | None = None, work_dir: str = WORK_DIR):
        super().__init__(serial, server, work_dir)
        self._clock_offset_s: float | None = None

    # ---- identity and state ---------------------------------------------------------------------
    def identity(self) -> DeviceIdentity:
        """Who the phone is (getprop, its page size, meminfo, uname, in one shell call); a virtual
        phone also says its host ABI."""
        sections = sections_of(self._text(f"getprop; echo {MARK}PAGESIZE; {PAGE_SIZE_COMMAND}; echo {MARK}MEMINFO; "
                                        f"cat /proc/meminfo; echo {MARK}UNAME; uname -r"))
        props = parse_getprop(sections.get("", ""))
        mem = parse_meminfo_kb(sections.get("MEMINFO", ""))
        soc = props.get("ro.soc.model") or props.get("ro.board.platform") or props.get("ro.hardware") or "unknown"
        sdk = props.get("ro.build.version.sdk", "")
        return DeviceIdentity(
            serial=self.serial, backend="adb", model=props.get("ro.product.model", "unknown"),
            manufacturer=props.get("ro.product.manufacturer", "unknown"), soc=soc,
            abi=props.get("ro.product.cpu.abi", "unknown"),
            android_release=props.get("ro.build.version.release", ""), sdk=int_or_none(sdk),
            ram_total_kb=mem.get("MemTotal", 0), swap_total_kb=mem.get("SwapTotal", 0),
            kernel=sections.get("UNAME", "").strip(),
            # a virtual phone (devices/virtual/phone.py) runs this host's binaries
            host_abi=props.get("ro.bmoe.host_abi", "") if props.get("ro.bmoe.virtual") == "1" else "",
            page_size_bytes=parse_page_size(sections.get("PAGESIZE", "")) or PAGE_SIZE_DEFAULT_BYTES,
        )

    def state(self) -> DeviceState:
        """One snapshot: memory, thermal zones, cpufreq caps, battery and thermal status (one shell call)."""
        return self.reads().state

    def reads(self, before: str = "", lmk_since_s: float | None = None, timeout_s: float | None = None,
              services: bool = True) -> PhoneReads:
        """One shell call for what a cell reads around its run: `before` first (a command line
        whose output is kept: the gate's stray stop and sync, clearing old outputs), then the
        state, and the low-memory killer's lines since `lmk_since_s` when given (lmk_events). The
        slow reads (dumpsys battery and thermalservice, logcat: a binder call or a log dump each)
        run at once (_at_once), so the call costs about the slowest of them, not their sum.
        `services=False` skips the two dumpsys (the state's battery_temp_dc and thermal_status are
        then None: the caller has them from a read moments ago)."""
        since_phone = None if lmk_since_s is None else lmk_since_s + self.clock_offset_s() - 2.0
        slow = [("BATTERY", "dumpsys battery"), ("THERMALSERVICE", "dumpsys thermalservice 2>/dev/null | head -n 20")]
        slow = slow if services else []
        if since_phone is not None:
            slow.append(("LMK", _LMK_LOGCAT))
        script = (f"{before}\necho {_READS}STATE; {_STATE_FAST}; "
                  + _at_once(slow, fast=_LMK_FAST if since_phone is not None else ""))
        text = self.shell(script, timeout_s)[1].decode("utf-8", "replace")
        before_text, _, rest = text.partition(f"{_READS}STATE\n")
        state = self._parse_state(rest)
        events = None
        if since_phone is not None:
            sections = sections_of(rest)
            events = self._parse_lmk(sections.get("LMKCLOCK", "") + "\n" + sections.get("LMK", ""),
                                     sections.get("DMESG", ""), since_phone)
        return PhoneReads(before_text, state, events)

    def _parse_state(self, text: str) -> DeviceState:
        sections = sections_of(text)
        mem = parse_meminfo_kb(sections.get("", ""))
        thermal, unreadable = thermal_zones.parse_zones(sections.get("THERMAL", ""))
        constant = self.zones.observe(thermal, time.monotonic())
        policies = []
        for line in sections.get("CPUFREQ", "").splitlines():
            name, _, freqs = line.partition("=")
            scaling, _, cpuinfo = freqs.partition(",")
            policies.append(CpuFreqPolicy(name, int_or_none(scaling), int_or_none(cpuinfo)))
        return DeviceState(taken_at_s=time.time(), mem_available_kb=mem.get("MemAvailable"),
                           mem_free_kb=mem.get("MemFree"), swap_free_kb=mem.get("SwapFree"), thermal_mc=thermal,
                           battery_temp_dc=parse_battery_temp_dc(sections.get("BATTERY", "")),
                           thermal_status=parse_thermal_status(sections.get("THERMALSERVICE", "")),
                           cpufreq=tuple(policies), vmstat=reclaim.vmstat_counters(sections.get("VMSTAT", "")),
                           constant_zones=constant, unreadable_zones=unreadable)

    # ---- evidence -------------------------------------------------------------------------------
    def lmkd_setting(self, ram_kb: int) -> lmkd_inputs.LmkdSetting:
        """What the phone's lmkd decides with (its ro.lmk.* properties and zone watermarks; from
        `ram_kb` where /proc/zoneinfo is refused), in one shell call."""
        return lmkd_inputs.parse_setting(self._text(lmkd_inputs.RUN_COMMAND), ram_kb)

    def clock_offset_s(self) -> float:
        """Phone clock minus host clock (seconds), measured once."""
        if self._clock_offset_s is None:
            before = time.time()
            text = self._text("date +%s").strip()
            phone = float(text) if re.fullmatch(r"[0-9]{1,12}", text) else before  # no clock said: none
            self._clock_offset_s = phone - (before + time.time()) / 2
        return self._clock_offset_s

    def lmk_events(self, since_s: float) -> list[LmkEvent]:
        """lmkd lines and killinfo events (logcat main+events), the kernel's OOM kills (logcat's
        kernel buffer, and dmesg where readable), since
        `since_s` (host epoch seconds; the phone's clock offset and boot time are accounted for)."""
        since_phone = since_s + self.clock_offset_s() - 2.0
        text = self._text(f"{_LMK_FAST}; echo {MARK}LMK; {_LMK_LOGCAT}")
        sections = sections_of(text)
        return self._parse_lmk(sections.get("LMKCLOCK", "") + "\n" + sections.get("LMK", ""),
                               sections.get("DMESG", ""), since_phone)

    def _parse_lmk(self, head: str, dmesg: str, since_phone: float) -> list[LmkEvent]:
        return lmk_since(head, dmesg, since_phone)


def lmk_since(head: str, dmesg: str, since_phone: float) -> list[LmkEvent]:
    """lmk_events' parse: `head` is the phone's epoch seconds and uptime, then logcat's lines
    (`-v epoch`: seconds space-padded, devices.lmk); the kills stamped at or after `since_phone`
    (phone epoch seconds), and any line without an epoch stamp."""
    lines = head.strip("\n").splitlines()
    try:
        boot_s = ascii_float(lines[0]) - ascii_float(lines[1])
    except (IndexError, ValueError):
        boot_s = None
    events = []
    for e in parse_log(lines[2:]):
        at = _at(e.timestamp, 0.0)
        if at is None or at >= since_phone:     # a line without an epoch stamp is kept
            events.append(e)
    if boot_s is not None:  # dmesg stamps are seconds since boot
        events += [e for e in parse_log(dmesg) if (_at(e.timestamp, boot_s) or 0.0) >= since_phone]
    return events


# What reads() prints, in sections split at @@BMOE markers (_sections): the fast reads of the
# state (meminfo first, in the unnamed section) ... Each one-line sysfs file is read with the
# shell's own `read`, not `$(cat FILE)`: a phone has ~15 zones and policies, and a fork and exec of
# toybox per file made this the slowest part of the call (~50 ms of ~75 on a virtual phone).
_STATE_FAST = (
    "cat /proc/meminfo; echo " + MARK + "THERMAL; " + ZONES_COMMAND + "; "
    "echo " + MARK + "CPUFREQ; "
    "for p in /sys/devices/system/cpu/cpufreq/policy*; do "
    "[ -d \"$p\" ] && { s=; c=; IFS= read -r s <\"$p/scaling_max_freq\"; IFS= read -r c <\"$p/cpuinfo_max_freq\"; "
    "echo \"${p##*/}=$s,$c\"; } 2>/dev/null; done; "
    "echo " + MARK + "VMSTAT; " + reclaim.VMSTAT_GREP
)
# ... and lmk_events' reads: the phone's clock and uptime (dmesg stamps are seconds since boot),
# dmesg where readable, and logcat's main, events and kernel buffers (the slow one; the kernel
# buffer holds the kernel OOM killer's line where dmesg is refused to the shell, and a phone whose
# logd keeps no kernel buffer refuses the whole call before printing: then main and events alone)
_LMK_FAST = ("echo " + MARK + "LMKCLOCK; date +%s; cut -d' ' -f1 /proc/uptime; "
             "echo " + MARK + "DMESG; dmesg 2>/dev/null | tail -n 400")
_LMK_LOGCAT = ("logcat -d -b main,events,kernel -v epoch 2>/dev/null"
               " || logcat -d -b main,events -v epoch 2>/dev/null")
_READS = MARK + "READS"        # reads(): where the output of its `before` commands ends
_AT_ONCE_DIR = "/data/local/tmp/.bmoe-reads.$$"


def _at_once(slow: Sequence[tuple[str, str]], fast: str = "") -> str:
    """A script running the `slow` commands at once in the background, each into a file of a
    scratch folder, and `fast` meanwhile, then printing each slow output after its marker; one
    after another where the folder cannot be made (the output is the same either way)."""
    if not slow:
        return fast or ":"
    d = _AT_ONCE_DIR
    started = " ".join(f"{{ {cmd}; }} >\"{d}/{i}\" 2>/dev/null &" for i, (_, cmd) in enumerate(slow))
    shown = "; ".join(f"echo {MARK}{name}; cat \"{d}/{i}\"" for i, (name, _) in enumerate(slow))
    serial = "; ".join(f"echo {MARK}{name}; {{ {cmd}; }} 2>/dev/null" for name, cmd in slow)
    fast_ = f"{fast}; " if fast else ""
    return (f"if mkdir \"{d}\" 2>/dev/null; then {started} {fast_}wait; {shown}; rm -rf \"{d}\"; "
            f"else {fast_}{serial}; fi")


# The kernel's page size: toybox `getconf PAGESIZE` (bytes), else, where the applet is missing, the
# KernelPageSize of the shell's own first mapping (its binary's text: base pages), which every
# kernel since 2.6.29 prints in /proc/PID/smaps (Documentation/filesystems/proc.rst)
PAGE_SIZE_COMMAND = "getconf PAGESIZE 2>/dev/null || grep -m 1 '^KernelPageSize:' /proc/self/smaps 2>/dev/null"


def parse_page_size(text: str) -> int | None:
    """PAGE_SIZE_COMMAND's answer in bytes: a bare number (getconf) or `KernelPageSize: N kB`;
    None when it said neither (or a size that is no power of two of at least 4 KiB)."""
    text = text.strip()
    m = re.fullmatch(r"([0-9]{1,9})", text) or re.match(r"KernelPageSize:\s+([0-9]{1,9}) kB", text)
    if m is None:
        return None
    size = int(m[1]) * (1024 if text.startswith("KernelPageSize") else 1)
    return size if size >= 4096 and size & (size - 1) == 0 else None


def _at(timestamp: str | None, base_s: float) -> float | None:
    try:
        return base_s + ascii_float(timestamp) if timestamp else None
    except ValueError:  # an MM-DD HH:MM:SS stamp: logcat was not asked for epoch times
        return None


def list_phones(servers: Sequence[AdbServer]) -> list[AdbPhone]:
    """Every phone ready to run commands ("device" state) on the servers, in their order."""
    phones = []
    for server in servers:
        try:
            for d in server.client().list():
                if d.state == "device":
                    phones.append(AdbPhone(d.serial, server))
        except TRANSPORT_ERRORS as e:
            raise DeviceError(f"adb server {server.host}:{server.port}: {one_line(str(e), 200)}") from None
    return phones
