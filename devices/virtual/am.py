"""The phone's ActivityManager: its installed packages, the app processes it starts and their adj,
which it registers with the phone's lmkd as system_server does, and the `cmd activity` and
`cmd package` services that the phone's `cmd`, `am` and `pm` reach (servicecmd.py).

Packages (PackageManager's part): the apps of `virtual up --apps` (com.bmoe.app.cached1, ..., uids
10100+, their sizes) and INSTALLED, the apps every virtual phone has (uids 10200+), each holding
the memory given when its process runs (apps.py's app: pages lz4 stores at ~3:1, marked cold once
filled), with a launcher activity PKG/.MainActivity and a service PKG/.RunService. `pm list
packages` lists them, `cmd package resolve-activity --brief PKG` names the activity to start.

The adj (ProcessList.java's values; OomAdjuster, kept simple): the app `am start` brought to the
front is FOREGROUND_APP_ADJ 0, the one it replaced PREVIOUS_APP_ADJ 700, older ones cached, 900 +
10 per place, the most recent first (to 999); an app with a foreground service (`am
start-foreground-service`) is PERCEPTIBLE_APP_ADJ 200 while not in front. When the front app dies
no other takes the front. `--apps` keep their state's adj until `am start` brings one to the
front; `am run-as-app` holds its app at the adj asked for. Each adj is sent to lmkd as LMK_PROCPRIO
over /dev/socket/lmkd (ProcessList.setOomAdj), a dead app's record removed (LMK_PROCREMOVE). Only
what is registered is lmkd's candidate (lmkd.py).

When an app process dies (lmkd's SIGKILL, the kernel's OOM killer, its own end) its process group
is killed: ActivityManagerService.appDiedLocked calls ProcessList.killProcessGroup(app.uid, pid)
(libprocessgroup kills the app's cgroup; here it is the app's POSIX process group, which a command
could leave with setsid, where on Android it could not leave its cgroup). lmkd kills the app's pid
alone (reaper.cpp: pidfd_send_signal; lmkd's own killProcessGroup call went in 2017).

`am` (ActivityManagerShellCommand.java's texts): `start [-W] [-S] -n PKG/ACTIVITY`,
`start-foreground-service -n PKG/SERVICE`, `force-stop PKG`, `help`, and the virtual phone's own
`run-as-app [--package PKG] [--adj N] [--] ARGV...`: a real phone has nothing like it (the shell
cannot make an app run a command). It exists so that what an engine does inside the app (a child
of a registered app, lmkd's victim with its app) can be observed on a virtual phone and held
against the app verdict the harness replays from an adb run: it starts a fresh process of the app
(default io.bigmoeonedge.example, upstream's example app) at the adj (default 200: upstream's
RunService is a foreground service; 0 is the app on top), registered with lmkd, which forks ARGV
as its child on the caller's stdin, stdout and stderr, in the caller's folder when the app's uid
may enter it, with the caller's environment, as the app's uid: what it opens by name it opens as
the app (a redirection the shell made is the shell's). `am` returns the command's status (137:
SIGKILL, by lmkd with its app or by the kernel); when the caller goes first, the app is
force-stopped.

Long because: it is one service, ActivityManager's state (the running apps, the front one, the
recent order, the lmkd socket) shared by the `cmd activity` and `cmd package` handlers and by the
adj ranking that starting and stopping apps changes; some 25 of its lines are the two help texts
those services print.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path

from devices.android import (
    CACHED_APP_MAX_ADJ,
    CACHED_APP_MIN_ADJ,
    FIRST_APP_UID,
    FOREGROUND_APP_ADJ,
    PERCEPTIBLE_APP_ADJ,
    PREVIOUS_APP_ADJ,
    App,
)
from devices.virtual import apps, logbuf, namespace, servicecmd
from devices.virtual.lmkd_registry import (
    CONTROL_SOCKET,
    PROC_TYPE_APP,
    connect_seqpacket,
    listen_seqpacket,
    peer_credentials,
    procprio_packet,
    procremove_packet,
)
from engine.units import MIB

log = logging.getLogger("bmoe.vphone.am")

SERVICE_SOCKET = servicecmd.SOCKET
LAUNCHER_ACTIVITY, FOREGROUND_SERVICE = "MainActivity", "RunService"
ENGINE_PACKAGE = "io.bigmoeonedge.example"
INSTALLED_FIRST_UID = FIRST_APP_UID + 100
# the apps every virtual phone has installed, and what each holds once running
INSTALLED = ((ENGINE_PACKAGE, 16 * MIB), ("com.bmoe.app.browser", 96 * MIB), ("com.bmoe.app.maps", 64 * MIB),
             ("com.bmoe.app.chat", 32 * MIB))
NO_CLASS_ERROR_CODE = "Error type 3"
REQUEST_TIMEOUT_S = 10.0
FAILED = -1          # a shell command's result code for an error: `cmd` exits 255


@dataclass(frozen=True)
class Package:
    name: str
    uid: int
    size_bytes: int
    compressible: bool = True
    active: bool = False

    def component(self, cls: str) -> str:
        return f"{self.name}.{cls}"


def installed(boot_apps: list[App], uid_offset: int = 0) -> dict[str, Package]:
    """The phone's packages: its `--apps` (their uids and sizes) and INSTALLED, whose uids start
    at the phone's `uid_offset` past INSTALLED_FIRST_UID (its own block of app uids, which the
    `--apps` already carry: devices.virtual.run.claim_app_uids)."""
    out = {a.name: Package(a.name, a.uid, a.size_bytes, a.compressible, a.active) for a in boot_apps}
    for k, (name, size_bytes) in enumerate(INSTALLED):
        out.setdefault(name, Package(name, INSTALLED_FIRST_UID + uid_offset + k, size_bytes))
    return out


def format_uid(uid: int) -> str:
    """UserHandle.formatUid for user 0: u0a100 for uid 10100."""
    return f"u0a{uid - 10000}" if uid >= 10000 else str(uid)


def short_component(package: str, cls: str) -> str:
    """ComponentName.flattenToShortString: `pkg/.Cls` when the class is in the package."""
    return f"{package}/{cls[len(package):]}" if cls.startswith(package + ".") else f"{package}/{cls}"


class UsageError(Exception):
    """A bad call: one line for stderr, status FAILED."""


@dataclass
class AppProcess:
    package: Package
    proc: asyncio.subprocess.Process
    adj: int
    pinned: bool             # its adj is not ActivityManager's to change (an --apps state, run-as-app)
    service: bool = False    # it runs a foreground service
    gone: bool = False       # died, and its process group was killed

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Call:
    """One `cmd` invocation: its arguments, the caller's folder, environment, stdio and uid."""
    args: list[str]
    cwd: str
    env: dict[str, str]
    stdio: list[int]
    uid: int
    conn: socket.socket


