"""The phone's lmkd: notices kills of its processes and WRITES them in Android lmkd's formats.

With a memory cgroup the kernel does the killing (memcg OOM); we learn of it from the cgroup's
oom_kill counter (v1 memory.oom_control, v2 memory.events) and from /dev/kmsg's "Killed process
PID (comm) ... anon-rss:NkB, file-rss:NkB, shmem-rss:NkB" line when readable (exact RSS). Without
a cgroup this module is the killer: a watchdog that SIGKILLs the largest process once the phone's
summed RSS passes its RAM. Either way the victim's name is its cmdline's first word (lmkd.cpp
proc_get_name; for a `#!` script, the script: see process_name) and the last ~10 Hz sample fills
in what the kernel did not say. A process being killed has lost its cmdline before the kernel's
line reaches us; a sample taken then is no sample (see sample), or the kill would be logged under
the kernel's comm.

Who lmkd may kill: only what the phone's ActivityManager registered (lmkd.cpp: its victims come
from its own per-adj lists, find_and_kill_process -> proc_adj_tail / proc_get_heaviest, which only
LMK_PROCPRIO fills), sent on the phone's /dev/socket/lmkd by the daemon's ActivityManager
(devices/virtual/am.py): lmkd_registry.py. A registered process's adj is lmkd's record of it, not
what the process writes for itself. A shell process is never a candidate, whatever its adj: when no
registered process is left, lmkd kills nothing (mp_event_psi: find_and_kill_process finds no one,
nothing is logged) and the kernel's memcg OOM killer is what takes the engine, a line in the
kernel buffer only. lmkd SIGKILLs the registered pid alone (reaper.cpp, pidfd_send_signal);
ActivityManager then kills the app's process group when it sees the app die (am.py).

Formats (lmkd.cpp; event.logtags tag 10195355):
  Android 12-14  Kill 'NAME' (PID), uid UID, oom_score_adj ADJ to free NkB rss, NkB swap; reason: TEXT
  Android 11     Kill 'NAME' (PID), uid UID, oom_adj ADJ to free NkB; reason: TEXT
  Android 10     Kill 'NAME' (PID), uid UID, oom_adj ADJ to free NkB
  Android 9      Killing 'NAME' (PID), uid UID, adj ADJ to free NkB ...
  events (11+)   killinfo: [pid,uid,oom_adj,min_oom_adj,task_size_kb,kill_reason,MemFree,...]
                 (13+: ending with five PSI avg10 floats, psi_avg10_tail)
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import signal
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from devices.lmkd_policy import (
    POLL_LONG_S,
    Candidate,
    Decision,
    Policy,
    Reading,
    choose_victim,
    read_psi_full_total_us,
)
from devices.virtual import logbuf, namespace
from devices.virtual.lmkd_registry import Registration, Registry
from devices.virtual.meminfo import MemInfo

log = logging.getLogger("bmoe.vphone.lmkd")

SHELL_UID = 2000
KILLINFO_TAG = "killinfo"
LMKD_TAG = "lowmemorykiller"
# enum kill_reasons (statslog.h): LOW_MEM_AND_SWAP = 3, LOW_MEM = 8 (Android 14).
LOW_MEM_AND_SWAP, LOW_MEM = 3, 8
_KILLED = re.compile(r"Killed process ([0-9]+) \(([^)]*)\).*?anon-rss:([0-9]+)kB, file-rss:([0-9]+)kB, shmem-rss:([0-9]+)kB")
_SUMMARY = re.compile(r"oom-kill:.*oom_memcg=([^,]*),.*pid=([0-9]+)")
_UID = re.compile(r"UID:([0-9]+)")
FIRST_APPLICATION_UID = 10000     # android_filesystem_config.h: an app's processes share its uid
FORGET_AFTER_S = 10.0
# after a victim is gone, lmkd decides again once the phone's counters have its memory back (the
# zram charge follows zram one poll late): a few of its 10 ms polls
SETTLE_AFTER_KILL_S = 0.05


@dataclass(frozen=True)
class ProcSample:
    pid: int
    name: str
    rss_kb: int
    swap_kb: int
    oom_score_adj: int
    seen_at: float
    uid: int = SHELL_UID
    started: float = 0.0   # /proc/PID/stat starttime, clock ticks since boot (lmkd's LRU order)
    pgid: int = 0          # its process group (an app's command is in the app's)
    phone_pid: int = 0     # the pid the phone knows it by (its pid namespace's: NSpid), 0: `pid`


@dataclass(frozen=True)
class Kill:
    pid: int
    name: str
    rss_kb: int
    swap_kb: int
    oom_score_adj: int
    source: str  # "lmkd" (its policy), "kmsg", "cgroup" (the kernel's OOM killer) or "watchdog"
    uid: int = SHELL_UID


def sample(pid: int, now: float) -> ProcSample | None:
    """What lmkd would read of `pid` now; None once it is gone or going. A process being killed
    loses its memory (and with it its cmdline) before it disappears from /proc, and the kernel's
    line reaches us after that: a sample taken then would name it by its comm, so it is not one."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        if not cmdline.strip(b"\0"):
            return None
        status = Path(f"/proc/{pid}/status").read_text()
        adj = int(Path(f"/proc/{pid}/oom_score_adj").read_text())
    except (OSError, ValueError):
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    name = process_name(cmdline, fields.get("Name", "?").strip())
    kb = lambda key: int(fields.get(key, "0 kB").split()[0])  # noqa: E731
    uid = int(fields.get("Uid", f"{SHELL_UID}").split()[0])
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        started, pgid = float(stat[19]), int(stat[2])
    except (OSError, IndexError, ValueError):
        started, pgid = 0.0, 0
    phone_pid = namespace.innermost_pid(status)
    return ProcSample(pid, name, kb("VmRSS"), kb("VmSwap"), adj, now, uid, started, pgid,
                      pid if phone_pid is None else phone_pid)


