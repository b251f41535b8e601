"""Every reachable device — this host and the phones on each adb server — with identity and state."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from devices.adb.phone import list_phones
from devices.adb.server import AdbServer, default_server, ensure_server
from devices.base import DeviceError, DeviceIdentity, DeviceState
from devices.local import LocalDevice
from engine.safetext import one_line

LINE_CHARS = 400


@dataclass(frozen=True)
class DeviceReport:
    """One device as `bmoe-fleet devices` shows it: identity, state (or why there is none)."""

    identity: DeviceIdentity
    state: DeviceState | None
    error: str | None = None

    def to_dict(self) -> dict:
        """As `devices --json` prints it."""
        return {"identity": self.identity.to_dict(), "state": self.state.to_dict() if self.state else None,
                "error": self.error}

    def line(self) -> str:
        """One terminal line. Every string in it came from the device (getprop, uname): shown
        escaped and cut short, so a model name cannot act on the terminal."""
        i, s = self.identity, self.state
        ram = f"{i.ram_total_kb / 1024 / 1024:.1f} GiB RAM"
        what = f"Android {i.android_release}" if i.android_release else i.kernel
        mem = "MemAvailable unknown" if s is None or s.mem_available_kb is None else \
            f"MemAvailable {s.mem_available_kb / 1024:,.0f} MiB"
        state = "state unavailable" if s is None else (
            mem + (f", CPU {s.cpu_temp_mc / 1000:.1f} °C" if s.cpu_temp_mc is not None else ""))
        text = f"{i.serial:22s} {i.model} ({i.manufacturer}, {i.soc}, {i.abi}), {what}, {ram}; {state}"
        return one_line(text, LINE_CHARS)


def inventory(servers: Sequence[AdbServer] | None = None, start_local_server: bool = True) -> list[DeviceReport]:
    """This host and every phone on the servers (default: the one adb's environment names,
    devices.adb.default_server), each with its state; a local server is started where none answers."""
    reports = [DeviceReport(LocalDevice().identity(), LocalDevice().state())]
    for server in servers if servers is not None else [default_server()]:
        if start_local_server:
            ensure_server(server)
        for phone in list_phones([server]):
            identity = phone.identity()
            try:
                reports.append(DeviceReport(identity, phone.state()))
            except DeviceError as e:
                reports.append(DeviceReport(identity, None, str(e)))
    return reports
