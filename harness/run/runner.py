"""Run a campaign: one worker thread per device (harness.run.worker), devices in parallel, every write
atomic.

The campaign directory (docs/campaign-dir.md, store/) is written so that a crash or Ctrl-C leaves
it consistent: an attempt is assembled in a temporary folder and renamed into `runs/<cell>/<n>`
whole, then its ledger line is appended; an interrupted attempt is discarded. Running the same
campaign again completes only what is missing; `rerun_failed` also retries cells whose latest
result is not `ok`. Lock files (store.locks, in ~/.bmoe-fleet/locks) keep two campaigns off one
directory and off one phone.

Pieces by job: worker.py (one device's cells), staging.py (the engine and models pushed),
classify.py (what a run came to), session.py (one command line outside a campaign).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devices.base import DeviceError
from engine.gguf.model import split_paths
from harness.campaign.device_models import DeviceModel, price_device_models
from harness.campaign.device_resolution import DeviceRef, resolve_devices
from harness.campaign.file import load_campaign
from harness.campaign.model import Campaign, CampaignError, ModelSpec, fleet_home
from harness.plan.adaptive import AdaptivePlan, adaptive_plan, foreign_cells
from harness.plan.grid import Plan, load_shapes, make_plan, read_plan, write_plan
from harness.run.errors import OtherCampaignError, RunnerError, disk_error
from harness.run.gate import stop_strays
from harness.run.progress import Progress
from harness.run.staging import Stager, file_sha256
from harness.run.worker import RunContext, Worker
from store import names, outcomes
from store.campaign_dir import CampaignDir
from store.errors import StoreError
from store.ledger import latest_by_cell
from store.locks import device_lock, dir_lock, holding
from store.names import safe_id


@dataclass(frozen=True)
class Prepared:
    """Everything a run needs, validated, nothing written yet (prepare)."""

    campaign: Campaign
    plan: Plan
    devices: list[DeviceRef]
    identities: Mapping[str, dict] = field(default_factory=dict)       # device spec -> identity
    device_models: Mapping[str, DeviceModel] = field(default_factory=dict)   # `device:` models, priced

    def first(self) -> Plan | AdaptivePlan:
        """What `--dry-run` shows: the plan, or an adaptive campaign's first round (harness.plan.adaptive)."""
        return adaptive_plan(self.campaign, self.plan, None) if self.campaign.plan.adaptive else self.plan


def prepare(campaign: Campaign) -> Prepared:
    """Validate everything a run needs (devices found, native builds per ABI, models priced:
    `device:` models from headers pulled from each device), writing nothing. Errors are one line
    naming the campaign key."""
    devices = resolve_devices(campaign)
    identities = _identities(devices, campaign)
    device_models = price_device_models(campaign, devices)
    on_host = dataclasses.replace(campaign, models=tuple(m for m in campaign.models if not m.on_device))
    shapes = load_shapes(on_host) | {name: found.shape for name, found in device_models.items()}
    plan = make_plan(campaign, {m.name: shapes[m.name] for m in campaign.models})
    return Prepared(campaign, plan, devices, identities, device_models)


def default_out_dir(campaign_file: str | os.PathLike, campaign: Campaign) -> Path:
    """A campaign directory's own campaign.toml runs in that directory; any other file runs into
    a folder named after the campaign, next to the file."""
    p = Path(campaign_file).resolve()
    if p.name == names.CAMPAIGN_TOML and CampaignDir(p.parent).plan_path.exists():
        return p.parent
    return p.parent / safe_id(campaign.name)


