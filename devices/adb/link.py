"""The link to one phone behind one adb server: its shell, bounded by the transport watch, and how
a failure of the link is told from the phone's answer (DeviceLost against DeviceError). Files
(devices/adb/files.py) and runs (devices/adb/runs.py) are built on it; devices/adb/phone.py is the
phone as the runner sees it. Everything sent to `adb shell` is quoted by the caller with shlex.quote.
"""

from __future__ import annotations

import re
import threading

from devices import sections
from devices.adb.adbutils_import import AdbDevice, AdbError, AdbTimeout
from devices.adb.server import TRANSPORT_ERRORS, AdbServer, default_server
from devices.base import (
    DeviceError,
    DeviceLost,
)
from engine.safetext import one_line

WORK_DIR = "/data/local/tmp/bmoe"
MARK = "@@BMOE"             # the markers of the phone's own lines in a command's output
DEVICE_TIMEOUT_S = 30.0     # run.device_timeout_s's default: a phone silent this long is lost


def lost_or_error(device: AdbDevice, server: AdbServer, what: str, e: BaseException) -> DeviceError:
    """A FAIL answer from a phone the server still lists is that phone refusing one request
    (DeviceError: a missing file to pull …). Anything else — the stream cut, a reset, a timeout, a
    garbled reply, the server gone, or a phone no longer listed — is DeviceLost, which the runner
    retries and records as `device_lost`: the link failed, not the phone's answer."""
    serial = device.serial
    reason = one_line(str(e) or type(e).__name__, 200)
    if isinstance(e, AdbError) and not isinstance(e, AdbTimeout):
        try:
            present = any(d.serial == serial and d.state == "device" for d in server.client().list())
        except TRANSPORT_ERRORS:
            present = False
        if present:
            return DeviceError(f"{serial}: {what} failed: {reason}")
    return DeviceLost(f"{serial}: device lost during {what} ({reason})")


class PhoneLink:
    """One phone's shell behind one adb server."""

    def __init__(self, serial: str, server: AdbServer | None = None, work_dir: str = WORK_DIR):
        self.serial = serial
        self.server = server if server is not None else default_server()
        self._work_dir = work_dir
        self._device = self.server.client().device(serial)
        # the transport watch of run(): seconds without an answer before the phone is lost, and
        # an event that ends a run at once (the campaign's Ctrl-C); set by watch()
        self.device_timeout_s = DEVICE_TIMEOUT_S
        self.stop_event: threading.Event | None = None

    def watch(self, device_timeout_s: float, stop: threading.Event | None = None) -> None:
        """How run() watches the transport: `device_timeout_s` without an answer (no output, no
        sample, no ping) is DeviceLost; `stop` set ends the run within a second (RunInterrupted)."""
        self.device_timeout_s = device_timeout_s
        self.stop_event = stop
        # every call outside run() is bounded by the same silence: shell() by default, the sync
        # service's stat/push/pull through the client's socket timeout
        self._device = self.server.client(device_timeout_s).device(self.serial)


    def shell(self, command: str, timeout_s: float | None = None) -> tuple[int, bytes, bytes]:
        """Run one shell command line (already quoted by the caller) and return (status, out, err).
        The phone may stay silent `timeout_s` (default: the watch's device_timeout_s) before it is
        lost; a command that is silent for longer by nature (a checksum of a model) says so."""
        try:
            r = self._device.shell2(command, timeout=timeout_s or self.device_timeout_s, encoding=None, v2=True)
        except TRANSPORT_ERRORS as e:
            raise lost_or_error(self._device, self.server, f"shell {command[:60]!r}", e) from None
        return r.returncode, r.stdout if r.stdout is not None else r.output, r.stderr or b""


    def open_shell(self, command: str):
        """A shell command line (already quoted) left running: its adbutils connection, to read
        from and to close. Closing it hangs up the command (adbd kills its process group)."""
        try:
            return self._device.shell(command, stream=True)
        except TRANSPORT_ERRORS as e:
            raise lost_or_error(self._device, self.server, f"shell {command[:60]!r}", e) from None


    def _text(self, command: str, timeout_s: float | None = None) -> str:
        return self.shell(command, timeout_s)[1].decode("utf-8", "replace")


    def work_dir(self) -> str:
        """Where engine, models and outputs are staged on the phone."""
        return self._work_dir



def int_or_none(text: str) -> int | None:
    """A device's decimal number (ASCII digits only: str.isdigit() also takes '²', which int() refuses)."""
    return int(text) if re.fullmatch(r"[0-9]{1,20}", text) else None


def sections_of(text: str) -> dict[str, str]:
    """Split the state script's output at its @@BMOE markers."""
    return sections.split(text, MARK)


