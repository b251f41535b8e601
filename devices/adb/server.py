"""adb servers (adbutils): where they are, adb's environment variables, connecting, starting one.

adb's conventions are read here and nowhere else (docs/lab.md, "adb's environment variables"):
`ADB_SERVER_SOCKET` (tcp:PORT or tcp:HOST:PORT) names the server, else
`ANDROID_ADB_SERVER_ADDRESS` and `ANDROID_ADB_SERVER_PORT` do, else 127.0.0.1:5037 — the
precedence of adb's own client (packages/modules/adb, client/commandline.cpp). `ANDROID_SERIAL`
is the device meant when a command names none. An explicit `--adb HOST:PORT` or `[[fleet.adb]]`
wins over all of them. A server is started only on purpose (ensure_server), only on this host, and
only where the environment or the user points: never a second one on 5037 behind the user's back.
The phone itself is devices.adb.phone (its shell, files and runs: devices.adb.link, .files, .runs).
"""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from devices.adb.adbutils_import import AdbClient, AdbConnection, AdbConnectionError, AdbError, AdbTimeout, adbutils
from devices.base import DeviceError
from engine.fsutil import fleet_home, replacing
from engine.safetext import one_line
from engine.units import is_digits

DEFAULT_ADB_PORT = 5037
DEFAULT_ADB_HOST = "127.0.0.1"
LOCAL_HOSTS = ("127.0.0.1", "localhost")      # where ensure_server may start one
ENV_SERIAL = "ANDROID_SERIAL"
ENV_SOCKET = "ADB_SERVER_SOCKET"
ENV_ADDRESS = "ANDROID_ADB_SERVER_ADDRESS"
ENV_PORT = "ANDROID_ADB_SERVER_PORT"
# What adbutils lets out when the link to a phone fails: its own errors (a FAIL answer, a
# timeout), socket errors (reset, refused: the adb server gone), EOFError from read_exact on a
# stream cut short ("Expected 5 bytes, got 0" when the phone's adbd dies), struct.error from a
# short sync reply, ValueError from a garbled length, and AssertionError from the sync service's
# reply checks (adbutils' sync.stat/list/pull `assert "STAT" == c.read_string(4)` on a phone whose
# daemon died mid-request). Every call into adbutils catches all of them.
TRANSPORT_ERRORS = (AdbError, OSError, EOFError, struct.error, ValueError, AssertionError)


@dataclass(frozen=True)
class AdbServer:
    """One adb server's address. Build it from text with parse(), from the environment with
    default_server(); the field defaults are adb's own (127.0.0.1:5037), never the environment."""

    host: str = DEFAULT_ADB_HOST
    port: int = DEFAULT_ADB_PORT

    @classmethod
    def parse(cls, text: str) -> AdbServer:
        """`HOST:PORT` (an IPv6 host in brackets, or bare: the last colon splits), or `:PORT`."""
        host, _, port = text.rpartition(":")
        if not (is_digits(port) and len(port) <= 5 and 0 < int(port) < 65536):    # int() refuses 4,300 digits
            raise DeviceError(f"--adb expects HOST:PORT, got {one_line(text, 80)!r}")
        return cls(_unbracket(host) or DEFAULT_ADB_HOST, int(port))

    def client(self, socket_timeout_s: float = 30.0) -> _Client:
        """A client of this server that never starts one of its own; a socket silent for
        `socket_timeout_s` fails (the sync service's calls have no timeout of their own)."""
        return _Client(host=self.host, port=self.port, socket_timeout=socket_timeout_s)


def default_server(environ: Mapping[str, str] | None = None) -> AdbServer:
    """The server adb itself would talk to: $ADB_SERVER_SOCKET first, else
    $ANDROID_ADB_SERVER_ADDRESS and $ANDROID_ADB_SERVER_PORT, else 127.0.0.1:5037. A value adb
    would refuse is a DeviceError naming the variable (one line)."""
    env = os.environ if environ is None else environ
    spec = env.get(ENV_SOCKET, "")
    if spec:
        return _socket_spec(spec)
    host = env.get(ENV_ADDRESS, "").strip()
    port = env.get(ENV_PORT, "").strip()
    return AdbServer(_unbracket(host) or DEFAULT_ADB_HOST, _port(port, ENV_PORT) if port else DEFAULT_ADB_PORT)


def server_at(host: str | None = None, port: int | None = None) -> AdbServer:
    """The server at host:port; a part not given comes from adb's environment (default_server)."""
    if host and port:
        return AdbServer(host, port)
    found = default_server()
    return AdbServer(host or found.host, port or found.port)


