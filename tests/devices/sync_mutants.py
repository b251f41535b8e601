"""Damaged adb traffic for the virtual adbd: sync requests (push, pull, stat, list) and the adb
transport messages that carry them, sent over a real TCP socket to a running phone's daemon.

Shared by the fuzz test (tests/devices/test_fuzz_sync.py, hypothesis draws the choices) and the
fuzz benchmark (benchmarks/fuzz_readers.py, random.Random draws them): every choice is `pick(n)`.

A mutant is one of a few valid sync conversations with one to three operations applied: the
byte-level ones of tests/results/mutants.py (flips, truncation, huge numbers, junk, …) and
sync-aware ones (a length field set to 0, 1 KiB + 1, 64 KiB + 1 or 2^32 - 1, an unknown or
swapped request id, a request cut in two). `sync` mutants go inside WRTE messages of a correct
transport, in chunks of random size; `wire` mutants damage the transport bytes themselves
(CNXN, OPEN, WRTE headers: magic, lengths, ids).

"Answered with FAIL, served, or closed; never crashed or hung": after every mutant the daemon
must still be running and answer a fresh connection's STAT at once (while the damaged one may
still be open). A service that raised is closed by adbd.py's containment: that is "closed" here,
and the benchmark counts such tracebacks in the daemon's log separately.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

from devices.virtual import wire
from tests.results.mutants import OPERATIONS as BYTE_OPERATIONS

Pick = Callable[[int], int]
REQUEST = struct.Struct("<4sI")
MAX_DATA = 4096            # the maxdata this client offers: replies come in WRTEs of at most this
TIMEOUT_S = 10.0           # a live daemon answers a STAT far sooner, even on a loaded machine
STALL_S = 0.3              # no OKAY this long: the daemon waits for bytes a request announced
QUIET_S = 0.15             # raw traffic: the daemon said all it will before we hang up
PAYLOAD = bytes(range(256)) * 5


def _req(ident: bytes, path: bytes) -> bytes:
    return REQUEST.pack(ident, len(path)) + path


def _send(path: bytes, data: bytes, mode: bytes = b"33188") -> bytes:
    return _req(b"SEND", path + b"," + mode) + REQUEST.pack(b"DATA", len(data)) + data + REQUEST.pack(b"DONE", 1700000000)


SEEDS: tuple[bytes, ...] = (
    _req(b"STAT", b"/data/local/tmp") + _req(b"QUIT", b""),
    _send(b"/data/local/tmp/fuzz.bin", PAYLOAD) + _req(b"RECV", b"/data/local/tmp/fuzz.bin") + _req(b"QUIT", b""),
    _req(b"LIST", b"/data/local/tmp") + _req(b"LIS2", b"/") + _req(b"STA2", b"/data") + _req(b"LST2", b"/proc/self"),
    _send(b"/data/local/tmp/sub/dir/x", b"abc", b"0755") + _req(b"STAT", b"/data/local/tmp/sub/dir/x"),
    _send(b"/data/local/tmp/link", b"fuzz.bin", b"41471") + _req(b"RECV", b"/data/local/tmp/link"),
)
_IDS = (b"STAT", b"STA2", b"LST2", b"LIST", b"LIS2", b"SEND", b"RECV", b"DATA", b"DONE", b"QUIT", b"OKAY", b"FAIL",
        b"\x00\x00\x00\x00", b"\xff\xff\xff\xff")
_LENGTHS = (0, 1, 1024, 1025, 65536, 65537, 2 ** 31, 2 ** 32 - 1)


def _fields(data: bytes) -> list[int]:
    """Offsets of the sync id/length pairs: every place a known id stands."""
    return [i for i in range(0, max(0, len(data) - 7)) if data[i:i + 4] in _IDS[:12]]


def set_length(data: bytes, pick: Pick) -> bytes:
    spots = _fields(data)
    if not spots:
        return data
    i = spots[pick(len(spots))] + 4
    return data[:i] + struct.pack("<I", _LENGTHS[pick(len(_LENGTHS))]) + data[i + 4:]


def set_id(data: bytes, pick: Pick) -> bytes:
    spots = _fields(data)
    if not spots:
        return data
    i = spots[pick(len(spots))]
    return data[:i] + _IDS[pick(len(_IDS))] + data[i + 4:]


def cut_request(data: bytes, pick: Pick) -> bytes:
    """A request repeated with its path cut short (a client killed mid-write)."""
    spots = _fields(data)
    if not spots:
        return data
    i = spots[pick(len(spots))]
    return data[:i] + data[i:i + 8 + pick(16)] + data[i:]


SYNC_OPERATIONS = (set_length, set_id, cut_request)
OPERATIONS = SYNC_OPERATIONS + BYTE_OPERATIONS


_HEADER_VALUES = (0, 1, 2, 255, 256, 4096, 4097, wire.MAX_PAYLOAD + 1, 2 ** 31, 2 ** 32 - 1)


def damage_header(raw: bytes, pick: Pick) -> bytes:
    """One transport message's header field (command, arg0, arg1, length, check, magic) set to an
    edge value, or its command to another known one with the magic fixed up to match."""
    starts, pos = [], 0
    while pos + wire.HEADER_BYTES <= len(raw):
        starts.append(pos)
        pos += wire.HEADER_BYTES + wire.HEADER.unpack_from(raw, pos)[3]
    if not starts:
        return raw
    at = starts[pick(len(starts))]
    fields = list(wire.HEADER.unpack_from(raw, at))
    if pick(3) == 0:
        command = sorted(wire.KNOWN_COMMANDS)[pick(len(wire.KNOWN_COMMANDS))]
        fields[0], fields[5] = command, command ^ 0xFFFFFFFF
    else:
        fields[pick(6)] = _HEADER_VALUES[pick(len(_HEADER_VALUES))]
    return raw[:at] + wire.HEADER.pack(*fields) + raw[at + wire.HEADER_BYTES:]


WIRE_OPERATIONS = (damage_header, damage_header) + BYTE_OPERATIONS


def mutate(data: bytes, pick: Pick, n_ops: int, kind: str = "sync") -> bytes:
    ops = WIRE_OPERATIONS if kind == "wire" else OPERATIONS
    for _ in range(n_ops):
        data = ops[pick(len(ops))](data, pick)
    return data


# ── a minimal adb transport client (the host side of devices/virtual/adbd.py) ──────────────────


class Client:
    """One TCP connection to a daemon, CNXN done; reads whole messages."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
        self.send(wire.A_CNXN, wire.A_VERSION, MAX_DATA, b"host::features=shell_v2,stat_v2\0")
        h, _ = self.recv()
        if h is None or h.command != wire.A_CNXN:
            raise AssertionError(f"no CNXN answer: {h}")

    def send(self, command: int, arg0: int, arg1: int, payload: bytes = b"") -> None:
        self.sock.sendall(wire.pack_header(command, arg0, arg1, payload, with_checksum=True) + payload)

    def _exactly(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def recv(self) -> tuple[wire.Header | None, bytes]:
        """The next message, or (None, b"") once the daemon closed the connection."""
        raw = self._exactly(wire.HEADER_BYTES)
        if raw is None:
            return None, b""
        h = wire.Header(*wire.HEADER.unpack(raw))
        payload = self._exactly(h.data_length) if h.data_length else b""
        return h, payload or b""

    def close(self) -> None:
        self.sock.close()


def sync_session(port: int, requests: bytes, pick: Pick) -> dict:
    """Open `sync:` on a fresh connection and send `requests` in WRTEs of random size, acking the
    daemon's WRTEs; then close our write side. What came back: replies, whether the daemon sent
    FAIL, closed the stream, or stopped acknowledging (waiting for bytes a request announced)."""
    c = Client(port)
    out = {"replies": b"", "closed": False, "stalled": False}
    try:
        c.send(wire.A_OPEN, 1, 0, b"sync:\0")
        h, _ = c.recv()
        if h is None or h.command != wire.A_OKAY:
            raise AssertionError(f"sync: not opened: {h}")
        remote = h.arg0
        c.sock.settimeout(STALL_S)
        pos = 0
        while pos < len(requests) and not out["closed"]:
            size = 1 + pick(min(MAX_DATA, len(requests) - pos))
            c.send(wire.A_WRTE, 1, remote, requests[pos:pos + size])
            pos += size
            while True:                            # until the daemon took that payload
                try:
                    h, payload = c.recv()
                except TimeoutError:
                    out["stalled"] = True           # it waits for more than we sent: allowed
                    break
                if h is None or h.command == wire.A_CLSE:
                    out["closed"] = True
                    break
                if h.command == wire.A_WRTE:
                    out["replies"] += payload
                    c.send(wire.A_OKAY, 1, remote)
                elif h.command == wire.A_OKAY:
                    break
            if out["stalled"]:
                break
        c.sock.settimeout(0.2)
        try:                                       # what it still says before we hang up
            while not out["closed"]:
                h, payload = c.recv()
                if h is None or h.command == wire.A_CLSE:
                    out["closed"] = True
                elif h.command == wire.A_WRTE:
                    out["replies"] += payload
                    c.send(wire.A_OKAY, 1, remote)
        except TimeoutError:
            pass
    finally:
        c.close()
    return out


def wire_session(port: int, raw: bytes) -> bytes:
    """Send raw (damaged) transport bytes on a fresh connection, listen until it goes quiet, then
    half-close: the daemon must close the connection soon after (everything it said is returned)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=QUIET_S)
    got = bytearray()
    try:
        try:
            sock.sendall(raw)
            while chunk := sock.recv(65536):         # its answers, until it waits for us
                got += chunk
            return bytes(got)                        # it hung up first: a protocol error
        except TimeoutError:
            pass
        except (BrokenPipeError, ConnectionResetError):
            return bytes(got)
        sock.settimeout(TIMEOUT_S)
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            return bytes(got)
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return bytes(got)
            if not chunk:
                return bytes(got)
            got += chunk
        raise AssertionError("the daemon kept the connection open after the peer hung up")
    finally:
        sock.close()


def wire_seed(requests: bytes) -> bytes:
    """A whole correct conversation as raw transport bytes: CNXN, OPEN sync:, the requests in WRTEs."""
    def msg(command: int, arg0: int, arg1: int, payload: bytes = b"") -> bytes:
        return wire.pack_header(command, arg0, arg1, payload, with_checksum=True) + payload
    out = msg(wire.A_CNXN, wire.A_VERSION, MAX_DATA, b"host::\0") + msg(wire.A_OPEN, 1, 0, b"sync:\0")
    for i in range(0, len(requests), 1000):
        out += msg(wire.A_WRTE, 1, 1, requests[i:i + 1000])
    return out     # no CLSE: the stream ends with the connection, once the daemon has answered


def alive(port: int) -> None:
    """A fresh connection's STAT of / is answered at once (the daemon neither died nor hangs)."""
    c = Client(port)
    try:
        c.send(wire.A_OPEN, 7, 0, b"sync:\0")
        h, _ = c.recv()
        assert h is not None and h.command == wire.A_OKAY, f"sync: not opened: {h}"
        c.send(wire.A_WRTE, 7, h.arg0, _req(b"STAT", b"/"))
        reply = b""
        while len(reply) < 16:
            h, payload = c.recv()
            assert h is not None, "the daemon closed a healthy connection"
            if h.command == wire.A_WRTE:
                reply += payload
                c.send(wire.A_OKAY, 7, h.arg1)
        assert reply[:4] == b"STAT" and struct.unpack("<I", reply[4:8])[0] != 0, reply[:16]
    finally:
        c.close()


def service_exceptions(log: Path) -> list[str]:
    """The last line of each traceback the daemon logged: a service that raised, which adbd.py
    contains (the stream is closed, the daemon serves on). Counted by the benchmark."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    out = []
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            j = i + 1
            while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
                j += 1
            out.append(lines[j] if j < len(lines) else "?")
    return out


def run_mutant(port: int, kind: str, mutant: bytes, pick: Pick) -> str:
    """One mutant against the daemon: "refused" (FAIL, stream or connection closed), "accepted"
    (served to the end), or an AssertionError when it crashed or hung."""
    if kind == "wire":
        # served: the sync service answered inside a WRTE; refused: the connection was dropped first
        outcome = "accepted" if wire.pack_header(wire.A_WRTE, 1, 1)[:4] in wire_session(port, mutant) else "refused"
    else:
        got = sync_session(port, mutant, pick)
        outcome = "refused" if b"FAIL" in got["replies"] or got["closed"] or got["stalled"] else "accepted"
    alive(port)
    return outcome
