"""Lock files on `filelock`: a second holder is refused in one line that names the first, a lock
whose holder died is free (and its file cleaned up), and run/sweep/status import and lock on a
Python without fcntl (Windows has none)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from store.errors import LockBusy
from store.locks import FileLock, dir_lock, locks_dir, owner_path, running

PROJECT = Path(__file__).resolve().parents[2]


def test_a_second_holder_is_refused_in_one_line_naming_the_first(tmp_path):
    first = dir_lock(tmp_path, "/data/camp")
    first.acquire(0, {"pid": 4242, "host": "box", "dir": "/data/camp", "since": 0})
    try:
        assert running(tmp_path, "/data/camp") == "pid 4242 on box"
        with pytest.raises(LockBusy) as e:
            dir_lock(tmp_path, "/data/camp").acquire(0.2, {"pid": 1})
        message = str(e.value)
        assert "\n" not in message and message.startswith("campaign directory /data/camp is in use by another "
                                                          "campaign (pid 4242 on box, campaign dir /data/camp, since ")
        assert message.endswith("after waiting 0.2 s; wait for it to finish, or set run.lock_wait_s to wait")
    finally:
        first.release()
    assert running(tmp_path, "/data/camp") is None
    assert list(locks_dir(tmp_path).iterdir()) == []                 # neither the lock nor its owner file


def _hold_until_killed(path: str, ready) -> None:
    lock = FileLock(Path(path), "the test lock")        # referenced: a lock nobody holds is released
    lock.acquire(0, {"pid": os.getpid(), "host": "gone"})
    ready.set()
    time.sleep(60)
    lock.release()


def test_a_lock_whose_holder_died_is_free_and_its_stale_files_go(tmp_path):
    path = locks_dir(tmp_path) / "dir-stale.lock"
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    child = ctx.Process(target=_hold_until_killed, args=(str(path), ready))
    child.start()
    try:
        assert ready.wait(30)
        with pytest.raises(LockBusy, match=f"pid {child.pid} on gone"):
            FileLock(path, "the test lock").acquire(0, {"pid": os.getpid()})
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
    assert path.exists() and owner_path(path).exists()                # what a crash leaves behind
    lock = FileLock(path, "the test lock")
    lock.acquire(0, {"pid": os.getpid(), "host": "here"})           # the kernel dropped the dead one's lock
    assert lock.held
    lock.release()
    assert not path.exists() and not owner_path(path).exists()


def test_run_sweep_and_status_import_and_lock_without_fcntl(tmp_path):
    """As on Windows: no fcntl module at all (filelock then locks without flock)."""
    code = textwrap.dedent(f"""
        import sys
        sys.modules["fcntl"] = None            # `import fcntl` now fails, as where there is none
        import harness.cli.main, harness.run.runner, harness.run.status, harness.campaign.presets, harness.importer, store.locks
        from store.locks import dir_lock, running
        home = {str(tmp_path)!r}
        lock = dir_lock(home, "/camp")
        lock.acquire(0, {{"pid": 7, "host": "h"}})
        print(running(home, "/camp"))
        lock.release()
        print(running(home, "/camp"), sorted(p.name for p in (lock.path.parent).iterdir()))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(PROJECT)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["pid 7 on h", "None []"]
