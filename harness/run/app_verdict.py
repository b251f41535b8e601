"""The app's verdict: what lmkd would have done to the engine had it run in the app, replayed from
what a run over adb sampled.

Over `adb shell` a real lmkd never considers the engine: lmkd kills only processes ActivityManager
registered with it (AOSP lmkd.cpp `find_and_kill_process` takes its victims from the per-adj lists
`LMK_PROCPRIO` fills, a socket only system_server may use), so near the limit it kills the user's
apps and the engine lives until the kernel's OOM killer takes it. In upstream's Android app the
engine is a child of a registered app process: adj 0 while the app is on top, 200 as its
foreground service (upstream examples/android RunService; ProcessList's PERCEPTIBLE_APP_ADJ). So
the answer a user of the app needs cannot be observed over adb on a real phone; it is replayed:

- every sample's lmkd inputs (devices.lmkd_inputs) go through lmkd's own decision
  (devices.lmkd_policy.Policy, one wakeup per sample), with the phone's ro.lmk.* properties and
  watermarks read once per run;
- a decision kills the registered process with the highest oom_score_adj at or above its
  min_score_adj: the run's other registered apps while one is alive (a kill removes it from the
  replay, as it frees its memory in both worlds), else the engine at the app's adj;
- the verdict is the first sample at which the engine would be that victim ("kill", with lmkd's
  reason), or "holds";
- each kill the real lmkd made of another app is a wakeup of its own (replay), and a kernel OOM
  kill of the engine over adb the last (at_kernel_kill): memory and swap exhausted, which lmkd
  meets with a kill at any adj.

A rule whose input the phone withheld (memory PSI is refused to the shell on production phones;
the refault counter on old kernels) cannot fire in the replay: the verdict names it, so a "holds"
is read as "holds by the rules that could be evaluated". The replay's wakeups are the run's
samples (about 1 s apart), lmkd's are 10-100 ms apart: a breach shorter than a sample is missed.
A virtual phone can run the engine as the app (devices/virtual's `am`), which checks the replay
against a real kill.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from devices.android import FOREGROUND_APP_ADJ, PERCEPTIBLE_APP_ADJ
from devices.lmk import LmkEvent
from devices.lmkd_inputs import LmkdSample, LmkdSetting
from devices.lmkd_policy import Candidate, Policy, choose_victim

# where the engine sits in the app: (role, adj), the roles in the order a verdict lists them
ROLES = (("top", FOREGROUND_APP_ADJ), ("service", PERCEPTIBLE_APP_ADJ))
ROLE_TEXT = {"top": "the app on top", "service": "the app's foreground service"}
# a pid no real process has: the engine's place in the replay's candidate lists
_ENGINE = -1


@dataclass(frozen=True)
class OtherApp:
    """A registered app of the run: its adj, its memory, and when the real lmkd killed it (seconds
    since the engine started; None: it outlived the run)."""

    name: str
    oom_score_adj: int
    rss_kb: int
    killed_at_s: float | None = None
    reason: str = ""                # lmkd's reason for the kill, as its line gave it

    def to_dict(self) -> dict[str, Any]:
        """run.json's `collateral` entry."""
        return asdict(self)


@dataclass(frozen=True)
class AppVerdict:
    role: str                       # "top" or "service" (ROLES)
    adj: int
    killed: bool
    at_s: float | None              # when, in seconds since the engine started
    reason: str                     # lmkd's kill_desc text of the deciding wakeup ("" when it holds)
    unevaluated: tuple[str, ...]    # lmkd's rules these samples could not evaluate, and why
    marks_from: str                 # where the watermarks came from (LmkdSetting.marks_from)
    samples: int                    # samples replayed

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["unevaluated"] = list(self.unevaluated)
        return d

    def describe(self, budget: str) -> str:
        """One line: "in the app (…), lmkd would kill the app at BUDGET after T s (reason)", or "holds"."""
        where = f"{ROLE_TEXT[self.role]}, adj {self.adj}"
        if self.samples == 0:
            return f"in the app ({where}): not replayed (no lmkd inputs were sampled)"
        if self.killed:
            return (f"in the app ({where}), lmkd would kill the app at {budget} after {self.at_s:.1f} s "
                    f"({self.reason})")
        gaps = f"; not evaluated: {'; '.join(self.unevaluated)}" if self.unevaluated else ""
        return f"in the app ({where}): holds at {budget}{gaps}"


def collateral(events: Sequence[LmkEvent], engine_kills: Sequence[LmkEvent], started_at_s: float,
               clock_offset_s: float) -> list[OtherApp]:
    """The registered apps lmkd killed while the engine ran (a run over adb's collateral), once each:
    lmkd's own lines and killinfo events that are not the engine's, each with when it came in
    seconds since the engine started (the phone's epoch stamp less its clock offset; a line without
    a stamp counts from the start, so it never shields the engine in the replay)."""
    engine = {e.pid for e in engine_kills}
    out: dict[int, OtherApp] = {}
    for e in events:
        if e.pid in engine or e.source not in ("lmkd", "killinfo"):
            continue
        try:
            at_s = max(0.0, float(e.timestamp) - clock_offset_s - started_at_s) if e.timestamp else 0.0
        except ValueError:
            at_s = 0.0
        known = out.get(e.pid)
        out[e.pid] = OtherApp(
            (known.name if known else "") or e.name or str(e.pid),
            e.oom_score_adj if e.oom_score_adj is not None else (known.oom_score_adj if known else 0),
            e.rss_kb if e.rss_kb is not None else (known.rss_kb if known else 0),
            min(at_s, known.killed_at_s) if known is not None and known.killed_at_s is not None else at_s,
            (known.reason if known else "") or e.reason or "")
    return list(out.values())


