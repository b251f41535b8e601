"""The phone's own view of the filesystem: a private mount namespace whose `/` is the phone's.

Built once, single-threaded, at daemon start; the daemon itself then returns to the host's
namespace (it needs the phone's folder, its cgroup and /dev/kmsg at their host paths) and keeps a
file descriptor of the phone's, which every command it spawns enters (setns) before it drops to
the shell user. The host's root is never written to.

The phone's `/` is a small tmpfs (read-only once built) holding what an Android root holds:
  /system   the phone's system folder, read-only (mksh, toybox and its applets, getprop, logcat,
            dumpsys in /system/bin; passwd/group in /system/etc), with /bin and /etc symlinks to it
  /data     the phone's data folder (nosuid, nodev): /data/local/tmp is the shell user's
  /sdcard   the phone's sdcard folder (nosuid, nodev, noexec)
  /vendor/bin, /product/bin, /system_ext/bin, /odm/bin   empty, as on a phone with nothing there
  /proc, /sys   one kernel's: /sys the host's, /proc the phone's own pid namespace's (below),
            with the phone's meminfo, thermal zones and cpufreq policies bind-mounted over them
  /dev      a tmpfs with the character devices a shell uses (null, zero, random, tty, ptmx, pts, ...)
            and /dev/socket, the phone's dev/socket (lmkd's control socket, the services' for `cmd`)
plus, read-only, nosuid and nodev, the few host paths an engine needs (HostPaths): the C library
and friends (/usr/lib, /lib*) for a host-built bmoe-cli and the Python interpreter, its standard
library and the venv for bmoe-py. Nothing else of the host is there: no /usr/bin, /tmp, /home,
/root (beyond the interpreter's own folder), /etc of the host.
Mount propagation is made private first so nothing leaks back to the host.

The phone's processes live in a pid namespace of its own (`new_pid_namespace`), as a phone's
have no other phone's: its `init` (pid 1, a fork of the daemon that reaps orphans) mounts /proc
afresh for it, so `ps`, `kill PID` and /proc/PID/root in a phone reach only its own processes.
The daemon stays in the host's pid namespace and knows them by their host pids; what it shows
the phone (lmkd's and the kernel's kill lines) names them by the phone's (`phone_pid`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import platform
import socket
import struct
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from engine.units import is_digits

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
MNT_DETACH = 0x2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41, "i686": 217, "armv7l": 218}
PHONE_TOP_DIRS = ("data", "system", "sdcard")
EMPTY_BIN_DIRS = ("vendor/bin", "product/bin", "system_ext/bin", "odm/bin")
ROOT_LINKS = {"bin": "/system/bin", "etc": "/system/etc"}   # as on Android 10+
OVERLAYS = ("proc/meminfo", "proc/vmstat", "proc/zoneinfo", "proc/cpuinfo", "sys/class/thermal", "sys/devices/system/cpu/cpufreq",
            "sys/devices/system/cpu/online", "dev/socket")
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty", "ptmx", "kmsg")
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2"}
HOST_LIB_DIRS = ("/lib", "/lib64", "/lib32", "/libx32", "/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/libx32")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class NamespaceUnavailable(Exception):
    pass


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise NamespaceUnavailable(f"{what}: {os.strerror(err)}")


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = _libc.mount(src.encode() if src else None, dst.encode(), fstype.encode() if fstype else None,
                     ctypes.c_ulong(flags), data.encode() if data else None)
    _check(rc, f"mount {src or fstype} on {dst}")


def setns(fd: int, nstype: int = CLONE_NEWNS) -> None:
    """Enter the mount (or `nstype`'s) namespace `fd` (os.setns arrived in Python 3.12). Safe
    between fork and exec."""
    if _libc.setns(fd, nstype) != 0:
        name = {CLONE_NEWNET: "CLONE_NEWNET", CLONE_NEWPID: "CLONE_NEWPID"}.get(nstype, "CLONE_NEWNS")
        raise OSError(ctypes.get_errno(), f"setns({name})")


@contextlib.contextmanager
def in_network(fd: int | None):
    """The calling thread inside the network namespace `fd` for the block (None: stays put), so a
    process it forks there starts inside; sockets opened before keep their own namespace."""
    if fd is None:
        yield
        return
    host = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(fd, CLONE_NEWNET)
        try:
            yield
        finally:
            setns(host, CLONE_NEWNET)
    finally:
        os.close(host)


def new_network() -> int:
    """A network namespace of the phone's own, with only its loopback (up): a file descriptor of
    it, which the phone's processes enter (setns) before they exec. They reach neither the host's
    loopback (its adb server, the phones' daemons, anything listening on 127.0.0.1 or ::1) nor
    its abstract unix sockets, as a phone on USB cannot. The calling thread ends up back in its
    own namespace, where the daemon keeps listening for the adb server. The namespace goes away
    with its last descriptor and process. Raises NamespaceUnavailable (not root, no CAP_SYS_ADMIN)."""
    import fcntl  # POSIX-only: here, so the package imports on any Python

    host = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:   # lo up: engines may use loopback
                ifreq = struct.pack("16sh22x", b"lo", 0)
                flags = struct.unpack_from("16sh", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, ifreq))[1]
                fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))
            return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            setns(host, CLONE_NEWNET)
    finally:
        os.close(host)


PROC_OVERLAYS = tuple(rel for rel in OVERLAYS if rel.startswith("proc/"))
INIT_REAP_S = 0.2


def new_pid_namespace(mnt_fd: int) -> tuple[int, int]:
    """The phone's own pid namespace, whose pid 1 (`init`, forked here) mounts a /proc of it in
    the phone's mount namespace `mnt_fd` (the phone's files bound over it again) and reaps what is
    orphaned in it. Every process the calling thread forks from now on is in it. Returns (init's
    host pid, a pipe's write end: closing it, or the daemon's death, ends init and with it every
    process of the namespace). Call single-threaded: from
    then on the calling thread can start no thread (the kernel refuses CLONE_THREAD across pid
    namespaces), so its children are waited for by pidfd (devices.virtual.run.serve). Raises
    NamespaceUnavailable, the thread left as it was."""
    host = os.open("/proc/thread-self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    alive_r, alive_w = os.pipe()
    ready_r, ready_w = os.pipe()
    try:
        _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
        try:
            pid = os.fork()
        except OSError as e:
            setns(host, CLONE_NEWPID)
            raise NamespaceUnavailable(f"fork the phone's init: {e}") from None
        if pid == 0:                                     # init: pid 1 of the phone
            os.close(alive_w)
            os.close(ready_r)
            try:
                _libc.prctl(PR_SET_PDEATHSIG, 9)        # SIGKILL with the daemon
                _libc.prctl(PR_SET_NAME, b"init")
                setns(mnt_fd)
                os.chdir("/")
                _own_proc()
            except BaseException as e:
                os.write(ready_w, f"{e}".encode(errors="replace")[:300] or b"?")
                os._exit(1)
            os.write(ready_w, b"ok")
            os.close(ready_w)
            _reap(alive_r)
            os._exit(0)
        os.close(ready_w)
        ready_w = -1
        said = os.read(ready_r, 400)
        if said != b"ok":
            os.waitpid(pid, 0)
            setns(host, CLONE_NEWPID)
            raise NamespaceUnavailable(f"the phone's /proc: {said.decode(errors='replace') or 'init died'}")
        return pid, alive_w
    except BaseException:
        os.close(alive_w)
        raise
    finally:
        os.close(host)
        os.close(alive_r)
        os.close(ready_r)
        if ready_w >= 0:
            os.close(ready_w)


def _own_proc() -> None:
    """In init: a /proc of this pid namespace over the host's, the phone's files bound over it
    again (held by O_PATH descriptors across the mount that hides them)."""
    held = {}
    for rel in PROC_OVERLAYS:
        with contextlib.suppress(OSError):
            held[rel] = os.open("/" + rel, os.O_PATH | os.O_CLOEXEC)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for rel, fd in held.items():
        _mount(f"/proc/self/fd/{fd}", "/" + rel, None, MS_BIND)
        os.close(fd)


def _reap(alive_fd: int) -> None:
    """init's loop: reap every child that ended, until `alive_fd` reads EOF (the daemon closed it)."""
    import select
    import signal

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    while True:
        ready, _, _ = select.select([alive_fd, wake_r], [], [], INIT_REAP_S)
        if alive_fd in ready and not os.read(alive_fd, 64):
            return
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 512)
        while True:
            try:
                child, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if child == 0:
                break


