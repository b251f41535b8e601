"""Other open apps beside the engine on a phone, for one cell (a campaign's `apps` axis, docs/decisions/other-apps.md).

Two kinds, told apart in run.json (`registered`, `ballast`):

- `open:PACKAGE`: an installed app opened as a user opens it, by its launcher activity through
  ActivityManager (`am start -W`; monkey's launcher intent where the activity is not resolved),
  stopped with `am force-stop`. ActivityManager registers it with lmkd, so it is lmkd's to kill:
  the run's collateral when the engine squeezes the phone (harness/run/app_verdict.py).
- `STATE:SIZE[...]`: ballast, a shell allocator holding memory at the state's adj. On a real
  phone lmkd never considers it (only ActivityManager registers processes with lmkd: AOSP lmkd.cpp,
  lmkd.rc), and neither does a virtual phone's lmkd; the kernel's OOM killer may take it. It
  stands for memory other apps hold, not for apps lmkd would kill.

The ballast is devices/coapp.c, built here for the phone's ABI (this host's C compiler for a phone
of this host's architecture, as a virtual phone is; the Android NDK's clang, from
$ANDROID_NDK_HOME, for an arm64 phone; else zig's clang) as a static binary of that one file with
no libc (its own entry point and system calls), pushed beside the engine and started each on an adb
shell connection held open while it runs: the shell says its pid, writes the state's oom_score_adj
(devices.android.STATES: cached 900 and up, previous 700, perceptible 200, foreground 0) and execs
the allocator, so adbd is its parent. Each names itself (`co.cached1`, `co.perceptible1` …), fills
its memory and says "ready" on its connection; `start` returns once all have (or have died). `stop`
closes the connections, which takes them down (adbd hangs up each command), and kills any that
outlived that. A campaign that crashed closed its connections with it; a phone that lost the
connection may still run them, so `start` kills every process of those names first.
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
from engine.units import GIB, MIB, is_digits

SOURCE = Path(__file__).with_name("coapp.c")
BINARY = "bmoe-coapp"
NAME_PREFIX = "co."          # a co-tenant: "co.perceptible1" fits the 15 bytes of a comm
# an app fills its memory from /dev/urandom: this long per GiB, at least, before it is given up on
FILL_S_PER_GIB = 30.0
FILL_MIN_S = 20.0
# one file, no libc: its own _start and system calls (coapp.c), so nothing to link (-nostdlib) and
# nothing the compiler may assume of a libc (-ffreestanding -fno-builtin) or call into one
# (-fno-stack-protector: __stack_chk_fail; no unwind tables: 32-bit ARM's name __aeabi_unwind_cpp_pr0);
# -static: no program interpreter, only the kernel
CFLAGS = ("-O2", "-static", "-nostdlib", "-ffreestanding", "-fno-builtin", "-fno-stack-protector",
          "-fno-unwind-tables", "-fno-asynchronous-unwind-tables", "-std=c11")
# Android ABIs (ro.product.cpu.abi) and the clang target of the NDK that builds for them
NDK_TARGETS = {"arm64-v8a": "aarch64-linux-android26", "x86_64": "x86_64-linux-android26"}
# ... and, without an NDK, zig's clang (the ziglang wheel: `pip install 'bmoe-fleet[phone]'`) for these
# targets; with -nostdlib it builds no musl (nor compiler-rt), whose name in a triple only picks the
# ABI: the binary needs only the kernel, and its build takes a second
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
        """run.json's `apps` entry. `registered`: opened through ActivityManager, so lmkd may kill it;
        otherwise `ballast`: a shell allocator, which lmkd on a real phone never considers."""
        return {"name": self.process_name, "state": self.app.state, "size_mib": self.app.size_bytes / MIB,
                "compressible": self.app.compressible, "active": self.app.active,
                "oom_score_adj": self.app.oom_score_adj, "pid": self.pid, "ready": self.ready,
                "registered": self.app.opened, "ballast": not self.app.opened}


def process_name(app: App) -> str:
    """The name lmkd's line gives the app: an opened app's process name (its package), else the
    ballast's comm (15 bytes at most): `co.` and its state and number (`co.perceptible1`)."""
    if app.opened:
        return app.name
    return (NAME_PREFIX + app.name.rsplit(".", 1)[-1])[:15]


