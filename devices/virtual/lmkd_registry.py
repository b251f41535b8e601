"""lmkd's registry on a virtual phone: the processes ActivityManager registered, lmkd's only victims.

AOSP's lmkd takes its victims from its own per-adj lists (lmkd.cpp: find_and_kill_process ->
proc_adj_tail / proc_get_heaviest), which only LMK_PROCPRIO fills. ActivityManager (system_server)
sends it over /dev/socket/lmkd, which lmkd.rc makes `seqpacket+passcred 0660 system system`. Here
the same: a SOCK_SEQPACKET socket at the phone's dev/socket/lmkd (/dev/socket/lmkd inside the
phone), owned by system (1000) and moded 0660, so the shell user cannot open it; a peer that is
neither root nor system is refused too (SELinux's part on a phone). The packets are lmkd's
(include/lmkd.h: network-order int32s; LMK_PROCPRIO pid uid oomadj [ptype], LMK_PROCREMOVE pid,
LMK_PROCPURGE) and so are the checks (cmd_procprio: the adj in range, a thread group leader, a
record only its registrant may change), and lmkd writes the adj to /proc/PID/oom_score_adj. Its
record (uid, adj) is what lmkd chooses by and logs, not what a process writes for itself. The
daemon's ActivityManager (am.py) is the only writer; it reaches the socket with connect_seqpacket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("bmoe.vphone.lmkd")

CONTROL_SOCKET = "dev/socket/lmkd"      # under the phone's root
# include/lmkd.h: enum lmk_cmd, enum proc_type; CTRL_PACKET_MAX_SIZE is 13 ints
LMK_PROCPRIO, LMK_PROCREMOVE, LMK_PROCPURGE = 1, 2, 3
PROC_TYPE_APP, PROC_TYPE_SERVICE = 0, 1
CTRL_PACKET_MAX_BYTES = 13 * 4
OOM_SCORE_ADJ_MIN, OOM_SCORE_ADJ_MAX = -1000, 1000
ROOT_UID, SYSTEM_UID = 0, 1000          # who may write to lmkd's socket: init and system_server
FORGET_REMOVED_S = 10.0                 # how long a removed record can still explain a kernel kill


@dataclass(frozen=True)
class Registration:
    """lmkd's record of a process ActivityManager registered (lmkd.cpp struct proc)."""
    pid: int
    uid: int
    oom_score_adj: int
    started: float     # the process's start time then: a reused pid is not it (lmkd holds a pidfd)
    registrant: int    # the client's pid: only it may change or remove the record (claim_record)
    name: str = "?"    # its name then (proc_get_name), for a kill after it is gone


def procprio_packet(pid: int, uid: int, oom_score_adj: int, ptype: int = PROC_TYPE_APP) -> bytes:
    """LMK_PROCPRIO as lmkd_pack_set_procprio packs it: five network-order int32s."""
    return struct.pack("!5i", LMK_PROCPRIO, pid, uid, oom_score_adj, ptype)


def procremove_packet(pid: int) -> bytes:
    """LMK_PROCREMOVE (lmkd_pack_set_procremove)."""
    return struct.pack("!2i", LMK_PROCREMOVE, pid)


def _in_dir(path: Path) -> tuple[int, str]:
    """(a descriptor of path's folder, a short path to it through /proc/self/fd): a unix socket's
    path may hold 107 bytes, a phone's folder can be deeper than that."""
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return fd, f"/proc/self/fd/{fd}/{path.name}"


