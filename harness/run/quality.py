"""A cell's quality scoring run (docs/decisions/quality-runs.md): after the cell's own run, in the
same attempt, the same command line scoring a fixed text with `--ppl` instead of generating
(store.engine_argv.scoring_argv), when the campaign measures quality (the cell's `progress`) and the
engine takes `--ppl` (bmoe-cli 0.24 or later: a real build that reports it, or bmoe-py claiming it).

The text ships with the project (harness/data/quality-en.txt, its licence beside it) and is pushed
to a phone as a model is (harness.run.staging). The run's stdout and stderr are kept as the
attempt's ppl.txt and ppl-stderr.txt, and run.json's `quality` says what ran and how it ended; a
scoring run that fails never changes the cell's outcome.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devices.base import Device, DeviceError, RunInterrupted
from engine.contract.claim import release_of
from engine.interface.flags import BMOE_CLI, PPL
from engine.interface.releases import Release
from harness.campaign.model import device_work_dir, is_local
from store import names
from store.campaign_dir import CampaignDir
from store.engine_argv import scoring_argv

QUALITY_TEXT = Path(__file__).resolve().parents[1] / "data" / "quality-en.txt"
_RELEASE = re.compile(r"\b([0-9]+\.[0-9]+(?:\.[0-9]+)?)\b")


def engine_release(kind: str, version: str) -> Release | None:
    """The bmoe-cli release an engine speaks, from the first line its `--version` printed: bmoe-py's
    claim (`bmoe-py 0.1.0 (bmoe-cli 0.24.0)`; none claimed: None), bmoe-cli's own number (`0.19.0`).
    None when the line says no release."""
    if kind == "python":
        return release_of(version)
    m = _RELEASE.search(version)
    try:
        return Release.parse(m[1]) if m else None
    except ValueError:
        return None


def scores(kind: str, version: str) -> bool:
    """Whether the engine takes `--ppl` (engine.interface.flags: since 0.24)."""
    release = engine_release(kind, version)
    return release is not None and PPL.taken_by(BMOE_CLI, release)


def text_path(device: str) -> str:
    """Where the scored text is on a device: pushed beside the models on a phone, where it is here."""
    return str(QUALITY_TEXT) if is_local(device) else f"{device_work_dir(device)}/{QUALITY_TEXT.name}"


@functools.cache
def text_sha256() -> str:
    """The text's sha256 (it ships with the project: read once per process)."""
    return hashlib.sha256(QUALITY_TEXT.read_bytes()).hexdigest()


def score(device: Device, where: str, argv: Sequence[str], env: Mapping[str, str] | None, timeout_s: float,
          attempt_dir: Path) -> dict[str, Any]:
    """Run a cell's command line (`argv`, on the campaign's device `where`) as its scoring run; its
    outputs go into the attempt's folder and the returned object is run.json's `quality`. A run that
    could not end (the device lost, the campaign interrupted) is recorded there (`ppl_error`), never
    raised: the cell's own run has already ended, and its outcome stands."""
    run = scoring_argv(argv, text_path(where))
    record: dict[str, Any] = {"ppl_text": QUALITY_TEXT.name, "ppl_text_sha256": text_sha256(),
                              "ppl_exit_status": None, "ppl_argv": run}
    try:
        outcome = device.run(run, env=env, timeout_s=timeout_s, sample_period_s=5.0)
    except RunInterrupted:
        record["ppl_error"] = "interrupted"
        return record
    except DeviceError as e:          # DeviceLost too: the next cell's gate finds out
        record["ppl_error"] = f"the scoring run did not end: {e}"
        return record
    CampaignDir.put(attempt_dir, names.PPL_TXT, outcome.stdout)
    CampaignDir.put(attempt_dir, names.PPL_STDERR_TXT, outcome.stderr)
    record.update(ppl_exit_status=outcome.exit_status, ppl_timed_out=outcome.timed_out,
                  ppl_wall_s=round(outcome.wall_s, 3))
    return record
