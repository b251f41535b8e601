"""Many small jobs spread over the host's cores: `each(jobs, work)` gives [work(job) for job in
jobs], worked out in this process when there are few (or one core, or no fork), else in forked
processes, one per core the process may run on, each taking the next chunk of jobs as it finishes
one. The report makes its run pages so (results.site.report): each page is written by the job that
makes it, and a page depends on nothing another page does. `started(jobs, work)` begins the same
and lets this process do its own work while the children do theirs (the report's analysis and its
other pages), then gives the results.

Forked, not spawned: the children inherit the jobs and everything `work` reads (the run table, the
analysis, the templates) instead of having them pickled. A job's exception reaches the caller as
it was raised; a child that dies (killed, out of memory) is a ResultsError, never a hang
(concurrent.futures notices a dead worker, where multiprocessing.Pool would wait for it). Ctrl-C is
the parent's alone (the children ignore SIGINT); leaving `each` early, by an error or Ctrl-C,
cancels the chunks not started and waits for the children to finish theirs (a chunk is short).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
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
    with started(jobs, work) as running:
        return running.results(progress)


@contextlib.contextmanager
def started(jobs: Sequence[T], work: Callable[[T], R]) -> Iterator[Started[R]]:
    """`each`, begun: inside, the children (when there are any) work while this process does
    something else, then `.results(progress)` gives what `each` gives. What `work` reads is what
    it was at the start (the children are forked then). Leaving early cancels the chunks not
    started and waits for the children's."""
    global _work
    n = cores()
    if len(jobs) < PROCESSES_FROM or n < 2 or "fork" not in multiprocessing.get_all_start_methods():
        yield Started(jobs, work, None, [])
        return
    _work = (work, jobs)
    # what the children inherit, out of the collector's sight: a child's collections never walk
    # (and so never copy on write) the parent's whole heap (gc.freeze's documented use)
    gc.freeze()
    pool = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork"), initializer=_quiet)
    try:
        futures = [pool.submit(_run, (at, min(at + CHUNK, len(jobs)))) for at in range(0, len(jobs), CHUNK)]
        yield Started(jobs, work, pool, futures)
    except BrokenProcessPool:
        raise ResultsError(f"a process working through {len(jobs)} jobs died before it finished "
                           "(killed, or out of memory?)") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        gc.unfreeze()
        _work = None


class Started(Generic[R]):
    """Jobs being worked out (`started`)."""

    def __init__(self, jobs: Sequence[Any], work: Callable[[Any], R], pool: ProcessPoolExecutor | None,
                 futures: list[Future]) -> None:
        self.jobs, self.work, self.pool, self.futures = jobs, work, pool, futures

    def results(self, progress: Callable[[int, int], None] | None = None) -> Done[R]:
        """Every job's result, in the jobs' order (worked out here and now when nothing was forked);
        `progress(done, of)` at most once a second."""
        shown = time.monotonic()
        if self.pool is None:
            out = []
            for job in self.jobs:
                out.append(self.work(job))
                if progress is not None and time.monotonic() - shown >= 1.0:
                    progress(len(out), len(self.jobs))
                    shown = time.monotonic()
            return Done(out, {os.getpid()})
        results: list[Any] = [None] * len(self.jobs)
        pids: set[int] = set()
        done = 0
        for future in as_completed(self.futures):
            at, values, pid = future.result()
            results[at:at + len(values)] = values
            pids.add(pid)
            done += len(values)
            if progress is not None and time.monotonic() - shown >= 1.0:
                progress(done, len(self.jobs))
                shown = time.monotonic()
        return Done(results, pids)