def _seqpacket_at(path: Path, op: str) -> socket.socket:
    """A SOCK_SEQPACKET socket bound or connected (`op`) to `path`, however long its folder's path."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    fd, short = _in_dir(path)
    try:
        getattr(sock, op)(short)
    except OSError:
        sock.close()
        raise
    finally:
        os.close(fd)
    return sock


def listen_seqpacket(path: Path, uid: int, gid: int, mode: int) -> socket.socket:
    """A non-blocking SOCK_SEQPACKET listener at `path` (replacing a stale one), owned and moded
    like an init socket (`socket NAME seqpacket MODE USER GROUP`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = _seqpacket_at(path, "bind")
    with contextlib.suppress(PermissionError):
        os.chown(path, uid, gid)
    os.chmod(path, mode)
    sock.listen(16)
    sock.setblocking(False)
    return sock


def connect_seqpacket(path: Path) -> socket.socket:
    """A blocking SOCK_SEQPACKET connection to the listener at `path`."""
    sock = _seqpacket_at(path, "connect")
    return sock


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of a unix socket's peer (SO_PEERCRED: struct ucred)."""
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid, uid, gid


def start_time(pid: int) -> float | None:
    """/proc/PID/stat starttime, clock ticks since boot (None: no such process)."""
    try:
        return float(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


class Registry:
    """The control socket and what came through it. `name_of(pid)` is lmkd's name for a process
    (proc_get_name), `error(text)` lmkd's ALOGE."""

    def __init__(self, root: Path, name_of: Callable[[int], str | None], error: Callable[[str], None]):
        self.root = Path(root)
        self.name_of, self.error = name_of, error
        self.records: dict[int, Registration] = {}
        # records ActivityManager removed (the process died), kept FORGET_REMOVED_S: the kernel's
        # line of a death in the app may come after the removal (Lmkd._record)
        self.removed: dict[int, tuple[Registration, float]] = {}
        self.clients: list[tuple[socket.socket, int]] = []     # (connection, the client's pid)
        self.loop: asyncio.AbstractEventLoop | None = None    # watching the sockets (watch)
        self.adj_refused = False
        self.control: socket.socket | None = None
        try:
            self.control = listen_seqpacket(self.root / CONTROL_SOCKET, SYSTEM_UID, SYSTEM_UID, 0o660)
        except OSError as e:
            log.warning("lmkd: no control socket (%s): nothing can register, so lmkd kills nothing", e)

    # -- the socket (lmkd.cpp ctrl_connect_handler, ctrl_command_handler) -------------------------
    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Handle the socket as it is written to, as lmkd's epoll does (not only at polls)."""
        self.loop = loop
        if self.control is not None:
            loop.add_reader(self.control.fileno(), self.serve)

    def serve(self) -> None:
        """Accept waiting clients and handle every packet they sent, without blocking."""
        while self.control is not None:
            try:
                conn, _ = self.control.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                log.warning("lmkd: accept on the control socket: %s", e)
                break
            pid, uid, _gid = peer_credentials(conn)
            if uid not in (ROOT_UID, SYSTEM_UID):   # the socket's 0660 system:system already stops the shell
                log.warning("lmkd: refused a control connection from uid %d (pid %d)", uid, pid)
                conn.close()
                continue
            conn.setblocking(False)
            self.clients.append((conn, pid))
            if self.loop is not None:
                self.loop.add_reader(conn.fileno(), self.serve)
        for client in list(self.clients):
            conn, pid = client
            while True:
                try:
                    packet = conn.recv(CTRL_PACKET_MAX_BYTES)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    packet = b""
                if not packet:       # the client went away (lmkd keeps its records, as lmkd does)
                    self.clients.remove(client)
                    self._forget(conn)
                    break
                self._command(packet, pid)

    def _forget(self, conn: socket.socket) -> None:
        if self.loop is not None:
            self.loop.remove_reader(conn.fileno())
        conn.close()

    def _command(self, packet: bytes, client_pid: int) -> None:
        if len(packet) < 4:
            self.error(f"Wrong control socket read length len={len(packet)}")
            return
        values = struct.unpack(f"!{len(packet) // 4}i", packet[:len(packet) // 4 * 4])
        cmd, args = values[0], values[1:]
        if cmd == LMK_PROCPRIO and 3 <= len(args) <= 4:
            self._procprio(args[0], args[1], args[2], args[3] if len(args) > 3 else PROC_TYPE_APP, client_pid)
        elif cmd == LMK_PROCREMOVE and len(args) == 1:
            reg = self.records.get(args[0])
            if reg is not None and reg.registrant != client_pid:
                self.error(f"A process  ({client_pid}) attempts to unregister a process registered by another client")
            elif reg is not None:
                self.removed[args[0]] = (self.records.pop(args[0]), time.time())
        elif cmd == LMK_PROCPURGE and not args:
            self.records = {pid: r for pid, r in self.records.items() if r.registrant != client_pid}
        elif cmd in (LMK_PROCPRIO, LMK_PROCREMOVE, LMK_PROCPURGE):
            self.error(f"Wrong control socket read length cmd={cmd} len={len(packet)}")
        else:
            self.error(f"Received unknown command code {cmd}")

    def _procprio(self, pid: int, uid: int, adj: int, ptype: int, client_pid: int) -> None:
        """cmd_procprio: check, write the process's oom_score_adj, record it."""
        if not OOM_SCORE_ADJ_MIN <= adj <= OOM_SCORE_ADJ_MAX:
            self.error(f"Invalid PROCPRIO oomadj argument {adj}")
            return
        if ptype not in (PROC_TYPE_APP, PROC_TYPE_SERVICE):
            self.error(f"Invalid PROCPRIO process type argument {ptype}")
            return
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            tgid = next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("Tgid:"))
        except (OSError, StopIteration, ValueError, IndexError):
            tgid = pid
        if tgid != pid:
            self.error(f"Attempt to register a task that is not a thread group leader (tid {pid}, tgid {tgid})")
            return
        started = start_time(pid)
        try:
            with open(f"/proc/{pid}/oom_score_adj", "w") as f:
                f.write(str(adj))
        except PermissionError:
            # lowering an adj takes CAP_SYS_RESOURCE, which lmkd has and a container's root may not:
            # lmkd's record (what it chooses by) still holds; the kernel's OOM killer sees the old adj
            if not self.adj_refused:
                log.warning("lmkd: may not lower /proc/%d/oom_score_adj to %d here (no CAP_SYS_RESOURCE): "
                            "lmkd's own record keeps it", pid, adj)
            self.adj_refused = True
        except OSError as e:
            log.warning("lmkd: Failed to open /proc/%d/oom_score_adj; errno=%d: process %d might have been killed",
                        pid, e.errno or 0, pid)
            return
        old = self.records.get(pid)
        if old is not None and old.registrant != client_pid and old.started == started:
            self.error(f"A process  ({client_pid}) attempts to modify a process registered by another client")
            return
        name = self.name_of(pid) or (old.name if old is not None else "?")
        self.records[pid] = Registration(pid, uid, adj, started if started is not None else 0.0, client_pid, name)

    # -- what lmkd asks ----------------------------------------------------------------------------
    def of(self, pid: int, started: float) -> Registration | None:
        """lmkd's record of this process, if it has one (the same process: not a reused pid)."""
        reg = self.records.get(pid)
        return reg if reg is not None and (not reg.started or reg.started == started) else None

    def take(self, pid: int, started: float | None) -> Registration | None:
        """The record of a process being killed or gone, out of lmkd's (pid_remove): registered, or
        just removed; None for a reused pid (`started`: its last start time seen, if any)."""
        reg = self.records.pop(pid, None)
        if reg is None and pid in self.removed:
            reg = self.removed.pop(pid)[0]
        if reg is not None and started is not None and reg.started and reg.started != started:
            return None
        return reg

    def of_uid(self, uid: int, besides: set[int]) -> int | None:
        """The pid of a registered (or just removed) process of `uid` not among `besides`: an app's
        processes share its uid."""
        regs = [*self.records.values(), *(r for r, _at in self.removed.values())]
        return next((r.pid for r in regs if r.uid == uid and r.pid not in besides), None)

    def expire(self, now: float) -> None:
        self.removed = {pid: (r, at) for pid, (r, at) in self.removed.items() if now - at < FORGET_REMOVED_S}

    def close(self) -> None:
        for conn, _pid in self.clients:
            self._forget(conn)
        self.clients = []
        if self.control is not None:
            self._forget(self.control)
            self.control = None
            with contextlib.suppress(OSError):
                (self.root / CONTROL_SOCKET).unlink()
