"""Many small jobs spread over the host's cores: `each(jobs, work)` gives [work(job) for job in
jobs], worked out in this process when there are few (or one core, or no fork), else in forked
processes, one per core the process may run on, each taking the next chunk of jobs as it finishes
one. The report makes its run pages so (results.site.report): each page is written by the job that
makes it, and a page depends on nothing another page does.

Forked, not spawned: the children inherit the jobs and everything `work` reads (the run table, the
analysis, the templates) instead of having them pickled. A job's exception reaches the caller as
it was raised; a child that dies (killed, out of memory) is a ResultsError, never a hang
(concurrent.futures notices a dead worker, where multiprocessing.Pool would wait for it). Ctrl-C is
the parent's alone (the children ignore SIGINT); leaving `each` early, by an error or Ctrl-C,
cancels the chunks not started and waits for the children to finish theirs (a chunk is short).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from results.errors import ResultsError

T = TypeVar("T")
R = TypeVar("R")

PROCESSES_FROM = 200     # fewer jobs than this are worked out in this process: forking costs more than it saves
CHUNK = 50               # jobs a child takes at a time: small enough that the cores finish together

_work: tuple[Callable[[Any], Any], Sequence[Any]] | None = None     # what the children inherit


@dataclass(frozen=True)
class Done(Generic[R]):
    """What `each` gave: every job's result, in the jobs' order, and the processes that worked them out."""

    results: list[R]
    pids: set[int]


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _quiet() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run(span: tuple[int, int]) -> tuple[int, list[Any], int]:
    assert _work is not None
    work, jobs = _work
    return span[0], [work(job) for job in jobs[span[0]:span[1]]], os.getpid()


def each(jobs: Sequence[T], work: Callable[[T], R], progress: Callable[[int, int], None] | None = None) -> Done[R]:
    """[work(job) for job in jobs] (module doc); `progress(done, of)` at most once a second."""
    global _work
    n = cores()
    shown = time.monotonic()
    if len(jobs) < PROCESSES_FROM or n < 2 or "fork" not in multiprocessing.get_all_start_methods():
        out = []
        for job in jobs:
            out.append(work(job))
            if progress is not None and time.monotonic() - shown >= 1.0:
                progress(len(out), len(jobs))
                shown = time.monotonic()
        return Done(out, {os.getpid()})
    results: list[Any] = [None] * len(jobs)
    pids: set[int] = set()
    _work = (work, jobs)
    pool = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork"), initializer=_quiet)
    try:
        futures = [pool.submit(_run, (at, min(at + CHUNK, len(jobs)))) for at in range(0, len(jobs), CHUNK)]
        done = 0
        for future in as_completed(futures):
            at, values, pid = future.result()
            results[at:at + len(values)] = values
            pids.add(pid)
            done += len(values)
            if progress is not None and time.monotonic() - shown >= 1.0:
                progress(done, len(jobs))
                shown = time.monotonic()
    except BrokenProcessPool:
        raise ResultsError(f"a process working through {len(jobs)} jobs died before it finished "
                           "(killed, or out of memory?)") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _work = None
    return Done(results, pids)
