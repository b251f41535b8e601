"""ledger.jsonl: one line per attempt, append-only (docs/campaign-dir.md, "Ledger line").

A line torn by a crash mid-append (no newline) never was a record: reading ignores it, and the
next append cuts it off first so it cannot glue onto the new line.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.fsutil import naming
from engine.units import MIB
from store import names, versioned
from store.errors import StoreError
from store.run_record import RunRecord


class Ledger:
    """ledger.jsonl: one line per attempt, append-only; a torn last line is ignored."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.lock = threading.Lock()

    def read(self) -> list[dict]:
        """Every complete line, upgraded to the current version."""
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return []
        lines = text.split("\n")
        records = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                if number == len(lines):  # torn by a crash mid-append: the attempt never happened
                    continue
                raise StoreError(f"{self.path}:{number}: not a ledger line") from None
            records.append(versioned.upgrade(record, versioned.LEDGER.name, f"{self.path}:{number}"))
        return records

    def append(self, record: Mapping[str, Any]) -> None:
        """One line, fsync'd; a torn last line left by a crash is cut off first."""
        line = versioned.json_line(record)
        with self.lock, naming(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    # a line torn by a crash mid-append: it never was a record; drop it so it
                    # cannot glue onto this one (the only write that is not an append)
                    tail = os.pread(fd, min(size, MIB), max(0, size - MIB))
                    cut = tail.rfind(b"\n")
                    os.ftruncate(fd, size - len(tail) + cut + 1 if cut >= 0 else 0)
                data = line.encode("utf-8")
                while data:     # a short write on a nearly full disk: the rest, or the error
                    data = data[os.write(fd, data):]
                os.fsync(fd)
            finally:
                os.close(fd)


# `attempted` of a ledger line or run record with no such key: the engine ran (the lines written
# before the key existed were all runs). Only an explicit false says an outcome was recorded without
# running: a lost device's later cells, a knee cell whose probe failed (docs/campaign-dir.md).
ATTEMPTED_DEFAULT = True


def was_attempted(record: Mapping[str, Any] | RunRecord) -> bool:
    """Whether a ledger line or a run record (run.json) ran the engine: true unless its `attempted`
    is false; a record without the key did (ATTEMPTED_DEFAULT), and so does one whose value is not a
    boolean (null, 0: not what the harness writes, and only false says "not run"). Every reader
    (spent, status, the run table, the benchmarks) counts attempts through this one test."""
    if isinstance(record, RunRecord):
        return record.attempted is not False       # RunRecord.attempted: None when the key is absent
    return record.get("attempted", ATTEMPTED_DEFAULT) is not False


def ledger_line(record: RunRecord) -> dict[str, Any]:
    """The ledger line of a run record (run.json)."""
    return {**versioned.LEDGER.stamp(), "cell_id": record.cell_id, "attempt": record.attempt,
            "run_dir": names.run_dir_rel(record.cell_id, record.attempt), "outcome": record.outcome,
            "started_at": record.started_at, "ended_at": record.ended_at,
            "host": record.host if record.has("host") else socket.gethostname(), "attempted": was_attempted(record)}


def latest_by_cell(records: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Each cell's latest attempt (highest attempt number)."""
    latest: dict[str, Mapping[str, Any]] = {}
    for r in records:
        cur = latest.get(r["cell_id"])
        if cur is None or int(r["attempt"]) >= int(cur["attempt"]):
            latest[r["cell_id"]] = r
    return latest


@dataclass(frozen=True)
class Spent:
    """What a campaign (or one device's share) cost (docs/decisions/adaptive-sweep.md): the cells the engine ran at
    least once, and the device time of every attempt that ran, gate and pushes included (each
    ledger line's ended_at - started_at; a cell recorded without running costs nothing)."""

    cells: int
    device_s: float

    def to_dict(self) -> dict[str, Any]:
        """As `status --json` gives it."""
        return {"cells": self.cells, "device_s": round(self.device_s, 3)}

    def text(self) -> str:
        """'12 cells, 95 s of device time'."""
        return f"{self.cells} cells, {self.device_s:.0f} s of device time"


def spent_of(records: Sequence[Mapping[str, Any]], ids: set[str] | None = None) -> Spent:
    """The cells run and device time of the ledger lines (of the cells `ids`, or every one)."""
    ran = [r for r in records if was_attempted(r) and (ids is None or r["cell_id"] in ids)]
    spans = [float(r.get("ended_at") or 0) - float(r.get("started_at") or 0) for r in ran
             if r.get("ended_at") and r.get("started_at")]
    return Spent(len({r["cell_id"] for r in ran}), sum(s for s in spans if math.isfinite(s) and s > 0))