def default_serial(environ: Mapping[str, str] | None = None) -> str | None:
    """$ANDROID_SERIAL: the device a command means when it names none (None when unset or empty)."""
    env = os.environ if environ is None else environ
    return env.get(ENV_SERIAL) or None


def _socket_spec(spec: str) -> AdbServer:
    """adb's socket spec as ADB_SERVER_SOCKET holds it: tcp:PORT or tcp:HOST:PORT. adb also
    takes local sockets (localabstract:, local:, vsock:); a client over TCP cannot reach those."""
    if not spec.startswith("tcp:"):
        raise DeviceError(f"{ENV_SOCKET}={one_line(spec, 80)!r}: expected tcp:PORT or tcp:HOST:PORT "
                          "(adb servers are reached over TCP here)")
    host, _, port = spec[len("tcp:"):].rpartition(":")      # tcp:PORT leaves host empty
    return AdbServer(_unbracket(host) or DEFAULT_ADB_HOST, _port(port, f"{ENV_SOCKET}={one_line(spec, 80)!r}"))


def _port(text: str, where: str) -> int:
    if is_digits(text) and len(text) <= 5 and 0 < int(text) < 65536:
        return int(text)
    name = where if "=" in where else f"{where}={one_line(text, 40)!r}"
    raise DeviceError(f"{name}: the port must be a number from 1 to 65535")


