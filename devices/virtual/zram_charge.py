"""What the phone's zram holds, charged to its RAM: a ballast of pages in its memory cgroup.

On a phone zram's compressed pages are RAM pages (zsmalloc allocates them from the memory the apps
use). Here zram's allocator charges no memory cgroup, so one process of the phone, the ballast,
keeps a file on a ramfs of its own as large as what the phone's swapped pages take in zram, rounded
to CHARGE_STEP: its memory cgroup's swap at the ratio of every zram swap area's pool
(VirtualPhone.zram_used_bytes, zram.ram_for), not its own device's `mm_stat` mem_used_total, which
holds whichever zram phone's pages the kernel put there (it picks swap areas by priority, never by
cgroup). ramfs pages are page cache that is never reclaimed nor swapped, charged to the cgroup of
the process that writes them, and in no process's RSS. When zram grows, the
ballast's write is a charge like any other: the kernel reclaims the phone's other pages (in the
ballast's context) or, with nothing left to reclaim, OOM-kills in the phone (the backstop, whose
badness, RSS + swap, never points at the ballast). So the kernel itself enforces resident + zram
<= RAM; the ballast follows zram at lmkd's polling pace (the daemon sends the target through a pipe).

This replaced lowering memory.limit_in_bytes to RAM - mem_used_total: a limit below the usage
fails with EBUSY when the kernel cannot reclaim down to it at once, and was retried at the next
poll, so whether an over-sized cache survived was a race (ok once, lmk_killed twice, same
configuration). A charge the kernel must satisfy is never skipped. Locked anonymous pages
(mlock) were the first idea: their RSS makes the ballast the OOM killer's pick, and shielding it
with oom_score_adj -1000 needs CAP_SYS_RESOURCE, which a container may not give root.

The ballast is forked from the daemon (before any thread exists), joins the phone's cgroups, is
no process of the phone for lmkd (VirtualPhone.pids leaves it out) and exits when its pipe closes
(the daemon stopped or was killed), its ramfs going with its descriptor. Its own pages (what the
fork copies on write) are measured once, before it holds anything, and added to the cgroup's
limit, so that the phone keeps the RAM it was given.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
import signal
import sys
import time

from engine.units import MIB

CHARGE_STEP = MIB                # the ballast moves in 1 MiB chunks
_CLONE_NEWNS, _MS_REC, _MS_PRIVATE, _MNT_DETACH = 0x20000, 0x4000, 0x40000, 2


class Ballast:
    """The daemon's handle of the ballast process."""

    def __init__(self, pid: int, fd: int, own_bytes: int):
        self.pid = pid
        self.fd = fd                  # write end of the target pipe (non-blocking)
        self.own_bytes = own_bytes    # what the ballast process itself costs (not the phone's)
        self.target_bytes = 0         # what it was last asked to hold

    @classmethod
    def start(cls, procs_files: list[str], usage_bytes) -> Ballast:
        """Fork the ballast into the phone's cgroups (procs_files: memory first); `usage_bytes()`
        reads the memory cgroup's usage, which holds only the ballast at this point."""
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        zeros = bytes(CHARGE_STEP)   # made before the fork: shared, never copied into the ballast
        targets_r, targets_w = os.pipe()
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:   # the ballast
            code = 1
            try:
                os.close(targets_w)
                os.close(ready_r)
                _serve(libc, procs_files, targets_r, ready_w, zeros)
                code = 0
            except BaseException as e:   # said in the daemon's log; the daemon refuses to start
                print(f"vphone: zram charge: {e!r} {getattr(e, 'filename', '')}", file=sys.stderr, flush=True)
            finally:
                os._exit(code)
        os.close(targets_r)
        os.close(ready_w)
        ok = select.select([ready_r], [], [], 10)[0] and os.read(ready_r, 1) == b"1"
        os.close(ready_r)
        if not ok:
            os.close(targets_w)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise OSError("the zram charge's ballast process did not start")
        os.set_blocking(targets_w, False)
        time.sleep(0.05)
        return cls(pid, targets_w, usage_bytes())

    def hold(self, zram_used_bytes: int) -> None:
        """Ask the ballast to hold what the phone's pages take in zram, rounded to CHARGE_STEP (a
        full pipe: asked at the next call)."""
        target = (zram_used_bytes + CHARGE_STEP // 2) // CHARGE_STEP * CHARGE_STEP
        if target == self.target_bytes:
            return
        with contextlib.suppress(BlockingIOError):
            os.write(self.fd, target.to_bytes(8, "little"))
            self.target_bytes = target

    def stop(self) -> None:
        if self.fd < 0:
            return
        os.close(self.fd)
        self.fd = -1
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _serve(libc, procs_files: list[str], targets_fd: int, ready_fd: int, zeros: bytes) -> None:
    """The ballast's loop: a ramfs file (unevictable page cache, charged to the cgroup of the
    process writing it, in nobody's RSS) as large as the latest target says, until EOF."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)     # it ends when the daemon's pipe closes, not before
    for path in procs_files:
        with open(path, "w") as f:
            f.write(str(os.getpid()))
    # a ramfs of its own, in a mount namespace of its own, detached once the file is open: the host
    # sees no mount, and the pages go when the ballast's descriptor does
    for ok, what in ((libc.unshare(_CLONE_NEWNS) == 0, "unshare"),
                     (libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) == 0, "mount --make-rprivate /"),
                     (libc.mount(b"bmoe-zram-charge", b"/tmp", b"ramfs", 0, b"mode=0700") == 0, "mount ramfs")):
        if not ok:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")
    fd = os.open("/tmp/charge", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    os.unlink("/tmp/charge")
    libc.umount2(b"/tmp", _MNT_DETACH)
    held = 0   # chunks in the file
    os.write(ready_fd, b"1")
    os.close(ready_fd)
    want = 0
    while True:
        # short of the target (the phone could not give the pages yet): try again in 50 ms
        if held == want or select.select([targets_fd], [], [], 0.05)[0]:
            data = os.read(targets_fd, 8 * 512)
            if not data:
                return
            end = len(data) // 8 * 8
            want = int.from_bytes(data[end - 8:end], "little") // CHARGE_STEP
        if held > want:
            os.ftruncate(fd, want * CHARGE_STEP)
            held = want
        while held < want:
            try:
                os.pwrite(fd, zeros, held * CHARGE_STEP)
            except OSError:      # not given (the phone's OOM killer ran, or will): retried
                break
            held += 1
