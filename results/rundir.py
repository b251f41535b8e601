"""Read campaign directories (docs/campaign-dir.md, format version 1) for the results side.

Everything in results/ is recomputed from these plain files alone, never from a device: the plan,
the device and model records, and every attempt's run folder. Files of a newer format version
are refused by name; a run folder without its run.json (an attempt interrupted before its commit)
is skipped, as the runner itself would discard it.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from results.errors import ResultsError

FORMAT_VERSION = 1
RUN_FORMAT = "bmoe-fleet.run"
DEVICE_FORMAT = "bmoe-fleet.device"
MODEL_FORMAT = "bmoe-fleet.model-shape"
PLAN_FORMAT = "bmoe-fleet.plan"
INFRA_OUTCOMES = ("device_lost", "push_failed")


def read_json(path: Path, fmt: str) -> dict[str, Any]:
    """One versioned JSON file of this format; a newer version is refused with a clear message."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ResultsError(f"{path}: cannot read: {e}") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise ResultsError(f"{path}: not a {fmt} file")
    version = data.get("version", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ResultsError(f"{path}: {fmt} version {version} is newer than this bmoe-fleet reads "
                           f"({FORMAT_VERSION}); upgrade bmoe-fleet")
    return data


@dataclass(frozen=True, eq=False)
class RunFolder:
    """One attempt of one cell: its run.json and the files next to it."""

    campaign: str                      # the campaign's label (unique among the directories read)
    root: Path                         # the campaign directory
    path: Path                         # runs/<cell>/<attempt>
    record: Mapping[str, Any]          # run.json
    latest: bool                       # the cell's latest attempt

    @property
    def run_id(self) -> str:
        return f"{self.campaign}/{self.record['cell_id']}/{self.record['attempt']}"

    def file(self, name: str) -> Path | None:
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


def campaign_toml(root: Path) -> dict[str, Any] | None:
    """The directory's campaign.toml (None without one). `bmoe-fleet import` writes an `[import]`
    table there instead of a campaign."""
    toml = root / "campaign.toml"
    if not toml.is_file():
        return None
    try:
        return tomllib.loads(toml.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ResultsError(f"{toml}: cannot read: {e}") from None


def _campaign_name(root: Path) -> tuple[str, bool, int]:
    name, imported, cells = root.name, False, 0
    plan = root / "plan.json"
    if plan.is_file():
        data = read_json(plan, PLAN_FORMAT)
        name = str(data.get("campaign") or name)
        cells = len(data.get("cells") or ())
    doc = campaign_toml(root)
    if doc is not None:
        imported = "import" in doc
        if not plan.is_file() and isinstance(doc.get("name"), str):
            name = doc["name"]
    return name, imported, cells


def read_campaign(root: str | Path, label: str | None = None) -> CampaignData:
    """Read one campaign directory (plan, devices, models and every committed attempt)."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise ResultsError(f"{root}: not a folder")
    runs_dir = root / "runs"
    if not (root / "plan.json").is_file() and not runs_dir.is_dir():
        raise ResultsError(f"{root}: not a campaign directory (no plan.json, no runs/)")
    name, imported, cells = _campaign_name(root)
    label = label or name
    devices: dict[str, Mapping[str, Any]] = {}
    for p in sorted((root / "devices").glob("*.json")):
        d = read_json(p, DEVICE_FORMAT)
        devices[str(d.get("device") or p.stem)] = MappingProxyType(d)
    models: dict[str, Mapping[str, Any]] = {}
    for p in sorted((root / "models").glob("*.json")):
        m = read_json(p, MODEL_FORMAT)
        models[str(m.get("name") or p.stem)] = MappingProxyType(m)
    folders: list[tuple[Path, dict[str, Any]]] = []
    if runs_dir.is_dir():
        for cell_dir in sorted(runs_dir.iterdir()):
            if not cell_dir.is_dir():
                continue
            for sub in sorted(cell_dir.iterdir(), key=lambda p: (not p.name.isdigit(), int(p.name) if
                                                                  p.name.isdigit() else 0)):
                if sub.name.isdigit() and (sub / "run.json").is_file():
                    folders.append((sub, read_json(sub / "run.json", RUN_FORMAT)))
    latest: dict[str, int] = {}
    for _, rec in folders:
        cid, attempt = str(rec["cell_id"]), int(rec["attempt"])
        latest[cid] = max(attempt, latest.get(cid, 0))
    runs = tuple(RunFolder(label, root, path, MappingProxyType(rec),
                           int(rec["attempt"]) == latest[str(rec["cell_id"])]) for path, rec in folders)
    return CampaignData(label, name, root, imported, MappingProxyType(devices), MappingProxyType(models), runs,
                        cells)


def read_campaigns(roots: Sequence[str | Path]) -> list[CampaignData]:
    """Several campaign directories; two campaigns of the same name get their folder in the label."""
    if not roots:
        raise ResultsError("give at least one campaign directory")
    names = [_campaign_name(Path(r).resolve())[0] if Path(r).is_dir() else str(r) for r in roots]
    out = []
    for root, name in zip(roots, names):
        label = name if names.count(name) == 1 else f"{name}@{Path(root).resolve().name}"
        if label in (c.label for c in out):
            label = f"{label}#{len(out)}"
        out.append(read_campaign(root, label))
    return out
