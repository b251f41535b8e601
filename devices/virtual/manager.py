"""Start, stop and list virtual phones as background daemons, connected to an adb server.

up() writes the phone's spec, starts `python -m devices.virtual.run` detached (own session, log
in .vphone/daemon.log), waits for its state.json (written once the port listens), then runs
`adb connect 127.0.0.1:PORT` through adbutils and waits for the device state. down() disconnects,
SIGTERMs the daemon (it removes its cgroup), SIGKILLs it after a grace, removes any cgroup left
behind, and deletes state.json; the phone's folder (its /data, logcat buffers) is kept unless
purge=True. list() reads the folders under the home (~/.bmoe-fleet/virtual by default).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from devices.android import parse_apps
from devices.virtual import cgroup as cgroups
from devices.virtual import cpuinfo, dataquota, zram
from devices.virtual.checks import VirtualPhoneError, check_args
from devices.virtual.phone import (
    INTERNAL,
    STACKS_SIGNAL,
    Layout,
    NotLinux,
    PhoneSpec,
    UserlandMissing,
    default_home,
    host_userland,
    reclaim_left,
    require_linux,
)
from engine.errors import BmoeError
from engine.procfs import read_kb_fields
from engine.units import KIB, MIB

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# How long a daemon has to serve: about 2 s on an idle 2-core host, zram and all; far longer on a
# loaded one is still a start, and one stuck is reported with where it is (_wait_for_state)
START_TIMEOUT_S = 60.0

@dataclass(frozen=True)
class PhoneInfo:
    name: str
    root: Path
    running: bool
    pid: int | None
    port: int | None
    serial: str | None
    ram_bytes: int
    model: str
    soc: str
    android: int
    namespace: bool
    cgroup_path: str | None
    warnings: tuple[str, ...]
    mount_namespace: str | None = None   # e.g. "mnt:[4026532179]", what /proc/PID/ns/mnt of its processes reads
    apps: tuple[str, ...] = ()            # the other open apps (apps.App.describe())
    zram_bytes: int = 0                   # its own zram swap (0: none)
    cpus: tuple[int, ...] = ()            # the host cores its cpuset gives it (running, --cpus), else ()
    storage_mbps: int = 0                 # its /data read throttle (0: none)
    build: str = "user"                   # ro.build.type
    page_size_bytes: int = 4096           # the page size its shell sees
    data_quota_bytes: int = 0             # the size of its /data (0: no quota, the host's disk)

    def to_dict(self) -> dict:
        d = self.__dict__.copy()
        d["root"] = str(self.root)
        d["warnings"] = [*self.warnings]
        d["apps"] = [*self.apps]
        d["cpus"] = [*self.cpus]
        return d


def _home(home: os.PathLike | str | None) -> Path:
    return Path(home) if home is not None else default_home()


def _is_daemon(pid: int | None) -> TypeGuard[int]:
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"devices.virtual.run" in cmdline


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def info(name: str, home: os.PathLike | str | None = None) -> PhoneInfo:
    """What the phone NAME is and whether its daemon runs (from its folder's spec and state)."""
    root = _home(home) / name
    spec_data = _read_json(root / INTERNAL / "spec.json")
    if spec_data is None:
        raise VirtualPhoneError(f"no virtual phone named {name!r} under {_home(home)}")
    spec = PhoneSpec.from_json(spec_data)
    state = _read_json(root / INTERNAL / "state.json") or {}
    running = _is_daemon(state.get("pid"))
    cg = state.get("cgroup") or {}
    return PhoneInfo(name=spec.name, root=root, running=running, pid=state.get("pid") if running else None,
                     port=state.get("port") if running else None, serial=state.get("serial") if running else None,
                     ram_bytes=spec.ram_bytes, model=spec.model, soc=spec.soc, android=spec.android,
                     namespace=bool(state.get("namespace")), cgroup_path=cg.get("path"),
                     warnings=tuple(state.get("warnings") or ()),
                     mount_namespace=state.get("mount_namespace") if running else None,
                     apps=tuple(a.describe() for a in parse_apps(spec.apps)), zram_bytes=spec.zram_bytes,
                     cpus=tuple(state.get("cpus") or ()) if running and spec.cpus else (),
                     storage_mbps=spec.storage_mbps, build=spec.build, page_size_bytes=spec.page_size_bytes,
                     data_quota_bytes=spec.data_quota_bytes)


def list_phones(home: os.PathLike | str | None = None) -> builtins.list[PhoneInfo]:
    """Every phone with a folder under the home, by name."""
    base = _home(home)
    if not base.is_dir():
        return []
    return [info(d.name, base) for d in sorted(base.iterdir()) if (d / INTERNAL / "spec.json").is_file()]


def _adb(adb_host: str | None, adb_port: int | None, start: bool = False):
    """A client of the adb server given, or of the one adb's environment names (devices.adb.server, the
    one place that reads it); start=True starts a local server there when none answers."""
    from devices.adb import server as adb  # a heavy import (adbutils), only for up/down

    server = adb.server_at(adb_host, adb_port)
    if start:
        adb.ensure_server(server)
    return server.client()


def _server_listening(adb_host: str | None, adb_port: int | None) -> bool:
    """Is an adb server there? (Asking one that is not would start it just to be told to disconnect.)"""
    from devices.adb.server import server_at

    try:
        server = server_at(adb_host, adb_port)
    except BmoeError:     # adb's environment is malformed: nothing to disconnect from, still stop the phone
        return False
    try:
        with socket.create_connection((server.host, server.port), timeout=2):
            return True
    except OSError:
        return False


def up(name: str, ram_bytes: int, model: str = "vphone", soc: str = "sm8550", android: int = 14,
       port: int | None = None, *, manufacturer: str = "bmoe", abi: str = "arm64-v8a",
       home: os.PathLike | str | None = None, adb_host: str | None = None,
       adb_port: int | None = None, timeout_s: float = START_TIMEOUT_S, isolated: bool = True,
       record_commands: bool = False, apps: str | builtins.list[str] | tuple[str, ...] = (),
       zram_bytes: int = 0, zram_algorithm: str = "lz4", swappiness: int = 100, cpus: int = 0,
       storage_mbps: int = 0, profile: str = "", lmk: dict | None = None, build: str = "user",
       page_size_bytes: int = 4096, data_quota_bytes: int = 0, thermal_unit: str = "mC") -> str:
    """Start the phone NAME and connect it to the adb server; returns its serial 127.0.0.1:PORT.

    isolated=False skips the memory cgroup and the mount namespace (what happens anyway where
    they are unavailable): an RSS watchdog enforces the RAM and commands see the host's files.
    record_commands=True keeps every shell/exec command line the phone is sent (recorded_commands).
    apps: other open apps, `cached:300MiB,perceptible:200MiB[:compressible]` (devices/virtual/apps.py).
    zram_bytes: the phone's own zram swap (0: none; the library's default, the CLI's is half the RAM),
    compressed with zram_algorithm, at swappiness. cpus: cores of its own (0: the host's, shared).
    storage_mbps: a read throttle on its /data (0: none). profile: the real phone the figures are
    from (recorded in the spec; devices/virtual/profiles.py). lmk: ro.lmk.* overrides.
    build: "user" (the default, as phones are sold) or "userdebug" (its logd keeps the kernel's
    log). page_size_bytes: 4096 or 16384 (Android 15 on). data_quota_bytes: the size of its /data
    and /sdcard (0: the host's disk; devices/virtual/dataquota.py). thermal_unit: what its CPU
    zones count in, "mC", "dC" or "C" (devices/virtual/variant.py).

    Every argument is checked first (devices/virtual/checks.py), then what this host can give;
    a refusal is one line and leaves nothing made."""
    app_items = tuple(apps.split(",") if isinstance(apps, str) else apps)
    check_args(name=name, ram_bytes=ram_bytes, model=model, manufacturer=manufacturer, soc=soc, android=android,
               abi=abi, port=port, apps=app_items, zram_bytes=zram_bytes, zram_algorithm=zram_algorithm,
               swappiness=swappiness, cpus=cpus, storage_mbps=storage_mbps, profile=profile, build=build,
               page_size_bytes=page_size_bytes, data_quota_bytes=data_quota_bytes, thermal_unit=thermal_unit)
    try:
        require_linux()
    except NotLinux as e:
        raise VirtualPhoneError(str(e)) from None
    _check_resources(ram_bytes, zram_bytes, zram_algorithm, cpus, storage_mbps, isolated)
    try:
        host_userland()
    except UserlandMissing as e:
        raise VirtualPhoneError(str(e)) from None
    root = _home(home) / name
    _check_quota(data_quota_bytes, isolated, root)
    internal = root / INTERNAL
    state = _read_json(internal / "state.json") or {}
    if _is_daemon(state.get("pid")):
        raise VirtualPhoneError(f"virtual phone {name!r} is already up as {state.get('serial')}")
    internal.mkdir(parents=True, exist_ok=True)
    spec = PhoneSpec(name=name, ram_bytes=ram_bytes, model=model, manufacturer=manufacturer, soc=soc,
                     android=android, abi=abi, isolated=isolated, record_commands=record_commands,
                     apps=tuple(a.strip() for a in app_items if a.strip()), zram_bytes=zram_bytes,
                     zram_algorithm=zram_algorithm, swappiness=swappiness, cpus=cpus, storage_mbps=storage_mbps,
                     profile=profile, lmk=dict(lmk or {}), build=build, page_size_bytes=page_size_bytes,
                     data_quota_bytes=data_quota_bytes, thermal_unit=thermal_unit)
    (internal / "spec.json").write_text(json.dumps(spec.to_json(), indent=2, allow_nan=False) + "\n")
    (internal / "state.json").unlink(missing_ok=True)
    (internal / "commands.jsonl").unlink(missing_ok=True)   # a recording is of this run of the phone
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "devices.virtual.run", "--root", str(root), "--port", str(port or 0)]
    # Started through a shell's background job so the daemon is nobody's child here: it outlives
    # this process and never lingers as its zombie.
    script = (" ".join(shlex.quote(a) for a in argv) + f" </dev/null >>{shlex.quote(str(Layout(root).daemon_log))}"
              " 2>&1 & echo $!")
    launched = subprocess.run(["/bin/sh", "-c", script], cwd=str(PROJECT_ROOT), env=env, capture_output=True,
                              text=True, start_new_session=True)
    try:
        pid = int(launched.stdout.strip())
    except ValueError:
        raise VirtualPhoneError(f"could not start the daemon: {launched.stderr.strip()}") from None
    state = _wait_for_state(internal, pid, timeout_s)
    serial = state["serial"]
    for warning in state.get("warnings") or ():
        print(f"virtual phone {name}: {warning}", file=sys.stderr)
    try:
        _connect(serial, adb_host, adb_port, timeout_s)
    except Exception as e:
        _stop(root, state)
        raise VirtualPhoneError(f"virtual phone {name!r} started but adb could not connect: {e}") from None
    return serial


