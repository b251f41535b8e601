"""One device's worker: the cells of a campaign on one device, one attempt at a time.

Per cell (docs/campaigns.md says why in this order): push what the device lacks (staging.py),
cool on a condition (gate.py: stop strays, sync, poll), clear old outputs, run the engine with a
timeout and `BMOE_*` scrubbed, pull its CSV (and route trace), then classify the run
(classify.py); an ok run of a campaign measuring quality on an engine that takes `--ppl` is followed
by its scoring run (quality.py). Only infrastructure failures (`device_lost`, `push_failed`) are retried, with
exponential backoff (run.retries times), except a push the device refused for good (no room, no
permission: devices.base.PushRefused), which a retry cannot change; an LMK kill is a result. A
knee cell first gets its budget from the device's route-trace probe (probe.py). An attempt is assembled in a temporary folder and committed whole
(store.campaign_dir); an interrupted one is discarded.

Long because: it is one thread's attempt loop, and `_run_cell`'s steps (stage, gate, start the
other apps, run, pull, read the kills, classify) all write one attempt record and read the
worker's memory of its device (the lmk baseline, the last exit state, the CPU it saw); what stands
alone is already in staging.py, gate.py, classify.py, turns.py, cpushare.py and app_verdict.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devices import coapps, lmkd_inputs, reclaim
from devices.adb import server as adb
from devices.adb.phone import AdbPhone
from devices.android import parse_load
from devices.base import (
    Device,
    DeviceError,
    DeviceLost,
    DeviceState,
    PressureSample,
    PushRefused,
    RunInterrupted,
    RunOutcome,
    at_oom_score_adj,
    pressure_metrics,
)
from devices.lmk import LmkEvent, hard_kills_of_others, kills_of
from engine.fsutil import naming
from harness.campaign.budgets import is_knee
from harness.campaign.device_resolution import DeviceRef
from harness.campaign.model import RUN_AS_APP, Campaign
from harness.plan.grid import Cell, Plan, out_paths, resolve_knee, resolve_threads
from harness.plan.probe import Knee, ProbeError, knee_of_trace
from harness.run import app_verdict, quality
from harness.run.classify import classify, o_direct_in_effect, result_of
from harness.run.cpushare import CPU_SCRIPT, CpuSeen, CpuShare, engine_threads, local_cpu, parse_cpu_report
from harness.run.errors import disk_error
from harness.run.gate import GateResult, cool
from harness.run.progress import Progress
from harness.run.staging import StagedEngine, Stager, engine_env, open_device
from harness.run.turns import SessionFeeder, gap_app_specs, turns_record
from store import names, outcomes, versioned
from store.campaign_dir import CampaignDir
from store.ledger import latest_by_cell, ledger_line
from store.names import safe_id
from store.run_record import RunRecord

EVIDENCE_WAIT_S = 3.0
SERVICES_FRESH_S = 5.0     # a previous exit state's dumpsys battery/thermalservice serve the next gate this long


@dataclass
class RunContext:
    """What every device's worker of one campaign run shares."""

    campaign: Campaign
    plan: Plan
    cdir: CampaignDir
    progress: Progress
    rerun_failed: bool
    stop: threading.Event = field(default_factory=threading.Event)
    host: str = field(default_factory=socket.gethostname)
    cpu: CpuShare = field(default_factory=CpuShare)    # the engines running at once, per kernel
    identities: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)   # device spec -> identity


def samples_csv(samples: Sequence[PressureSample]) -> str:
    """samples.csv: one row per pressure sample (store.names.SAMPLE_COLUMNS, then the reclaim
    columns, devices.reclaim.COLUMNS, then what lmkd reads, devices.lmkd_inputs.COLUMNS)."""
    rows = [",".join(names.SAMPLE_COLUMNS + reclaim.COLUMNS + lmkd_inputs.COLUMNS)]
    for s in samples:
        rows.append(",".join("" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
                             for v in (s.t_s, s.mem_available_kb, s.vm_hwm_kb, s.vm_rss_kb, s.cpu_temp_mc,
                                       s.battery_temp_dc, *dataclasses.astuple(s.reclaim),
                                       *dataclasses.astuple(s.lmkd))))
    return "\n".join(rows) + "\n"


