"""Other open apps beside the engine on a phone, for one cell (a campaign's `apps` axis, issue 25).

The same on every phone, virtual or real: devices/coapp.c, built here for the phone's ABI (this
host's C compiler for a phone of this host's architecture, as a virtual phone is; the Android
NDK's clang, from $ANDROID_NDK_HOME, for an arm64 phone), is pushed beside the engine and started
each on an adb shell connection held open while it runs: the shell says its pid, writes the app
state's oom_score_adj (devices.android.STATES: cached 900 and up, previous 700, perceptible
200, foreground 0) and execs the app, so adbd is its parent and nothing else of ours sits in the
phone for lmkd to pick. The shell user may raise its own adj, never lower it, and adb's shell
runs at 0, so every state is in reach. Each app names itself (`co.cached1`, `co.perceptible1` …:
what lmkd's kill line shows), fills its memory and says "ready" on its connection; `start`
returns once all have (or have died: lmkd took them while the phone filled). `stop` closes the
connections, which takes the apps down (adbd hangs up each command), and kills any that outlived
that. A campaign that crashed closed its connections with it; a phone that lost the connection
may still run them, so `start` kills every process of those names first.

On a virtual phone they are the phone's own processes (its memory cgroup, its lmkd's candidates),
but run as the shell user, not as app uids the way `virtual up --apps` starts them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devices.android import ACTIVE_PERCENT, ACTIVE_PERIOD_S, HOST_ABI, App
from devices.base import DeviceError

SOURCE = Path(__file__).with_name("coapp.c")
BINARY = "bmoe-coapp"
NAME_PREFIX = "co."          # a co-tenant: "co.perceptible1" fits the 15 bytes of a comm
# an app fills its memory from /dev/urandom: this long per GiB, at least, before it is given up on
FILL_S_PER_GIB = 30.0
FILL_MIN_S = 20.0
CFLAGS = ("-O2", "-static", "-std=c11")
# Android ABIs (ro.product.cpu.abi) and the clang target of the NDK that builds for them
NDK_TARGETS = {"arm64-v8a": "aarch64-linux-android26", "x86_64": "x86_64-linux-android26"}
# ... and, without an NDK, zig's clang (the ziglang wheel: `pip install 'bmoe-fleet[phone]'`), which
# links musl statically: a static binary needs nothing of Android's libc, only its kernel
ZIG_TARGETS = {"arm64-v8a": "aarch64-linux-musl", "armeabi-v7a": "arm-linux-musleabihf",
               "x86_64": "x86_64-linux-musl", "x86": "x86-linux-musl"}


class CoAppError(DeviceError):
    """The apps could not be built, pushed or started."""


@dataclass(frozen=True)
class RunningApp:
    """One app started on the phone."""

    app: App
    pid: int
    ready: bool              # it held its memory before the engine started

    @property
    def process_name(self) -> str:
        return process_name(self.app)

    def to_dict(self) -> dict:
        return {"name": self.process_name, "state": self.app.state, "size_mib": self.app.size_bytes / (1 << 20),
                "compressible": self.app.compressible, "active": self.app.active,
                "oom_score_adj": self.app.oom_score_adj, "pid": self.pid, "ready": self.ready}


def process_name(app: App) -> str:
    """The app's comm (15 bytes at most): `co.` and its state and number (`co.perceptible1`)."""
    return (NAME_PREFIX + app.name.rsplit(".", 1)[-1])[:15]


