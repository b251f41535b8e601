"""Read campaign directories (docs/campaign-dir.md, format version 1) for the results side.

Everything in results/ is recomputed from these plain files alone, never from a device: the plan,
the device and model records, and every attempt's run folder. Files of a newer format version
are refused by name, older ones upgraded (store.versioned); a run folder without its run.json (an
attempt interrupted before its commit) is skipped, as the runner itself would discard it.

`report --db` reads no run folder: inside `provided_folders(store)`, a run folder the store holds
gives its run.json's bytes and its files' names from the store (what the results database kept
when it ingested the folder: results.db.load), as results.read.series answers its series.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from results.errors import ResultsError
from results.read.provided import Provided
from store import names, versioned
from store.campaign_dir import CampaignDir
from store.run_record import RunRecord


@dataclass(frozen=True)
class StoredFolder:
    """What a store keeps of a run folder for its page: its run.json's bytes and its files' names
    (sorted)."""

    record: bytes
    files: tuple[str, ...]


_provided: Provided[StoredFolder] = Provided("provided_folders")


def provided_folders(store: Mapping[str, StoredFolder]) -> contextlib.AbstractContextManager[None]:
    """Answer the run folders of `store` (its keys: str(folder)) from it, while inside."""
    return _provided.providing(store)


@dataclass(frozen=True, eq=False)
class RunFolder:
    """One attempt of one cell: its run.json and the files next to it. The record is read when it
    is first asked for (a site rebuilt from a results database reads no run.json of a page it
    keeps: results.site.report), and must name the cell and attempt of its folder."""

    campaign: str                      # the campaign's label (unique among the directories read)
    root: Path                         # the campaign directory
    path: Path                         # runs/<cell>/<attempt>
    cell_id: str                       # the folder's names, which its run.json repeats
    attempt: int
    latest: bool                       # the cell's latest attempt

    @functools.cached_property
    def record(self) -> RunRecord:
        """run.json (a StoreError naming it when it does not read; a ResultsError when it is another
        attempt's)."""
        rec = RunRecord.from_bytes(self.record_bytes(), self.path / names.RUN_JSON)
        if (rec.cell_id, rec.attempt) != (self.cell_id, self.attempt):
            raise ResultsError(f"{self.path}: its run.json does not read as attempt {self.attempt} of {self.cell_id}")
        return rec

    def record_bytes(self) -> bytes:
        """run.json's bytes, from the provided store when it holds this folder (not kept: a table
        of many runs keeps their records, not their bytes)."""
        found = _provided.of(self.path)
        if found is not None:
            return found.record
        return versioned.file_bytes(self.path / names.RUN_JSON)

    def file_names(self) -> tuple[str, ...]:
        """The names of the folder's files, sorted, from the provided store when it holds it."""
        found = _provided.of(self.path)
        if found is not None:
            return found.files
        return tuple(sorted(e.name for e in os.scandir(self.path) if e.is_file()))

    @property
    def run_id(self) -> str:
        """campaign/cell/attempt: unique over the directories read."""
        return f"{self.campaign}/{self.cell_id}/{self.attempt}"

    def file(self, name: str) -> Path | None:
        """One file of the attempt's folder (a store.names name), None when the run left none."""
        p = self.path / name
        return p if p.is_file() else None


@dataclass(frozen=True, eq=False)
class CampaignData:
    """One campaign directory, read whole."""

    label: str                                  # unique label (the campaign name, or name@folder)
    name: str
    root: Path
    imported: bool                              # written by `bmoe-fleet import`
    devices: Mapping[str, Mapping[str, Any]]    # device spec -> devices/<id>.json
    models: Mapping[str, Mapping[str, Any]]     # model name -> models/<id>.json
    runs: tuple[RunFolder, ...] = field(default=())
    planned_cells: int = 0


def _campaign_name(cdir: CampaignDir) -> tuple[str, bool, int]:
    name, imported, cells = cdir.root.name, False, 0
    plan = cdir.read_plan_doc() if cdir.has_plan() else None
    if plan is not None:
        name = str(plan.get("campaign") or name)
        cells = len(plan.get("cells") or ())
    doc = cdir.read_campaign_toml()
    if doc is not None:
        imported = "import" in doc
        if plan is None and isinstance(doc.get("name"), str):
            name = doc["name"]
    return name, imported, cells


def read_campaign(root: str | Path, label: str | None = None,
                  named: tuple[str, bool, int] | None = None) -> CampaignData:
    """Read one campaign directory (plan, devices, models and every committed attempt)."""
    head = campaign_head(root, label, named)
    folders = CampaignDir(head.root).attempt_paths()
    latest: dict[str, int] = {}
    for cell, attempt, _ in folders:
        latest[cell] = max(attempt, latest.get(cell, 0))
    runs = tuple(RunFolder(head.label, head.root, path, cell, attempt, attempt == latest[cell])
                 for cell, attempt, path in folders)
    return replace(head, runs=runs)


def campaign_head(root: str | Path, label: str | None = None,
                  named: tuple[str, bool, int] | None = None) -> CampaignData:
    """One campaign directory without its runs: its name, plan size, device and model records (the
    results database reads the attempts it lacks itself); `named`: its _campaign_name, when read."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise ResultsError(f"{root}: not a folder")
    cdir = CampaignDir(root)
    if not cdir.has_plan() and not cdir.has_runs():
        raise ResultsError(f"{root}: not a campaign directory (no plan.json, no runs/)")
    name, imported, cells = named or _campaign_name(cdir)
    devices: dict[str, Mapping[str, Any]] = {}
    for p, d in cdir.device_records():
        devices[str(d.get("device") or p.stem)] = MappingProxyType(d)
    models: dict[str, Mapping[str, Any]] = {}
    for p, m in cdir.model_records():
        models[str(m.get("name") or p.stem)] = MappingProxyType(m)
    return CampaignData(label or name, name, root, imported, MappingProxyType(devices), MappingProxyType(models), (),
                        cells)


def campaign_labels(names: Sequence[str], roots: Sequence[str | Path]) -> list[str]:
    """Each campaign's label among these: its name, or name@folder where two share a name (then
    `#N` if even that repeats)."""
    out: list[str] = []
    for root, name in zip(roots, names):
        label = name if names.count(name) == 1 else f"{name}@{Path(root).resolve().name}"
        if label in out:
            label = f"{label}#{len(out)}"
        out.append(label)
    return out


def read_campaigns(roots: Sequence[str | Path]) -> list[CampaignData]:
    """Several campaign directories; two campaigns of the same name get their folder in the label."""
    return [read_campaign(root, label, n) for root, label, n in _labelled(roots)]


def campaign_heads(roots: Sequence[str | Path]) -> list[CampaignData]:
    """Several campaign directories without their runs (no run folder listed), labelled as
    read_campaigns labels them."""
    return [campaign_head(root, label, n) for root, label, n in _labelled(roots)]


def _labelled(roots: Sequence[str | Path]) -> list[tuple[str | Path, str, tuple[str, bool, int] | None]]:
    if not roots:
        raise ResultsError("give at least one campaign directory")
    named = [_campaign_name(CampaignDir(Path(r).resolve())) if Path(r).is_dir() else None for r in roots]
    labels = campaign_labels([n[0] if n else str(r) for n, r in zip(named, roots)], roots)
    return list(zip(roots, labels, named))
