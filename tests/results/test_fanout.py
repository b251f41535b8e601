"""results.site.fanout: jobs worked out in forked processes give what one process gives, in order;
a job's error, a child killed and Ctrl-C each end it cleanly, with no child left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from results.errors import ResultsError
from results.site import fanout

PROJECT = Path(__file__).resolve().parents[2]
JOBS = list(range(fanout.PROCESSES_FROM * 2))


def _needs_cores() -> None:
    if fanout.cores() < 2 or "fork" not in __import__("multiprocessing").get_all_start_methods():
        pytest.skip(f"this host gives the process {fanout.cores()} core(s) or no fork: fanout works in one process")


def _square(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def test_forked_jobs_give_what_one_process_gives_in_the_jobs_order():
    _needs_cores()
    done = fanout.each(JOBS, _square)
    assert [r for r, _ in done.results] == [x * x for x in JOBS]
    assert os.getpid() not in done.pids and done.pids == {pid for _, pid in done.results}
    few = fanout.each(JOBS[:fanout.PROCESSES_FROM - 1], _square)          # too few to fork for
    assert few.pids == {os.getpid()} and [r for r, _ in few.results] == [x * x for x in JOBS[:fanout.PROCESSES_FROM - 1]]
    heard: list[tuple[int, int]] = []
    slow = fanout.each(JOBS, lambda x: time.sleep(0.01) or x, lambda done, of: heard.append((done, of)))
    assert slow.results == JOBS and heard and all(of == len(JOBS) and 0 < d <= of for d, of in heard)


def test_started_jobs_are_worked_out_while_this_process_does_its_own_work(tmp_path):
    _needs_cores()

    def job(x: int) -> int:
        (tmp_path / str(x)).touch()
        return x

    with fanout.started(JOBS, job) as running:
        deadline = time.monotonic() + 30           # this process's own work: waiting for theirs
        while len(list(tmp_path.iterdir())) < len(JOBS) and time.monotonic() < deadline:
            time.sleep(0.05)
        made_before_asked = len(list(tmp_path.iterdir()))
        done = running.results()
    assert made_before_asked == len(JOBS) and done.results == JOBS and os.getpid() not in done.pids


def test_a_jobs_error_reaches_the_caller_and_a_killed_child_is_an_error_not_a_hang():
    _needs_cores()

    def bad(x: int) -> int:
        if x == len(JOBS) // 2:
            raise ValueError(f"job {x} cannot be done")
        return x

    with pytest.raises(ValueError, match=f"job {len(JOBS) // 2} cannot be done"):
        fanout.each(JOBS, bad)

    def dies(x: int) -> int:
        if x == len(JOBS) - 3:
            os.kill(os.getpid(), signal.SIGKILL)          # as the kernel's OOM killer would
        return x

    started = time.monotonic()
    with pytest.raises(ResultsError, match="died before it finished"):
        fanout.each(JOBS, dies)
    assert time.monotonic() - started < 30
    import multiprocessing

    assert multiprocessing.active_children() == []


CTRL_C = """
import os, sys, time
from results.site import fanout
fanout.CHUNK = 5             # a child's chunk is short: leaving waits for the ones started
def job(x):
    with open(sys.argv[1], "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(0.05)
    return x
print("started", flush=True)
fanout.each(list(range(2000)), job)
print("finished", flush=True)
"""


def test_ctrl_c_stops_the_parent_and_leaves_no_child_running(tmp_path):
    _needs_cores()
    pids = tmp_path / "pids"
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C, str(pids)], cwd=PROJECT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(PROJECT)})
    assert proc.stdout is not None and proc.stdout.readline() == "started\n"
    deadline = time.monotonic() + 30
    while not (pids.exists() and len(set(pids.read_text().split())) >= 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "finished" not in out
    assert err.count("KeyboardInterrupt") == 1, err          # the parent's alone: no child printed one
    children = {int(p) for p in pids.read_text().split()}
    assert len(children) >= 2 and proc.pid not in children
    time.sleep(0.2)
    assert [p for p in children if Path(f"/proc/{p}").exists()] == []