def _session_whole(turns: Sequence[dict], feeder: SessionFeeder) -> bool:
    """Every turn of a session cell answered BMOE_DONE, and stdin was closed after the last."""
    return feeder.closed and len(turns) == feeder.n_turns and all(t["outcome"] == "done" for t in turns)


def _session_short(turns: Sequence[dict], n_turns: int) -> str:
    """Why a session run that exited 0 is not a measurement of its turns."""
    done = sum(t["outcome"] == "done" for t in turns)
    errors = [f"turn {t['turn']}: {t.get('error') or t['outcome']}" for t in turns if t["outcome"] != "done"]
    return f"session: {done} of {n_turns} turns answered BMOE_DONE" + (f" ({'; '.join(errors)})" if errors else "")


class Worker(threading.Thread):
    """The cells of one device, in order, in a thread of their own."""

    def __init__(self, ctx: RunContext, ref: DeviceRef, cells: list[Cell], records: list[dict],
                 stager: Stager | None = None):
        super().__init__(name=f"bmoe-{ref.device_id}", daemon=True)
        self.ctx, self.ref, self.cells = ctx, ref, cells
        self.records = records                        # ledger lines so far (attempt numbering)
        self.device: Device | None = None
        # an earlier round's stager (an adaptive campaign's rounds, harness.run.runner): what it checked
        # on the device is not checked again (a 1 GiB model's check costs ~13 s of device time)
        self.stager = stager or Stager(ctx.campaign, ref, lambda msg: None)
        self.stager.note = lambda msg: ctx.progress.note(ref.spec, msg)
        self.knees: dict[str, Knee] = {}              # probe cell id -> its replayed knee
        self.cpu_seen: CpuSeen | None = None          # the device's CPU at its latest run
        # a phone's lmk lines as its latest cell's last read saw them: the next cell's baseline
        # when its gate passes at once (the moments between are the gate's first call)
        self.lmk_seen: tuple[Device, set[str]] | None = None
        self.lmkd_setting: tuple[Device, lmkd_inputs.LmkdSetting] | None = None
        # and its exit state, when (monotonic): the next gate's battery and thermal status if fresh
        self.last_exit: tuple[Device, DeviceState, float] | None = None
        self.busy = False
        self.final = False          # the latest attempt failed in a way no retry can change (PushRefused)
        self.error: BaseException | None = None
        self.finished = threading.Event()   # waited on instead of join(): see runner.run_campaign

    # -- loop -------------------------------------------------------------------------------
    def run(self) -> None:
        """The cells, one attempt at a time; an error is kept for run_campaign to raise."""
        try:
            self._loop()
        except OSError as e:
            # this host could not write (a full disk): every device would hit it next, so all stop
            self.error = disk_error(e)
            self.ctx.stop.set()
            self.ctx.progress.finish_device(self.ref.spec, f"stopped: {self.error}")
        except BaseException as e:  # surfaced by run_campaign after the other devices finish
            self.error = e
            self.ctx.progress.finish_device(self.ref.spec, f"stopped by an error: {e}")
        finally:
            self.finished.set()

    def _loop(self) -> None:
        for cell in self.cells:
            if self.ctx.stop.is_set():
                return
            record = None
            if is_knee(cell.config.budget_spec):
                knee_cell, record = self._with_knee(cell)
                if knee_cell is None and record is None:
                    return                                   # interrupted during the probe
                cell = knee_cell or cell
            if record is None:
                record = self._attempt_with_retries(cell)
            if record is not None and record.outcome in outcomes.INFRA:
                self.ctx.progress.abandon_cell(self.ref.spec)
            if record is not None and record.outcome == outcomes.DEVICE_LOST:
                rest = self.cells[[c.cell_id for c in self.cells].index(cell.cell_id) + 1:]
                for later in rest:
                    if self.ctx.stop.is_set():
                        return
                    self._record_without_run(
                        later, outcomes.DEVICE_LOST, f"not attempted: {self.ref.spec} was lost at cell "
                        f"{cell.label()} ({record.evidence[-1] if record.evidence else 'no evidence'})")
                self.ctx.progress.finish_device(self.ref.spec, f"device lost; {len(rest)} more cells not run")
                return
        self.ctx.progress.finish_device(self.ref.spec, "done")

    def _attempt_with_retries(self, cell: Cell) -> RunRecord | None:
        """Attempts of one cell until a result; infrastructure failures are retried with backoff.
        None when interrupted."""
        c = self.ctx.campaign
        tries = 0
        while True:
            self.final = False
            record = self._attempt(cell)
            if record is None or record.outcome not in outcomes.INFRA or self.final:
                return record
            tries += 1
            if tries > c.run.retries or self.ctx.stop.is_set():
                return record
            delay = c.run.retry_backoff_s * 2 ** (tries - 1)
            self.ctx.progress.note(self.ref.spec, f"{record.outcome}; retry {tries}/{c.run.retries} in {delay:g} s")
            if self.ctx.stop.wait(delay):
                return None
            self.device = None                    # reopen: the connection may be new
            if record.outcome == outcomes.DEVICE_LOST:
                self.stager.forget()

    def _with_knee(self, cell: Cell) -> tuple[Cell | None, RunRecord | None]:
        """A "knee*F" cell with its budget from this device's probe (run first if it has no
        finished attempt), or the cell's record when there is no knee to be had; (None, None) when
        interrupted."""
        probe = self.ctx.plan.probe_for(cell)
        if probe.cell_id not in self.knees:
            line = latest_by_cell(self.records).get(probe.cell_id)     # its ledger line
            ended, attempt = (str(line["outcome"]), int(line["attempt"])) if line is not None else (None, 0)
            if ended != outcomes.OK:
                self.ctx.progress.note(self.ref.spec, f"route-trace probe for {cell.model} "
                                                      f"(k={cell.config.n_expert_used})")
                rec = self._attempt_with_retries(probe)
                if rec is None:
                    return None, None
                ended, attempt = rec.outcome, rec.attempt
            if ended != outcomes.OK:
                outcome = ended if ended in outcomes.INFRA else outcomes.ENGINE_ERROR
                return cell, self._record_without_run(
                    cell, outcome, f"no knee: the route-trace probe {probe.cell_id} attempt {attempt} ended "
                                   f"{ended}", attempted=outcome in outcomes.INFRA)
            trace = self.ctx.cdir.run_dir(probe.cell_id, attempt) / names.ROUTE_CSV
            try:
                self.knees[probe.cell_id] = knee_of_trace(trace)
            except ProbeError as e:
                return cell, self._record_without_run(cell, outcomes.ENGINE_ERROR, f"no knee: {e}")
        return resolve_knee(self.ctx.campaign, cell, self.knees[probe.cell_id].knee_mib, probe.cell_id), None

    def _record_without_run(self, cell: Cell, outcome: str, reason: str, attempted: bool = False) -> RunRecord:
        """A cell's outcome when it could not be run (a lost device's later cells, a knee cell
        whose probe failed): committed like any attempt, with `attempted: false` and the reason as
        evidence, so the directory says why the cell has no result. INFRA outcomes rerun."""
        attempt = self.ctx.cdir.next_attempt(cell.cell_id, self.records)
        tmp = self.ctx.cdir.start_attempt(cell.cell_id, attempt)
        if self.cpu_seen is not None:   # "-t auto" as the device's runs had it, so results group it with them
            cell = resolve_threads(self.ctx.campaign, cell, self.cpu_seen.cores)
        record = self._new_record(cell, attempt, time.time())
        record.update(outcome=outcome, evidence=[reason], attempted=attempted, ended_at=record["started_at"])
        run = RunRecord.from_dict(record, tmp / names.RUN_JSON)
        self.ctx.cdir.commit_attempt(tmp, run)
        self.records.append(ledger_line(run))
        self.ctx.progress.end_cell(self.ref.spec, cell.label(), outcome, 0.0, final=outcome not in outcomes.INFRA)
        return run

    def _new_record(self, cell: Cell, attempt: int, started: float) -> dict[str, Any]:
        c = self.ctx.campaign
        return {
            **versioned.RUN.stamp(), "cell_id": cell.cell_id, "attempt": attempt,
            "device": cell.device, "device_id": self.ref.device_id, "model": cell.model,
            "model_id": safe_id(cell.model), "engine": {"kind": c.engine.kind},
            "config": cell.config.to_dict(), "argv": list(cell.argv), "repeat": cell.repeat, "pass": cell.pass_no,
            "order": cell.order, "outcome": None, "evidence": [], "exit_status": None, "timed_out": False,
            "wall_s": None, "timeout_s": c.run.timeout_s, "gate": None, "entry_state": None, "exit_state": None,
            "pressure": {}, "lmk_events": [], "o_direct": None, "summary": None, "result": None, "pushed": [],
            "started_at": started, "ended_at": None, "host": self.ctx.host, "attempted": True,
            "probe": bool(cell.config.probe), "cpu": None, "oom_score_adj": c.run.oom_score_adj,
        }

    def _attempt(self, cell: Cell) -> RunRecord | None:
        ctx = self.ctx
        attempt = ctx.cdir.next_attempt(cell.cell_id, self.records)
        label = cell.label()
        ctx.progress.start_cell(self.ref.spec, label, attempt)
        tmp = ctx.cdir.start_attempt(cell.cell_id, attempt)
        started = time.time()
        record = self._new_record(cell, attempt, started)
        self.busy = True
        try:
            outcome_name, evidence = self._run_cell(cell, tmp, record)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            self.busy = False
        if outcome_name is None or (ctx.stop.is_set() and outcome_name not in (outcomes.OK,) + outcomes.INFRA):
            # interrupted: the attempt never happened (the engine was killed by us, not measured)
            shutil.rmtree(tmp, ignore_errors=True)
            ctx.progress.end_cell(self.ref.spec, label, "interrupted", time.time() - started, final=False)
            return None
        if outcome_name == outcomes.DEVICE_LOST:
            evidence = (*evidence, *self._server_back())
        record["outcome"], record["evidence"] = outcome_name, list(evidence)
        record["ended_at"] = time.time()
        # the record as the run assembled it, checked before anything is committed
        run = RunRecord.from_dict(record, tmp / names.RUN_JSON)
        ctx.cdir.commit_attempt(tmp, run)
        self.records.append(ledger_line(run))
        probe = bool(cell.config.probe)
        ctx.progress.end_cell(self.ref.spec, label, f"probe {outcome_name}" if probe else outcome_name,
                              record["ended_at"] - started, final=outcome_name not in outcomes.INFRA and not probe)
        return run

    def _server_back(self) -> tuple[str, ...]:
        """A lost device's adb server, if it is the one that went: restarted when bmoe-fleet
        started it (this worker's phone `adb connect`ed again), else waited for a bounded time
        (run.device_timeout_s). What happened is the attempt's evidence and the log's; the retry
        follows the usual rules."""
        ref, c = self.ref, self.ctx.campaign
        if ref.server is None or self.ctx.stop.is_set():
            return ()
        reconnect = [ref.serial] if ref.kind == "virtual" or ref.spec in c.connect else []
        note = adb.bring_back(ref.server, reconnect, c.run.device_timeout_s)
        if note is None:
            return ()
        self.ctx.progress.note(ref.spec, note)
        self.device = None
        return (note,)

    def _open(self) -> Device:
        if self.device is None:
            self.device = open_device(self.ref)
            if isinstance(self.device, AdbPhone):     # the transport watch of its runs, and Ctrl-C
                self.device.watch(self.ctx.campaign.run.device_timeout_s, self.ctx.stop)
        return self.device

    def _run_cell(self, cell: Cell, tmp: Path, record: dict) -> tuple[str | None, tuple[str, ...]]:
        ctx, c = self.ctx, self.ctx.campaign
        try:
            device = self._open()
            try:
                engine, record["pushed"] = self.stager.stage(device, cell)
            except DeviceLost:
                raise
            except PushRefused as e:        # no room, no permission: another try cannot change it
                self.final = True
                return outcomes.PUSH_FAILED, (str(e),)
            except (DeviceError, OSError) as e:
                return outcomes.PUSH_FAILED, (str(e),)
            record["engine"] = engine.to_dict()
            csv_remote, route_remote = out_paths(cell.device, cell.cell_id)
            phone = isinstance(device, AdbPhone)
            seen_lines, self.lmk_seen = self.lmk_seen, None
            prior = seen_lines[1] if seen_lines is not None and seen_lines[0] is device else None
            last, self.last_exit = self.last_exit, None
            services = last[1] if last is not None and last[0] is device and \
                time.monotonic() - last[2] <= SERVICES_FRESH_S else None
            # a phone clears old outputs and says its CPU in the gate's first call, and its lmk
            # baseline too unless its previous cell's last read has it
            gate = self._gate(device, f"rm -f {shlex.quote(csv_remote)} {shlex.quote(route_remote)}; {CPU_SCRIPT}"
                              if phone else "", lmk=phone and prior is None, services_from=services)
            record["gate"], record["entry_state"] = gate.to_dict(), gate.entry_state.to_dict()
            if ctx.stop.is_set():
                return None, ()
            if phone:
                if gate.baseline is not None:
                    baseline = {e.line for e in gate.baseline}
                elif prior is not None and gate.polls == 1:
                    baseline = prior
                else:      # the gate waited: lines may have come since the previous cell's read
                    baseline = {e.line for e in device.lmk_events(time.time())}
                seen = self.cpu_seen = parse_cpu_report(gate.extra)
            else:
                self._remove(device, [csv_remote, route_remote])
                baseline = {e.line for e in device.lmk_events(time.time())}
                seen = self.cpu_seen = self._cpu(device)
        except RunInterrupted:
            return None, ()
        except DeviceLost as e:
            return outcomes.DEVICE_LOST, (str(e),)
        except DeviceError as e:
            return outcomes.DEVICE_LOST, (f"device error before the run: {e}",)

        # "-t auto" takes the cores the device has now; the record keeps the command that ran
        cell = resolve_threads(c, cell, seen.cores)
        record["config"], record["argv"] = cell.config.to_dict(), list(cell.argv)
        # the other apps the cell asks for: started after the gate, stopped once the engine ends
        try:
            apps = self._start_apps(device, cell, record)
        except DeviceLost as e:
            return outcomes.DEVICE_LOST, (str(e),)
        except DeviceError as e:
            return outcomes.PUSH_FAILED, (str(e),)
        feeder = self._feeder(device, cell)
        try:
            outcome = self._engine_run(device, cell, engine, seen, csv_remote, record, feeder)
        finally:
            self._stop_apps(device, apps, record)
        if not isinstance(outcome, RunOutcome):
            return outcome
        try:
            metrics_path = tmp / names.METRICS_CSV
            if isinstance(device, AdbPhone):
                # pulled first, so clearing the outputs, the exit state and the lmk lines are one call
                pulled = self._pull(device, csv_remote, metrics_path)
                if cell.config.route_trace:
                    self._pull(device, route_remote, tmp / names.ROUTE_CSV)
                after = device.reads(f"rm -f {shlex.quote(csv_remote)} {shlex.quote(route_remote)}",
                                     lmk_since_s=outcome.started_at_s)
                exit_state = after.state
                events, kills = self._kills(device, outcome, baseline, after.lmk_events, cell.config.run_as)
                self.lmk_seen = (device, baseline | {e.line for e in events})
                self.last_exit = (device, exit_state, time.monotonic())
            else:
                exit_state = device.state()
                events, kills = self._kills(device, outcome, baseline)
                pulled = self._pull(device, csv_remote, metrics_path)
                if cell.config.route_trace:
                    self._pull(device, route_remote, tmp / names.ROUTE_CSV)
                self._remove(device, [csv_remote, route_remote])
        except RunInterrupted:
            return None, ()
        except DeviceLost as e:
            return outcomes.DEVICE_LOST, (f"device lost after the run (exit status {outcome.exit_status}): {e}",)
        except DeviceError as e:
            return outcomes.DEVICE_LOST, (f"device error after the run (exit status {outcome.exit_status}): {e}",)

        pressure = pressure_metrics(gate.entry_state, outcome.samples, exit_state)
        for name, data in ((names.STDOUT_TXT, outcome.stdout), (names.STDERR_TXT, outcome.stderr),
                           (names.SAMPLES_CSV, samples_csv(outcome.samples)),
                           (names.RUN_METRICS, "".join(f"{k}={v}\n" for k, v in pressure.items()))):
            CampaignDir.put(tmp, name, data)
        metrics, parse_problem = None, None
        if pulled:
            from results.read.parse import ParseError, read_metrics_csv

            try:
                metrics = read_metrics_csv(metrics_path)
            except ParseError as e:
                parse_problem = str(e)
        taken = {e.pid for e in events}
        if apps:
            for app in record["apps"]:
                app["lmk_killed"] = app["pid"] in taken
        if feeder is not None:
            record["turns"] = turns_record(feeder, outcome.samples, metrics.summaries if metrics is not None else (),
                                           self._page_bytes())
            for turn in record["turns"]:
                for app in (turn.get("gap") or {}).get("apps") or ():
                    app["lmk_killed"] = app["pid"] in taken
        # another app lmkd killed past its soft level to make room (docs/method.md, fought rule 3)
        record["others_hard_killed"] = hard_kills_of_others(events, kills)
        verdict = classify(outcome, kills, metrics, bool(cell.config.o_direct), bool(cell.config.moe_stream))
        if isinstance(device, AdbPhone):
            # over adb lmkd never considers the engine: what it took instead, and what it would have
            # done in the app (harness/run/app_verdict.py)
            try:
                setting = self._lmkd_setting(device)
                others = app_verdict.collateral(events, kills, outcome.started_at_s, device.clock_offset_s())
            except (DeviceLost, DeviceError) as e:
                record["app_verdicts_problem"] = str(e)
            else:
                record["collateral"] = [o.to_dict() for o in others]
                record["lmkd_setting"] = {"marks_from": setting.marks_from, "props_set": list(setting.props_set),
                                          "watermarks_kb": dataclasses.asdict(setting.marks)}
                if cell.config.run_as not in RUN_AS_APP:      # run as the app, the run is its own verdict
                    # the kernel's kill, its line shown (a userdebug build) or not: classify's `killed`
                    kernel_kill = verdict.outcome == outcomes.KILLED
                    swap_kb = self.ctx.identities.get(self.ref.spec, {}).get("swap_total_kb")
                    record["app_verdicts"] = [v.to_dict() for v in app_verdict.verdicts(
                        [(s.t_s, s.lmkd) for s in outcome.samples], setting, others,
                        outcome.wall_s if kernel_kill else None, swap_kb if isinstance(swap_kb, int) else 0)]
        record.update(exit_status=outcome.exit_status, timed_out=outcome.timed_out, wall_s=round(outcome.wall_s, 3),
                      pid=outcome.pid, exit_state=exit_state.to_dict(), pressure=pressure,
                      reclaim=reclaim.metrics([s.reclaim for s in outcome.samples], gate.entry_state.vmstat,
                                              exit_state.vmstat, self._page_bytes()),
                      lmk_events=[dataclasses.asdict(e) for e in events])
        record["o_direct"] = o_direct_in_effect(outcome.stderr, metrics)
        if metrics is not None:
            record["summary"] = dict(metrics.summary) if metrics.summary is not None else None
        record["result"] = result_of(metrics, cell.config)
        evidence = verdict.evidence
        if verdict.outcome == outcomes.INVALID and parse_problem:
            evidence = (parse_problem,)
        if feeder is not None and verdict.outcome == outcomes.OK and not _session_whole(record["turns"], feeder):
            # exit 0 with a summary, but the session did not run every turn it was asked for
            return outcomes.INVALID, (_session_short(record["turns"], feeder.n_turns),)
        if verdict.outcome == outcomes.OK and cell.config.progress and quality.scores(engine.kind, engine.version):
            self._score(device, cell, engine, seen, tmp, record)
        return verdict.outcome, evidence

    # -- pieces -----------------------------------------------------------------------------
    def _score(self, device: Device, cell: Cell, engine: StagedEngine, seen: CpuSeen, tmp: Path,
               record: dict) -> None:
        """The cell's quality scoring run (harness.run.quality), after its own run and its reads:
        run.json's `quality`. It counts among the campaign's engines on its cores while it runs."""
        c = self.ctx.campaign
        share = self.ctx.cpu.begin(cell.device, cell.cell_id, seen, engine_threads(c.engine.staged_name, cell.argv),
                                   quality.text_path(cell.device))
        try:
            record["quality"] = quality.score(device, cell.device, cell.argv, engine_env(device, engine.env),
                                              c.run.timeout_s, tmp)
        finally:
            self.ctx.cpu.end(share)
        # the next cell reads its own lmk baseline and device services: this run came between
        self.lmk_seen = self.last_exit = None

    def _lmkd_setting(self, device: AdbPhone) -> lmkd_inputs.LmkdSetting:
        """The phone's lmkd setting, read once per connection (its properties are fixed at boot and
        its watermarks move only when a margin is changed)."""
        if self.lmkd_setting is None or self.lmkd_setting[0] is not device:
            ram_kb = self.ctx.identities.get(self.ref.spec, {}).get("ram_total_kb")
            self.lmkd_setting = (device, device.lmkd_setting(ram_kb if isinstance(ram_kb, int) else 0))
        return self.lmkd_setting[1]

    def _page_bytes(self) -> int:
        """The device's page size as its identity says (pswpin/pswpout count pages of it)."""
        size = self.ctx.identities.get(self.ref.spec, {}).get("page_size_bytes")
        return size if isinstance(size, int) and size > 0 else reclaim.PAGE_BYTES

    def _start_apps(self, device: Device, cell: Cell, record: dict) -> coapps.AppSession | None:
        """The cell's other apps running on the phone, each holding its memory (record["apps"])."""
        if not cell.config.apps:
            return None
        if not isinstance(device, AdbPhone):
            raise DeviceError(f"other apps ({cell.config.apps}) run only on a phone, not on {cell.device}")
        session = coapps.start(device, parse_load(cell.config.apps), self.stager.apps_binary(device))
        record["apps"] = session.to_dicts()
        return session

    def _stop_apps(self, device: Device, session: coapps.AppSession | None, record: dict) -> None:
        """Stop them; note those already gone when the engine ended (lmkd took them)."""
        if session is None:
            return
        try:
            gone = set(coapps.stop(device, session))
        except DeviceError:
            return               # a lost phone: the next cell's start kills what is left by name
        for app in record["apps"]:
            app["gone_by_end"] = app["name"] in gone

    def _feeder(self, device: Device, cell: Cell) -> SessionFeeder | None:
        """A session cell's driver (harness.run.turns): its turns, its idle gaps, and the gap apps it
        starts and stops in each gap (on a phone; elsewhere each gap records why it has none)."""
        c = cell.config
        if not c.turns or c.turns <= 1:
            return None
        gap_apps = gap_app_specs(parse_load(c.gap_apps)) if c.gap_apps else []

        def start(_after_turn: int) -> coapps.AppSession | None:
            if not gap_apps:
                return None
            if not isinstance(device, AdbPhone):
                raise DeviceError(f"other apps ({c.gap_apps}) run only on a phone, not on {cell.device}")
            return coapps.start(device, gap_apps, self.stager.apps_binary(device))

        def stop(session: coapps.AppSession | None) -> list[dict]:
            if session is None:
                return []
            gone = set(coapps.stop(device, session))
            return [a | {"gone_by_end": a["name"] in gone} for a in session.to_dicts()]

        return SessionFeeder(c.turns, float(c.idle_s or 0.0), c.prompt, int(c.n_predict or 1), start, stop,
                             stop=self.ctx.stop)

    def _engine_run(self, device: Device, cell: Cell, engine: StagedEngine, seen: CpuSeen, csv_remote: str,
                    record: dict, feeder: SessionFeeder | None = None) -> RunOutcome | tuple[str | None, tuple[str, ...]]:
        """The engine's run, its share of the cores recorded; an outcome pair when it never ran
        or its end is unknown (None: interrupted)."""
        c = self.ctx.campaign
        share = self.ctx.cpu.begin(cell.device, cell.cell_id, seen, engine_threads(c.engine.staged_name, cell.argv),
                                   csv_remote)
        argv, env = at_oom_score_adj(cell.argv, c.run.oom_score_adj), engine_env(device, engine.env)
        if cell.config.run_as in RUN_AS_APP:
            # as the app: a child of a fresh process of it, registered with the phone's lmkd at the
            # app's adj (devices/virtual/am.py); it writes as the app's uid, so its temporary files
            # go to the output folder staging opened to it
            argv = ["am", "run-as-app", "--adj", str(RUN_AS_APP[cell.config.run_as]), "--", *argv]
            env = {**(env or {}), "TMPDIR": os.path.dirname(csv_remote)}
        try:
            return device.run(argv, env=env, timeout_s=c.run.timeout_s, sample_period_s=1.0, feeder=feeder)
        except RunInterrupted:
            return None, ()
        except DeviceLost as e:
            return outcomes.DEVICE_LOST, (str(e),)
        except DeviceError as e:
            return outcomes.ENGINE_ERROR, (f"the engine could not start: {e}",)
        finally:
            record["cpu"] = self.ctx.cpu.end(share)

    def _kills(self, device: Device, outcome: RunOutcome, baseline: set[str],
               read: list[LmkEvent] | None = None, run_as: str = "") -> tuple[list[LmkEvent], list[LmkEvent]]:
        """The low-memory killer's new lines since the run began (`read`: already read since
        then), and those that killed it (lmkd writes its line a moment after the kill: a SIGKILL
        without one waits EVIDENCE_WAIT_S; any other end has no line to wait for)."""
        names_ = [] if outcome.pid else list(self.ctx.campaign.engine.stray_names)
        pids = [outcome.pid] if outcome.pid else []
        if run_as in RUN_AS_APP:      # lmkd's line names the app process the engine was a child of
            from devices.virtual.am import ENGINE_PACKAGE

            names_.append(ENGINE_PACKAGE)
        events = [e for e in read if e.line not in baseline] if read is not None else \
            self._new_events(device, outcome, baseline)
        kills = kills_of(events, pids=pids, names=names_)
        if outcome.killed_by_sigkill and not outcome.timed_out and not kills and not self.ctx.stop.is_set():
            deadline = time.monotonic() + EVIDENCE_WAIT_S
            while not kills and time.monotonic() < deadline:
                time.sleep(0.25)
                events = self._new_events(device, outcome, baseline)
                kills = kills_of(events, pids=pids, names=names_)
        return events, kills

    def _gate(self, device: Device, extra: str = "", lmk: bool = False,
              services_from: DeviceState | None = None) -> GateResult:
        c = self.ctx.campaign
        return cool(device, c.gate, c.engine.stray_names, stop=self.ctx.stop,
                    on_wait=lambda why: self.ctx.progress.note(self.ref.spec, f"gate: {why}"),
                    extra=extra, lmk_since_s=time.time() if lmk else None, services_from=services_from)

    def _cpu(self, device: Device) -> CpuSeen:
        """The device's cores and kernel boot id (harness.run.cpushare), unknown when it cannot say."""
        if self.ref.kind == "local":
            return local_cpu()
        try:
            out = device.run(["sh", "-c", CPU_SCRIPT], timeout_s=60, sample_period_s=60.0)
        except DeviceLost:
            raise
        except DeviceError:
            return CpuSeen(None, None, None)
        return parse_cpu_report(out.stdout.decode("utf-8", "replace"))

    def _new_events(self, device: Device, outcome: RunOutcome, baseline: set[str]) -> list[LmkEvent]:
        return [e for e in device.lmk_events(outcome.started_at_s) if e.line not in baseline]

    def _remove(self, device: Device, paths: Sequence[str]) -> None:
        if self.ref.kind == "local":
            for p in paths:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(p)
        else:
            device.run(["rm", "-f", *paths], timeout_s=60)

    def _pull(self, device: Device, remote: str, local: Path) -> bool:
        if self.ref.kind == "local":
            if not os.path.isfile(remote):
                return False
            with naming(local):
                shutil.copyfile(remote, local)
            return True
        try:
            device.pull(remote, str(local))
            return True
        except DeviceLost:
            raise
        except DeviceError:
            return False  # the engine wrote no such file (refused before opening it)
