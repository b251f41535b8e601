"""Run a campaign: one worker thread per device, devices in parallel, every write atomic.

Per cell (docs/campaigns.md says why in this order): push what the device lacks (engine + model,
skipped when the same bytes are there), cool on a condition (gate.py: stop strays, sync, poll),
clear old outputs, run the engine with a timeout and `BMOE_*` scrubbed, pull its CSV (and route
trace), then classify the run from its exit status, stderr, CSV and the low-memory killer's lines
(method.md rule 4). Only infrastructure failures (`device_lost`, `push_failed`) are retried, with
exponential backoff; an LMK kill is a result.

The campaign directory (docs/campaign-dir.md) is written so that a crash or Ctrl-C leaves it
consistent: an attempt is assembled in a temporary folder and renamed into `runs/<cell>/<n>`
whole, then its ledger line is appended; an interrupted attempt is discarded. Running the same
campaign again completes only what is missing; `rerun_failed` also retries cells whose latest
result is not `ok`. Per-device lock files (flock, in ~/.bmoe-fleet/locks) keep two campaigns off
one phone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import signal
import socket
import threading
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devices.base import (
    Device,
    DeviceError,
    DeviceLost,
    PressureSample,
    RunOutcome,
    pressure_metrics,
)
from devices.lmk import LmkEvent, kills_of
from engine import fsutil
from engine.fsutil import naming
from engine.model import split_paths
from engine.safetext import printable
from engine.units import parse_number
from harness.campaign import (
    Campaign,
    CampaignError,
    DeviceRef,
    ModelSpec,
    fleet_home,
    is_knee,
    load_campaign,
    remote_model_path,
    resolve_devices,
    safe_id,
)
from harness.campaign_dir import (
    FORMAT_VERSION,
    INFRA,
    RUN_FORMAT,
    CampaignDir,
    RunnerError,
    atomic_write,
    is_done,
    latest_by_cell,
    ledger_line,
    locks_dir,
    read_versioned_json,
    write_json,
)
from harness.cpushare import CPU_SCRIPT, CpuSeen, CpuShare, engine_threads, local_cpu, parse_cpu_report
from harness.device_models import DeviceModel, price_device_models
from harness.gate import GateResult, cool, stop_strays
from harness.plan import (
    Cell,
    Plan,
    engine_path,
    load_shapes,
    make_plan,
    out_paths,
    resolve_knee,
    resolve_threads,
)
from harness.probe import Knee, ProbeError, knee_of_trace
from harness.progress import Progress

SAMPLE_COLUMNS = ("t_s", "mem_available_kb", "vm_hwm_kb", "vm_rss_kb", "cpu_temp_mc", "battery_temp_dc")
EVIDENCE_WAIT_S = 3.0
_CONFIG_ERROR_RE = re.compile(r"config error:|unknown arg:|missing value for|expects ")


# ── files ──────────────────────────────────────────────────────────────────────────────────────


def disk_error(e: OSError, where: str | os.PathLike | None = None) -> RunnerError:
    """One line for a write that failed on this host (a full disk above all): the file, what went
    wrong, and that nothing half-written is kept, so a rerun resumes."""
    path = e.filename or where or "the campaign directory"
    what = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or str(e)).lower()
    return RunnerError(f"{printable(str(path))}: {what}; nothing half-written was kept: free space (or fix it) "
                       "and rerun to resume")


# ── locks ──────────────────────────────────────────────────────────────────────────────────────


class FileLock:
    """An exclusive flock on a file; the holder writes who it is into it for the next one, and
    removes the file when it releases it.

    Removing a lock file is safe only with a check on the other side: a process that opened the
    file before the holder removed it gets its flock on the removed inode. So after locking, the
    path must still name the inode that is locked; if not (removed, or already made anew by a
    third process), that lock guards nothing and the acquirer opens the path again."""

    def __init__(self, path: Path, what: str):
        self.path = path
        self.what = what
        self.fd: int | None = None

    def acquire(self, wait_s: float, owner: Mapping[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # at least a moment: `status` probes a directory lock with a brief shared flock
        deadline = time.monotonic() + max(wait_s, 0.5)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _read_holder(fd)
                    os.close(fd)
                    waited = f" after waiting {wait_s:g} s" if wait_s else ""
                    raise RunnerError(f"{self.what} is in use by another campaign ({holder}){waited}; wait for "
                                      "it to finish, or set run.lock_wait_s to wait") from None
                os.close(fd)
                time.sleep(min(0.2, max(0.01, deadline - time.monotonic())))
                continue
            if _names_inode(self.path, fd):
                break
            os.close(fd)          # locked a file its holder had removed: try the path again
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(dict(owner)) + "\n").encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            # removed while still locked: whoever waits on this inode sees it gone and reopens
            if _names_inode(self.path, self.fd):
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def _names_inode(path: Path, fd: int) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "holder unknown"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("since", 0)))
    return f"pid {info.get('pid')} on {info.get('host')}, campaign dir {info.get('dir')}, since {since}"


def device_lock(ref: DeviceRef) -> FileLock:
    return FileLock(locks_dir() / f"device-{ref.lock_key}.lock", f"device {ref.spec}")


@contextlib.contextmanager
def holding(locks: Sequence[FileLock], wait_s: float, owner: Mapping[str, Any]) -> Iterator[None]:
    """Take every lock (in a fixed order, so two campaigns cannot deadlock) or none."""
    taken: list[FileLock] = []
    deadline = time.monotonic() + wait_s
    try:
        for lock in sorted(locks, key=lambda lk: str(lk.path)):
            lock.acquire(max(0.0, deadline - time.monotonic()), owner)
            taken.append(lock)
        yield
    finally:
        for lock in reversed(taken):
            lock.release()


# ── the engine as a device sees it ─────────────────────────────────────────────────────────────

ENGINE_DIR = Path(__file__).resolve().parents[1] / "engine"


def build_bmoe_py(python: str) -> Path:
    """bmoe-py as one executable file: a zipapp of engine/ whose `#!` line is the interpreter the
    device runs it with. Deterministic (fixed timestamps), so the same source gives the same bytes
    and a device that has them is not pushed again. Its process name (comm) is `bmoe-py`."""
    entries = [("__main__.py", b"from engine.cli import main\nmain()\n")]
    entries += [(f"engine/{p.name}", p.read_bytes()) for p in sorted(ENGINE_DIR.glob("*.py"))]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    payload = b"#!" + python.encode() + b"\n" + buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest()[:16]
    path = fleet_home() / "engines" / digest / "bmoe-py"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fsutil.atomic_write(path, payload, mode=0o755)
    return path


@dataclass
class StagedEngine:
    kind: str
    path: str                          # on the device
    version: str = ""                  # the first line the engine's own --version prints
    sha256: str = ""
    env: dict[str, str] = field(default_factory=dict)
    build: str = ""                    # native: the engine.native key that served this device
    libs: list[dict[str, str]] = field(default_factory=list)   # native: name + sha256 of each pushed lib

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "version": self.version, "sha256": self.sha256, "path": self.path}
        if self.kind == "native":
            out.update(build=self.build, libs=list(self.libs))
        return out


def engine_env(device: Device, extra: Mapping[str, str]) -> dict[str, str] | None:
    """The engine's environment: on this host the harness's own minus every BMOE_* variable (the
    engine reads BMOE_CACHE_MB and friends as flag overrides); phones scrub on the device side."""
    from devices.local import LocalDevice

    if isinstance(device, LocalDevice):
        env = {k: v for k, v in os.environ.items() if not k.startswith("BMOE_")}
        env.update(extra)
        return env
    return dict(extra)


def _sha256(path: str) -> str:
    from devices.local import file_sha256

    return file_sha256(path)


# ── classification ─────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Classified:
    outcome: str
    evidence: tuple[str, ...]


_STREAMING_ON_RE = re.compile(r"bmoe: expert streaming ON\b.*?\bo_direct=(\d+)")


def o_direct_in_effect(stderr: bytes, metrics) -> int | None:
    """Whether expert reads really bypassed the page cache: the engine's `bmoe: expert streaming ON
    … o_direct=N` stderr line, which both engines print after any fallback (bmoe-cli's CSV preamble
    records what was asked for, not what happened); else the preamble's value; None if neither."""
    seen = _STREAMING_ON_RE.findall(stderr.decode("utf-8", "replace"))
    if seen:
        return int(seen[-1])
    value = metrics.preamble.get("o_direct") if metrics is not None else None
    return parse_number(value) if value is not None else None


def classify(outcome: RunOutcome, kills: Sequence[LmkEvent], metrics, o_direct_asked: bool,
             moe_stream: bool) -> Classified:
    """method.md rule 4, from what one run left behind. `metrics` is a results.parse.MetricsFile
    (or None when the engine wrote no CSV); `kills` are the lmkd/kernel kill lines of this process."""
    status = outcome.exit_status
    err_lines = [line for line in outcome.stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    if outcome.timed_out:
        return Classified("timeout", (f"no exit within the timeout; killed after {outcome.wall_s:.1f} s",))
    if outcome.killed_by_sigkill:
        if kills:
            return Classified("lmk_killed", (f"exit status {status} (SIGKILL)",) + tuple(k.line for k in kills))
        return Classified("killed", (f"exit status {status} (SIGKILL) with no lmkd or kernel kill line for pid "
                                     f"{outcome.pid}",))
    if status is None:
        return Classified("engine_error", ("exit status unknown",))
    if status != 0:
        refused = [line for line in err_lines if _CONFIG_ERROR_RE.search(line)]
        if status in (1, 2) and refused:
            return Classified("config_error", (f"exit status {status}", refused[0]))
        errors = [line for line in err_lines if line.lstrip().startswith("error")] or err_lines[-1:]
        return Classified("engine_error", (f"exit status {status}",) + tuple(errors[:1]))
    if metrics is None:
        return Classified("invalid", ("exit status 0 but no metrics CSV",))
    if metrics.summary is None:
        return Classified("invalid", ("exit status 0 but the CSV has no summary line",))
    if moe_stream and o_direct_asked and o_direct_in_effect(outcome.stderr, metrics) == 0:
        return Classified("invalid", ("o_direct=0: O_DIRECT was asked for but the engine fell back to buffered "
                                      "reads (is the model on a FUSE or tmpfs filesystem?)",))
    return Classified("ok", ())


def result_of(metrics, config: Mapping[str, Any]) -> dict[str, Any]:
    """The headline numbers of a run from its CSV summary (None where not measured)."""
    out: dict[str, Any] = {"tokens": None, "tok_per_s": None, "cache_hit_pct": None, "budget_mib": None,
                           "cycle_mb": config.get("cycle_mb")}
    if metrics is None or metrics.summary is None:
        return out
    s = metrics.summary
    out["tokens"] = s.get("tokens")
    out["tok_per_s"] = s.get("tok/s")
    hit = s.get("cache_hit_pct")
    out["cache_hit_pct"] = None if hit is None or hit == -1 else hit
    budget = s.get("cache_budget_MiB")
    if budget is None and "cache_mb" in metrics.preamble and str(metrics.preamble.get("cache_auto", "0")) == "0":
        budget = parse_number(metrics.preamble["cache_mb"])  # a fixed budget is what was asked; auto is not known
    out["budget_mib"] = budget
    return out


def samples_csv(samples: Sequence[PressureSample]) -> str:
    rows = [",".join(SAMPLE_COLUMNS)]
    for s in samples:
        rows.append(",".join("" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
                             for v in (s.t_s, s.mem_available_kb, s.vm_hwm_kb, s.vm_rss_kb, s.cpu_temp_mc,
                                       s.battery_temp_dc)))
    return "\n".join(rows) + "\n"


# ── one device's worker ────────────────────────────────────────────────────────────────────────


@dataclass
class _Context:
    campaign: Campaign
    plan: Plan
    cdir: CampaignDir
    progress: Progress
    rerun_failed: bool
    stop: threading.Event = field(default_factory=threading.Event)
    host: str = field(default_factory=socket.gethostname)
    cpu: CpuShare = field(default_factory=CpuShare)    # the engines running at once, per kernel


class _Worker(threading.Thread):
    def __init__(self, ctx: _Context, ref: DeviceRef, cells: list[Cell], records: list[dict]):
        super().__init__(name=f"bmoe-{ref.device_id}", daemon=True)
        self.ctx, self.ref, self.cells = ctx, ref, cells
        self.records = records                        # ledger lines so far (attempt numbering)
        self.device: Device | None = None
        self.engine: StagedEngine | None = None
        self.staged_models: set[str] = set()
        self.knees: dict[str, Knee] = {}              # probe cell id -> its replayed knee
        self.cpu_seen: CpuSeen | None = None          # the device's CPU at its latest run
        self.busy = False
        self.error: BaseException | None = None
        self.finished = threading.Event()   # waited on instead of join(): see run_campaign

    # -- loop -------------------------------------------------------------------------------
    def run(self) -> None:
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
            if is_knee(cell.config["budget_spec"]):
                cell, record = self._with_knee(cell)
                if cell is None and record is None:
                    return                                   # interrupted during the probe
            if record is None:
                record = self._attempt_with_retries(cell)
            if record is not None and record["outcome"] in INFRA:
                self.ctx.progress.abandon_cell(self.ref.spec)
            if record is not None and record["outcome"] == "device_lost":
                rest = self.cells[self.cells.index(cell) + 1:]
                for later in rest:
                    if self.ctx.stop.is_set():
                        return
                    self._record_without_run(
                        later, "device_lost", f"not attempted: {self.ref.spec} was lost at cell {cell.label()} "
                        f"({record['evidence'][-1] if record['evidence'] else 'no evidence'})")
                self.ctx.progress.finish_device(self.ref.spec, f"device lost; {len(rest)} more cells not run")
                return
        self.ctx.progress.finish_device(self.ref.spec, "done")

    def _attempt_with_retries(self, cell: Cell) -> dict | None:
        """Attempts of one cell until a result; infrastructure failures are retried with backoff.
        None when interrupted."""
        c = self.ctx.campaign
        tries = 0
        while True:
            record = self._attempt(cell)
            if record is None or record["outcome"] not in INFRA:
                return record
            tries += 1
            if tries > c.run.retries or self.ctx.stop.is_set():
                return record
            delay = c.run.retry_backoff_s * 2 ** (tries - 1)
            self.ctx.progress.note(self.ref.spec, f"{record['outcome']}; retry {tries}/{c.run.retries} in {delay:g} s")
            if self.ctx.stop.wait(delay):
                return None
            self.device = None                    # reopen: the connection may be new
            if record["outcome"] == "device_lost":
                self.engine = None
                self.staged_models.clear()

    def _with_knee(self, cell: Cell) -> tuple[Cell | None, dict | None]:
        """A "knee*F" cell with its budget from this device's probe (run first if it has no
        finished attempt), or the cell's record when there is no knee to be had; (None, None) when
        interrupted."""
        probe = self.ctx.plan.probe_for(cell)
        if probe.cell_id not in self.knees:
            rec = latest_by_cell(self.records).get(probe.cell_id)
            if rec is None or rec["outcome"] != "ok":
                self.ctx.progress.note(self.ref.spec, f"route-trace probe for {cell.model} "
                                                      f"(k={cell.config['n_expert_used']})")
                rec = self._attempt_with_retries(probe)
                if rec is None:
                    return None, None
            if rec["outcome"] != "ok":
                outcome = rec["outcome"] if rec["outcome"] in INFRA else "engine_error"
                return cell, self._record_without_run(
                    cell, outcome, f"no knee: the route-trace probe {probe.cell_id} attempt {rec['attempt']} ended "
                                   f"{rec['outcome']}", attempted=outcome in INFRA)
            trace = self.ctx.cdir.run_dir(probe.cell_id, int(rec["attempt"])) / "route.csv"
            try:
                self.knees[probe.cell_id] = knee_of_trace(trace)
            except ProbeError as e:
                return cell, self._record_without_run(cell, "engine_error", f"no knee: {e}")
        return resolve_knee(self.ctx.campaign, cell, self.knees[probe.cell_id].knee_mib, probe.cell_id), None

    def _record_without_run(self, cell: Cell, outcome: str, reason: str, attempted: bool = False) -> dict:
        """A cell's outcome when it could not be run (a lost device's later cells, a knee cell
        whose probe failed): committed like any attempt, with `attempted: false` and the reason as
        evidence, so the directory says why the cell has no result. INFRA outcomes rerun."""
        attempt = self.ctx.cdir.next_attempt(cell.cell_id, self.records)
        tmp = self.ctx.cdir.start_attempt(cell.cell_id, attempt)
        if self.cpu_seen is not None:   # "-t auto" as the device's runs had it, so results group it with them
            cell = resolve_threads(self.ctx.campaign, cell, self.cpu_seen.cores)
        record = self._new_record(cell, attempt, time.time())
        record.update(outcome=outcome, evidence=[reason], attempted=attempted, ended_at=record["started_at"])
        self.ctx.cdir.commit_attempt(tmp, record)
        self.records.append(ledger_line(record))
        self.ctx.progress.end_cell(self.ref.spec, cell.label(), outcome, 0.0, final=outcome not in INFRA)
        return record

    def _new_record(self, cell: Cell, attempt: int, started: float) -> dict[str, Any]:
        c = self.ctx.campaign
        return {
            "format": RUN_FORMAT, "version": FORMAT_VERSION, "cell_id": cell.cell_id, "attempt": attempt,
            "device": cell.device, "device_id": self.ref.device_id, "model": cell.model,
            "model_id": safe_id(cell.model), "engine": {"kind": c.engine.kind},
            "config": dict(cell.config), "argv": list(cell.argv), "repeat": cell.repeat, "pass": cell.pass_no,
            "order": cell.order, "outcome": None, "evidence": [], "exit_status": None, "timed_out": False,
            "wall_s": None, "timeout_s": c.run.timeout_s, "gate": None, "entry_state": None, "exit_state": None,
            "pressure": {}, "lmk_events": [], "o_direct": None, "summary": None, "result": None, "pushed": [],
            "started_at": started, "ended_at": None, "host": self.ctx.host, "attempted": True,
            "probe": bool(cell.config.get("probe")), "cpu": None,
        }

    def _attempt(self, cell: Cell) -> dict | None:
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
        if outcome_name is None or (ctx.stop.is_set() and outcome_name not in ("ok",) + INFRA):
            # interrupted: the attempt never happened (the engine was killed by us, not measured)
            shutil.rmtree(tmp, ignore_errors=True)
            ctx.progress.end_cell(self.ref.spec, label, "interrupted", time.time() - started, final=False)
            return None
        record["outcome"], record["evidence"] = outcome_name, list(evidence)
        record["ended_at"] = time.time()
        ctx.cdir.commit_attempt(tmp, record)
        self.records.append(ledger_line(record))
        probe = bool(cell.config.get("probe"))
        ctx.progress.end_cell(self.ref.spec, label, f"probe {outcome_name}" if probe else outcome_name,
                              record["ended_at"] - started, final=outcome_name not in INFRA and not probe)
        return record

    def _open(self) -> Device:
        if self.device is None:
            if self.ref.server is not None:
                self._check_attached()
            self.device = self.ref.open()
        return self.device

    def _check_attached(self) -> None:
        """Ask the adb server before talking to a phone that may be gone (and whose every command
        would fail the slow way)."""
        try:
            states = {d.serial: d.state for d in self.ref.server.client().list()}
        except Exception as e:  # adbutils raises its own errors and OSError
            raise DeviceLost(f"{self.ref.spec}: adb server {self.ref.server.host}:{self.ref.server.port} does not "
                             f"answer ({e})") from None
        if states.get(self.ref.serial) != "device":
            raise DeviceLost(f"{self.ref.spec}: device lost ({self.ref.serial} is "
                             f"{states.get(self.ref.serial, 'not attached')} on adb server "
                             f"{self.ref.server.host}:{self.ref.server.port})")

    def _run_cell(self, cell: Cell, tmp: Path, record: dict) -> tuple[str | None, tuple[str, ...]]:
        ctx, c = self.ctx, self.ctx.campaign
        try:
            device = self._open()
            try:
                record["pushed"] = self._stage(device, cell)
            except DeviceLost:
                raise
            except (DeviceError, OSError) as e:
                return "push_failed", (str(e),)
            record["engine"] = self.engine.to_dict()
            gate = self._gate(device)
            record["gate"], record["entry_state"] = gate.to_dict(), gate.entry_state.to_dict()
            if ctx.stop.is_set():
                return None, ()
            csv_remote, route_remote = out_paths(cell.device, cell.cell_id)
            self._remove(device, [csv_remote, route_remote])
            baseline = {e.line for e in device.lmk_events(time.time())}
            seen = self.cpu_seen = self._cpu(device)
        except DeviceLost as e:
            return "device_lost", (str(e),)
        except DeviceError as e:
            return "device_lost", (f"device error before the run: {e}",)

        # "-t auto" takes the cores the device has now; the record keeps the command that ran
        cell = resolve_threads(c, cell, seen.cores)
        record["config"], record["argv"] = dict(cell.config), list(cell.argv)
        env = engine_env(device, self.engine.env)
        share = ctx.cpu.begin(cell.device, cell.cell_id, seen, engine_threads(c.engine.staged_name, cell.argv),
                              csv_remote)
        try:
            outcome = device.run(cell.argv, env=env, timeout_s=c.run.timeout_s, sample_period_s=1.0)
        except DeviceLost as e:
            return "device_lost", (str(e),)
        except DeviceError as e:
            return "engine_error", (f"the engine could not start: {e}",)
        finally:
            record["cpu"] = ctx.cpu.end(share)
        try:
            exit_state = device.state()
            events = self._new_events(device, outcome, baseline)
            kills = kills_of(events, pids=[outcome.pid] if outcome.pid else [],
                             names=[] if outcome.pid else c.engine.stray_names)
            if outcome.killed_by_sigkill and not outcome.timed_out and not kills and not ctx.stop.is_set():
                deadline = time.monotonic() + EVIDENCE_WAIT_S  # lmkd writes its line a moment later
                while not kills and time.monotonic() < deadline:
                    time.sleep(0.25)
                    events = self._new_events(device, outcome, baseline)
                    kills = kills_of(events, pids=[outcome.pid] if outcome.pid else [],
                                     names=[] if outcome.pid else c.engine.stray_names)
            metrics_path = tmp / "metrics.csv"
            pulled = self._pull(device, csv_remote, metrics_path)
            if cell.config.get("route_trace"):
                self._pull(device, route_remote, tmp / "route.csv")
            self._remove(device, [csv_remote, route_remote])
        except DeviceLost as e:
            return "device_lost", (f"device lost after the run (exit status {outcome.exit_status}): {e}",)
        except DeviceError as e:
            return "device_lost", (f"device error after the run (exit status {outcome.exit_status}): {e}",)

        pressure = pressure_metrics(gate.entry_state, outcome.samples, exit_state)
        for name, data in (("stdout.txt", outcome.stdout), ("stderr.txt", outcome.stderr),
                           ("samples.csv", samples_csv(outcome.samples)),
                           ("run.metrics", "".join(f"{k}={v}\n" for k, v in pressure.items()))):
            with naming(tmp / name):
                (tmp / name).write_bytes(data.encode() if isinstance(data, str) else data)
        metrics, parse_problem = None, None
        if pulled:
            from results.parse import ParseError, read_metrics_csv

            try:
                metrics = read_metrics_csv(metrics_path)
            except ParseError as e:
                parse_problem = str(e)
        record.update(exit_status=outcome.exit_status, timed_out=outcome.timed_out, wall_s=round(outcome.wall_s, 3),
                      pid=outcome.pid, exit_state=exit_state.to_dict(), pressure=pressure,
                      lmk_events=[_event_dict(e) for e in events])
        record["o_direct"] = o_direct_in_effect(outcome.stderr, metrics)
        if metrics is not None:
            record["summary"] = dict(metrics.summary) if metrics.summary is not None else None
        record["result"] = result_of(metrics, cell.config)
        verdict = classify(outcome, kills, metrics, bool(cell.config["o_direct"]), bool(cell.config["moe_stream"]))
        evidence = verdict.evidence
        if verdict.outcome == "invalid" and parse_problem:
            evidence = (parse_problem,)
        return verdict.outcome, evidence

    # -- pieces -----------------------------------------------------------------------------
    def _gate(self, device: Device) -> GateResult:
        c = self.ctx.campaign
        return cool(device, c.gate, c.engine.stray_names, stop=self.ctx.stop,
                    on_wait=lambda why: self.ctx.progress.note(self.ref.spec, f"gate: {why}"))

    def _cpu(self, device: Device) -> CpuSeen:
        """The device's cores and kernel boot id (harness.cpushare), unknown when it cannot say."""
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

    def _stage(self, device: Device, cell: Cell) -> list[dict]:
        """Push the engine and the cell's model unless the device has them (same bytes)."""
        c = self.ctx.campaign
        pushed: list[dict] = []
        local = self.ref.kind == "local"
        if self.engine is None:
            work = self.ref.work_dir
            target = engine_path(c, cell.device)
            staged = StagedEngine(c.engine.kind, target)
            if local:
                os.makedirs(f"{work}/out", exist_ok=True)
            else:
                self._check(device.run(["mkdir", "-p", f"{work}/out"], timeout_s=60), "mkdir")
            if c.engine.kind == "python":
                source = str(build_bmoe_py(c.engine.python))
                files = [(source, target)]
            else:
                identity = device.identity()
                build = c.engine.build_for_device(identity)
                if build is None:
                    raise RunnerError(f"{self.ref.spec}: {c.engine.missing_build(identity, self.ref.spec)}")
                # the libraries go to one folder the loader is pointed at (LD_LIBRARY_PATH wins over the
                # binary's RUNPATH, which names its folder on the build host)
                files = [(build.cli, target)] + [(lib, f"{work}/lib/{os.path.basename(lib)}") for lib in build.libs]
                staged.env = {"LD_LIBRARY_PATH": f"{work}/lib"}
                staged.build = build.abi
                staged.libs = [{"name": os.path.basename(lib), "sha256": _sha256(lib)} for lib in build.libs]
                source = build.cli
            for src, dst in files:
                self.ctx.progress.note(self.ref.spec, f"checking {os.path.basename(dst)}")
                if device.push(src, dst):
                    pushed.append({"path": dst, "bytes": os.path.getsize(src)})
            if not local:
                self._check(device.run(["chmod", "755", target], timeout_s=60), "chmod")
            staged.sha256 = _sha256(source)
            hint = (f"; engine.python ({c.engine.python}) must be an interpreter path this device has"
                    if c.engine.kind == "python" else "")
            try:
                version = device.run([target, "--version"], env=engine_env(device, staged.env), timeout_s=120)
            except DeviceLost:
                raise
            except DeviceError as e:  # not a push failure: retrying cannot help
                raise RunnerError(f"{self.ref.spec}: the engine cannot start there ({e}){hint}") from None
            text = (version.stdout or version.stderr).decode("utf-8", "replace").strip().splitlines()
            if version.exit_status in (126, 127):  # the device's shell could not execute it at all
                raise RunnerError(f"{self.ref.spec}: the engine cannot start there (exit status "
                                  f"{version.exit_status}: {' '.join(text)[:200]}){hint}")
            staged.version = text[0] if text and version.exit_status == 0 else \
                f"unknown (--version exit status {version.exit_status})"
            self.engine = staged
        model = c.model(cell.model)
        if cell.model not in self.staged_models:
            if not local and not model.on_device:     # a device: model is already there
                remote = remote_model_path(cell.device, model)
                folder = remote.rsplit("/", 1)[0]
                for shard in split_paths(model.path):
                    dst = f"{folder}/{os.path.basename(shard)}"
                    self.ctx.progress.note(self.ref.spec, f"checking {os.path.basename(shard)}")
                    if device.push(shard, dst):
                        pushed.append({"path": dst, "bytes": os.path.getsize(shard)})
            self.staged_models.add(cell.model)
        return pushed

    @staticmethod
    def _check(outcome: RunOutcome, what: str) -> None:
        if outcome.exit_status != 0:
            raise DeviceError(f"{what} failed (exit status {outcome.exit_status}): "
                              f"{outcome.stderr.decode('utf-8', 'replace').strip()[:200]}")

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


def _event_dict(e: LmkEvent) -> dict:
    return dataclasses.asdict(e)


# ── campaigns ──────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Prepared:
    campaign: Campaign
    plan: Plan
    devices: list[DeviceRef]
    identities: Mapping[str, dict] = field(default_factory=dict)       # device spec -> identity
    device_models: Mapping[str, DeviceModel] = field(default_factory=dict)   # `device:` models, priced


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
    if p.name == "campaign.toml" and (p.parent / "plan.json").exists():
        return p.parent
    return p.parent / safe_id(campaign.name)


def run_campaign(campaign: Campaign, out_dir: str | os.PathLike, rerun_failed: bool = False,
                 progress_stream=None, tty: bool | None = None, prepared: Prepared | None = None):
    """Run (or resume) a campaign into out_dir; returns its status.CampaignStatus."""
    from harness.status import campaign_status

    prepared = prepared or prepare(campaign)
    plan, refs = prepared.plan, prepared.devices
    root = Path(out_dir).resolve()
    cdir = CampaignDir(root)
    _check_out_dir(cdir, plan)
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "dir": str(root), "since": time.time()}
    dir_lock = FileLock(locks_dir() / f"dir-{hashlib.sha256(str(root).encode()).hexdigest()[:16]}.lock",
                        f"campaign directory {root}")
    locks = [dir_lock] + [device_lock(r) for r in refs]
    with holding(locks, campaign.run.lock_wait_s, owner):
        toml_text = campaign.to_toml()      # a campaign that cannot be written makes no folder
        created = not root.exists()
        try:
            identities = prepared.identities or _identities(refs, campaign)
            root.mkdir(parents=True, exist_ok=True)
            atomic_write(root / "campaign.toml", toml_text)
            if cdir.read_plan() != plan:
                cdir.write_plan(plan)
            device_models = prepared.device_models
            if any(m.on_device and m.name not in device_models for m in campaign.models):  # a Prepared made by hand
                device_models = price_device_models(campaign, refs)
            _write_models(cdir, campaign, plan, device_models)
            for ref in refs:
                cdir.write_device(ref, identities[ref.spec])
            cdir.reconcile()
        except BaseException as e:
            if created:                     # nothing ran yet: leave no folder behind
                shutil.rmtree(root, ignore_errors=True)
            if isinstance(e, OSError):
                raise disk_error(e, root) from None
            raise
        records = cdir.ledger.read()
        latest = latest_by_cell(records)
        todo = {ref.spec: [cell for cell in plan.for_device(ref.spec)
                           if not is_done(latest.get(cell.cell_id), rerun_failed)] for ref in refs}
        progress = Progress({ref.spec: len(todo[ref.spec]) for ref in refs}, progress_stream, tty)
        ctx = _Context(campaign, plan, cdir, progress, rerun_failed)
        workers = [_Worker(ctx, ref, todo[ref.spec], list(records)) for ref in refs if todo[ref.spec]]
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
                ctx.stop.set()
                for w in workers:
                    if w.busy:
                        with contextlib.suppress(Exception):
                            stop_strays(w.ref.open(), campaign.engine.stray_names)
                deadline = time.monotonic() + 30
                while not all(w.finished.is_set() for w in workers) and time.monotonic() < deadline:
                    time.sleep(0.05)
                raise
            finally:
                progress.close()
        errors = [w.error for w in workers if w.error is not None]
        if errors:
            raise errors[0]
    return campaign_status(root)


def _check_out_dir(cdir: CampaignDir, plan: Plan) -> None:
    root = cdir.root
    if not root.exists():
        return
    if not root.is_dir():
        raise RunnerError(f"{root}: exists and is not a folder")
    old = cdir.read_plan()
    if old is None:
        if any(root.iterdir()):
            raise RunnerError(f"{root}: is not empty and holds no campaign (no plan.json); choose another -o")
        return
    old_ids, new_ids = {c.cell_id for c in old.cells}, {c.cell_id for c in plan.cells}
    if old_ids != new_ids:
        raise RunnerError(f"{root}: holds a different campaign ({len(old_ids - new_ids)} of its cells are not in "
                          f"this plan, {len(new_ids - old_ids)} cells are new); write to another -o folder")


def _identities(refs: Sequence[DeviceRef], campaign: Campaign) -> dict[str, dict]:
    out = {}
    for ref in refs:
        try:
            identity = ref.open().identity()
        except DeviceError as e:
            raise RunnerError(f"device {ref.spec}: {e}") from None
        if campaign.engine.kind == "native" and campaign.engine.build_for_device(identity) is None:
            raise CampaignError(f"{campaign.source + ': ' if campaign.source else ''}"
                                f"{campaign.engine.missing_build(identity, ref.spec)}")
        out[ref.spec] = identity.to_dict()
    return out


def _write_models(cdir: CampaignDir, campaign: Campaign, plan: Plan,
                  device_models: Mapping[str, DeviceModel]) -> None:
    """models/<id>.json: the shape record plus sha256 (reused while size and mtime are unchanged).
    A model whose bytes changed since the campaign started is refused: its runs would mix."""
    for m in campaign.models:
        path = cdir.root / "models" / f"{safe_id(m.name)}.json"
        if m.on_device:
            _write_device_model(path, m, plan, device_models[m.name])
            continue
        shards = split_paths(m.path)
        stat = [(os.path.getsize(s), os.stat(s).st_mtime_ns) for s in shards]
        old = read_versioned_json(path, "bmoe-fleet.model-shape") if path.exists() else None
        if old and old.get("file_stats") == [list(x) for x in stat]:
            continue
        hashes = [_sha256(s) for s in shards]
        sha = hashes[0] if len(hashes) == 1 else hashlib.sha256("".join(hashes).encode()).hexdigest()
        if old and old.get("sha256") != sha:
            raise RunnerError(f"model {m.name} ({m.path}) changed since this campaign started (sha256 differs); "
                              "write to another -o folder")
        shape = plan.models[m.name]
        record = shape.to_dict(list(plan.top_ks.get(m.name, ())))
        record.update(name=m.name, path=m.path, sha256=sha, shard_sha256=hashes,
                      file_stats=[list(x) for x in stat])
        write_json(path, record)


def _write_device_model(path: Path, m: ModelSpec, plan: Plan, found: DeviceModel) -> None:
    """A `device:` model's record: its shape from the pulled headers, identified by their sha256
    and the file sizes (its bytes never come to this host to be hashed)."""
    old = read_versioned_json(path, "bmoe-fleet.model-shape") if path.exists() else None
    identity = found.identity()
    if old is not None:
        if {k: old.get(k) for k in identity} != identity:
            raise RunnerError(f"model {m.name} ({m.spec}) changed since this campaign started (its header or size "
                              "differs); write to another -o folder")
        return
    record = found.shape.to_dict(list(plan.top_ks.get(m.name, ())))
    record.update(name=m.name, path=m.spec, on_device=True, sha256=None, **identity)
    write_json(path, record)


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
    from harness.status import RunEnd, campaign_status

    root = Path(out_dir).resolve()
    try:
        status = run_campaign(campaign, root, rerun_failed, progress_stream, prepared=prepared)
    except KeyboardInterrupt:
        try:
            status = campaign_status(root) if CampaignDir(root).plan_path.exists() else None
        except RunnerError:
            status = None
        return RunEnd(str(root), status, interrupted=True)
    return RunEnd(str(root), status)


def run_campaign_file(path: str | os.PathLike, out_dir: str | os.PathLike | None = None, rerun_failed: bool = False,
                      progress_stream=None):
    """Load a campaign file and run it (into its default folder unless out_dir is given)."""
    campaign = load_campaign(path)
    return run_campaign(campaign, out_dir or default_out_dir(path, campaign), rerun_failed, progress_stream)


# ── one command line outside a campaign's records (`recommend --verify`) ───────────────────────


@dataclass(frozen=True)
class SingleRun:
    """How the engine answered one command line run outside the campaign's records."""

    argv: tuple[str, ...]
    status: str                  # "accepted" (exit 0), "refused" (its config/argument error), "failed"
    exit_status: int | None
    line: str                    # the engine's own line that says so
    engine: str                  # the first line of its --version


_ACCEPTED_RE = re.compile(r"bmoe: expert streaming ON.*|^generation: .*", re.M)


def judge_single_run(outcome: RunOutcome) -> tuple[str, str]:
    """(status, the engine's line) of one run: refused is the engine's own configuration refusal
    (the `config_error` of a campaign), accepted an exit 0, anything else failed."""
    err = outcome.stderr.decode("utf-8", "replace")
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    if outcome.exit_status == 0 and not outcome.killed_by_sigkill:
        seen = _ACCEPTED_RE.findall(err + "\n" + outcome.stdout.decode("utf-8", "replace"))
        return "accepted", (seen[0].strip() if seen else "exit status 0")
    refused = [line for line in lines if _CONFIG_ERROR_RE.search(line)]
    if outcome.exit_status in (1, 2) and refused:
        return "refused", refused[0]
    if outcome.timed_out:
        return "failed", f"no exit within the timeout ({outcome.wall_s:.0f} s)"
    errors = [line for line in lines if line.startswith("error")] or lines[-1:]
    return "failed", f"exit status {outcome.exit_status}" + (f": {errors[0]}" if errors else "")


class DeviceSession:
    """A campaign's engine staged on one of its devices exactly as its runs stage it (bytes the
    device already holds are not pushed again; a native build's libraries and LD_LIBRARY_PATH go
    along), under the device's lock, for single command lines: `recommend --verify` runs each
    recommended argv once here. Use as a context manager."""

    def __init__(self, campaign: Campaign, device: str, progress_stream=None):
        self.campaign = dataclasses.replace(campaign, devices=(device,))
        self.spec = device
        self._stream = progress_stream if progress_stream is not None else io.StringIO()
        self._worker: _Worker | None = None
        self._locks: contextlib.ExitStack | None = None

    def __enter__(self) -> DeviceSession:
        (ref,) = resolve_devices(self.campaign)
        ctx = _Context(self.campaign, Plan(self.campaign.name, ()), CampaignDir(fleet_home() / "verify"),
                       Progress({ref.spec: 0}, self._stream), False)
        self._locks = contextlib.ExitStack()
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "dir": "recommend --verify", "since": time.time()}
        self._locks.enter_context(holding([device_lock(ref)], self.campaign.run.lock_wait_s, owner))
        self._worker = _Worker(ctx, ref, [], [])
        return self

    def __exit__(self, *exc) -> None:
        if self._locks is not None:
            self._locks.close()

    def run(self, model: str, settings: Sequence[str], n_predict: int = 1,
            timeout_s: float | None = None) -> SingleRun:
        """The engine on `model` with these settings (every flag but model, prompt and length),
        the campaign's prompt, `n_predict` tokens."""
        from types import MappingProxyType

        w = self._worker
        cell = Cell("verify", self.spec, model, self.campaign.engine.kind, MappingProxyType({}), 0, 0, 0, ())
        try:
            device = w._open()
            w._stage(device, cell)
        except (DeviceError, OSError) as e:
            raise RunnerError(f"{self.spec}: cannot stage the engine or {model}: {e}") from None
        argv = (engine_path(self.campaign, self.spec), "-m", remote_model_path(self.spec, self.campaign.model(model)),
                "-p", self.campaign.run.prompt, "-n", str(n_predict), *settings)
        try:
            outcome = device.run(list(argv), env=engine_env(device, w.engine.env),
                                 timeout_s=timeout_s or self.campaign.run.timeout_s, sample_period_s=60.0)
        except DeviceError as e:
            raise RunnerError(f"{self.spec}: the engine could not start: {e}") from None
        status, line = judge_single_run(outcome)
        return SingleRun(argv, status, outcome.exit_status, line, w.engine.version)