def _check_resources(ram_bytes: int, zram_bytes: int, algorithm: str, cpus: int, storage_mbps: int,
                     isolated: bool) -> None:
    """Refuse, in one line, what this host cannot give a phone (before anything is started)."""
    host_kib = read_kb_fields("/proc/meminfo").get("MemTotal")
    if host_kib and ram_bytes > host_kib * KIB:
        raise VirtualPhoneError(f"--ram {ram_bytes // MIB}MiB refused: this host has {host_kib * KIB // MIB} MiB "
                                "(a phone's limit it could never reach measures nothing)")
    if not isolated and (zram_bytes or cpus or storage_mbps):
        raise VirtualPhoneError("--zram, --cpus and --storage-mbps need isolation (cgroups): drop --no-isolation")
    if zram_bytes:
        reason = zram.available()
        if reason:
            raise VirtualPhoneError(f"--zram {zram_bytes // MIB}MiB refused: {reason}; --zram 0 runs without swap")
        offered = zram.algorithms()
        if offered and algorithm not in offered:
            raise VirtualPhoneError(f"zram algorithm {algorithm!r} not offered by this kernel (it has "
                                    f"{', '.join(offered)})")
    have = len(cpuinfo.host_cpus())
    if cpus > have:
        raise VirtualPhoneError(f"--cpus {cpus} refused: this host has {have} cores")


