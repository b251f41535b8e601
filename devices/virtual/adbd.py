"""A device-side adb daemon in asyncio: the real adb server connects to it with `adb connect`.

Protocol (AOSP packages/modules/adb: protocol.txt, adb.cpp handle_packet, transport.cpp):
- the server speaks first with CNXN(version, maxdata, "host::features=..."); we answer
  CNXN(A_VERSION, MAX_PAYLOAD, "device::ro.product.name=...;...;features=...") and never send AUTH,
  which is how an adbd with auth disabled behaves (the device decides; the host only answers);
- OPEN(remote-id, 0, "service\\0") -> OKAY(local-id, remote-id) or CLSE(0, remote-id). arg1 must be
  0 because we do not advertise delayed_ack (adb.cpp refuses a mismatch the same way);
- WRTE(local, remote, data): one in flight per stream per direction until the other side's OKAY;
  payloads are at most min(our, their) maxdata;
- CLSE(local, remote) from either side ends the stream; we answer nothing to a CLSE.
Bad input only ever costs the connection it came on: framing errors close that socket and the
listener keeps accepting. With no authentication, connections are accepted only from processes of
the daemon's own user or root (the socket owner, read from /proc/net/tcp).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from devices.virtual import wire

log = logging.getLogger("bmoe.vphone.adbd")

Service = Callable[["Stream"], Awaitable[None]]
Router = Callable[[str, "Connection"], Service | None]

FEATURES = ("shell_v2", "cmd", "stat_v2", "ls_v2", "fixed_push_mkdir")
MAX_QUEUED_WRITES = 16  # a peer that ignores flow control this badly is dropped


@dataclass(frozen=True)
class Banner:
    product_name: str
    model: str
    device: str
    features: tuple[str, ...] = FEATURES

    def text(self) -> str:
        # adb.cpp parse_banner splits on ':' then ';' then '=': none of these may appear in values.
        def clean(v: str) -> str:
            return "".join(ch for ch in v if ch not in ":;=")
        props = [f"ro.product.name={clean(self.product_name)}", f"ro.product.model={clean(self.model)}",
                 f"ro.product.device={clean(self.device)}", "features=" + ",".join(self.features)]
        return "device::" + ";".join(props)


class StreamClosed(Exception):
    """The stream (or its whole connection) was closed while a service was using it."""


class Stream:
    """One OPENed service: payloads in (with OKAY sent when the service takes them), writes out
    chunked at the connection's max payload, each waiting for the peer's OKAY."""

    def __init__(self, conn: Connection, local_id: int, remote_id: int, service_name: str):
        self.conn = conn
        self.local_id = local_id
        self.remote_id = remote_id
        self.service_name = service_name
        self.closed = False  # by the peer or by the connection going away
        self._inbox: deque[bytes] = deque()
        self._inbox_ready = asyncio.Event()
        self._can_send = asyncio.Event()
        self._can_send.set()
        self._write_lock = asyncio.Lock()  # a multi-chunk write must not interleave with another
        self.task: asyncio.Task | None = None

    # -- incoming ---------------------------------------------------------------------------
    def _feed(self, payload: bytes) -> None:
        if len(self._inbox) >= MAX_QUEUED_WRITES:
            raise wire.ProtocolError(f"stream {self.local_id}: peer ignores flow control")
        self._inbox.append(payload)
        self._inbox_ready.set()

    async def read(self) -> bytes:
        """The next WRTE payload, or b"" once the peer closed the stream."""
        while not self._inbox:
            if self.closed:
                return b""
            self._inbox_ready.clear()
            await self._inbox_ready.wait()
        data = self._inbox.popleft()
        # OKAY as soon as the service owns the payload: the peer may send the next one while
        # this one is processed, and never more than that.
        if not self.closed:
            self.conn.send(wire.A_OKAY, self.local_id, self.remote_id)
        return data

    def _acked(self) -> None:
        self._can_send.set()

    def _peer_closed(self) -> None:
        self.closed = True
        self._inbox_ready.set()
        self._can_send.set()

    # -- outgoing ---------------------------------------------------------------------------
    async def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        step = self.conn.max_payload
        async with self._write_lock:
            for off in range(0, len(view), step):
                # Re-check after every wake-up: only the peer's OKAY re-opens the window.
                while not self._can_send.is_set():
                    await self._can_send.wait()
                if self.closed:
                    raise StreamClosed(self.service_name)
                self._can_send.clear()
                self.conn.send(wire.A_WRTE, self.local_id, self.remote_id, view[off:off + step])
                await self.conn.drain()

    async def flushed(self) -> None:
        """Wait until the peer acknowledged our last WRTE (or went away)."""
        await self._can_send.wait()


class Connection:
    def __init__(self, daemon: Daemon, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.daemon = daemon
        self.reader = reader
        self.writer = writer
        self.version = wire.A_VERSION_MIN
        self.max_payload = wire.MAX_PAYLOAD_V1
        self.online = False
        self.peer_banner = ""
        self.streams: dict[int, Stream] = {}
        self._next_id = 1
        self.task: asyncio.Task | None = None
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"

    # -- sending ------------------------------------------------------------------------------
    def send(self, command: int, arg0: int, arg1: int, payload: bytes | memoryview = b"") -> None:
        if self.writer.is_closing():
            return
        with_checksum = command == wire.A_CNXN or self.version < wire.A_VERSION_SKIP_CHECKSUM
        header = wire.pack_header(command, arg0, arg1, payload, with_checksum)
        # One synchronous call per message: messages of concurrent streams never interleave.
        self.writer.writelines([header, payload] if len(payload) else [header])

    async def drain(self) -> None:
        try:
            await self.writer.drain()
        except (ConnectionError, RuntimeError) as e:
            raise StreamClosed(str(e)) from None

    # -- receiving ----------------------------------------------------------------------------
    async def run(self) -> None:
        """Serve this connection until the adb server closes it or breaks the protocol."""
        log.info("connection from %s", self.peer)
        try:
            while True:
                raw = await self.reader.readexactly(wire.HEADER_BYTES)
                header = wire.parse_header(raw, wire.MAX_PAYLOAD)
                payload = await self.reader.readexactly(header.data_length) if header.data_length else b""
                self._handle(header, payload)
        except asyncio.IncompleteReadError:
            log.info("connection from %s closed by peer", self.peer)
        except (ConnectionError, OSError) as e:
            log.info("connection from %s dropped: %s", self.peer, e)
        except wire.ProtocolError as e:
            log.warning("connection from %s: protocol error, closing: %s", self.peer, e)
        finally:
            self._close_all_streams()
            self.writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self.writer.wait_closed()

    def _close_all_streams(self) -> None:
        for stream in list(self.streams.values()):
            stream._peer_closed()
            if stream.task and not stream.task.done():
                stream.task.cancel()
        self.streams.clear()

    def _handle(self, h: wire.Header, payload: bytes) -> None:
        if h.command == wire.A_CNXN:
            self._on_connect(h, payload)
        elif h.command in (wire.A_AUTH, wire.A_SYNC):
            pass  # auth is not required here, so any AUTH the host volunteers is moot
        elif h.command == wire.A_STLS:
            raise wire.ProtocolError("STLS requested but this daemon offers no TLS")
        elif not self.online:
            pass  # like adbd: nothing but CNXN counts before the handshake
        elif h.command == wire.A_OPEN:
            self._on_open(h, payload)
        elif h.command == wire.A_OKAY:
            stream = self.streams.get(h.arg1)
            if stream is not None and stream.remote_id == h.arg0:
                stream._acked()
        elif h.command == wire.A_WRTE:
            stream = self.streams.get(h.arg1)
            if stream is not None and stream.remote_id == h.arg0 and not stream.closed:
                stream._feed(payload)
        elif h.command == wire.A_CLSE:
            stream = self.streams.pop(h.arg1, None)
            if stream is not None and h.arg0 in (0, stream.remote_id):
                stream._peer_closed()
                if stream.task and not stream.task.done():
                    stream.task.cancel()
            elif stream is not None:
                self.streams[h.arg1] = stream  # a CLSE naming another peer id is not for us

    def _on_connect(self, h: wire.Header, payload: bytes) -> None:
        if h.arg1 < 256:
            raise wire.ProtocolError(f"CNXN with unusable maxdata {h.arg1}")
        if self.online:
            self._close_all_streams()  # a second CNXN restarts the session (adb.cpp handle_offline)
        self.version = min(h.arg0, wire.A_VERSION)
        self.max_payload = min(h.arg1, wire.MAX_PAYLOAD)
        self.peer_banner = payload.rstrip(b"\0").decode("utf-8", "replace")
        self.online = True
        log.info("CNXN from %s: version=0x%08x maxdata=%d banner=%r", self.peer, h.arg0, h.arg1,
                 self.peer_banner[:200])
        self.send(wire.A_CNXN, wire.A_VERSION, wire.MAX_PAYLOAD, self.daemon.banner.text().encode())

    def _on_open(self, h: wire.Header, payload: bytes) -> None:
        if h.arg0 == 0:
            return
        name = payload.split(b"\0", 1)[0].decode("utf-8", "replace")
        if h.arg1 != 0:
            log.warning("OPEN %r with send buffer %d but delayed acks were not negotiated", name, h.arg1)
            self.send(wire.A_CLSE, 0, h.arg0)
            return
        service = None
        try:
            service = self.daemon.router(name, self)
        except Exception:  # a router bug must not take the connection down
            log.exception("routing %r failed", name)
        if service is None:
            log.info("refusing service %r", name)
            self.send(wire.A_CLSE, 0, h.arg0)
            return
        local_id = self._allocate_id()
        stream = Stream(self, local_id, h.arg0, name)
        self.streams[local_id] = stream
        self.send(wire.A_OKAY, local_id, h.arg0)
        stream.task = asyncio.create_task(self._run_service(stream, service))

    def _allocate_id(self) -> int:
        while True:
            local_id = self._next_id
            self._next_id = self._next_id + 1 if self._next_id < 0x7FFFFFFF else 1
            if local_id not in self.streams:
                return local_id

    async def _run_service(self, stream: Stream, service: Service) -> None:
        log.info("stream %d: %s", stream.local_id, stream.service_name[:200])
        try:
            await service(stream)
            if not stream.closed:
                await stream.flushed()
        except (StreamClosed, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("service %r failed", stream.service_name[:200])
        finally:
            if self.streams.get(stream.local_id) is stream:
                del self.streams[stream.local_id]
                if not stream.closed:
                    stream.closed = True
                    self.send(wire.A_CLSE, stream.local_id, stream.remote_id)


def peer_uid(peer_port: int, our_port: int) -> int | None:
    """The uid owning the loopback client socket 127.0.0.1:peer_port -> :our_port (/proc/net/tcp),
    None when it cannot be told."""
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 7 and fields[1].endswith(f":{peer_port:04X}") and fields[2].endswith(f":{our_port:04X}"):
            return int(fields[7])
    return None


class Daemon:
    """Listens on 127.0.0.1 only; each accepted TCP connection is one adb transport."""

    def __init__(self, banner: Banner, router: Router, host: str = "127.0.0.1", port: int = 0):
        if host not in ("127.0.0.1", "localhost"):
            raise ValueError("the virtual adbd listens on 127.0.0.1 only")
        self.banner = banner
        self.router = router
        self.host = "127.0.0.1"
        self.port = port
        self.connections: set[Connection] = set()
        self.allowed_uids = {0, os.getuid()}
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("listening on %s:%d", self.host, self.port)
        return self.port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        uid = peer_uid(peer[1], self.port) if peer else None
        if uid is not None and uid not in self.allowed_uids:
            # No auth, as on an adbd with auth off: so only our own user (or root) may connect.
            log.warning("refusing a connection from uid %d", uid)
            writer.close()
            return
        conn = Connection(self, reader, writer)
        conn.task = asyncio.current_task()
        self.connections.add(conn)
        try:
            await conn.run()
        except asyncio.CancelledError:
            pass  # close(): ending quietly keeps asyncio's stream callback from logging it
        except Exception:  # never let one connection's failure reach the listener
            log.exception("connection from %s failed", conn.peer)
        finally:
            self.connections.discard(conn)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = []
        for conn in list(self.connections):
            conn._close_all_streams()
            conn.writer.close()
            if conn.task is not None:
                conn.task.cancel()
                tasks.append(conn.task)
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