def host_pid(pid_ns: str, phone_pid: int) -> int | None:
    """The host's pid of the process a phone knows as `phone_pid`: `pid_ns` is the phone's pid
    namespace as /proc/PID/ns/pid names it (its state file's `pid_namespace`); None when none."""
    for entry in os.listdir("/proc"):
        if not is_digits(entry):
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != pid_ns:
                continue
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        if innermost_pid(status) == phone_pid:
            return int(entry)
    return None


def innermost_pid(status: str) -> int | None:
    """The pid the innermost pid namespace knows a process by: the last of /proc/PID/status's
    NSpid (None when the text has none)."""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            with contextlib.suppress(ValueError, IndexError):
                return int(line.split()[-1])
    return None


def phone_pid(host_pid: int) -> int | None:
    """The pid the phone's processes know a process by (the last of its NSpid), None once gone."""
    try:
        status = Path(f"/proc/{host_pid}/status").read_text()
    except OSError:
        return None
    found = innermost_pid(status)
    return host_pid if found is None else found


@dataclass(frozen=True)
class HostPaths:
    """Host paths the phone sees read-only at the same place: folders, files, and symlinks
    (recreated, so an interpreter reached through a chain of links resolves as on the host)."""
    dirs: tuple[str, ...]
    files: tuple[str, ...]
    links: tuple[tuple[str, str], ...]      # (path, target)

    @classmethod
    def for_engines(cls, python: str = sys.executable) -> HostPaths:
        """The C runtime and the interpreter that runs bmoe-py (and the phone's own tools)."""
        dirs: list[str] = []
        links: list[tuple[str, str]] = []
        files: list[str] = []
        for d in HOST_LIB_DIRS:
            if os.path.islink(d):
                links.append((d, os.readlink(d)))
            elif os.path.isdir(d):
                dirs.append(d)
        paths = sysconfig.get_paths()
        for where in (sys.prefix, paths.get("stdlib"), paths.get("platstdlib"), sysconfig.get_config_var("LIBDIR")):
            if where and os.path.isdir(where):
                dirs.append(os.path.abspath(where))
        # the interpreter through its chain of links (venv/bin/python -> .../bin/python3.11)
        path = os.path.abspath(python)
        for _ in range(40):
            if os.path.islink(path):
                target = os.readlink(path)
                links.append((path, target))
                path = os.path.normpath(os.path.join(os.path.dirname(path), target))
            else:
                if os.path.isfile(path):
                    files.append(path)
                break
        dirs = _outermost(dirs)
        covered = lambda p: any(p == d or p.startswith(d.rstrip("/") + "/") for d in dirs)  # noqa: E731
        return cls(tuple(dirs), tuple(dict.fromkeys(f for f in files if not covered(f))),
                   tuple(dict.fromkeys((p, t) for p, t in links if not covered(p))))


