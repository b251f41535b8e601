"""`virtual up --data-quota SIZE`: the phone's /data (and /sdcard, which is /data/media/0 on a
phone) on a file system of SIZE bytes, so a write past it fails with ENOSPC as on a full phone.

The file system is ext4 (Android's /data is ext4 or f2fs) in an image of SIZE bytes,
`.vphone/data.img`, its blocks preallocated on this host's disk (the host never runs out under
the phone), with no blocks reserved for root (adbd's sync service writes as root with the shell's
fsuid, the shell as the shell: a reserve would let one write where the other cannot). It sits on
a loop device with direct I/O (no second copy of its pages in the host's page cache: the phone's
own page cache is the ext4's, charged to the phone's memory cgroup) and is mounted over the
phone's data folder in a mount namespace of the daemon's own, made private first, so the host
never sees the mount. Every phone-side view is made from that namespace: the phone's own `/`
(namespace.py), the paced FUSE server of `--storage-mbps` (pacedfs.py, whose statfs passes the
image's through), the sync service. The mount goes when the last process of those namespaces
does (the daemon, its FUSE server, the phone's processes, which `down` kills with the cgroup, and
a crashed daemon's the next `up` kills); the loop device is detached with it (autoclear, set by
detaching it while mounted). Nothing is left on the host but the image, in the phone's folder
(`down --purge` deletes it).

What the image does not hold: the logcat buffers (`data/misc/logd`), bound over it from the
phone's data folder, since a phone's logd keeps its logs in RAM and a full /data must not stop
them. A phone started again with the same quota finds its /data as it left it; another quota
makes a new, empty file system (docs/decisions/vphone-data-quota.md).

adbd on a full /data (file_sync_service.cpp handle_send_file): `SendSyncFailErrno(s, "write
failed")`, i.e. FAIL "write failed: No space left on device", then it reads and drops the rest of
the DATA stream up to DONE and unlinks the partial file; devices/virtual/syncsvc.py answers so.
A shell's write gets the kernel's ENOSPC itself (`No space left on device`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import subprocess
import time
from pathlib import Path

from engine.units import MIB

IMAGE = "data.img"             # in the phone's internal folder
MIN_BYTES = 16 * MIB           # the smallest quota: ext4's journal (4 MiB) and tables take a part of it
DETACH_WAIT_S = 5.0            # how long a stopped daemon's loop device may take to go
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 0x40000
TOOLS = ("mkfs.ext4", "losetup")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class QuotaUnavailable(Exception):
    """The phone's /data cannot be given its quota here (one line why)."""


def available() -> str | None:
    """None when a quota can be given on this host, else why not."""
    if os.geteuid() != 0:
        return "a /data quota needs root (a loop device and a mount namespace)"
    missing = [t for t in TOOLS if _tool(t) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (Debian: e2fsprogs, mount)"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices here (/dev/loop-control is missing)"
    return None


def _tool(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/sbin/{name}", f"/usr/sbin/{name}") if os.path.isfile(p)), None)


def _run(*argv: str) -> subprocess.CompletedProcess:
    tool = _tool(argv[0]) or argv[0]
    return subprocess.run([tool, *argv[1:]], capture_output=True, text=True, timeout=60)


def image_path(internal: Path) -> Path:
    return Path(internal) / IMAGE


def attached(image: Path) -> list[str]:
    """The loop devices backed by `image` now (`losetup -j`)."""
    out = _run("losetup", "-j", str(image)).stdout
    return [line.split(":", 1)[0] for line in out.splitlines() if line.strip()]


def ensure_image(internal: Path, size_bytes: int) -> Path:
    """The phone's /data image of `size_bytes`: the one there (its files kept) when it has that
    size, else a new, empty ext4 (written beside it and renamed over it)."""
    image = image_path(internal)
    try:
        if image.stat().st_size == size_bytes:
            return image
    except FileNotFoundError:
        pass
    tmp = image.with_name(IMAGE + ".new")
    tmp.unlink(missing_ok=True)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, size_bytes)
        finally:
            os.close(fd)
        made = _run("mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096", "-E", "root_owner=0:0", "-L", "data",
                    str(tmp))
        if made.returncode != 0:
            raise QuotaUnavailable(f"mkfs.ext4 failed: {made.stderr.strip() or made.stdout.strip()}")
        os.replace(tmp, image)
    except OSError as e:
        raise QuotaUnavailable(f"cannot make the {size_bytes // MIB} MiB image {image}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return image


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise QuotaUnavailable(f"{what}: {os.strerror(ctypes.get_errno())}")


def _mount(src: str | None, dst: str, fstype: str | None, flags: int) -> None:
    _check(_libc.mount(src.encode() if src else None, dst.encode(), fstype.encode() if fstype else None,
                       ctypes.c_ulong(flags), None), f"mount {src or ''} on {dst}")


def mount(root: Path, internal: Path, size_bytes: int, logd_dir: str, sdcard_dir: str) -> str:
    """Put the phone's data folder (and its sdcard folder, as data/media/0) on the image, in a
    private mount namespace the calling process enters for good (call it single-threaded, before
    the phone's own namespace is built from it); the folder `logd_dir` (under the data folder)
    stays the host folder's. Returns the loop device. Raises QuotaUnavailable."""
    root = Path(root)
    data, logd, sdcard = root / "data", root / logd_dir, root / sdcard_dir
    image = ensure_image(internal, size_bytes)
    deadline = time.monotonic() + DETACH_WAIT_S
    while attached(image):     # a stopped daemon's mount goes with its namespace's last process
        if time.monotonic() > deadline:
            raise QuotaUnavailable(f"{image} is still on {', '.join(attached(image))}: another daemon's "
                                   "processes still hold this phone's /data")
        time.sleep(0.05)
    logd.mkdir(parents=True, exist_ok=True)
    sdcard.mkdir(parents=True, exist_ok=True)
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)        # nothing mounted here reaches the host
    # the host's logcat folder, held before the image hides it (in this namespace: a bind's
    # source must be one of its mounts)
    host_logd = os.open(logd, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        made = _run("losetup", "--find", "--show", "--direct-io=on", str(image))
        if made.returncode != 0:
            raise QuotaUnavailable(f"losetup {image}: {made.stderr.strip()}")
        dev = made.stdout.strip()
        try:
            _mount(dev, str(data), "ext4", MS_NOSUID | MS_NODEV)
        finally:
            _run("losetup", "-d", dev)   # mounted: detached when unmounted (autoclear); else now
        on_image = [data / Path(logd_dir).relative_to("data"), data / "media/0"]
        for d in on_image:
            d.mkdir(parents=True, exist_ok=True)
        _mount(f"/proc/self/fd/{host_logd}", str(on_image[0]), None, MS_BIND)
        _mount(str(on_image[1]), str(sdcard), None, MS_BIND)
        return dev
    finally:
        os.close(host_logd)
