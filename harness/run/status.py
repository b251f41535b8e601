"""`bmoe-fleet status DIR`: how far a campaign directory is, and what its runs came to.

Read-only: the plan says what should exist, the ledger what was attempted; a cell's state is its
latest attempt's outcome (`pending` when never attempted or when only infrastructure failures
were recorded). Whether a campaign is running right now is read from its directory lock.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.safetext import one_line, printable
from harness.campaign.model import fleet_home
from harness.plan.adaptive import Bracket, brackets_of
from harness.plan.grid import read_plan
from store import locks
from store.campaign_dir import CampaignDir
from store.errors import StoreError
from store.ledger import Spent, latest_by_cell, spent_of, was_attempted
from store.outcomes import DEVICE_LOST, INFRA, OUTCOMES

STATUS_FORMAT = "bmoe-fleet.status"


@dataclass(frozen=True)
class DeviceStatus:
    """One device's share of a campaign."""

    device: str
    planned: int
    done: int                               # cells whose latest attempt is a result
    pending: int
    attempts: int
    outcomes: dict[str, int] = field(default_factory=dict)   # latest outcome per cell
    lost: str | None = None                 # the evidence of its latest device_lost attempt
    spent: Spent = field(default_factory=lambda: Spent(0, 0.0))

    def to_dict(self) -> dict[str, Any]:
        """The JSON `status --json` gives per device."""
        return {"device": self.device, "planned": self.planned, "done": self.done, "pending": self.pending,
                "attempts": self.attempts, "outcomes": dict(self.outcomes), "lost": self.lost,
                "spent": self.spent.to_dict()}


@dataclass(frozen=True)
class CampaignStatus:
    """How far a campaign directory is."""

    root: str
    campaign: str
    planned: int
    done: int
    pending: int
    attempts: int
    outcomes: dict[str, int]
    devices: tuple[DeviceStatus, ...]
    running: str | None                     # "pid N on HOST" while a run holds the directory
    last_activity_at: float | None
    cells: dict[str, str] = field(default_factory=dict)      # cell_id -> latest outcome or "pending"
    spent: Spent = field(default_factory=lambda: Spent(0, 0.0))   # probes included
    brackets: tuple[Bracket, ...] = ()      # an adaptive plan's, per group (harness.plan.adaptive)

    @property
    def complete(self) -> bool:
        """Every planned cell has a result (and an adaptive plan has decided all it will)."""
        return self.planned > 0 and self.pending == 0 and all(b.closed for b in self.brackets)

    def to_dict(self) -> dict[str, Any]:
        """`status --json`."""
        return {"format": STATUS_FORMAT, "version": 1, "dir": self.root, "campaign": self.campaign,
                "planned": self.planned, "done": self.done, "pending": self.pending, "attempts": self.attempts,
                "complete": self.complete, "running": self.running, "last_activity_at": self.last_activity_at,
                "outcomes": dict(self.outcomes), "devices": [d.to_dict() for d in self.devices],
                "cells": dict(self.cells), "spent": self.spent.to_dict(),
                **({"adaptive": [b.to_dict() for b in self.brackets]} if self.brackets else {})}

    def to_json(self) -> str:
        """`status --json`, as text."""
        return json.dumps(self.to_dict(), indent=2)

    def text(self) -> str:
        """`status`: a line for the campaign and one per device."""
        state = f"running ({self.running})" if self.running else ("complete" if self.complete else "stopped")
        lines = [f"campaign {self.campaign} in {self.root}: {self.done}/{self.planned} cells done, "
                 f"{self.pending} pending, {self.attempts} attempts — {state}"]
        if self.outcomes:
            lines.append("  outcomes: " + ", ".join(f"{k} {v}" for k, v in _ordered(self.outcomes)))
        lines.append(f"  spent: {self.spent.text()}")
        for b in self.brackets:
            lines.append(f"  adaptive: {b.text()}")
        for d in self.devices:
            counts = ", ".join(f"{k} {v}" for k, v in _ordered(d.outcomes)) or "nothing yet"
            lines.append(f"  {d.device}: {d.done}/{d.planned} done, {d.pending} pending ({counts}); "
                         f"spent {d.spent.text()}")
            if d.lost:
                lines.append(f"    latest {DEVICE_LOST}: {d.lost}")
        return "\n".join(printable(line) for line in lines)   # names come from files and devices


EXIT_COMPLETE, EXIT_ERROR, EXIT_INCOMPLETE, EXIT_INTERRUPTED = 0, 1, 3, 130