def _outermost(dirs: list[str]) -> list[str]:
    out: list[str] = []
    for d in sorted(set(dirs), key=len):
        if not any(d == o or d.startswith(o.rstrip("/") + "/") for o in out):
            out.append(d)
    return out


def _parents(new: str, path: str) -> str:
    """Create `path`'s parent folders in the new root (0755, so the shell user can walk them)."""
    dst = os.path.join(new, path.lstrip("/"))
    parent = os.path.dirname(dst)
    os.makedirs(parent, mode=0o755, exist_ok=True)
    return dst


def _bind(src: str, dst: str, flags: int, recursive: bool = False) -> None:
    _mount(src, dst, None, MS_BIND | (MS_REC if recursive else 0))
    if flags:
        # a bind mount takes its own flags only on a remount
        _mount(None, dst, None, MS_REMOUNT | MS_BIND | flags)


def enter(root: Path, staging: Path, host: HostPaths) -> tuple[int, list[str]]:
    """Build the phone's mount namespace and return (a file descriptor of it, overlays that could
    not be placed). The calling (single-threaded) process ends up back in its own namespace.
    Raises NamespaceUnavailable when there is no namespace at all (not root, no CAP_SYS_ADMIN)."""
    root = Path(root).resolve()
    nr = platform.machine()
    if nr not in SYS_PIVOT_ROOT:
        raise NamespaceUnavailable(f"pivot_root syscall number unknown on {nr}")
    host_ns = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    cwd = os.getcwd()
    try:
        _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        try:
            missing = _build(root, Path(staging).resolve(), host, nr)
            phone_ns = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            setns(host_ns)
            os.chdir(cwd)
    finally:
        os.close(host_ns)
    return phone_ns, missing