def process_name(cmdline: bytes, comm: str) -> str:
    """The name lmkd logs: its proc_get_name() takes the cmdline's first word. A `#!` script is
    the exception here: the kernel starts it as `INTERPRETER [ARG] SCRIPT ...` and names the
    process (comm) after the script, so the argument comm names is logged, as the path the
    shell ran; that is what the engine would be called were it native (bmoe-py, not python3).
    comm is at most 15 characters, so names compare by that prefix."""
    args = [a.decode("utf-8", "replace") for a in cmdline.split(b"\0") if a]
    if not args:
        return comm or "?"
    first = args[0].split(" ", 1)[0]
    if comm and os.path.basename(first)[:15] != comm:
        for arg in args[1:3]:       # the script follows the interpreter and at most one option
            if os.path.basename(arg)[:15] == comm:
                return arg
    return first


class KernelLog:
    """New /dev/kmsg records, non-blocking; unavailable (not root) means None from open()."""

    def __init__(self) -> None:
        self.fd: int | None = None
        try:
            self.fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.lseek(self.fd, 0, os.SEEK_END)
        except OSError:
            self.fd = None

    def lines(self) -> list[str]:
        out = []
        while self.fd is not None:
            try:
                rec = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten before we read it: skip ahead
                    continue
                break
            if not rec:
                break
            _prefix, _, msg = rec.decode("utf-8", "replace").partition(";")
            out.append(msg.split("\n", 1)[0])
        return out

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Lmkd:
    def __init__(self, root: Path, android_release: int, ram_bytes: int,
                 pids: Callable[[], list[int]], oom_kills: Callable[[], int] | None,
                 meminfo: Callable[[], MemInfo], memcg_leaf: str = "", policy: Policy | None = None,
                 vmstat: Callable[[], dict[str, int]] | None = None,
                 headroom_bytes: Callable[[], int] | None = None):
        self.root = Path(root)
        self.memcg_leaf = memcg_leaf
        self.memcg_of: dict[int, bool] = {}  # pid -> "the kernel said it was ours"
        self.android = android_release
        self.ram_bytes = ram_bytes
        self.pids = pids
        self.oom_kills = oom_kills  # None: no cgroup, we are the killer (watchdog)
        self.meminfo = meminfo
        self.kmsg = KernelLog()
        self.samples: dict[int, ProcSample] = {}
        self.logged: set[int] = set()
        self.kernel_count = oom_kills() if oom_kills else 0
        self.unexplained: list[float] = []  # times of counted kills not yet attributed
        self.kills: list[Kill] = []
        self.last_poll: float | None = None
        # Android 14 lmkd's own decisions (lmkd_policy); None: the kernel's kills stand in for them
        self.policy = policy
        self.vmstat = vmstat
        # the phone's cgroup limit minus its usage: what is really free when zram's use is charged
        # to the limit (MemFree counts that charge as free)
        self.headroom_bytes = headroom_bytes
        self.pending: tuple[int, float] | None = None   # (pid, when) of lmkd's last kill
        self.settle_until = 0.0                          # no decision before (the last victim's memory returning)
        # what ActivityManager registered (LMK_PROCPRIO on /dev/socket/lmkd): lmkd's only candidates
        self.registry = Registry(self.root, _name_of, self._error)

    def watch_control(self, loop: asyncio.AbstractEventLoop) -> None:
        """Handle lmkd's control socket as it is written to, as lmkd's epoll does."""
        self.registry.watch(loop)

    def _error(self, text: str) -> None:
        """lmkd's ALOGE: the main buffer, tag lowmemorykiller."""
        logbuf.append(self.root, "main", LMKD_TAG, text, priority="E")
        log.warning("lmkd: %s", text)

    def registered(self, s: ProcSample) -> Registration | None:
        """lmkd's record of the process sampled, if it has one."""
        return self.registry.of(s.pid, s.started)

    # -- one poll (~10 Hz) ------------------------------------------------------------------
    def poll(self) -> list[Kill]:
        now = time.time()
        if self.last_poll is not None and now - self.last_poll > 1.0:
            log.warning("lmkd poll %.2f s after the last one (expected ~0.1 s)", now - self.last_poll)
        self.last_poll = now
        self.registry.serve()
        for pid in self.pids():
            s = sample(pid, now)
            if s is not None:
                self.samples[pid] = s
        if self.policy is not None:
            self._decide(now)
        found: list[Kill] = []
        for line in self.kmsg.lines():
            summary = _SUMMARY.search(line)
            if summary and self.memcg_leaf:
                self.memcg_of[int(summary[2])] = summary[1].rstrip("/").endswith("/" + self.memcg_leaf)
            m = _KILLED.search(line)
            if m:
                pid = int(m[1])
                ours = self.memcg_of.pop(pid, None)
                known = pid in self.samples if ours is None else ours
                if known or (ours is None and self.unexplained and pid not in self.logged):
                    prev = self.samples.get(pid)
                    if prev is None:
                        log.warning("no sample of %d (%s) before its kill: named by the kernel's comm", pid, m[2])
                    rss = int(m[3]) + int(m[4]) + int(m[5])
                    uid = _UID.search(line)
                    found.append(Kill(pid, prev.name if prev else m[2], rss, prev.swap_kb if prev else 0,
                                      prev.oom_score_adj if prev else 0, "kmsg",
                                      prev.uid if prev else int(uid[1]) if uid else SHELL_UID))
                    logbuf.append(self.root, "kernel", "kernel", self._as_phone_sees(line, pid), priority="E",
                                  pid=0, tid=0)
        if self.oom_kills is not None:
            count = self.oom_kills()
            self.unexplained += [now] * max(0, count - self.kernel_count)
            self.kernel_count = max(count, self.kernel_count)
        else:
            found += self._watchdog(now)
        for kill in found:
            if kill.pid in self.logged:
                continue
            if self.unexplained and kill.source == "kmsg":
                self.unexplained.pop(0)
            self._record(kill)
        # Counted kills that no kernel line explained within 0.3 s: the vanished process with
        # the largest last sample is the one the OOM killer picks (largest badness).
        while self.unexplained and now - self.unexplained[0] > 0.3:
            self.unexplained.pop(0)
            alive = set(self.pids())
            gone = [s for s in self.samples.values() if s.pid not in alive and s.pid not in self.logged
                    and not _exists(s.pid)]
            if gone:
                victim = max(gone, key=lambda s: s.rss_kb)
                self._record(Kill(victim.pid, victim.name, victim.rss_kb, victim.swap_kb, victim.oom_score_adj,
                                  "cgroup", victim.uid))
        self.samples = {pid: s for pid, s in self.samples.items()
                        if now - s.seen_at < FORGET_AFTER_S and pid not in self.logged}
        self.registry.expire(now)
        return found

    # -- lmkd's own policy (Android 14 mp_event_psi) -------------------------------------------
    def _decide(self, now: float) -> None:
        assert self.policy is not None
        if self.pending is not None:   # is_kill_pending(): wait while the last victim still exists
            pid, at = self.pending
            if _exists(pid) and (now - at) * 1000 < max(self.policy.props.kill_timeout_ms, 1000):
                return
            self.pending = None
            # ... and one poll more: what its zram held leaves the phone's counters when the ballast
            # (zram_charge.py) has shrunk, which it does after this poll asked it to; deciding now
            # took a stale charge for "min watermark is breached even after kill" and killed the next
            self.settle_until = now + SETTLE_AFTER_KILL_S
        if now < self.settle_until:
            return
        mi = self.meminfo()
        vm = self.vmstat() if self.vmstat is not None else {}
        f = mi.fields
        free_kb = f["MemFree"]
        if self.headroom_bytes is not None:
            free_kb = max(0, min(free_kb, self.headroom_bytes() // 1024))
        reading = Reading(free_kb=free_kb, swap_total_kb=f["SwapTotal"], swap_free_kb=f["SwapFree"],
                          file_lru_kb=f["Active(file)"] + f["Inactive(file)"],
                          workingset_refault_file=vm.get("workingset_refault_file", vm.get("workingset_refault", 0)),
                          psi_full_total_us=read_psi_full_total_us(), now_s=now, available_kb=f["MemAvailable"])
        decision = self.policy.decide(reading)
        if decision is None:
            return
        # lmkd's candidates are its registered processes only, at the adj it holds for them
        live = {s.pid: (s, reg) for s in self.samples.values()
                if s.seen_at == now and s.pid not in self.logged and (reg := self.registered(s)) is not None}
        chosen = choose_victim([Candidate(s.pid, reg.oom_score_adj, s.rss_kb, s.started) for s, reg in live.values()],
                               decision.min_score_adj, self.policy.props.kill_heaviest_task)
        if chosen is None:   # nothing registered at or above min_score_adj: no kill, no line
            return
        victim, reg = live[chosen.pid]
        self.registry.take(victim.pid, victim.started)   # kill_one_process: pid_remove, killed or not
        try:
            os.kill(victim.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.policy.killed()
        self.pending = (victim.pid, now)
        self._log(Kill(victim.pid, victim.name, victim.rss_kb, victim.swap_kb, reg.oom_score_adj, "lmkd", reg.uid),
                  decision)

    def _record(self, kill: Kill) -> None:
        """A kill the kernel made (its memcg OOM killer, or the watchdog standing in for it). It is
        the kernel's: a line in the kernel buffer, never an lmkd line, when lmkd's policy runs on a
        phone with swap (the backstop: RAM and zram both full) and whenever the victim was no
        registered process (a shell's engine: lmkd could never have killed it). Without swap (or
        without the policy) lmkd's policy cannot act before the cgroup's OOM killer, so a kernel
        kill of a registered app stands in for the kill lmkd would have made first and is logged
        as lmkd's, and so is one of an app's command (run-as-app): lmkd would have killed the app,
        and does so now (ActivityManager then takes its process group)."""
        prev = self.samples.get(kill.pid)
        reg = self.registry.take(kill.pid, prev.started if prev is not None else None)
        stand_in = self.policy is None or self.meminfo().fields["SwapTotal"] <= 0
        if stand_in and reg is not None:
            self._log(replace(kill, name=kill.name if prev is not None else reg.name, uid=reg.uid,
                              oom_score_adj=reg.oom_score_adj))
            return
        self._kernel_line(kill)
        if not stand_in:
            return
        # the app whose process group (or, unsampled, whose uid) the victim was in
        app_reg = None
        if prev is not None and prev.pgid != kill.pid and prev.pgid not in self.logged:
            app_reg = self.registry.take(prev.pgid, _started(self.samples.get(prev.pgid)))
        if app_reg is None and kill.uid >= FIRST_APPLICATION_UID:
            app_pid = self.registry.of_uid(kill.uid, self.logged | {kill.pid})
            app_reg = self.registry.take(app_pid, _started(self.samples.get(app_pid))) if app_pid else None
        if app_reg is not None:
            # the app may have ended already (its command did): lmkd would have killed it first
            with contextlib.suppress(ProcessLookupError):
                os.kill(app_reg.pid, signal.SIGKILL)
            app = self.samples.get(app_reg.pid)
            self._log(Kill(app_reg.pid, app.name if app else app_reg.name, app.rss_kb if app else 0,
                           app.swap_kb if app else 0, app_reg.oom_score_adj, "lmkd", app_reg.uid))

    def _kernel_line(self, kill: Kill) -> None:
        self.logged.add(kill.pid)
        self.kills.append(kill)
        if kill.source != "kmsg":   # the kernel's own line was not readable: write what it logs
            comm = os.path.basename(kill.name)[:15]     # the kernel names a task by its comm
            line = (f"Memory cgroup out of memory: Killed process {self.shown_pid(kill.pid)} ({comm}) total-vm:0kB, "
                    f"anon-rss:{kill.rss_kb}kB, file-rss:0kB, shmem-rss:0kB, UID:{kill.uid} pgtables:0kB "
                    f"oom_score_adj:{kill.oom_score_adj}")
            logbuf.append(self.root, "kernel", "kernel", line, priority="E", pid=0, tid=0)
        log.info("the kernel's OOM killer killed %s (%d, %d kB)", kill.name, kill.pid, kill.rss_kb)

    def shown_pid(self, pid: int) -> int:
        """A host pid as the phone's processes know it (their pid namespace's), for what the phone
        reads: sampled, else read now, else the pid itself."""
        s = self.samples.get(pid)
        if s is not None and s.phone_pid:
            return s.phone_pid
        return namespace.phone_pid(pid) or pid

    def _as_phone_sees(self, line: str, pid: int) -> str:
        """The kernel's line with the victim's pid as the phone knows it (`pid=N`, `process N`)."""
        shown = self.shown_pid(pid)
        if shown == pid:
            return line
        return re.sub(rf"(\bpid=|Killed process ){pid}\b", lambda m: f"{m[1]}{shown}", line)

    @property
    def poll_interval_s(self) -> float:
        """Seconds to the next poll: lmkd's 10 ms while swap is low or after a kill, else 100 ms."""
        return self.policy.poll_interval_s if self.policy is not None else POLL_LONG_S

    def _watchdog(self, now: float) -> list[Kill]:
        live = [s for s in self.samples.values() if s.seen_at == now]
        total_kb = sum(s.rss_kb for s in live)
        if not live or total_kb * 1024 <= self.ram_bytes:
            return []
        victim = max(live, key=lambda s: (s.oom_score_adj, s.rss_kb))
        try:
            os.kill(victim.pid, signal.SIGKILL)
        except ProcessLookupError:
            return []
        log.warning("watchdog: %d kB > RAM, killed %s (%d)", total_kb, victim.name, victim.pid)
        return [Kill(victim.pid, victim.name, victim.rss_kb, victim.swap_kb, victim.oom_score_adj, "watchdog")]

    # -- writing ----------------------------------------------------------------------------
    def _log(self, kill: Kill, decision: Decision | None = None) -> None:
        self.logged.add(kill.pid)
        self.kills.append(kill)
        mi = self.meminfo()
        if decision is not None:
            reason_code, reason, min_adj = decision.reason, decision.text, decision.min_score_adj
        else:
            reason_code = LOW_MEM if self.android >= 14 else LOW_MEM_AND_SWAP
            reason = "min watermark is breached" if self.android >= 14 else \
                "min watermark is breached and swap is low (0kB < 0kB)"
            min_adj = 0
        k = replace(kill, pid=self.shown_pid(kill.pid))
        if self.android >= 12:
            msg = (f"Kill '{k.name}' ({k.pid}), uid {k.uid}, oom_score_adj {k.oom_score_adj} to free "
                   f"{k.rss_kb}kB rss, {k.swap_kb}kB swap; reason: {reason}")
        elif self.android == 11:
            msg = (f"Kill '{k.name}' ({k.pid}), uid {k.uid}, oom_adj {k.oom_score_adj} to free {k.rss_kb}kB; "
                   f"reason: {reason}")
        elif self.android == 10:
            msg = f"Kill '{k.name}' ({k.pid}), uid {k.uid}, oom_adj {k.oom_score_adj} to free {k.rss_kb}kB"
        else:
            msg = (f"Killing '{k.name}' ({k.pid}), uid {k.uid}, adj {k.oom_score_adj}\n"
                   f"   to free {k.rss_kb}kB because system is under critical memory pressure (min_oom_adj={min_adj})")
        now = time.time()
        logbuf.append(self.root, "main", LMKD_TAG, msg, priority="I", time_s=now)
        if self.android >= 11:
            f = mi.fields
            mem = [f["MemFree"], f["Cached"], f["SwapCached"], f["Buffers"], f["Shmem"], f["Unevictable"],
                   f["SwapTotal"], f["SwapFree"], f["Active(anon)"], f["Inactive(anon)"], f["Active(file)"],
                   f["Inactive(file)"], f["SReclaimable"], f["SUnreclaim"], f["KernelStack"], f["PageTables"],
                   0, 0, 0]  # IonHeap, IonHeapPool, CmaFree
            values = [k.pid, k.uid, k.oom_score_adj, min_adj, k.rss_kb, reason_code] + mem
            if self.android >= 12:
                # MsSinceEvent, MsSincePrevWakeup, WakeupsSinceEvent, SkippedWakeups, TaskSwapSize,
                # GPU, Thrashing, MaxThrashing
                values += [0, 100, 1, 0, k.swap_kb, 0, 0, 0]
            fields = [str(v) for v in values] + (psi_avg10_tail() if self.android >= 13 else [])
            logbuf.append(self.root, "events", KILLINFO_TAG, "[" + ",".join(fields) + "]",
                          priority="I", time_s=now)
        log.info("logged kill of %s (%d, %d kB, via %s)", k.name, k.pid, k.rss_kb, k.source)

    def close(self) -> None:
        self.kmsg.close()
        self.registry.close()


def psi_avg10_tail(base: str = "/proc/pressure") -> list[str]:
    """killinfo's tail from Android 13 on (lmkd.cpp killinfo_log, 2022's "Log psi averages in
    killinfo reports"; event.logtags PsiMemSome, PsiMemFull, PsiIoSome, PsiIoFull, PsiCpuSome):
    the avg10 of memory some/full, io some/full and cpu some, each a float32 that logcat prints
    with "%f" (liblog logprint.cpp). They are this host's, system-wide, as lmkd reads
    /proc/pressure (a memory cgroup v1 has no PSI of its own); 0 where unreadable, as lmkd logs
    zeros without PSI data."""
    out: list[str] = []
    for resource, kinds in (("memory", ("some", "full")), ("io", ("some", "full")), ("cpu", ("some",))):
        avg10: dict[str, float] = {}
        with contextlib.suppress(OSError, ValueError):
            for line in Path(base, resource).read_text().splitlines():
                kind, _, rest = line.partition(" ")
                for field in rest.split():
                    name, _, value = field.partition("=")
                    if name == "avg10":
                        avg10[kind] = float(value)
        out += [f"{struct.unpack('<f', struct.pack('<f', avg10.get(kind, 0.0)))[0]:f}" for kind in kinds]
    return out


def _name_of(pid: int) -> str | None:
    s = sample(pid, 0.0)
    return s.name if s is not None else None


def _started(s: ProcSample | None) -> float | None:
    return s.started if s is not None else None


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True