def _unbracket(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


class _Connection(AdbConnection):
    """adbutils' server connection, closed at once when the server answers FAIL (adbutils 2.12
    raises from check_okay() and leaves the socket to the garbage collector, openatx/adbutils
    PR #178, so every call to a lost phone would leak one until then), and never starting a
    server of its own when none answers."""

    def check_okay(self) -> None:
        try:
            super().check_okay()
        except BaseException:
            self.close()
            raise

    def send_command(self, cmd: str) -> None:
        # the same for a request the server never takes (it died after accepting the connection)
        try:
            super().send_command(cmd)
        except BaseException:
            self.close()
            raise

    def _safe_connect(self) -> socket.socket:
        # adbutils answers a refused connection by running `adb start-server` (on
        # ANDROID_ADB_SERVER_PORT or 5037, whatever ADB_SERVER_SOCKET says) and trying again, so a
        # lab's server that went away would be answered by a new local one; servers are started on
        # purpose only (ensure_server). Its
        # _create_socket also leaves the refused socket open. Same socket options as adbutils'.
        s = socket.socket()
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPCNT", 3), ("TCP_KEEPINTVL", 10)):
                if hasattr(socket, option):
                    s.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
            s.settimeout(3)
            s.connect((self._AdbConnection__host, self._AdbConnection__port))  # set by AdbConnection
            s.settimeout(None)
            return s
        except TimeoutError:
            s.close()
            raise AdbTimeout("connect to adb server timeout") from None
        except OSError as e:
            s.close()
            raise AdbConnectionError(f"connect to adb server failed: {e}") from None


_VERSIONS: dict[tuple[str, int], int] = {}


class _Client(AdbClient):
    def __init__(self, host: str, port: int, socket_timeout: float):
        super().__init__(host=host, port=port, socket_timeout=socket_timeout)
        self._timeout_s = socket_timeout

    def server_version(self) -> int:
        """The server's version as adbutils asks it, once per server: its open_transport() asks
        while holding the device's connection, and leaks that connection when the question
        fails (the server died in between). live_version() asks every time."""
        key = (self.host, self.port)
        if key not in _VERSIONS:
            _VERSIONS[key] = self.live_version()
        return _VERSIONS[key]

    def live_version(self) -> int:
        """The server's version, asked now (whether it answers at all)."""
        return super().server_version()

    def make_connection(self, timeout: float | None = None) -> AdbConnection:
        try:
            conn = _Connection(self.host, self.port)
        except TimeoutError:
            raise AdbTimeout("connect to adb server timeout") from None
        if timeout or self._timeout_s:
            conn.conn.settimeout(timeout or self._timeout_s)
        return conn


_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_SERVER_PORTS_FROM = 10000


def free_server_port(host: str = DEFAULT_ADB_HOST) -> int:
    """A port free on `host` now, for an adb server to be started on: below the kernel's ephemeral
    range (where 5037 is too). A port inside it can be handed to a client as its own source port
    while the client tries to connect to it with nothing listening yet: Linux then connects the
    socket to itself (TCP simultaneous open), and adb's client reads its own request back, saying
    "protocol fault (status 30 30 30 63?!)" ("000c", the length of host:version), as a test run
    here once did. Random within the range, so concurrent callers rarely pick alike; a port some
    other process binds between this check and the server's start still fails that start."""
    try:
        low = int(_PORT_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(_SERVER_PORTS_FROM, max(low, _SERVER_PORTS_FROM + 1))
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise DeviceError(f"no free port for an adb server on {host} below {low}")


def adb_binary() -> str:
    """The real adb binary: the one in the adbutils wheel, else the one on PATH."""
    return adbutils.adb_path()


def ensure_server(server: AdbServer) -> None:
    """Start a local adb server on the port if none answers (remote servers must already run)."""
    try:
        server.client().live_version()
        return
    except TRANSPORT_ERRORS:
        pass
    if server.host not in LOCAL_HOSTS:
        raise DeviceError(f"no adb server answers at {server.host}:{server.port}")
    # -P makes adb ignore ADB_SERVER_SOCKET but not ANDROID_ADB_SERVER_ADDRESS: both are dropped,
    # so the one server started is the one asked for, on this host
    env = {k: v for k, v in os.environ.items() if k not in (ENV_SOCKET, ENV_ADDRESS)}
    done = subprocess.run([adb_binary(), "-P", str(server.port), "start-server"], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise DeviceError(f"cannot start adb server on port {server.port}: {one_line(done.stderr.strip(), 300)}")
    _mark_started(server)


# -- the tool's own servers: restarted when they die (docs/decisions/adb-servers.md) -------------------------------
_RESTART_LOCK = threading.Lock()        # one restart at a time, whichever device's worker saw it die


def _started_path(server: AdbServer) -> Path:
    """Where ensure_server records a server it started ($BMOE_FLEET_HOME, else ~/.bmoe-fleet, as
    engine.fsutil.fleet_home): a record outlives the process, since `virtual up` starts the
    server a later `sweep` uses."""
    return fleet_home() / "adb-servers" / f"{server.port}.json"


def _mark_started(server: AdbServer) -> None:
    path = _started_path(server)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path) as fh:
            fh.write(json.dumps({"host": server.host, "port": server.port, "started_at": time.time(),
                                 "adb": adb_binary()}).encode() + b"\n")
    except OSError:
        pass        # unrecorded: a server that dies is then waited for, as a user's would be


def started_here(server: AdbServer) -> bool:
    """Whether bmoe-fleet started this server (ensure_server), so may start it again."""
    return server.host in LOCAL_HOSTS and _started_path(server).is_file()


def answers(server: AdbServer, timeout_s: float = 3.0) -> bool:
    """Whether the server answers a version request within timeout_s."""
    try:
        _Client(host=server.host, port=server.port, socket_timeout=timeout_s).live_version()
        return True
    except TRANSPORT_ERRORS:
        return False


def bring_back(server: AdbServer, reconnect: Sequence[str], wait_s: float) -> str | None:
    """After a device was lost: None when its server still answers. Else a server bmoe-fleet
    started is started again and the endpoints in `reconnect` (virtual and network phones) `adb
    connect`ed and waited for until ready (at most wait_s); a user's or a lab's server is waited
    for, at most wait_s, never started. Returns what happened, one line (the attempt's evidence)."""
    if answers(server):
        return None
    where = f"adb server {server.host}:{server.port}"
    if not started_here(server):
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if answers(server):
                return f"{where} did not answer (not started by bmoe-fleet: waited, never restarted); it is back"
            time.sleep(min(1.0, wait_s / 10))
        return f"{where} did not answer for {wait_s:g} s (not started by bmoe-fleet: waited, never restarted)"
    with _RESTART_LOCK:
        restarted = not answers(server)
        if restarted:
            try:
                ensure_server(server)
            except DeviceError as e:
                return f"{where} was gone and could not be restarted: {e}"
    done = []
    deadline = time.monotonic() + wait_s
    for address in reconnect:
        try:
            connect(server, address)
        except DeviceError as e:
            return f"{where} was gone and is back, but {e}"
        while time.monotonic() < deadline:
            try:
                if any(d.serial == address and d.state == "device" for d in server.client().list()):
                    break
            except TRANSPORT_ERRORS:
                pass
            time.sleep(0.2)
        done.append(address)
    again = f"; reconnected {', '.join(done)}" if done else ""
    return f"{where} was gone; {'restarted it' if restarted else 'another device restarted it'} " \
           f"(bmoe-fleet had started it){again}"


def connect(server: AdbServer, address: str) -> str:
    """`adb connect` an endpoint (a device farm's or a virtual phone's); returns its serial."""
    try:
        msg = server.client().connect(address, timeout=10)
    except TRANSPORT_ERRORS as e:
        raise DeviceError(f"adb connect {address} failed: {one_line(str(e), 200)}") from None
    if "connected" not in msg:
        raise DeviceError(f"adb connect {address}: {msg}")
    return address

