"""A virtual phone's lmkd samples: what it reads of a live process, and that a dying one is no sample."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from devices.virtual.lmkd import sample


def test_a_live_script_is_named_by_the_path_it_was_run_as(tmp_path):
    script = tmp_path / "engine"
    script.write_text(f"#!{sys.executable}\nimport time; time.sleep(30)\n")
    script.chmod(0o755)
    child = subprocess.Popen([str(script), "--flag"])
    try:
        deadline = time.monotonic() + 10
        s = None
        while time.monotonic() < deadline:
            s = sample(child.pid, time.time())
            if s is not None and s.name == str(script):
                break
            time.sleep(0.05)
        assert s is not None and s.name == str(script) and s.rss_kb > 0 and s.pid == child.pid
    finally:
        child.kill()
        child.wait()


def test_a_process_that_has_lost_its_memory_is_no_sample():
    """A zombie keeps its /proc entry and comm but no cmdline, as a process being OOM-killed does
    before the kernel's line is read: sampling it must not yield a comm-named sample."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # not reaped: a zombie once it has exited
        with open(f"/proc/{child.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.02)
    try:
        assert os.path.exists(f"/proc/{child.pid}/status")
        assert sample(child.pid, time.time()) is None
    finally:
        child.wait()
    assert sample(child.pid, time.time()) is None  # and gone
