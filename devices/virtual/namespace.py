"""The phone's own view of the filesystem: a private mount namespace for its daemon and commands.

Called once, single-threaded, at daemon start; every command the daemon spawns inherits it. The
host's root is never written to: a small tmpfs becomes the new `/`, each top-level host folder
is bind-mounted (recursively) into it, the phone's `data` and `system` folders appear as /data
and /system (so /data/local/tmp and /system/bin/sh exist as on Android), then pivot_root. On top,
the phone's generated /proc/meminfo, /sys/class/thermal and /sys/devices/system/cpu/cpufreq are
bind-mounted over the host's. Mount propagation is made private first so nothing leaks back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from pathlib import Path

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_BIND, MS_REC, MS_PRIVATE = 0x1, 0x1000, 0x4000, 0x40000
MNT_DETACH = 0x2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41, "i686": 217, "armv7l": 218}
PHONE_TOP_DIRS = ("data", "system")
OVERLAYS = ("proc/meminfo", "sys/class/thermal", "sys/devices/system/cpu/cpufreq")

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


def enter(root: Path, staging: Path) -> list[str]:
    """Move this (single-threaded) process into the phone's mount namespace.

    Returns the overlays that could not be placed (their host target is missing); raises
    NamespaceUnavailable when there is no namespace at all (not root, no CAP_SYS_ADMIN)."""
    root = Path(root).resolve()
    if len(root.parts) > 1 and root.parts[1] in PHONE_TOP_DIRS:
        # the phone's /data and /system replace the host's, which would hide the phone's own folder
        raise NamespaceUnavailable(f"the phone's folder {root} is under /{root.parts[1]}")
    nr = platform.machine()
    if nr not in SYS_PIVOT_ROOT:
        raise NamespaceUnavailable(f"pivot_root syscall number unknown on {nr}")
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    staging = Path(staging).resolve()
    staging.mkdir(parents=True, exist_ok=True)
    new = str(staging)
    _mount("tmpfs", new, "tmpfs", 0, "mode=0755,size=16m")
    for entry in sorted(os.listdir("/")):
        src, dst = "/" + entry, os.path.join(new, entry)
        if entry in PHONE_TOP_DIRS:
            continue
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif os.path.isdir(src):
            os.mkdir(dst)
            _mount(src, dst, None, MS_BIND | MS_REC)
        elif os.path.isfile(src):
            open(dst, "w").close()
            _mount(src, dst, None, MS_BIND)
    for top in PHONE_TOP_DIRS:
        os.mkdir(os.path.join(new, top))
        _mount(str(root / top), os.path.join(new, top), None, MS_BIND | MS_REC)
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
    # The recursive bind of the folder holding the staging mount copied the new root into
    # itself once; detach that copy so the phone's tree has no loop.
    if os.path.ismount(new):
        _libc.umount2(new.encode(), MNT_DETACH)
    return missing
