"""Session cells: N turns of one engine session with an idle gap between them (docs/decisions/session-cells.md).

A cell with `turns` > 1 runs the engine with `--session` (both engines speak bmoe-cli 0.19.0's
line protocol, docs/engine-contract.md "Session mode") and drives it through its stdin, as an
Android app drives the engine: after `BMOE_READY` the first turn's generate request; after each
`BMOE_DONE` an idle gap of `idle_s` seconds (the cell's `gap_apps`, when it has some, started on
the phone as the gap begins and stopped as it ends: another app allocating while the engine
idles), then the next request; after the last `BMOE_DONE` stdin is closed, which ends the
session. The SessionFeeder is the devices.base.StdinFeeder every device kind's run() takes, so a
phone (stdin packets of adb's shell protocol) and this host (a pipe) are driven by one code path.

What a session run records (run.json `turns`, `turns_record`): per turn the engine's `BMOE_DONE`
figures (tokens, tok/s, s/token, hit %, MiB read, major faults per token), the device's swap-in
while it ran (pswpin between the samples around it), and for each turn after the first the gap
before it: when it ran, the apps started in it, and the engine's VmSwap, VmRSS and RssFile lows
and highs over the samples taken in it (run()'s sampler keeps sampling through the gaps). The
rule that reads these (re-reads after a gap) is results/read/turns.py.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from devices import reclaim
from devices.base import PressureSample
from engine.app import protocol as session_protocol
from engine.units import MIB
from results.read.parse_session import done_figures, extremes

READY, DONE, ERROR = (kind.encode() for kind in (session_protocol.READY, session_protocol.DONE, session_protocol.ERROR))
FINISH_WAIT_S = 60.0        # finish() waits this long for the feeder's thread (a gap's apps being stopped)


def request_line(turn_id: int, prompt: str, n_predict: int) -> bytes:
    """One generate request, as bmoe-cli reads it (one line of JSON)."""
    return json.dumps({"cmd": "generate", "id": turn_id, "prompt": prompt, "n_predict": n_predict},
                      ensure_ascii=True).encode() + b"\n"


@dataclass
class Turn:
    """One turn as the feeder saw it: when its request went out and its answer came."""

    id: int
    sent_t_s: float
    answered_t_s: float | None = None
    done: dict[str, Any] | None = None        # its BMOE_DONE object
    error: dict[str, Any] | None = None       # or its BMOE_ERROR object


@dataclass
class Gap:
    """One idle gap after a turn: when it ran, and what the apps started in it reported."""

    after_turn: int
    idle_s: float
    start_t_s: float
    end_t_s: float | None = None
    apps: list[dict] = field(default_factory=list)
    apps_error: str = ""


GapHook = Callable[[int], Any]


class SessionFeeder:
    """Drives one `--session` engine through `turns` turns with `idle_s` of idle between them
    (devices.base.StdinFeeder). `on_gap_start(k)` is called as the gap after turn k begins and
    returns a handle; `on_gap_end(handle)` as it ends, returning the apps' records (both run in
    the feeder's thread; an exception of theirs is recorded on the gap, the session goes on).
    `stop` set (the campaign's Ctrl-C) ends a gap at once."""

    def __init__(self, turns: int, idle_s: float, prompt: str, n_predict: int,
                 on_gap_start: GapHook | None = None, on_gap_end: Callable[[Any], list[dict]] | None = None,
                 stop: threading.Event | None = None):
        if turns < 1:
            raise ValueError(f"a session has at least one turn, got {turns}")
        self.n_turns, self.idle_s = turns, idle_s
        self.requests = [request_line(k, prompt, n_predict) for k in range(1, turns + 1)]
        self.on_gap_start, self.on_gap_end = on_gap_start, on_gap_end
        self.stop = stop or threading.Event()
        self.turns: list[Turn] = []
        self.gaps: list[Gap] = []
        self.ready: dict[str, Any] | None = None
        self.closed = False                       # stdin was closed after the last turn's answer
        self._buf = b""
        self._event = threading.Condition()
        self._answers: dict[int, tuple[float, bytes, dict[str, Any]]] = {}
        self._ready_seen = False
        self._finished = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def now_s(self) -> float:
        """Seconds on the clock of the run's samples."""
        return time.monotonic() - self._t0

    # ---- devices.base.StdinFeeder -------------------------------------------------------------
    def attach(self, write: Callable[[bytes], None], close: Callable[[], None], t0_monotonic: float) -> None:
        self._t0 = t0_monotonic
        self._thread = threading.Thread(target=self._drive, args=(write, close), name="bmoe-session", daemon=True)
        self._thread.start()

    def on_stdout(self, data: bytes) -> None:
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            kind, _, body = line.partition(b" ")
            if kind not in (READY, DONE, ERROR):
                continue
            try:
                obj = json.loads(body.decode("latin-1"))
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            with self._event:
                if kind == READY:
                    self._ready_seen, self.ready = True, obj
                else:
                    raw_id = obj.get("id")
                    turn_id = raw_id if isinstance(raw_id, int) else 0
                    self._answers[turn_id] = (self.now_s(), kind, obj)
                self._event.notify_all()

    def finish(self) -> None:
        self._finished.set()
        with self._event:
            self._event.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(FINISH_WAIT_S)

    # ---- the session -------------------------------------------------------------------------
    def _wait(self, ready: Callable[[], bool]) -> bool:
        """Until `ready()` or the run ended; whether it became ready."""
        with self._event:
            while not ready():
                if self._finished.is_set():
                    return False
                self._event.wait(0.5)
            return True

    def _answered(self, turn_id: int) -> Callable[[], bool]:
        """Whether turn `turn_id` has its answer (or the session a fatal one of id 0)."""
        return lambda: turn_id in self._answers or 0 in self._answers

    def _drive(self, write: Callable[[bytes], None], close: Callable[[], None]) -> None:
        try:
            if not self._wait(lambda: self._ready_seen):
                return
            for k, request in enumerate(self.requests, start=1):
                turn = Turn(k, self.now_s())
                self.turns.append(turn)
                write(request)
                if not self._wait(self._answered(k)):
                    return
                at, kind, obj = self._answers.get(k) or self._answers[0]
                turn.answered_t_s = at
                if kind == DONE:
                    turn.done = obj
                else:
                    turn.error = obj
                    if obj.get("fatal") is True:
                        return
                if k < self.n_turns:
                    self._gap(k)
                    if self._finished.is_set() or self.stop.is_set():
                        return
            self.closed = True
        finally:
            close()

    def _gap(self, after_turn: int) -> None:
        gap = Gap(after_turn, self.idle_s, self.now_s())
        self.gaps.append(gap)
        handle = None
        if self.on_gap_start is not None:
            try:
                handle = self.on_gap_start(after_turn)
            except Exception as e:      # recorded on the gap; the session goes on
                gap.apps_error = f"the gap's apps did not start: {e}"
        deadline = time.monotonic() + max(0.0, self.idle_s - (self.now_s() - gap.start_t_s))
        while not self._finished.is_set() and not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._finished.wait(min(left, 0.5))
        if handle is not None and self.on_gap_end is not None:
            try:
                gap.apps = self.on_gap_end(handle)
            except Exception as e:      # as above
                gap.apps_error = f"the gap's apps did not stop cleanly: {e}"
        gap.end_t_s = self.now_s()


# ---- what run.json records ---------------------------------------------------------------------
def _round(v: float | None, places: int = 3) -> float | None:
    return None if v is None else round(v, places)


def _around(samples: Sequence[PressureSample], start: float, end: float, key: str) -> float | None:
    """A cumulative counter's growth over [start, end]: from the last sample at or before start
    (else the first in it) to the first at or after end (else the last in it)."""
    have = [(s.t_s, getattr(s.reclaim, key)) for s in samples if getattr(s.reclaim, key) is not None]
    before = [v for t, v in have if t <= start] or [v for t, v in have if start < t <= end][:1]
    after = [v for t, v in have if t >= end][:1] or [v for t, v in have if start <= t < end][-1:]
    if not before or not after:
        return None
    return max(0, after[0] - before[-1])


def _gap_samples(samples: Sequence[PressureSample], start: float, end: float) -> dict[str, Any]:
    """The engine's VmSwap, VmRSS and RssFile lows and highs over the samples taken in a gap."""
    inside = [s for s in samples if start <= s.t_s <= end]
    return {"samples": len(inside), **extremes({"vm_swap": [s.reclaim.vm_swap_kb for s in inside],
                                                "vm_rss": [s.vm_rss_kb for s in inside],
                                                "rss_file": [s.reclaim.rss_file_kb for s in inside]})}


def turns_record(feeder: SessionFeeder, samples: Sequence[PressureSample],
                 summaries: Sequence[Mapping[str, Any]] = (), page_bytes: int = reclaim.PAGE_BYTES) -> list[dict[str, Any]]:
    """run.json `turns`: one object per turn sent (docs/campaign-dir.md). `summaries` are the CSV's
    `# summary` trailers, one per finished turn in order (their evictions and rereads); `page_bytes`
    the device's page size (pswpin counts pages)."""
    out = []
    done_index = 0
    gaps = {g.after_turn: g for g in feeder.gaps}
    for turn in feeder.turns:
        end = turn.answered_t_s if turn.answered_t_s is not None else (samples[-1].t_s if samples else turn.sent_t_s)
        swap_in = _around(samples, turn.sent_t_s, end, "pswpin")
        rec: dict[str, Any] = {
            "turn": turn.id, "id": turn.id, "outcome": "done" if turn.done else "error" if turn.error else "unanswered",
            **done_figures(turn.done or {}),
            "swap_in_mib": None if swap_in is None else round(swap_in * page_bytes / MIB, 3),
            "sent_t_s": _round(turn.sent_t_s), "answered_t_s": _round(turn.answered_t_s),
        }
        if turn.error is not None:
            rec["error"] = str(turn.error.get("msg", ""))[:300]
        if turn.done is not None and done_index < len(summaries):
            summary = summaries[done_index]
            rec["evictions"], rec["rereads"] = summary.get("evictions"), summary.get("rereads")
            done_index += 1
        gap = gaps.get(turn.id - 1)
        if gap is not None:
            gap_end = gap.end_t_s if gap.end_t_s is not None else turn.sent_t_s
            rec["gap"] = {"idle_s": gap.idle_s, "start_t_s": _round(gap.start_t_s), "end_t_s": _round(gap_end),
                          **_gap_samples(samples, gap.start_t_s, gap_end), "apps": gap.apps,
                          **({"apps_error": gap.apps_error} if gap.apps_error else {})}
        out.append(rec)
    return out


def gap_app_specs(apps: Sequence[Any]) -> list[Any]:
    """The gap's apps under names of their own (`co.gcached1`), so that starting them (which kills
    leftovers of their names first) never touches the cell's own axes.apps apps (`co.cached1`)."""
    renamed = []
    for app in apps:
        head, _, tail = app.name.rpartition(".")
        renamed.append(dataclasses.replace(app, name=f"{head}.g{tail}"))
    return renamed