def run_campaign(campaign: Campaign, out_dir: str | os.PathLike, rerun_failed: bool = False,
                 progress_stream=None, tty: bool | None = None, prepared: Prepared | None = None):
    """Run (or resume) a campaign into out_dir; returns its status.CampaignStatus."""
    from harness.run.status import campaign_status

    prepared = prepared or prepare(campaign)
    plan, refs = prepared.plan, prepared.devices
    root = Path(out_dir).resolve()
    cdir = CampaignDir(root)
    # an adaptive campaign's first round (decided from no runs) says whether the folder is this campaign's
    first = adaptive_plan(campaign, plan, None) if campaign.plan.adaptive else None
    _check_out_dir(cdir, plan, first, campaign.to_toml())
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "dir": str(root), "since": time.time()}
    locks = [dir_lock(fleet_home(), root)] + [device_lock(fleet_home(), r) for r in refs]
    with holding(locks, campaign.run.lock_wait_s, owner):
        toml_text = campaign.to_toml()      # a campaign that cannot be written makes no folder
        created = not root.exists()
        try:
            identities = prepared.identities or _identities(refs, campaign)
            root.mkdir(parents=True, exist_ok=True)
            cdir.write_campaign_toml(toml_text)
            # a run killed between renaming its attempt and appending its ledger line: its line first,
            # so the adaptive plan below is decided from every run on disk
            cdir.reconcile()
            # decided under the lock, from the runs as they are now (a new folder's: the first round)
            adaptive = adaptive_plan(campaign, plan, cdir) if first is not None and not created else first
            _write_plan(cdir, plan, adaptive)
            device_models = prepared.device_models
            if any(m.on_device and m.name not in device_models for m in campaign.models):  # a Prepared made by hand
                device_models = price_device_models(campaign, refs)
            _write_models(cdir, campaign, plan, device_models)
            for ref in refs:
                cdir.write_device(ref.device_id, {"device": ref.spec, "kind": ref.kind}, identities[ref.spec])
        except BaseException as e:
            if created:                     # nothing ran yet: leave no folder behind
                shutil.rmtree(root, ignore_errors=True)
            if isinstance(e, OSError):
                raise disk_error(e, root) from None
            raise
        stagers: dict[str, Stager] = {}        # per device, kept from round to round
        if adaptive is None:
            _run_round(campaign, plan, cdir, refs, rerun_failed, progress_stream, tty, stagers, identities)
        else:
            # each round runs what the results so far decide, then asks again (harness.plan.adaptive); it
            # stops when nothing new is decided, or when a cell is still pending (a lost device)
            # (a rerun whose plan has nothing left to run still asks: a kill may have landed between a
            # round's last run and the next round's plan)
            while True:
                _run_round(campaign, adaptive.plan, cdir, refs, rerun_failed, progress_stream, tty, stagers,
                           identities)
                rerun_failed = False            # once: the later rounds' failures are results
                latest = latest_by_cell(cdir.ledger.read())
                if not all(outcomes.is_done(latest.get(c.cell_id)) for c in adaptive.plan.cells):
                    break
                planned = {c.cell_id for c in adaptive.plan.cells}
                adaptive = adaptive_plan(campaign, plan, cdir)
                _write_plan(cdir, plan, adaptive)
                if {c.cell_id for c in adaptive.plan.cells} <= planned:
                    break
    return campaign_status(root)


def _write_plan(cdir: CampaignDir, plan: Plan, adaptive: AdaptivePlan | None) -> None:
    """plan.json, when it changed: the grid's plan, or the adaptive plan with its brackets."""
    if adaptive is not None:
        doc = adaptive.to_doc()
        if cdir.read_plan_doc() != doc:
            cdir.write_plan_doc(doc)
    elif read_plan(cdir) != plan:
        write_plan(cdir, plan)