def _build(root: Path, staging: Path, host: HostPaths, nr: str) -> list[str]:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    staging.mkdir(parents=True, exist_ok=True)
    new = str(staging)
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    # the phone's own folders
    phone_flags = {"system": MS_RDONLY | MS_NODEV, "data": MS_NOSUID | MS_NODEV,
                   "sdcard": MS_NOSUID | MS_NODEV | MS_NOEXEC}
    for top in PHONE_TOP_DIRS:
        os.mkdir(os.path.join(new, top), 0o755)
        # data with what is mounted in it: a /data quota's image keeps the host's logcat buffers
        # bound over its data/misc/logd (dataquota.py)
        _bind(str(root / top), os.path.join(new, top), phone_flags[top], recursive=top == "data")
    for rel in EMPTY_BIN_DIRS:
        os.makedirs(os.path.join(new, rel), mode=0o755)
    for name, target in ROOT_LINKS.items():
        os.symlink(target, os.path.join(new, name))
    # one kernel: the host's /proc and /sys
    for top in ("proc", "sys"):
        os.mkdir(os.path.join(new, top), 0o555)
        _mount("/" + top, os.path.join(new, top), None, MS_BIND | MS_REC)
    _dev(new)
    # what engines need from the host, read-only
    ro = MS_RDONLY | MS_NOSUID | MS_NODEV
    for d in host.dirs:
        dst = _parents(new, d)
        os.makedirs(dst, mode=0o755, exist_ok=True)
        _bind(d, dst, ro)
    for path, target in host.links:
        dst = _parents(new, path)
        if not os.path.lexists(dst):
            os.symlink(target, dst)
    for f in host.files:
        dst = _parents(new, f)
        open(dst, "w").close()
        _bind(f, dst, ro)
    missing = []
    for rel in OVERLAYS:
        src, dst = root / rel, os.path.join(new, rel)
        if src.exists() and os.path.exists(dst) and src.is_dir() == os.path.isdir(dst):
            _mount(str(src), dst, None, MS_BIND)
        else:
            missing.append("/" + rel)
    old = os.path.join(new, ".oldroot")
    os.mkdir(old)
    _check(_libc.syscall(ctypes.c_long(SYS_PIVOT_ROOT[nr]), new.encode(), old.encode()), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.oldroot", MNT_DETACH), "umount old root")
    os.rmdir("/.oldroot")
    # a phone's root file system is read-only
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    return missing


def _dev(new: str) -> None:
    dev = os.path.join(new, "dev")
    os.mkdir(dev, 0o755)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for node in DEV_NODES:
        src, dst = "/dev/" + node, os.path.join(dev, node)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif os.path.exists(src):
            open(dst, "w").close()
            _mount(src, dst, None, MS_BIND)
    if os.path.isdir("/dev/pts"):
        os.mkdir(os.path.join(dev, "pts"), 0o755)
        _mount("/dev/pts", os.path.join(dev, "pts"), None, MS_BIND | MS_REC)
    for name, target in DEV_LINKS.items():
        os.symlink(target, os.path.join(dev, name))
    os.mkdir(os.path.join(dev, "socket"), 0o755)   # init's sockets (lmkd's): the phone's dev/socket bound here