def _check_quota(data_quota_bytes: int, isolated: bool, root: Path) -> None:
    """Refuse, in one line, a /data quota this host cannot give (dataquota.py) to the phone `root`."""
    if not data_quota_bytes:
        return
    if data_quota_bytes < dataquota.MIN_BYTES:
        raise VirtualPhoneError(f"--data-quota {data_quota_bytes} bytes is too small (at least "
                                f"{dataquota.MIN_BYTES // MIB} MiB: ext4's own tables take some)")
    if not isolated:
        raise VirtualPhoneError("--data-quota needs isolation (a mount namespace): drop --no-isolation")
    reason = dataquota.available()
    if reason:
        raise VirtualPhoneError(f"--data-quota refused: {reason}")
    with contextlib.suppress(OSError):
        if dataquota.image_path(root / INTERNAL).stat().st_size == data_quota_bytes:
            return      # its /data image is there already
    where = next((p for p in (root, *root.parents) if p.exists()), Path("/"))
    st = os.statvfs(where)
    if st.f_bavail * st.f_frsize < data_quota_bytes:
        raise VirtualPhoneError(f"--data-quota {data_quota_bytes // MIB} MiB refused: {where} has only "
                                f"{st.f_bavail * st.f_frsize // MIB} MiB free for the phone's /data image")


