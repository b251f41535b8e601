"""`shell:`, `shell,v2,...:` and `exec:` services: run a command on the phone, stream its output.

Service names (AOSP daemon/services.cpp): "shell[,arg,...]:[command]" where args are "v2" (the
shell protocol), "raw", "pty" and "TERM=..."; without raw/pty a command runs raw and an empty one
gets a pty. The shell protocol (shell_protocol.h) frames every message as 1 byte id + u32le
length + data: 0 stdin, 1 stdout, 2 stderr, 3 exit (1 byte status), 4 close-stdin, 5 window size
("ROWSxCOLS,XPIXxYPIX"). Without v2 there is one byte stream (stdout and stderr merged) and no
exit status. A process killed by signal N reports 128+N, as adbd does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import struct
from dataclasses import dataclass
from typing import Protocol

from devices.virtual.adbd import Stream, StreamClosed

log = logging.getLogger("bmoe.vphone.shell")

ID_STDIN, ID_STDOUT, ID_STDERR, ID_EXIT, ID_CLOSE_STDIN, ID_WINDOW_SIZE = range(6)
PACKET_HEADER = struct.Struct("<BI")
READ_CHUNK = 64 * 1024
KILL_GRACE_S = 1.0


@dataclass(frozen=True)
class ShellRequest:
    command: str | None  # None: interactive shell
    protocol_v2: bool
    pty: bool
    term: str = "dumb"


def parse_service(name: str) -> ShellRequest | None:
    if name.startswith("exec:"):
        return ShellRequest(command=name[5:], protocol_v2=False, pty=False)
    if not name.startswith("shell") or ":" not in name:
        return None
    head, command = name.split(":", 1)
    args = head.split(",")
    if args[0] != "shell":
        return None
    v2, pty, term = False, None, "dumb"
    for arg in args[1:]:
        if arg == "v2":
            v2 = True
        elif arg == "raw":
            pty = False
        elif arg == "pty":
            pty = True
        elif arg.startswith("TERM="):
            term = arg[5:] or "dumb"
    if pty is None:
        pty = command == ""
    return ShellRequest(command=command or None, protocol_v2=v2, pty=pty, term=term)


def shell_packet(packet_id: int, data: bytes) -> bytes:
    return PACKET_HEADER.pack(packet_id, len(data)) + data


class Launcher(Protocol):
    async def spawn(self, command: str | None, *, pty_slave: int | None, merge_stderr: bool,
                    term: str) -> asyncio.subprocess.Process: ...


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode & 0xFF


class _PtyReader:
    """Non-blocking reads of a pty master; EIO (slave side all closed) is end of file."""

    def __init__(self, fd: int):
        self.fd = fd
        os.set_blocking(fd, False)

    async def read(self, n: int) -> bytes:
        loop = asyncio.get_running_loop()
        while True:
            try:
                return os.read(self.fd, n)
            except BlockingIOError:
                fut: asyncio.Future[None] = loop.create_future()
                loop.add_reader(self.fd, _wake, fut)
                try:
                    await fut
                finally:
                    loop.remove_reader(self.fd)
            except OSError:  # EIO once the child side is gone
                return b""


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


_reapers: set[asyncio.Task] = set()


def _kill_tree(proc: asyncio.subprocess.Process) -> None:
    """The client went away: hang up the command's process group, SIGKILL it after a grace."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGHUP)
    except (ProcessLookupError, PermissionError):
        return

    async def reap() -> None:
        try:
            await asyncio.wait_for(proc.wait(), KILL_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

    task = asyncio.get_running_loop().create_task(reap())
    _reapers.add(task)
    task.add_done_callback(_reapers.discard)


async def serve_shell(stream: Stream, request: ShellRequest, launcher: Launcher) -> None:
    master = slave = None
    if request.pty:
        master, slave = os.openpty()
    try:
        proc = await launcher.spawn(request.command, pty_slave=slave, merge_stderr=not request.protocol_v2,
                                    term=request.term)
    except OSError as e:
        msg = f"vphone: cannot start shell: {e}\n".encode()
        await stream.write(shell_packet(ID_STDERR, msg) + shell_packet(ID_EXIT, b"\x7f")
                           if request.protocol_v2 else msg)
        return
    finally:
        if slave is not None:
            os.close(slave)
    try:
        await _run(stream, request, proc, master)
    finally:
        _kill_tree(proc)
        if master is not None:
            os.close(master)


async def _run(stream: Stream, request: ShellRequest, proc: asyncio.subprocess.Process,
               master: int | None) -> None:
    v2 = request.protocol_v2

    async def pump(reader, packet_id: int) -> None:
        while True:
            data = await reader.read(READ_CHUNK)
            if not data:
                return
            await stream.write(shell_packet(packet_id, data) if v2 else data)

    outputs = [pump(_PtyReader(master) if master is not None else proc.stdout, ID_STDOUT)]
    if v2 and master is None:
        outputs.append(pump(proc.stderr, ID_STDERR))
    stdin_task = asyncio.create_task(_feed_stdin(stream, proc, master, v2))
    try:
        await asyncio.gather(*outputs)
        returncode = await proc.wait()
        if v2:
            await stream.write(shell_packet(ID_EXIT, bytes([exit_status(returncode)])))
    finally:
        stdin_task.cancel()


async def _feed_stdin(stream: Stream, proc: asyncio.subprocess.Process, master: int | None,
                      v2: bool) -> None:
    pending = bytearray()
    stdin_open = True

    async def to_child(data: bytes) -> None:
        nonlocal stdin_open
        if not stdin_open or not data:
            return
        try:
            if master is not None:
                await _write_all(master, data)
            elif proc.stdin is not None:
                proc.stdin.write(data)
                await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError, OSError):
            stdin_open = False

    def close_child_stdin() -> None:
        nonlocal stdin_open
        stdin_open = False
        if master is None and proc.stdin is not None:
            proc.stdin.close()
        elif master is not None:
            with contextlib.suppress(OSError):
                os.write(master, b"\x04")  # a pty has no half-close: send EOF (^D)

    try:
        while True:
            data = await stream.read()
            if not data:
                return
            if not v2:
                await to_child(data)
                continue
            pending += data
            while len(pending) >= PACKET_HEADER.size:
                packet_id, length = PACKET_HEADER.unpack_from(pending)
                if len(pending) < PACKET_HEADER.size + length:
                    break
                body = bytes(pending[PACKET_HEADER.size:PACKET_HEADER.size + length])
                del pending[:PACKET_HEADER.size + length]
                if packet_id == ID_STDIN:
                    await to_child(body)
                elif packet_id == ID_CLOSE_STDIN:
                    close_child_stdin()
                elif packet_id == ID_WINDOW_SIZE and master is not None:
                    _set_window_size(master, body)
    except (StreamClosed, asyncio.CancelledError):
        pass


async def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
            view = view[n:]
        except BlockingIOError:
            await asyncio.sleep(0.01)


def _set_window_size(fd: int, body: bytes) -> None:
    # POSIX-only modules, imported here so the package imports anywhere (virtual phones run on Linux)
    import fcntl
    import termios

    try:
        rows_cols, _, pixels = body.decode("ascii").partition(",")
        rows, cols = (int(x) for x in rows_cols.split("x"))
        xpix, ypix = (int(x) for x in pixels.split("x")) if pixels else (0, 0)
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, xpix, ypix))
    except (ValueError, OSError):
        log.info("ignoring bad window size %r", body[:40])