def reply(out: str = "", err: str = "", status: int = 0) -> dict:
    return {"out": out, "err": err, "status": status}


class ActivityManager:
    def __init__(self, root: Path, boot_apps: list[App], procs_files: list[str], ns_fd: int | None,
                 net_fd: int | None = None, uid_offset: int = 0):
        self.root = Path(root)
        self.boot_apps = [replace(a, uid=a.uid + uid_offset) for a in boot_apps]
        self.packages = installed(self.boot_apps, uid_offset)
        self.procs_files, self.ns_fd, self.net_fd = procs_files, ns_fd, net_fd
        self.running: dict[str, AppProcess] = {}
        self.top: str | None = None          # the package `am start` brought to the front last
        self.recent: list[str] = []          # packages `am start` opened, the most recent first
        self.locks: dict[str, asyncio.Lock] = {}
        self.tasks: set[asyncio.Task] = set()
        self.lmkd: socket.socket | None = None
        self.listener: socket.socket | None = None

    # -- life ------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Reach lmkd, serve `cmd`, start the `--apps` (each holding its memory when this returns)."""
        try:
            self.lmkd = connect_seqpacket(self.root / CONTROL_SOCKET)
            self.lmkd.settimeout(1.0)
        except OSError as e:
            log.warning("am: cannot reach lmkd (%s): no app will be lmkd's to kill", e)
        self.listener = listen_seqpacket(self.root / SERVICE_SOCKET, 0, 0, 0o666)
        asyncio.get_running_loop().add_reader(self.listener.fileno(), self._accept)
        for app in self.boot_apps:
            await self._launch(self.packages[app.name], app.oom_score_adj, f"added application {app.name}",
                               pinned=True)

    async def stop(self) -> None:
        """Every app and its process group killed, the sockets closed (never raises: the phone's
        teardown goes on after it)."""
        if self.listener is not None:
            asyncio.get_running_loop().remove_reader(self.listener.fileno())
            self.listener.close()
            self.listener = None
            with contextlib.suppress(OSError):
                (self.root / SERVICE_SOCKET).unlink()
        for rec in list(self.running.values()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(rec.pid, signal.SIGKILL)
            try:
                await asyncio.wait_for(rec.proc.wait(), REQUEST_TIMEOUT_S)
            except Exception:      # the phone's cgroup removal kills what is left
                log.exception("am: %s (%d) did not end", rec.package.name, rec.pid)
        for task in list(self.tasks):
            task.cancel()
        if self.lmkd is not None:
            self.lmkd.close()
            self.lmkd = None

    def _task(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _lock(self, package: str) -> asyncio.Lock:
        return self.locks.setdefault(package, asyncio.Lock())

    # -- processes -------------------------------------------------------------------------------
    async def _launch(self, pkg: Package, adj: int, hosting: str, pinned: bool = False) -> AppProcess:
        """Start pkg's process at adj, registered with lmkd before it fills its memory, and return
        once it holds it (or died filling it)."""
        app = App("installed", pkg.size_bytes, pkg.compressible, pkg.name, pkg.uid, adj, pkg.active)
        proc = await apps.spawn(app, self.procs_files, self.ns_fd, self.net_fd)
        rec = self._started(pkg, proc, adj, pinned, hosting)
        await apps.ready(proc)
        return rec

    def _started(self, pkg: Package, proc: asyncio.subprocess.Process, adj: int, pinned: bool,
                 hosting: str) -> AppProcess:
        rec = AppProcess(pkg, proc, adj, pinned)
        self.running[pkg.name] = rec
        self._register(rec)
        logbuf.append(self.root, "system", "ActivityManager",
                      f"Start proc {namespace.phone_pid(rec.pid) or rec.pid}:{pkg.name}/{format_uid(pkg.uid)} "
                      f"for {hosting}")
        self._task(self._watch(rec))
        return rec

    async def _watch(self, rec: AppProcess) -> None:
        await rec.proc.wait()
        self._died(rec)

    def _died(self, rec: AppProcess) -> None:
        """appDiedLocked: kill the app's process group, forget the app, unregister it."""
        if rec.gone:
            return
        rec.gone = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(rec.pid, signal.SIGKILL)
        if self.running.get(rec.package.name) is not rec:
            return
        del self.running[rec.package.name]
        self._send(procremove_packet(rec.pid))
        log.info("am: %s (%d) died (%s)", rec.package.name, rec.pid, rec.proc.returncode)
        self._rerank()

    async def force_stop(self, name: str) -> None:
        """forceStopPackage: its process group killed, its activity and service gone."""
        rec = self.running.get(name)
        if name in self.recent:
            self.recent.remove(name)
        if self.top == name:
            self.top = None
        if rec is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(rec.pid, signal.SIGKILL)
            await rec.proc.wait()
            self._died(rec)

    def _register(self, rec: AppProcess) -> None:
        self._send(procprio_packet(rec.pid, rec.package.uid, rec.adj, PROC_TYPE_APP))

    def _send(self, packet: bytes) -> None:
        if self.lmkd is None:
            return
        try:
            self.lmkd.send(packet)
        except OSError as e:
            log.warning("am: writing to lmkd failed (%s)", e)

    def _rerank(self) -> None:
        """Each app's adj from its place (front, previous, cached) and its service; changes to lmkd."""
        order = [n for n in self.recent if n in self.running and n != self.top]
        for name, rec in self.running.items():
            if rec.pinned:
                continue
            if name == self.top:
                adj = FOREGROUND_APP_ADJ
            elif name in order:
                k = order.index(name)
                adj = PREVIOUS_APP_ADJ if k == 0 else min(CACHED_APP_MAX_ADJ, CACHED_APP_MIN_ADJ + 10 * (k - 1))
            else:
                adj = CACHED_APP_MIN_ADJ
            if rec.service:
                adj = min(adj, PERCEPTIBLE_APP_ADJ)
            if adj != rec.adj:
                rec.adj = adj
                self._register(rec)

    # -- the service socket ----------------------------------------------------------------------
    def _accept(self) -> None:
        while self.listener is not None:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.warning("am: accept: %s", e)
                return
            conn.setblocking(False)
            self._task(self._session(conn))

    async def _session(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            try:
                data, fds = await asyncio.wait_for(_receive(conn), REQUEST_TIMEOUT_S)
                request = json.loads(data)
                call = Call([str(a) for a in request["args"]], str(request.get("cwd") or "/"),
                            {str(k): str(v) for k, v in dict(request.get("env") or {}).items()}, fds,
                            peer_credentials(conn)[1], conn)
            except (TimeoutError, ValueError, KeyError, TypeError, OSError) as e:
                log.warning("am: a call it cannot read (%s)", e)
                return
            log.info("am: uid %d: cmd %s", call.uid, " ".join(call.args)[:300])
            try:
                answer = await self._dispatch(call)
            except UsageError as e:
                answer = reply(err=f"{e}\n", status=FAILED)
            await asyncio.get_running_loop().sock_sendall(conn, json.dumps(answer).encode())
        except OSError:
            pass                                  # the caller went away
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            conn.close()

    async def _dispatch(self, call: Call) -> dict:
        if not call.args:
            return reply(err="cmd: No service specified; use -l to list all running services\n",
                         status=servicecmd.NO_SERVICE_STATUS)
        service, args = call.args[0], call.args[1:]
        if service == "-l":
            return reply("Currently running services:\n  activity\n  package\n")
        if service == "activity":
            return await self._activity(args, call)
        if service == "package":
            return self._package(args)
        return reply(err=f"cmd: Can't find service: {service}\n", status=servicecmd.NO_SERVICE_STATUS)

    # -- cmd activity ----------------------------------------------------------------------------
    async def _activity(self, args: list[str], call: Call) -> dict:
        if not args or args[0] in ("help", "-h"):
            return reply(ACTIVITY_HELP)
        sub, rest = args[0], args[1:]
        if sub in ("start", "start-activity"):
            return await self._start_activity(rest)
        if sub in ("start-foreground-service", "start-fg-service", "startforegroundservice", "startfgservice"):
            return await self._start_service(rest)
        if sub == "force-stop":
            names = _options(rest, "force-stop", {"--user": True})[1]
            if len(names) != 1:
                raise UsageError("Error: force-stop needs one package: am force-stop PKG")
            await self.force_stop(names[0])
            return reply()
        if sub == "run-as-app":
            return await self._run_as_app(rest, call)
        return reply(err=f"Unknown command: {sub}\n", status=FAILED)

    def _resolve(self, args: list[str], what: str, cls: str) -> tuple[Package | None, str, dict[str, str]]:
        opts, rest = _options(args, what, {"-n": True, "--user": True, "-W": False, "-S": False})
        if rest or "-n" not in opts:
            raise UsageError(f"Error: a virtual phone's am {what} takes -n PKG/{cls} (cmd package "
                             "resolve-activity --brief PKG names the activity)")
        pkg_name, _, name = opts["-n"].partition("/")
        full = pkg_name + name if name.startswith(".") else name
        pkg = self.packages.get(pkg_name)
        return (pkg if pkg is not None and full == pkg.component(cls) else None), full, opts

    async def _start_activity(self, args: list[str]) -> dict:
        pkg, full, opts = self._resolve(args, "start", LAUNCHER_ACTIVITY)
        name = opts["-n"].partition("/")[0]
        out = []
        if pkg is not None and "-S" in opts:
            out.append(f"Stopping: {pkg.name}")
            await self.force_stop(pkg.name)
        out.append(f"Starting: Intent {{ cmp={short_component(name, full)} }}")
        if pkg is None:
            return reply("\n".join(out) + "\n", f"{NO_CLASS_ERROR_CODE}\nError: Activity class {{{name}/{full}}} "
                         "does not exist.\n", 1)
        started = time.monotonic()
        async with self._lock(pkg.name):
            rec = self.running.get(pkg.name)
            in_front = rec is not None and self.top == pkg.name
            self.top = pkg.name
            if pkg.name in self.recent:
                self.recent.remove(pkg.name)
            self.recent.insert(0, pkg.name)
            if rec is not None:
                rec.pinned = False
            self._rerank()
            if rec is None:
                await self._launch(pkg, FOREGROUND_APP_ADJ, f"top-activity {{{pkg.name}/{full}}}")
        err = ""
        if in_front:
            warning = "Warning: Activity not started, its current task has been brought to the front"
            if "-W" in opts:
                out.append(warning)
            else:
                err = warning + "\n"
        if "-W" in opts:
            ms = int((time.monotonic() - started) * 1000)
            out += ["Status: ok", f"LaunchState: {'HOT' if rec is not None else 'COLD'}",
                    f"Activity: {short_component(pkg.name, full)}", f"TotalTime: {ms}", f"WaitTime: {ms}", "Complete"]
        return reply("\n".join(out) + "\n", err)

    async def _start_service(self, args: list[str]) -> dict:
        pkg, full, opts = self._resolve(args, "start-foreground-service", FOREGROUND_SERVICE)
        name = opts["-n"].partition("/")[0]
        out = f"Starting service: Intent {{ cmp={short_component(name, full)} }}\n"
        if pkg is None:
            return reply(out, "Error: Not found; no service started.\n", FAILED)
        async with self._lock(pkg.name):
            rec = self.running.get(pkg.name)
            if rec is None:
                rec = await self._launch(pkg, PERCEPTIBLE_APP_ADJ, f"foreground-service {{{pkg.name}/{full}}}")
            rec.service, rec.pinned = True, False
            self._rerank()
        return reply(out)

    async def _run_as_app(self, args: list[str], call: Call) -> dict:
        opts, argv = _options(args, "run-as-app", {"--package": True, "--adj": True})
        if not argv:
            raise UsageError("Error: run-as-app needs a command: am run-as-app [--package PKG] [--adj N] -- ARGV...")
        name = opts.get("--package", ENGINE_PACKAGE)
        pkg = self.packages.get(name)
        if pkg is None:
            raise UsageError(f"Error: package {name} is not installed (pm list packages lists them)")
        try:
            adj = int(opts.get("--adj", str(PERCEPTIBLE_APP_ADJ)))
        except ValueError:
            adj = -1
        if not FOREGROUND_APP_ADJ <= adj <= CACHED_APP_MAX_ADJ:
            raise UsageError(f"Error: --adj takes an app's oom_score_adj, 0 to {CACHED_APP_MAX_ADJ} (0 on top, "
                             f"{PERCEPTIBLE_APP_ADJ} a foreground service), not {opts['--adj']!r}")
        if len(call.stdio) != 3:
            raise UsageError("Error: run-as-app needs the caller's stdin, stdout and stderr")
        loop = asyncio.get_running_loop()
        async with self._lock(pkg.name):
            await self.force_stop(pkg.name)       # a fresh process of the app runs the command
            proc = await apps.spawn_host(pkg.name, pkg.uid, adj, call.cwd, argv, call.env,
                                         (call.stdio[0], call.stdio[1], call.stdio[2]), self.procs_files,
                                         self.ns_fd, self.net_fd)
            self._started(pkg, proc, adj, True, f"run-as-app {argv[0]}")
        gone = loop.create_task(loop.sock_recv(call.conn, 1))   # the caller hanging up: b"" (or an error)
        done = loop.create_task(proc.wait())
        try:
            await asyncio.wait({gone, done}, return_when=asyncio.FIRST_COMPLETED)
            if not done.done():
                log.info("am: the caller of run-as-app %s went away: force-stopping %s", argv[0], pkg.name)
                await self.force_stop(pkg.name)
            code = await done
        finally:
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await gone
        return reply(status=128 - code if code < 0 else code)

    # -- cmd package -----------------------------------------------------------------------------
    def _package(self, args: list[str]) -> dict:
        if not args or args[0] in ("help", "-h"):
            return reply(PACKAGE_HELP)
        if args[:2] == ["list", "packages"]:
            words = [a for a in args[2:] if not a.startswith("-")]
            return reply("".join(f"package:{n}\n" for n in sorted(self.packages) if not words or words[0] in n))
        if args[0] == "resolve-activity":
            opts, rest = _options(args[1:], "resolve-activity",
                                  {"--brief": False, "--user": True, "-a": True, "-c": True})
            target = rest[-1].partition("/")[0] if rest else ""
            pkg = self.packages.get(target)
            if pkg is None:
                return reply("No activity found\n")
            activity = short_component(pkg.name, pkg.component(LAUNCHER_ACTIVITY))
            head = "priority=0 preferredOrder=0 match=0x108000 specificIndex=-1 isDefault=true\n"
            return reply(head + activity + "\n" if "--brief" in opts else f"  name={activity}\n  {head}")
        return reply(err=f"Unknown command: {args[0]}\n", status=FAILED)


def _options(args: list[str], what: str, known: dict[str, bool]) -> tuple[dict[str, str], list[str]]:
    """Options (name -> value, "" for a flag; `known` says which take a value) up to the first
    word that is none, or `--`; and the words after."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        word = args[i]
        if word == "--":
            i += 1
            break
        if word not in known:
            raise UsageError(f"Error: Unknown option: {word} (a virtual phone's am {what} takes "
                             f"{', '.join(sorted(known))})")
        if known[word]:
            if i + 1 == len(args):
                raise UsageError(f"Error: {word} needs a value")
            opts[word], i = args[i + 1], i + 2
        else:
            opts[word], i = "", i + 1
    return opts, args[i:]


async def _receive(conn: socket.socket) -> tuple[bytes, list[int]]:
    """One message and the descriptors it carries, once the socket has it."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(conn, servicecmd.MAX_MESSAGE_BYTES, 3)
        except (BlockingIOError, InterruptedError):
            readable: asyncio.Future[None] = loop.create_future()
            loop.add_reader(conn.fileno(), _wake, readable)
            try:
                await readable
            finally:
                loop.remove_reader(conn.fileno())
            continue
        for fd in fds:
            os.set_inheritable(fd, False)
        return data, fds


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


ACTIVITY_HELP = """Activity manager (activity) commands (a virtual phone's subset):
  help
      Print this help text.
  start [-W] [-S] -n PKG/ACTIVITY
      Start an activity: its app comes to the front (oom_score_adj 0). -W: wait for the launch
      and say how it went; -S: force-stop the app first.
  start-foreground-service -n PKG/SERVICE
      Start a foreground service: its app is perceptible (200) while not in front.
  force-stop PKG
      Completely stop the given application package.
  run-as-app [--package PKG] [--adj N] [--] ARGV...
      The virtual phone's own, not a real phone's: run ARGV as a child of a fresh process of the
      app (default io.bigmoeonedge.example) at oom_score_adj N (default 200, a foreground service),
      registered with lmkd, on this command's stdin, stdout and stderr; exits with its status.
"""

PACKAGE_HELP = """Package manager (package) commands (a virtual phone's subset):
  help
      Print this help text.
  list packages [FILTER]
      Print all packages, optionally only those whose name contains FILTER.
  resolve-activity [--brief] PKG
      Print the activity that PKG's launcher intent resolves to.
"""