def _run_round(campaign: Campaign, plan: Plan, cdir: CampaignDir, refs: Sequence[DeviceRef], rerun_failed: bool,
               progress_stream, tty: bool | None, stagers: dict[str, Stager],
               identities: Mapping[str, dict] | None = None) -> None:
    """Run every cell of the plan not yet done, devices in parallel.
    `stagers` holds each device's Stager from an earlier round and gets this round's; `identities`
    each device's identity (its page size)."""
    records = cdir.ledger.read()
    latest = latest_by_cell(records)
    todo = {ref.spec: [cell for cell in plan.for_device(ref.spec)
                       if not outcomes.is_done(latest.get(cell.cell_id), rerun_failed)] for ref in refs}
    if not any(todo.values()):
        return
    progress = Progress({ref.spec: len(todo[ref.spec]) for ref in refs}, progress_stream, tty)
    ctx = RunContext(campaign, plan, cdir, progress, rerun_failed, identities=dict(identities or {}))
    workers = [Worker(ctx, ref, todo[ref.spec], list(records), stagers.get(ref.spec)) for ref in refs
               if todo[ref.spec]]
    stagers.update((w.ref.spec, w.stager) for w in workers)
    with _sigterm_as_interrupt():
        # Waiting polls the workers' events with sleep(): a Ctrl-C landing inside Thread.join()
        # makes CPython 3.11 mark the still-running thread as stopped (bpo-45274's fix), and
        # the process would then exit in the middle of an attempt.
        try:
            for w in workers:
                w.start()
            while not all(w.finished.is_set() for w in workers):
                time.sleep(0.1)
        except KeyboardInterrupt:
            # every worker's run sees ctx.stop within a second (devices.adb.runs's reading
            # loop); the engines are stopped in threads of their own, and the whole wait is
            # bounded: a hung phone is never waited for (its attempt is discarded, as any
            # interrupted one, and the next run's gate stops what it left running)
            ctx.stop.set()
            deadline = time.monotonic() + INTERRUPT_WAIT_S
            for w in workers:
                if w.busy:
                    threading.Thread(target=_stop_strays_quietly, args=(w.ref, campaign.engine.stray_names),
                                     daemon=True).start()
            while not all(w.finished.is_set() for w in workers) and time.monotonic() < deadline:
                time.sleep(0.05)
            raise
        finally:
            progress.close()
    errors = [w.error for w in workers if w.error is not None]
    if errors:
        raise errors[0]


INTERRUPT_WAIT_S = 3.0      # Ctrl-C: the longest wait for the workers (the sweep ends within 5 s)


def _stop_strays_quietly(ref: DeviceRef, stray_names: Sequence[str]) -> None:
    with contextlib.suppress(Exception):
        stop_strays(ref.open(), stray_names)


def _check_out_dir(cdir: CampaignDir, plan: Plan, first: AdaptivePlan | None = None, toml_text: str = "") -> None:
    """Refuse a folder that holds something other than this campaign. `first` is an adaptive
    campaign's first round (its plan decided from no runs); `toml_text` the campaign.toml this
    campaign writes."""
    root = cdir.root
    if not root.exists():
        return
    if not root.is_dir():
        raise RunnerError(f"{root}: exists and is not a folder")
    old = read_plan(cdir)
    if old is None:
        if any(not _left_by_a_start(p, toml_text) for p in root.iterdir()):
            raise RunnerError(f"{root}: is not empty and holds no campaign (no plan.json); choose another -o")
        return
    old_ids, new_ids = {c.cell_id for c in old.cells}, {c.cell_id for c in plan.cells}
    if first is not None:
        # an adaptive plan grows round by round and keeps every cell plan.json holds (adaptive_plan
        # starts from them), whatever round each group was in when the run stopped: the folder holds
        # this campaign when its first round is among the old cells and every old cell is a point
        # of this campaign's series
        new_ids = {c.cell_id for c in first.plan.cells}
        foreign = {c.cell_id for c in foreign_cells(plan, old.cells)}
        if new_ids <= old_ids:
            if not foreign:
                return
            old_ids = new_ids | foreign        # the message counts the cells this campaign cannot hold
    if old_ids != new_ids:
        # a folder begun before run.quality existed, whose lossy cells "auto" now runs with --progress
        hint = ("; this plan measures output quality (run.quality) and the folder's did not: run.quality = \"off\" "
                "(sweep --quality off) plans it as before" if plan.quality and not any(c.config.progress for c in old.cells)
                else "")
        raise OtherCampaignError(f"{root}: holds a different campaign ({len(old_ids - new_ids)} of its cells are "
                                 f"not in this plan, {len(new_ids - old_ids)} cells are new){hint}; write to another "
                                 "-o folder")


def _left_by_a_start(path: Path, toml_text: str) -> bool:
    """What a run of this campaign killed before its first plan.json leaves: its campaign.toml, or
    a temporary file of an atomic write."""
    if path.name.startswith(".") and path.is_file():
        return True
    return path.name == names.CAMPAIGN_TOML and path.is_file() and bool(toml_text) and \
        path.read_text(errors="replace") == toml_text


