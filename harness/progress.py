"""Campaign progress: a live line per device on a terminal, a plain log line per event otherwise.

Workers (one thread per device) report here; all output goes through one lock. On a terminal the
block of device lines is redrawn in place (cursor up + clear line); anything else (a pipe, a CI
log, a test) gets one timestamped line per cell start, end and wait, so a log reads top to bottom.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from engine.safetext import one_line

LINE_CHARS = 1000


@dataclass
class _DeviceLine:
    device: str
    total: int
    done: int = 0
    current: str = "waiting"
    outcomes: Counter = field(default_factory=Counter)
    walls: list[float] = field(default_factory=list)
    note: str = ""

    def eta_s(self) -> float | None:
        if not self.walls:
            return None
        return (self.total - self.done) * sum(self.walls) / len(self.walls)

    def text(self) -> str:
        eta = self.eta_s()
        eta_text = "" if eta is None else f" ETA {_duration(eta)}"
        counts = " ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items())) or "no results yet"
        note = f" — {self.note}" if self.note else ""
        return f"{self.device}: [{self.done}/{self.total}] {self.current}{note} | {counts}{eta_text}"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Thread-safe progress for one campaign run."""

    def __init__(self, totals: dict[str, int], stream: TextIO | None = None, tty: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.lines = {d: _DeviceLine(d, n) for d, n in totals.items()}
        self.lock = threading.Lock()
        self.drawn = 0

    # -- events -----------------------------------------------------------------------------
    def start_cell(self, device: str, label: str, attempt: int) -> None:
        with self.lock:
            line = self.lines[device]
            line.current = label + (f" (attempt {attempt})" if attempt > 1 else "")
            line.note = ""
            self._emit(device, f"start {line.current}")

    def note(self, device: str, text: str) -> None:
        with self.lock:
            line = self.lines[device]
            if line.note == text:
                return
            line.note = text
            self._emit(device, text)

    def end_cell(self, device: str, label: str, outcome: str, wall_s: float, final: bool = True) -> None:
        with self.lock:
            line = self.lines[device]
            line.outcomes[outcome] += 1
            if final:
                line.done += 1
                line.walls.append(wall_s)
            line.current = "idle" if line.done >= line.total else "next"
            line.note = ""
            self._emit(device, f"{label} -> {outcome} ({wall_s:.1f} s)")

    def abandon_cell(self, device: str) -> None:
        """A cell given up after its retries (infrastructure failures): counted as handled."""
        with self.lock:
            self.lines[device].done += 1

    def finish_device(self, device: str, text: str) -> None:
        with self.lock:
            self.lines[device].current = text
            self.lines[device].note = ""
            self._emit(device, text)

    def close(self) -> None:
        with self.lock:
            if self.tty and self.drawn:
                self.stream.write("\n")
                self.stream.flush()
                self.drawn = 0

    # -- output -----------------------------------------------------------------------------
    def _emit(self, device: str, event: str) -> None:
        if self.tty:
            self._redraw()
        else:
            line = self.lines[device]
            counts = " ".join(f"{k}={v}" for k, v in sorted(line.outcomes.items()))
            eta = line.eta_s()
            tail = f" [{line.done}/{line.total}{' ' + counts if counts else ''}" \
                   f"{' ETA ' + _duration(eta) if eta is not None else ''}]"
            # device names, notes and errors carry the devices' own text: escaped, on one line
            self.stream.write(f"{time.strftime('%H:%M:%S')} {one_line(f'{device}: {event}', LINE_CHARS)}{tail}\n")
            self.stream.flush()

    def _redraw(self) -> None:
        out = []
        if self.drawn:
            out.append(f"\x1b[{self.drawn}F")  # to the start of the first device line
        for line in self.lines.values():
            out.append("\x1b[2K" + one_line(line.text(), 200) + "\n")
        self.drawn = len(self.lines)
        self.stream.write("".join(out))
        self.stream.flush()
