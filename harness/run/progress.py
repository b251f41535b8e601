"""Campaign progress: a live line per device on a terminal, a plain log line per event otherwise.

Workers (one thread per device) report here; all output goes through one lock. On a terminal a
rich `Live` block holds one line per device, each fitted to the terminal's width as it is now (a
long cell label or note is cut with `…`; the device name and its cell count stay); anything else
(a pipe, a CI log, a test) gets one timestamped line per cell start, end and wait, with no control
characters, so a log reads top to bottom and can be parsed.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.text import Text

from engine.safetext import one_line

LINE_CHARS = 1000
BAR_CELLS = 12           # the per-device bar, drawn when the terminal has room for it
BAR_MIN_WIDTH = 60       # narrower terminals get the counts without a bar
NAME_MIN_CELLS = 16      # a device name is cut to a third of the width, but never below this


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

    def summary(self) -> str:
        """Outcome counts and the ETA: `ok 1 lmk_killed 2 ETA 3m05s`."""
        eta = self.eta_s()
        counts = " ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items())) or "no results yet"
        return counts + ("" if eta is None else f" ETA {_duration(eta)}")

    def render(self, width: int) -> Text:
        """This device's line in at most `width` cells: name, bar, count, what runs now, summary.
        What runs now (a cell label, a note) gives way first; device strings arrive escaped."""
        name = Text(one_line(self.device, LINE_CHARS), style="bold")
        name.truncate(max(NAME_MIN_CELLS, width // 3), overflow="ellipsis")
        line = Text.assemble(name, " ")
        if width >= BAR_MIN_WIDTH:
            line.append_text(bar(self.done, self.total, BAR_CELLS))
            line.append(" ")
        line.append(f"{self.done}/{self.total}")
        tail = Text(" | " + one_line(self.summary(), LINE_CHARS), style="dim")
        now = one_line(self.current + (f" — {self.note}" if self.note else ""), LINE_CHARS)
        room = width - line.cell_len - tail.cell_len - 1
        if room >= 2:
            middle = Text(" " + now)
            middle.truncate(room + 1, overflow="ellipsis")
            line.append_text(middle)
        line.append_text(tail)
        line.truncate(max(width, 1), overflow="ellipsis")
        return line


def bar(done: float, total: float, cells: int) -> Text:
    """A progress bar `cells` wide: the done part green, the rest dim."""
    filled = cells if total <= 0 else min(cells, max(0, round(cells * done / total)))
    return Text.assemble(("━" * filled, "green"), ("━" * (cells - filled), "dim"))


def fitted(label: str, done: float, total: float, tail: str, width: int) -> Text:
    """`label bar tail` in at most `width` cells: the label (escaped) is cut first, the bar is left
    out on a narrow terminal."""
    right = Text(" ")
    if width >= BAR_MIN_WIDTH:
        right.append_text(bar(done, total, BAR_CELLS))
        right.append(" ")
    right.append(one_line(tail, LINE_CHARS))
    line = Text(one_line(label, LINE_CHARS))
    line.truncate(max(NAME_MIN_CELLS, width - right.cell_len), overflow="ellipsis")
    line.append_text(right)
    line.truncate(max(width, 1), overflow="ellipsis")
    return line


class _Board:
    """The device lines as one rich renderable, laid out for the width rich offers at each draw."""

    def __init__(self, lines: dict[str, _DeviceLine]):
        self.lines = lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in self.lines.values():
            yield line.render(options.max_width)


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Thread-safe progress for one campaign run. `console` (tests) draws the terminal lines on a
    given rich Console instead of one on `stream`."""

    def __init__(self, totals: dict[str, int], stream: TextIO | None = None, tty: bool | None = None,
                 console: Console | None = None):
        self.stream = stream if stream is not None else sys.stderr
        if tty is None:
            tty = console.is_terminal if console is not None else self.stream.isatty()
        self.tty = tty
        self.lines = {d: _DeviceLine(d, n) for d, n in totals.items()}
        self.lock = threading.Lock()
        self._console = console
        self._live: Live | None = None

    # -- events -----------------------------------------------------------------------------
    def start_cell(self, device: str, label: str, attempt: int) -> None:
        """A cell starts on `device` (attempt > 1: a retry)."""
        with self.lock:
            line = self.lines[device]
            line.current = label + (f" (attempt {attempt})" if attempt > 1 else "")
            line.note = ""
            self._emit(device, f"start {line.current}")

    def note(self, device: str, text: str) -> None:
        """What `device` is doing between cells or inside one (a gate wait, a retry)."""
        with self.lock:
            line = self.lines[device]
            if line.note == text:
                return
            line.note = text
            self._emit(device, text)

    def end_cell(self, device: str, label: str, outcome: str, wall_s: float, final: bool = True) -> None:
        """A cell ended; `final` False: it will run again (an infrastructure failure)."""
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
        """`device` has no more cells to run; `text` says why (done, lost, stopped)."""
        with self.lock:
            self.lines[device].current = text
            self.lines[device].note = ""
            self._emit(device, text)

    def close(self) -> None:
        """Leave the last drawing on the terminal (the cursor below it, shown again)."""
        with self.lock:
            if self._live is not None:
                self._live.stop()
                self._live = None

    # -- output -----------------------------------------------------------------------------
    def _emit(self, device: str, event: str) -> None:
        if self.tty:
            if self._live is None:
                # started on the first event, so a run that never reports leaves the terminal alone
                console = self._console or Console(file=self.stream, force_terminal=True, highlight=False)
                self._live = Live(_Board(self.lines), console=console, auto_refresh=False, transient=False,
                                  redirect_stdout=False, redirect_stderr=False)
                self._live.start(refresh=True)
            else:
                self._live.refresh()
        else:
            line = self.lines[device]
            counts = " ".join(f"{k}={v}" for k, v in sorted(line.outcomes.items()))
            eta = line.eta_s()
            tail = f" [{line.done}/{line.total}{' ' + counts if counts else ''}" \
                   f"{' ETA ' + _duration(eta) if eta is not None else ''}]"
            # device names, notes and errors carry the devices' own text: escaped, on one line
            self.stream.write(f"{time.strftime('%H:%M:%S')} {one_line(f'{device}: {event}', LINE_CHARS)}{tail}\n")
            self.stream.flush()