def _identities(refs: Sequence[DeviceRef], campaign: Campaign) -> dict[str, dict]:
    out = {}
    for ref in refs:
        try:
            identity = ref.open().identity()
        except DeviceError as e:
            raise RunnerError(f"device {ref.spec}: {e}") from None
        if campaign.engine.kind == "native" and campaign.engine.build_for_device(identity) is None:
            raise CampaignError(f"{campaign.source + ': ' if campaign.source else ''}"
                                f"{campaign.engine.missing_build(identity, ref.spec, campaign.source == 'sweep')}")
        out[ref.spec] = identity.to_dict()
    return out


def _write_models(cdir: CampaignDir, campaign: Campaign, plan: Plan,
                  device_models: Mapping[str, DeviceModel]) -> None:
    """models/<id>.json: the shape record plus sha256 (reused while size and mtime are unchanged).
    A model whose bytes changed since the campaign started is refused: its runs would mix."""
    for m in campaign.models:
        model_id = safe_id(m.name)
        if m.on_device:
            _write_device_model(cdir, model_id, m, plan, device_models[m.name])
            continue
        shards = split_paths(m.path)
        stat = [(os.path.getsize(s), os.stat(s).st_mtime_ns) for s in shards]
        old = cdir.read_model(model_id)
        if old and old.get("file_stats") == [list(x) for x in stat]:
            continue
        hashes = [file_sha256(s) for s in shards]
        sha = hashes[0] if len(hashes) == 1 else hashlib.sha256("".join(hashes).encode()).hexdigest()
        if old and old.get("sha256") != sha:
            raise RunnerError(f"model {m.name} ({m.path}) changed since this campaign started (sha256 differs); "
                              "write to another -o folder")
        shape = plan.models[m.name]
        record = shape.to_dict(list(plan.top_ks.get(m.name, ())))
        record.update(name=m.name, path=m.path, sha256=sha, shard_sha256=hashes,
                      file_stats=[list(x) for x in stat])
        cdir.write_model(model_id, record)


def _write_device_model(cdir: CampaignDir, model_id: str, m: ModelSpec, plan: Plan, found: DeviceModel) -> None:
    """A `device:` model's record: its shape from the pulled headers, identified by their sha256
    and the file sizes (its bytes never come to this host to be hashed)."""
    old = cdir.read_model(model_id)
    identity = found.identity()
    if old is not None:
        if {k: old.get(k) for k in identity} != identity:
            raise RunnerError(f"model {m.name} ({m.spec}) changed since this campaign started (its header or size "
                              "differs); write to another -o folder")
        return
    record = found.shape.to_dict(list(plan.top_ks.get(m.name, ())))
    record.update(name=m.name, path=m.spec, on_device=True, sha256=None, **identity)
    cdir.write_model(model_id, record)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run_to_end(campaign: Campaign, out_dir: str | os.PathLike, rerun_failed: bool = False,
               prepared: Prepared | None = None, progress_stream=None):
    """`run` and `sweep`: run the campaign and say how it ended (status.RunEnd: the summary and the
    exit status, 0 complete, 3 cells pending, 130 interrupted). Ctrl-C and SIGTERM end it as
    interrupted, never as an error: what finished is kept and a rerun resumes."""
    from harness.run.status import RunEnd, campaign_status

    root = Path(out_dir).resolve()
    try:
        status = run_campaign(campaign, root, rerun_failed, progress_stream, prepared=prepared)
    except KeyboardInterrupt:
        try:
            status = campaign_status(root) if CampaignDir(root).plan_path.exists() else None
        except StoreError:
            status = None
        return RunEnd(str(root), status, interrupted=True)
    return RunEnd(str(root), status)


def run_campaign_file(path: str | os.PathLike, out_dir: str | os.PathLike | None = None, rerun_failed: bool = False,
                      progress_stream=None):
    """Load a campaign file and run it (into its default folder unless out_dir is given)."""
    campaign = load_campaign(path)
    return run_campaign(campaign, out_dir or default_out_dir(path, campaign), rerun_failed, progress_stream)
