"""`shell:`, `shell,v2,...:` and `exec:` services: run a command on the phone, stream its output.

Service names (AOSP daemon/services.cpp): "shell[,arg,...]:[command]" where args are "v2" (the
shell protocol), "raw", "pty" and "TERM=..."; without raw/pty a command runs raw and an empty one
gets a pty. The shell protocol (shell_protocol.h) frames every message as 1 byte id + u32le
length + data: 0 stdin, 1 stdout, 2 stderr, 3 exit (1 byte status), 4 close-stdin, 5 window size
("ROWSxCOLS,XPIXxYPIX"). Without v2 there is one byte stream (stdout and stderr merged) and no
exit status. A process killed by signal N reports 128+N, as adbd does. When the stream closes,
the shell alone is hung up (_hang_up), as adbd does: what it started in the background may live on.
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
from engine.units import KIB, is_digits

log = logging.getLogger("bmoe.vphone.shell")

ID_STDIN, ID_STDOUT, ID_STDERR, ID_EXIT, ID_CLOSE_STDIN, ID_WINDOW_SIZE = range(6)
PACKET_HEADER = struct.Struct("<BI")
READ_CHUNK = 64 * KIB


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
# The sessions the shells started (each shell leads its own: setsid, as adbd's child does), kept
# while any process is in one: what the phone's teardown kills where no cgroup holds them.
_sessions: set[int] = set()


def _hang_up(proc: asyncio.subprocess.Process) -> None:
    """The stream is over (the client went away, or the command ended): what adbd's
    Subprocess::PassDataStreams does when its protocol socket dies (daemon/shell_service.cpp):
    SIGHUP to the shell's pid alone, `kill(pid_, SIGHUP)`, then close the pipes to the child "so
    that if it ignores SIGHUP and continues to write data it won't fill up the pipe and block"
    (a child writing gets EPIPE, or dies of SIGPIPE: adbd gives its child SIGPIPE's default). No
    SIGKILL follows: adbd only waits for the shell (WaitForExit). A background child of the
    shell, which the SIGHUP did not reach, lives on, as on a phone; a pty's hangup is the
    kernel's (the master is closed: the session leader, then the foreground group, get SIGHUP)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signal.SIGHUP)
    if proc.stdin is not None:
        proc.stdin.close()
    transport = getattr(proc, "_transport", None)   # asyncio's Process has no close() of its pipes
    for fd in (1, 2):
        pipe = transport.get_pipe_transport(fd) if transport is not None else None
        if pipe is not None:
            pipe.close()

    async def reap() -> None:
        await proc.wait()
        if not session_members({proc.pid}):
            _sessions.discard(proc.pid)

    task = asyncio.get_running_loop().create_task(reap())
    _reapers.add(task)
    task.add_done_callback(_reapers.discard)


def session_members(sids: set[int]) -> list[int]:
    """The live processes of the sessions `sids` (this host's /proc; zombies are not alive)."""
    return [pid for members in _members(sids).values() for pid in members]


def _members(sids: set[int]) -> dict[int, list[int]]:
    wanted = {str(sid) for sid in sids}
    out: dict[int, list[int]] = {}
    if not wanted:
        return out
    for entry in os.listdir("/proc"):
        if not is_digits(entry):
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and fields[0] != "Z" and fields[3] in wanted:   # state, ppid, pgrp, session
            out.setdefault(int(fields[3]), []).append(int(entry))
    return out


def started_sessions() -> set[int]:
    """The sessions of shells this daemon started that still have processes (an empty one is
    forgotten here: its number may come back as another process's session)."""
    live = _members(_sessions)
    _sessions.intersection_update(live)
    return set(live)


def kill_sessions() -> None:
    """SIGKILL every process left in the sessions the shells started: the phone's teardown where
    no memory cgroup holds its processes (the fallback); a process that left its session
    (setsid) is not found."""
    for pid in session_members(started_sessions()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    _sessions.clear()


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
    _sessions.add(proc.pid)
    try:
        await _run(stream, request, proc, master)
    finally:
        _hang_up(proc)
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