@dataclass(frozen=True)
class RunEnd:
    """How a `run` or `sweep` ended: the campaign's status after it (None when it was interrupted
    before its directory held a plan) and the exit status it means (README, "Exit statuses"):
    0 every planned cell has a result; 3 cells are pending (a device lost, a push that kept
    failing) and a rerun resumes them; 130 interrupted (Ctrl-C, SIGTERM), a rerun resumes. An
    error (exit 1) never gets here: it is raised."""

    root: str
    status: CampaignStatus | None
    interrupted: bool = False

    @property
    def exit_status(self) -> int:
        """0 complete, 3 cells pending, 130 interrupted."""
        if self.interrupted:
            return EXIT_INTERRUPTED
        return EXIT_COMPLETE if self.status is not None and self.status.complete else EXIT_INCOMPLETE

    def verdict(self) -> str:
        """One line: how the run ended and what to do next."""
        pending = self.status.pending if self.status is not None else None
        if self.interrupted:
            left = f" ({pending} cells pending)" if pending is not None else ""
            return f"interrupted{left}: rerun the same command to resume; finished runs are kept"
        if self.exit_status == EXIT_COMPLETE:
            return "complete: every planned cell has a result"
        if pending == 0:
            return "incomplete: the adaptive plan has more cells to decide; rerun the same command to resume"
        seen = self.status.outcomes if self.status is not None else {}
        infra = {k: v for k, v in seen.items() if k in INFRA}
        why = ", ".join(f"{k} {v}" for k, v in _ordered(infra))
        return (f"incomplete: {pending} cells pending{f' ({why})' if why else ''}; rerun the same command to "
                "resume (devices lost or unreachable: bring them back first)")

    def text(self) -> str:
        """The status, then the verdict."""
        return "\n".join(([self.status.text()] if self.status is not None else []) + [self.verdict()])

    def to_dict(self) -> dict[str, Any]:
        """`run --json`: the status with the exit status and verdict."""
        base = self.status.to_dict() if self.status is not None else {"format": STATUS_FORMAT, "version": 1,
                                                                        "dir": self.root}
        return {**base, "exit_status": self.exit_status, "interrupted": self.interrupted, "verdict": self.verdict()}

    def to_json(self) -> str:
        """`run --json`, as text."""
        return json.dumps(self.to_dict(), indent=2)


def _ordered(counts: dict[str, int]) -> list[tuple[str, int]]:
    rank = {name: i for i, name in enumerate(OUTCOMES + ("pending",))}
    return sorted(counts.items(), key=lambda kv: rank.get(kv[0], len(rank)))


def _latest_lost(cdir: CampaignDir, records: list[dict], ids: set[str]) -> str | None:
    """What the device's latest attempted device_lost run says (its evidence, one line): why it
    was lost, and what became of its adb server (restarted, waited for)."""
    lost = [r for r in records if r["cell_id"] in ids and r["outcome"] == DEVICE_LOST and was_attempted(r)]
    if not lost:
        return None
    latest = max(lost, key=lambda r: float(r.get("ended_at") or 0))
    try:
        run = cdir.read_run(latest["cell_id"], int(latest["attempt"]))
    except StoreError:
        return None           # its folder gone or unreadable: status still answers
    return one_line("; ".join(run.evidence), 400) or None


def campaign_status(out_dir: str | os.PathLike) -> CampaignStatus:
    """How far a campaign directory is (read-only, see the module doc)."""
    root = Path(out_dir).resolve()
    cdir = CampaignDir(root)
    plan = read_plan(cdir)
    if plan is None:
        raise StoreError(f"{root}: not a campaign directory (no plan.json)")
    records = cdir.ledger.read()
    latest = latest_by_cell(records)
    attempts = Counter(r["cell_id"] for r in records if was_attempted(r))
    cells: dict[str, str] = {}
    per_device: dict[str, list[str]] = {}
    for cell in plan.cells:
        rec = latest.get(cell.cell_id)
        state = "pending" if rec is None or rec["outcome"] in INFRA else rec["outcome"]
        cells[cell.cell_id] = state
        per_device.setdefault(cell.device, []).append(cell.cell_id)
    devices = []
    for device, ids in per_device.items():
        states = Counter(cells[i] for i in ids)
        # infrastructure failures are shown too: they are why a cell is still pending
        for i in ids:
            rec = latest.get(i)
            if rec is not None and rec["outcome"] in INFRA:
                states[rec["outcome"]] += 1
        pending = sum(1 for i in ids if cells[i] == "pending")
        probe_ids = {p.cell_id for p in plan.probes if p.device == device}
        devices.append(DeviceStatus(device, len(ids), len(ids) - pending, pending, sum(attempts[i] for i in ids),
                                    {k: v for k, v in states.items() if k != "pending"},
                                    _latest_lost(cdir, records, set(ids)), spent_of(records, set(ids) | probe_ids)))
    outcomes: Counter[str] = Counter()
    for d in devices:
        outcomes.update(d.outcomes)
    pending = sum(d.pending for d in devices)
    ends = [float(r["ended_at"]) for r in records if r.get("ended_at")]
    return CampaignStatus(root=str(root), campaign=plan.campaign, planned=len(plan.cells),
                          done=len(plan.cells) - pending, pending=pending, attempts=sum(attempts.values()),
                          outcomes=dict(outcomes), devices=tuple(devices), running=locks.running(fleet_home(), root),
                          last_activity_at=max(ends) if ends else None, cells=cells, spent=spent_of(records),
                          brackets=brackets_of(cdir.read_plan_doc()))

