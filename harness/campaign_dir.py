"""The campaign directory on disk (docs/campaign-dir.md): its formats and version, the outcome
vocabulary, the ledger, the attempt folders and the one JSON writer and versioned reader.

Both the runner (which writes a campaign directory) and status/import (which read it) import it
from here, so neither needs the other at file level.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine import fsutil
from engine.errors import BmoeError
from engine.fsutil import naming
from harness.campaign import DeviceRef, fleet_home
from harness.plan import Plan, plan_from_dict
from results.numbers import json_safe

RUN_FORMAT, LEDGER_FORMAT, DEVICE_FORMAT = "bmoe-fleet.run", "bmoe-fleet.ledger", "bmoe-fleet.device"
FORMAT_VERSION = 1
RESULTS = ("ok", "lmk_killed", "killed", "config_error", "engine_error", "timeout", "invalid")
INFRA = ("device_lost", "push_failed")
OUTCOMES = RESULTS + INFRA


class RunnerError(BmoeError):
    """A campaign cannot run (device in use, output folder holds another campaign …)."""


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    """A campaign directory's file: its folder made, fsync'd before the rename (a record survives
    a power cut), an OSError naming the file."""
    fsutil.atomic_write(path, data, fsync=True, mkdir=True)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Strict JSON (NaN and infinities stored as null, never as bare NaN)."""
    atomic_write(path, json.dumps(json_safe(obj), indent=2, ensure_ascii=False, allow_nan=False) + "\n")


def read_versioned_json(path: str | os.PathLike, fmt: str) -> dict:
    """A JSON file of this format at version <= ours; a newer one is refused by name."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise RunnerError(f"{path}: cannot read: {e}") from None
    if data.get("format") != fmt:
        raise RunnerError(f"{path}: not a {fmt} file")
    if int(data.get("version", 0)) > FORMAT_VERSION:
        raise RunnerError(f"{path}: version {data['version']} is newer than this bmoe-fleet reads "
                          f"({FORMAT_VERSION}); upgrade it")
    return data


class Ledger:
    """ledger.jsonl: one line per attempt, append-only; a torn last line is ignored."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.lock = threading.Lock()

    def read(self) -> list[dict]:
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
                raise RunnerError(f"{self.path}:{number}: not a ledger line") from None
            if int(record.get("version", 0)) > FORMAT_VERSION:
                raise RunnerError(f"{self.path}:{number}: ledger version {record['version']} is newer than this "
                                  f"bmoe-fleet reads ({FORMAT_VERSION}); upgrade it")
            records.append(record)
        return records

    def append(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(json_safe(record), ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"
        with self.lock, naming(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    # a line torn by a crash mid-append: it never was a record; drop it so it
                    # cannot glue onto this one (the only write that is not an append)
                    tail = os.pread(fd, min(size, 1 << 20), max(0, size - (1 << 20)))
                    cut = tail.rfind(b"\n")
                    os.ftruncate(fd, size - len(tail) + cut + 1 if cut >= 0 else 0)
                data = line.encode("utf-8")
                while data:     # a short write on a nearly full disk: the rest, or the error
                    data = data[os.write(fd, data):]
                os.fsync(fd)
            finally:
                os.close(fd)


def latest_by_cell(records: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Each cell's latest attempt (highest attempt number)."""
    latest: dict[str, Mapping[str, Any]] = {}
    for r in records:
        cur = latest.get(r["cell_id"])
        if cur is None or int(r["attempt"]) >= int(cur["attempt"]):
            latest[r["cell_id"]] = r
    return latest


def is_done(record: Mapping[str, Any] | None, rerun_failed: bool = False) -> bool:
    if record is None or record["outcome"] in INFRA:
        return False
    return record["outcome"] == "ok" or not rerun_failed


class CampaignDir:
    """Reading and writing one campaign directory (format version 1)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.ledger = Ledger(self.root / "ledger.jsonl")

    @property
    def plan_path(self) -> Path:
        return self.root / "plan.json"

    def read_plan(self) -> Plan | None:
        if not self.plan_path.exists():
            return None
        try:
            data = json.loads(self.plan_path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise RunnerError(f"{self.plan_path}: not JSON: {e}") from None
        return plan_from_dict(data, str(self.plan_path))

    def write_plan(self, plan: Plan) -> None:
        write_json(self.plan_path, plan.to_dict())

    def run_dir(self, cell_id: str, attempt: int) -> Path:
        return self.root / "runs" / cell_id / str(attempt)

    def next_attempt(self, cell_id: str, records: Sequence[Mapping[str, Any]]) -> int:
        used = [int(r["attempt"]) for r in records if r["cell_id"] == cell_id]
        folder = self.root / "runs" / cell_id
        if folder.is_dir():
            used += [int(p.name) for p in folder.iterdir() if p.name.isdigit()]
        return max(used, default=0) + 1

    def start_attempt(self, cell_id: str, attempt: int) -> Path:
        folder = self.root / "runs" / cell_id
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".tmp-{attempt}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        return tmp

    def commit_attempt(self, tmp: Path, record: Mapping[str, Any]) -> None:
        """run.json last, the folder renamed whole, then the ledger line: a crash between the
        rename and the append is repaired by reconcile()."""
        final = self.run_dir(record["cell_id"], record["attempt"])
        try:
            write_json(tmp / "run.json", record)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)   # never a run folder without its run.json
            raise
        self.ledger.append(ledger_line(record))

    def reconcile(self) -> int:
        """Remove half-written attempts; give every complete run folder its ledger line."""
        runs = self.root / "runs"
        if not runs.is_dir():
            return 0
        known = {(r["cell_id"], int(r["attempt"])) for r in self.ledger.read()}
        repaired = 0
        for cell_dir in sorted(runs.iterdir()):
            if not cell_dir.is_dir():
                continue
            for sub in sorted(cell_dir.iterdir()):
                if sub.name.startswith(".tmp-"):
                    shutil.rmtree(sub, ignore_errors=True)
                elif sub.name.isdigit() and (cell_dir.name, int(sub.name)) not in known:
                    run_json = sub / "run.json"
                    if run_json.is_file():
                        self.ledger.append(ledger_line(read_versioned_json(run_json, RUN_FORMAT)))
                        repaired += 1
        return repaired

    def write_device(self, ref: DeviceRef, identity: Mapping[str, Any]) -> None:
        path = self.root / "devices" / f"{ref.device_id}.json"
        if not path.exists():
            write_json(path, {"format": DEVICE_FORMAT, "version": FORMAT_VERSION, "device": ref.spec,
                              "kind": ref.kind, "first_seen_at": time.time(), **identity})


def ledger_line(record: Mapping[str, Any]) -> dict[str, Any]:
    return {"format": LEDGER_FORMAT, "version": FORMAT_VERSION, "cell_id": record["cell_id"],
            "attempt": record["attempt"], "run_dir": f"runs/{record['cell_id']}/{record['attempt']}",
            "outcome": record["outcome"], "started_at": record["started_at"], "ended_at": record["ended_at"],
            "host": record.get("host", socket.gethostname()), "attempted": record.get("attempted", True)}


def locks_dir() -> Path:
    return fleet_home() / "locks"