# An installed app opened as a user opens it: its launcher activity through ActivityManager (`am
# start -W`, the activity `cmd package resolve-activity --brief` names), else monkey's launcher
# intent; then its process's pid. ActivityManager registers it with lmkd (ProcessList.setOomAdj),
# so it is lmkd's to kill, where a shell process never is. $1: the package.
OPEN_SH = (
    'a=$(cmd package resolve-activity --brief "$1" 2>/dev/null | tail -n 1); '
    'case "$a" in */*) am start -W -n "$a" >/dev/null 2>&1;; '
    '*) monkey -p "$1" -c android.intent.category.LAUNCHER 1 >/dev/null 2>&1;; esac; '
    'i=0; while [ $i -lt 50 ]; do p=$(pidof "$1" 2>/dev/null); [ -n "$p" ] && { echo "${p%% *}"; exit 0; }; '
    'sleep 0.1; i=$((i+1)); done; echo "no process of $1 after it was opened" >&2; exit 1'
)


def _open(phone, app: App) -> RunningApp:
    status, out, err = phone.shell(f"sh -c {shlex.quote(OPEN_SH)} sh {shlex.quote(app.name)}", timeout_s=30)
    pid = out.decode(errors="replace").strip()
    if status != 0 or not is_digits(pid):
        raise CoAppError(f"{app.describe()} could not be opened: "
                         f"{(err.decode(errors='replace').strip() or 'no pid')[:200]}")
    return RunningApp(app, int(pid), True)


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
    opened = [a for a in apps if a.opened]
    apps = [a for a in apps if not a.opened]
    session = AppSession([])
    try:
        for app in opened:
            session.running.append(_open(phone, app))
        if apps:
            _start_ballast(phone, apps, binary_local, session)
    except BaseException:
        stop(phone, session)
        raise
    return session


def _start_ballast(phone, apps: Sequence[App], binary_local: Path, session: AppSession) -> None:
    """The shell allocators of a load, started on `session`."""
    work = phone.work_dir()
    binary = f"{work}/{BINARY}"
    phone.push(str(binary_local), binary)
    status, _, err = phone.shell(f"chmod 755 {shlex.quote(binary)}")
    if status != 0:
        raise CoAppError(f"chmod of {binary} failed: {err.decode(errors='replace').strip()}")
    phone.stop_strays([process_name(a) for a in apps])
    connections = []
    for app in apps:
        conn = phone.open_shell(start_command(binary, app))
        connections.append(conn)
        session.connections.append(conn)
    deadline = time.monotonic() + max(FILL_MIN_S, FILL_S_PER_GIB * sum(a.size_bytes for a in apps) / GIB)
    for app, conn in zip(apps, connections):
        lines = _lines_until(conn, "ready", deadline)
        if not lines or not is_digits(lines[0]):
            raise CoAppError(f"{app.describe()} did not start: {' '.join(lines)[:200]!r}")
        session.running.append(RunningApp(app, int(lines[0]), "ready" in lines[1:]))


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
    # an opened app is stopped as a user's app is (am force-stop), a shell allocator killed
    script = "; ".join(
        # an opened app: said gone when its pid is no longer its package's, force-stopped either way
        (f"pidof {shlex.quote(r.app.name)} 2>/dev/null | grep -qw {r.pid} || echo {shlex.quote(r.process_name)}; "
         f"am force-stop {shlex.quote(r.app.name)} >/dev/null 2>&1") if r.app.opened else
        f"if {_alive_test(r)}; then kill -9 {r.pid}; else echo {shlex.quote(r.process_name)}; fi" for r in running)
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
