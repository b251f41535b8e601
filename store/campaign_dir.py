"""Reading and writing one campaign directory (docs/campaign-dir.md): its campaign.toml and plan,
the device and model records, and the attempt folders with their ledger lines.

An attempt is assembled in `runs/<cell>/.tmp-<attempt>-<pid>/` and renamed into place whole, then
its ledger line is appended; a crash between the two is repaired by reconcile(), and half-built
folders are removed by it. So a directory is consistent after any crash or Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.fsutil import naming
from engine.units import is_digits
from store import names, versioned
from store.errors import StoreError
from store.ledger import Ledger, ledger_line
from store.run_record import RunRecord


class CampaignDir:
    """Reading and writing one campaign directory."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.ledger = Ledger(self.root / names.LEDGER_JSONL)

    # -- the campaign and its plan ------------------------------------------------------------
    @property
    def plan_path(self) -> Path:
        """plan.json."""
        return self.root / names.PLAN_JSON

    @property
    def campaign_toml_path(self) -> Path:
        """campaign.toml."""
        return self.root / names.CAMPAIGN_TOML

    def has_plan(self) -> bool:
        """Whether the directory holds a plan (a campaign ran, or an import wrote one, here)."""
        return self.plan_path.is_file()

    def has_runs(self) -> bool:
        """Whether the directory has a runs folder (attempts may be there)."""
        return (self.root / names.RUNS_DIR).is_dir()

    def read_plan_doc(self) -> dict[str, Any] | None:
        """plan.json at the current version (None when there is none); harness.plan.grid makes it a Plan."""
        if not self.plan_path.exists():
            return None
        return versioned.read_json(self.plan_path, versioned.PLAN.name)

    def write_plan_doc(self, doc: Mapping[str, Any]) -> None:
        """plan.json (a harness.plan.grid.Plan's to_dict)."""
        versioned.write_json(self.plan_path, doc)

    def read_campaign_toml(self) -> dict[str, Any] | None:
        """The directory's campaign.toml (None without one). `bmoe-fleet import` writes an `[import]`
        table there instead of a campaign."""
        path = self.campaign_toml_path
        if not path.is_file():
            return None
        try:
            return tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise StoreError(f"{path}: cannot read: {e}") from None

    def write_campaign_toml(self, text: str) -> None:
        """campaign.toml (the resolved campaign, or an import's [import] table)."""
        versioned.atomic_write(self.campaign_toml_path, text)

    # -- device and model records --------------------------------------------------------------
    def write_device(self, device_id: str, head: Mapping[str, Any], identity: Mapping[str, Any]) -> None:
        """devices/<id>.json as the device was first seen (never rewritten): `head` (device, kind),
        when, then its identity (devices.base.DeviceIdentity)."""
        path = names.device_record(self.root, device_id)
        if not path.exists():
            versioned.write_json(path, {**versioned.DEVICE.stamp(), **head, "first_seen_at": time.time(), **identity})

    def read_model(self, model_id: str) -> dict[str, Any] | None:
        """models/<id>.json (None when there is none yet)."""
        path = names.model_record(self.root, model_id)
        return versioned.read_json(path, versioned.MODEL.name) if path.exists() else None

    def write_model(self, model_id: str, record: Mapping[str, Any]) -> None:
        """models/<id>.json: the shape record (engine.gguf.model.ModelShape.to_dict) plus what identifies it."""
        versioned.write_json(names.model_record(self.root, model_id), record)

    # -- attempts ------------------------------------------------------------------------------
    def run_dir(self, cell_id: str, attempt: int) -> Path:
        """One committed attempt's folder."""
        return names.run_dir(self.root, cell_id, attempt)

    def next_attempt(self, cell_id: str, records: Sequence[Mapping[str, Any]]) -> int:
        """The attempt number after every one the ledger or the runs folder knows."""
        used = [int(r["attempt"]) for r in records if r["cell_id"] == cell_id]
        folder = names.cell_runs(self.root, cell_id)
        if folder.is_dir():
            used += [int(p.name) for p in folder.iterdir() if is_digits(p.name)]
        return max(used, default=0) + 1

    def start_attempt(self, cell_id: str, attempt: int) -> Path:
        """An empty folder to assemble one attempt in (hidden until commit_attempt)."""
        folder = names.cell_runs(self.root, cell_id)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{names.TMP_PREFIX}{attempt}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        return tmp

    @staticmethod
    def put(tmp: Path, name: str, data: bytes | str | Path) -> None:
        """One file of an attempt being assembled: bytes, text, or a copy of a file (an OSError
        names it)."""
        with naming(tmp / name):
            if isinstance(data, Path):
                shutil.copyfile(data, tmp / name)
            else:
                (tmp / name).write_bytes(data.encode() if isinstance(data, str) else data)

    def commit_attempt(self, tmp: Path, record: RunRecord) -> None:
        """run.json last (a RunRecord: nothing unchecked is committed), the folder renamed whole, then
        the ledger line: a crash between the rename and the append is repaired by reconcile()."""
        final = self.run_dir(record.cell_id, record.attempt)
        try:
            versioned.write_json(tmp / names.RUN_JSON, record.to_dict())
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)   # never a run folder without its run.json
            raise
        self.ledger.append(ledger_line(record))

    def reconcile(self) -> int:
        """Remove half-written attempts; give every complete run folder its ledger line."""
        runs = self.root / names.RUNS_DIR
        if not runs.is_dir():
            return 0
        known = {(r["cell_id"], int(r["attempt"])) for r in self.ledger.read()}
        repaired = 0
        for cell_dir in sorted(runs.iterdir()):
            if not cell_dir.is_dir():
                continue
            for sub in sorted(cell_dir.iterdir()):
                if sub.name.startswith(names.TMP_PREFIX):
                    shutil.rmtree(sub, ignore_errors=True)
                elif is_digits(sub.name) and (cell_dir.name, int(sub.name)) not in known:
                    run_json = sub / names.RUN_JSON
                    if run_json.is_file():
                        self.ledger.append(ledger_line(RunRecord.read(run_json)))
                        repaired += 1
        return repaired

    def attempt_paths(self) -> list[tuple[str, int, Path]]:
        """Every committed attempt folder (one holding its run.json) as (cell id, attempt, folder), by
        cell then attempt number; nothing is read."""
        runs = self.root / names.RUNS_DIR
        out: list[tuple[str, int, Path]] = []
        if not runs.is_dir():
            return out
        with os.scandir(runs) as found:
            cells = sorted(e.name for e in found if e.is_dir())
        for cell in cells:
            cell_dir = os.path.join(runs, cell)
            with os.scandir(cell_dir) as found:
                attempts = sorted((e.name for e in found if is_digits(e.name)), key=int)
            for attempt in attempts:
                sub = os.path.join(cell_dir, attempt)
                if os.path.isfile(os.path.join(sub, names.RUN_JSON)):
                    out.append((cell, int(attempt), Path(sub)))
        return out

    def read_run(self, cell_id: str, attempt: int) -> RunRecord:
        """One committed attempt's run.json (a StoreError naming the file when it is missing or does
        not read as a run record)."""
        return RunRecord.read(self.run_dir(cell_id, attempt) / names.RUN_JSON)

    def device_records(self) -> list[tuple[Path, dict[str, Any]]]:
        """The campaign's root/devices/*.json, sorted by file name."""
        return [(p, versioned.read_json(p, versioned.DEVICE.name))
                for p in sorted((self.root / names.DEVICES_DIR).glob("*.json"))]

    def model_records(self) -> list[tuple[Path, dict[str, Any]]]:
        """models/*.json, sorted by file name."""
        return [(p, versioned.read_json(p, versioned.MODEL.name))
                for p in sorted((self.root / names.MODELS_DIR).glob("*.json"))]