def build(abi: str, cache_dir: Path) -> Path:
    """devices/coapp.c built for `abi` (cached by source, flags and ABI), or CoAppError saying
    what is missing."""
    src = SOURCE.read_bytes()
    key = hashlib.sha256(src + " ".join(CFLAGS).encode() + abi.encode()).hexdigest()[:16]
    out = cache_dir / key / BINARY
    if out.is_file():
        return out
    env = None
    if HOST_ABI.get(platform.machine()) == abi:
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            raise CoAppError(f"the apps axis builds {SOURCE.name} with a C compiler: none here (install gcc)")
        argv = [cc]
    elif (clang := _ndk_clang()) is not None and abi in NDK_TARGETS:
        argv = [clang, f"--target={NDK_TARGETS[abi]}"]
    elif abi in ZIG_TARGETS and importlib.util.find_spec("ziglang") is not None:
        argv = [sys.executable, "-m", "ziglang", "cc", "-target", ZIG_TARGETS[abi]]
        env = dict(os.environ, ZIG_GLOBAL_CACHE_DIR=str(cache_dir / "zig-cache"))   # ours, not ~/.cache
    else:
        raise CoAppError(f"the apps axis needs {SOURCE.name} built for a {abi or 'unknown'} phone: set "
                         "ANDROID_NDK_HOME to an Android NDK, or pip install ziglang (bmoe-fleet[phone])")
    out.parent.mkdir(parents=True, exist_ok=True)
    # a partial of this build's own: two campaigns on one host may build it at once (the same
    # source and flags: whichever rename comes last leaves the same binary)
    tmp = out.with_name(f"{out.name}.partial-{os.getpid()}-{threading.get_ident()}")
    try:
        r = subprocess.run([*argv, *CFLAGS, "-o", str(tmp), str(SOURCE)], capture_output=True, text=True,
                           timeout=300, env=env)
        if r.returncode != 0:
            raise CoAppError(f"building {SOURCE.name} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _ndk_clang() -> str | None:
    import glob

    home = os.environ.get("ANDROID_NDK_HOME") or os.environ.get("ANDROID_NDK_ROOT")
    if not home:
        return None
    found = sorted(glob.glob(os.path.join(home, "toolchains", "llvm", "prebuilt", "*", "bin", "clang")))
    return found[0] if found else None


def start_command(binary: str, app: App) -> str:
    """The shell line of one app: say its pid, take the state's adj, become the app (exec: no shell
    stays between adbd and the app, as none stays between an app and zygote)."""
    args = [binary, process_name(app), str(app.size_bytes), "1" if app.compressible else "0",
            "1" if app.active else "0", str(ACTIVE_PERCENT), str(round(ACTIVE_PERIOD_S * 1000))]
    return f"echo $$; echo {app.oom_score_adj} > /proc/self/oom_score_adj && exec {shlex.join(args)} 2>&1"


@dataclass
class AppSession:
    """The apps running on one phone, each on the adb shell connection it was started on."""

    running: list[RunningApp]
    connections: list[Any] = field(default_factory=list)     # adbutils AdbConnection, one per app

    def to_dicts(self) -> list[dict]:
        return [r.to_dict() for r in self.running]


def start(phone, apps: Sequence[App], binary_local: Path) -> AppSession:
    """Push the app binary (when the phone lacks it), stop any leftovers of these names, start
    each app on a held shell connection, and wait until each holds its memory or is gone. `phone`
    is a devices.adb.phone.AdbPhone."""
    if not apps:
        return AppSession([])
    work = phone.work_dir()
    binary = f"{work}/{BINARY}"
    phone.push(str(binary_local), binary)
    status, _, err = phone.shell(f"chmod 755 {shlex.quote(binary)}")
    if status != 0:
        raise CoAppError(f"chmod of {binary} failed: {err.decode(errors='replace').strip()}")
    phone.stop_strays([process_name(a) for a in apps])
    session = AppSession([])
    try:
        for app in apps:
            session.connections.append(phone.open_shell(start_command(binary, app)))
        deadline = time.monotonic() + max(FILL_MIN_S, FILL_S_PER_GIB * sum(a.size_bytes for a in apps) / (1 << 30))
        for app, conn in zip(apps, session.connections):
            lines = _lines_until(conn, "ready", deadline)
            if not lines or not lines[0].isdigit():
                raise CoAppError(f"{app.describe()} did not start: {' '.join(lines)[:200]!r}")
            session.running.append(RunningApp(app, int(lines[0]), "ready" in lines[1:]))
    except BaseException:
        stop(phone, session)
        raise
    return session


def _lines_until(conn, word: str, deadline: float) -> list[str]:
    """The lines a connection gives until one is `word`, it ends (the app died), or the deadline."""
    buf = b""
    while time.monotonic() < deadline:
        conn.conn.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = conn.conn.recv(4096)
        except TimeoutError:
            break
        if not chunk:
            break
        buf += chunk
        if word.encode() in buf.split(b"\n"):
            break
    return buf.decode(errors="replace").split()


def stop(phone, session: AppSession) -> list[str]:
    """Kill the apps still running and hang up their connections, in one shell round trip; the
    names of those already gone before (lmkd took them during the run)."""
    running = session.running
    script = "; ".join(f"if {_alive_test(r)}; then kill -9 {r.pid}; else echo {shlex.quote(r.process_name)}; fi"
                       for r in running)
    gone = phone.shell(script)[1].decode(errors="replace").split() if running else []
    for conn in session.connections:
        conn.close()
    session.connections = []
    return gone


def _alive_test(r: RunningApp) -> str:
    """A shell test: the app's pid is still this app and has not exited (a zombie has: its
    memory is gone, and an orphan may wait a while for init to reap it)."""
    status = f"/proc/{r.pid}/status"
    return (f"grep -qs {shlex.quote('^Name:[[:space:]]*' + r.process_name + '$')} {status} && "
            f"! grep -qs '^State:[[:space:]]*Z' {status}")
