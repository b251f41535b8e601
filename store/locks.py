"""Lock files that keep two campaigns off one campaign directory or one device, on the `filelock`
library (flock on Unix, LockFileEx on Windows), so every command imports and `status` works
where there is no fcntl.

Lock files live under the fleet's home (`~/.bmoe-fleet/locks`), one per campaign directory and
one per device. The holder writes who it is into a file beside the lock (`<lock>.owner`: pid,
host, campaign directory, since) for the next one's message; on Windows the locked byte of the
lock file itself cannot be read by others. A lock a crashed process held is free again (the
kernel drops it), so a stale file only ever costs its bytes.

A released lock's file is removed (~900 of them were once left behind). That is safe only
with a check on the waiting side: a waiter that opened the file before its holder removed it
gets its lock on the removed inode; filelock then sees the inode unlinked and opens the path
again, so that lock never counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import filelock

from engine import fsutil
from store import names
from store.errors import LockBusy

# at least a moment: `status` probes a directory lock by taking it briefly
MIN_WAIT_S = 0.5
POLL_S = 0.05


def locks_dir(home: str | os.PathLike) -> Path:
    """Where the lock files live under the fleet's home (harness.campaign.model.fleet_home)."""
    return Path(home) / names.LOCKS_DIR


def owner_path(path: Path) -> Path:
    """The file beside a lock that says who holds it."""
    return path.with_name(path.name + ".owner")


class FileLock:
    """An exclusive lock on a file; its holder says who it is beside it, and removes the file
    when it releases it."""

    def __init__(self, path: Path, what: str):
        self.path = Path(path)
        self.what = what
        self._lock: Any = None          # the filelock lock while held
        self._inode: tuple[int, int] | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._lock is not None

    def acquire(self, wait_s: float, owner: Mapping[str, Any]) -> None:
        """Take the lock within wait_s seconds (at least MIN_WAIT_S), or raise LockBusy naming its
        holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.take(max(wait_s, MIN_WAIT_S)):
            waited = f" after waiting {wait_s:g} s" if wait_s else ""
            raise LockBusy(f"{self.what} is in use by another campaign ({holder_text(self.path)}){waited}; wait for "
                           "it to finish, or set run.lock_wait_s to wait")
        try:
            fsutil.atomic_write(owner_path(self.path), json.dumps(dict(owner)) + "\n")
        except BaseException:
            self.release()                       # a lock nobody would release otherwise
            raise

    def take(self, timeout_s: float) -> bool:
        """Take the lock within timeout_s seconds without saying who holds it; False if it stayed busy."""
        lock = filelock.FileLock(self.path, thread_local=False)
        try:
            lock.acquire(timeout=timeout_s, poll_interval=POLL_S)
        except filelock.Timeout:
            return False
        self._lock = lock
        # the file we hold: only its holder removes a lock file, so the path names it until we do
        with contextlib.suppress(OSError):
            st = os.stat(self.path)
            self._inode = (st.st_dev, st.st_ino)
        return True

    def release(self) -> None:
        """Give the lock up and remove its files (the owner file first: a next holder's stays)."""
        if self._lock is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(owner_path(self.path))
        # removed while still held: whoever waits on this inode sees it gone and opens the path again
        if _names_inode(self.path, self._inode):
            with contextlib.suppress(OSError):      # Windows: open files stay; filelock removes it below
                os.unlink(self.path)
        lock, self._lock, self._inode = self._lock, None, None
        lock.release()


def _names_inode(path: Path, inode: tuple[int, int] | None) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    return inode == (st.st_dev, st.st_ino)


def _owner(path: Path) -> dict[str, Any]:
    try:
        info = json.loads(owner_path(path).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def holder_text(path: Path) -> str:
    """Who holds a lock, as its holder wrote it."""
    info = _owner(path)
    if not info:
        return "holder unknown"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("since", 0)))
    return f"pid {info.get('pid')} on {info.get('host')}, campaign dir {info.get('dir')}, since {since}"


def dir_lock(home: str | os.PathLike, root: str | os.PathLike) -> FileLock:
    """The lock of one campaign directory (by its absolute path)."""
    return FileLock(locks_dir(home) / names.dir_lock_name(root), f"campaign directory {root}")


class LockedDevice(Protocol):
    """A device as its lock knows it (harness's DeviceRef)."""

    @property
    def spec(self) -> str:
        """The device as the campaign names it."""

    @property
    def lock_key(self) -> str:
        """One key per phone, whatever name a campaign gives it."""


def device_lock(home: str | os.PathLike, device: LockedDevice) -> FileLock:
    """The lock of one device."""
    return FileLock(locks_dir(home) / names.device_lock_name(device.lock_key), f"device {device.spec}")


@contextlib.contextmanager
def holding(locks: Sequence[FileLock], wait_s: float, owner: Mapping[str, Any]) -> Iterator[None]:
    """Take every lock (in a fixed order, so two campaigns cannot deadlock) or none."""
    taken: list[FileLock] = []
    deadline = time.monotonic() + wait_s
    try:
        for lock in sorted(locks, key=lambda lk: str(lk.path)):
            lock.acquire(max(0.0, deadline - time.monotonic()), owner)
            taken.append(lock)
        yield
    finally:
        for lock in reversed(taken):
            lock.release()


def running(home: str | os.PathLike, root: str | os.PathLike) -> str | None:
    """"pid N on HOST" while a run holds a campaign directory's lock, else None. Never waits: a
    free lock is taken for a moment (and its stale file, a crashed run's, removed)."""
    path = locks_dir(home) / names.dir_lock_name(root)
    if not path.exists():
        return None
    probe = FileLock(path, f"campaign directory {root}")
    if probe.take(0):
        probe.release()
        return None
    info = _owner(path)
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')}"