def unevaluated(samples: Sequence[LmkdSample]) -> tuple[str, ...]:
    """lmkd's rules that need an input no sample had."""
    out = []
    if not any(s.psi_full_total_us is not None for s in samples):
        out.append("device is not responding (memory PSI refused)")
    if not any(s.workingset_refault_file is not None and s.file_lru_kb is not None for s in samples):
        out.append("thrashing (workingset_refault_file or the file LRU not readable)")
    return tuple(out)


def at_kernel_kill(samples: Sequence[tuple[float, LmkdSample]], killed_at_s: float,
                   swap_total_kb: int = 0) -> tuple[float, LmkdSample] | None:
    """The wakeup the kernel's OOM kill stands for: the engine over adb was killed by the kernel
    (a SIGKILL with no lmkd line), which happens only once reclaim has nothing left, so free memory
    is under the min watermark and a phone's swap is full. On a phone with swap that is lmkd's
    LOW_MEM_AND_SWAP at the min watermark (min_score_adj 0: the app's adj too); the replay adds it
    at the kill, since samples about a second apart may all come before the squeeze. None on a
    phone without swap (there lmkd has only its PSI rule, which a sample cannot stand in for)."""
    swap = next((s.swap_total_kb for _, s in reversed(samples) if s.swap_total_kb), swap_total_kb)
    if not swap:
        return None
    return killed_at_s, LmkdSample(free_kb=0, available_kb=0, swap_total_kb=swap, swap_free_kb=0)


def replay(samples: Sequence[tuple[float, LmkdSample]], setting: LmkdSetting, others: Sequence[OtherApp],
           role: str, adj: int, kernel_killed_at_s: float | None = None, swap_total_kb: int = 0) -> AppVerdict:
    """The app's verdict for the engine at `adj` over one run's samples ((t_s, sample), in order),
    the real lmkd's kills of the run's other apps (each a wakeup of its own, below), and the
    kernel's kill of the engine over adb when there was one (at_kernel_kill; `swap_total_kb`, the
    phone's swap, where no sample said it).

    A kill the real lmkd made is a wakeup the samples may have missed (lmkd polls every 10-100 ms):
    lmkd decided then with a min_score_adj at or under the killed app's adj. In the app's world the
    same wakeup takes the registered process of the highest adj at or above that, which is the
    engine when its adj is higher than every app still alive (a tie goes to the older process, the
    app lmkd took)."""
    policy = Policy(setting.props, setting.marks)
    alive = {i: o for i, o in enumerate(others)}
    replayed = 0
    skipped = unevaluated([s for _, s in samples])
    wakeups: list[tuple[float, LmkdSample | int]] = list(samples)
    wakeups += [(o.killed_at_s, i) for i, o in enumerate(others) if o.killed_at_s is not None]
    if kernel_killed_at_s is not None and \
            (last := at_kernel_kill(samples, kernel_killed_at_s, swap_total_kb)) is not None:
        wakeups.append(last)
    wakeups.sort(key=lambda w: (w[0], isinstance(w[1], int)))
    for t_s, wakeup in wakeups:
        if isinstance(wakeup, int):                # the real lmkd killed this app: its decision
            taken = others[wakeup]
            min_score_adj, text = taken.oom_score_adj, f"as lmkd did when it killed {taken.name}" + (
                f": {taken.reason}" if taken.reason else "")
        else:
            for i, other in list(alive.items()):   # the real lmkd took it: gone in the app's world too
                if other.killed_at_s is not None and other.killed_at_s < t_s:
                    del alive[i]
            reading = wakeup.reading(t_s)
            if reading is None:
                continue
            replayed += 1
            decision = policy.decide(reading)
            if decision is None:
                continue
            min_score_adj, text = decision.min_score_adj, decision.text
        candidates = [Candidate(i, o.oom_score_adj, max(1, o.rss_kb), float(i)) for i, o in alive.items()]
        candidates.append(Candidate(_ENGINE, adj, 1, float(len(others))))
        victim = choose_victim(candidates, min_score_adj, setting.props.kill_heaviest_task)
        if victim is None:
            continue                              # nothing at or above min_score_adj: lmkd kills nothing
        policy.killed()
        if victim.pid == _ENGINE:
            return AppVerdict(role, adj, True, t_s, text, skipped, setting.marks_from, replayed)
        del alive[victim.pid]
    return AppVerdict(role, adj, False, None, "", skipped, setting.marks_from, replayed)


def verdicts(samples: Sequence[tuple[float, LmkdSample]], setting: LmkdSetting,
             others: Sequence[OtherApp], kernel_killed_at_s: float | None = None,
             swap_total_kb: int = 0) -> list[AppVerdict]:
    """The app's verdict for each role (ROLES)."""
    return [replay(samples, setting, others, role, adj, kernel_killed_at_s, swap_total_kb) for role, adj in ROLES]

