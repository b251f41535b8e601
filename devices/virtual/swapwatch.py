"""A virtual phone's processes watched from the host while a run goes: who is in swap, and how much.

Tests and benchmarks read, at 5 Hz, every process of the phone's memory cgroup in this host's /proc
(the phone's kernel is this host's), with devices.reclaim.read_process: the per-process half of a
run's samples (VmSwap, RssAnon, RssFile, majflt), each the process's own whichever zram device took
its pages; never this host's /proc/vmstat or a zram device's counters, which are every phone's.
The phone's apps are the processes of an app uid (apps.py, FIRST_APP_UID and up); its engine is
the process whose command line is the staged engine's (`/bmoe/bmoe-`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from devices.android import FIRST_APP_UID
from devices.reclaim import read_process

ENGINE_MARK = b"/bmoe/bmoe-"
PERIOD_S = 0.2


class SwapWatch:
    """Peaks of the phone's processes during a `with` block: VmSwap (kB) of the engine and of the
    apps, the engine's own anonymous memory (RssAnon + VmSwap), its RssFile at each sample and its
    major faults at the last sample."""

    def __init__(self, cgroup_path: str | os.PathLike) -> None:
        self.procs = Path(cgroup_path, "cgroup.procs")
        self.peak_kb = {"engine": 0, "app": 0}
        self.engine_own_kb = 0
        self.engine_rss_file_kb: list[int] = []
        self.engine_majflt = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(PERIOD_S):
            try:
                pids = [int(p) for p in self.procs.read_text().split()]
            except OSError:
                continue
            for pid in pids:
                try:
                    uid = os.stat(f"/proc/{pid}").st_uid
                    engine = ENGINE_MARK in Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                r = read_process(pid)
                role = "app" if uid >= FIRST_APP_UID else "engine"
                self.peak_kb[role] = max(self.peak_kb[role], r.vm_swap_kb or 0)
                if engine:
                    self.engine_own_kb = max(self.engine_own_kb, (r.rss_anon_kb or 0) + (r.vm_swap_kb or 0))
                    if r.rss_file_kb is not None:
                        self.engine_rss_file_kb.append(r.rss_file_kb)
                    if r.maj_flt is not None:
                        self.engine_majflt = r.maj_flt

    def __enter__(self) -> SwapWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