def recorded_commands(name: str, home: os.PathLike | str | None = None) -> builtins.list[str]:
    """The command lines a phone started with record_commands=True was sent, in order (an
    interactive shell is the empty string)."""
    path = _home(home) / name / INTERNAL / "commands.jsonl"
    try:
        lines = path.read_text(encoding="utf-8", errors="surrogateescape").splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line)["command"] or "" for line in lines if line.strip()]


def _wait_for_state(internal: Path, pid: int, timeout_s: float) -> dict:
    """The state the daemon `pid` writes once it serves. One that exits first, or has not written
    it in `timeout_s`, raises with its log's end; one still running is asked for its threads'
    stacks (STACKS_SIGNAL, to its log), killed, and what it made is removed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = _read_json(internal / "state.json")
        if state and state.get("pid") == pid:
            return state
        if not _is_daemon(pid):
            raise VirtualPhoneError("virtual phone daemon exited before it served: " + _log_tail(internal, 5))
        time.sleep(0.05)
    where = _where(pid)
    with contextlib.suppress(OSError):
        os.kill(pid, STACKS_SIGNAL)
        time.sleep(0.5)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    gone = time.monotonic() + 10.0
    while _is_daemon(pid) and time.monotonic() < gone:
        time.sleep(0.05)
    reclaim_left(internal)        # what it made in its setup, as its next start would remove it
    raise VirtualPhoneError(f"virtual phone daemon did not serve in {timeout_s:g} s ({where}); killed. "
                            "Its log ends: " + _log_tail(internal, 16))


def _where(pid: int) -> str:
    """Where a process is: its state and the kernel function it waits in (/proc/PID/stat, wchan)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        state = stat[stat.rindex(")") + 2:].split()[0]
    except (OSError, ValueError, IndexError):
        return "gone"
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip() or "-"
    except OSError:
        wchan = "?"
    return f"state {state}, waiting in {wchan}"


def _log_tail(internal: Path, lines: int) -> str:
    try:
        tail = Layout(internal.parent).daemon_log.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        tail = []
    return " | ".join(line.strip() for line in tail) or "no output"


def _connect(serial: str, adb_host: str | None, adb_port: int | None, timeout_s: float) -> None:
    client = _adb(adb_host, adb_port, start=True)
    answer = client.connect(serial, timeout=timeout_s)
    if "connected to" not in answer:
        raise VirtualPhoneError(answer.strip())
    deadline = time.monotonic() + timeout_s
    state = "?"
    while time.monotonic() < deadline:
        state = next((d.state for d in client.list() if d.serial == serial), "absent")
        if state == "device":
            return
        time.sleep(0.05)
    raise VirtualPhoneError(f"{serial} stayed {state!r}")


def down(name: str | None = None, *, all_phones: bool = False, purge: bool = False,
         home: os.PathLike | str | None = None, adb_host: str | None = None,
         adb_port: int | None = None) -> builtins.list[str]:
    """Stop NAME (or every phone with all_phones=True); returns the names stopped."""
    if (name is None) == (not all_phones):
        raise VirtualPhoneError("give either a phone's name or --all" if name is None else
                                "give a phone's name or --all, not both")
    targets = [p.name for p in list_phones(home)] if name is None else [info(name, home).name]
    for target in targets:
        root = _home(home) / target
        state = _read_json(root / INTERNAL / "state.json") or {}
        if state.get("serial") and _server_listening(adb_host, adb_port):
            # the server may be going away; the daemon still has to stop
            with contextlib.suppress(Exception):
                _adb(adb_host, adb_port).disconnect(state["serial"])
        _stop(root, state)
        if purge:
            shutil.rmtree(root, ignore_errors=True)
    return targets


def _stop(root: Path, state: dict) -> None:
    pid = state.get("pid")
    if _is_daemon(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        while _is_daemon(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _is_daemon(pid):
            os.kill(pid, signal.SIGKILL)
            while _is_daemon(pid) and time.monotonic() < deadline + 2.0:
                time.sleep(0.05)
    cg = state.get("cgroup") or {}
    for path in [cg.get("path"), cg.get("cpu_path"), *(cg.get("extra") or ())]:
        if path and Path(path).is_dir():
            cgroups.remove_path(Path(path))
    zram.reclaim(root / INTERNAL)   # a daemon killed before its stop leaves its zram device
    (root / INTERNAL / "state.json").unlink(missing_ok=True)


list = list_phones
