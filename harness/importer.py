"""`bmoe-fleet import SRC… -o DIR`: upstream bench-data folders as runs of a campaign directory.

Each engine run found under a source folder (results.read.parse.discover groups its CSV, `.metrics`
sidecar, `.log`/`.out`/`.err` captures, route trace, `.state` and its section of a multi-run
capture) becomes one cell with one attempt, written like a campaign's own runs. The
configuration comes from the CSV preamble (v1/v2); for older files, from the file name, the
driver's separator tag and the engine's own log lines — parsed by results.read.parse, never here.
Upstream kept no exit status, so the outcome is read from what the files show: the engine's
refusal (`config_error`), its runtime error (`engine_error`), a summary or end-of-run block
(`ok`), or neither (`invalid`: killed or cut short, nobody recorded which).

Importing the same folder again adds nothing: a cell's id hashes its source path and config.

Values are range-checked where they enter, by the parsers (results.read.parse_values): a number no
engine prints refuses the whole import (one line naming file, line and key; nothing written);
nan/inf and impossible values are stored as null, each with a line in the run's `notes`. Strings
from the files (model names, error lines, file names) are stored with control characters escaped.
Every JSON file written is strict JSON.

The output folder is a new folder or an earlier import's (its campaign.toml has `[import]`): a
sweep's campaign directory is refused, since cells added to its plan would stop it resuming.
Campaign directories inside a source folder (the output folder among them) are skipped, not read
as upstream runs; a source that is itself a campaign directory, or lies inside the output
folder, is refused.

Long because: it is one command's pipeline, from the source folders to the runs committed under
one directory lock, and its two kinds of source (a run's group of files, a session capture) share
the record, renaming and escaping helpers; the parsing it could have grown is results.read's.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from engine.interface.outputs import reader_aliases
from engine.safetext import printable
from engine.units import parse_number
from harness.campaign.model import FORMAT_VERSION, CampaignError, fleet_home
from harness.plan.grid import Cell, Plan, cell_id_of, read_plan, write_plan
from harness.run.classify import result_of
from results.read.parse import (
    ConsoleRun,
    RunFiles,
    config_from_command,
    config_from_log,
    config_from_name,
    discover,
    read_console,
    read_console_runs,
    read_metrics_csv,
    read_sidecar,
    read_state,
)
from results.read.parse_config import MODEL_ALIASES
from results.read.parse_discover import campaign_dirs, source_files
from results.read.parse_session import REPORT, SessionCapture, find_sessions, missing_notes, session_turns
from results.read.parse_text import NumberError, excerpt, located
from results.read.parse_values import checked
from store import names, outcomes, versioned
from store.campaign_dir import CampaignDir
from store.cells import CellConfig
from store.ledger import latest_by_cell
from store.locks import dir_lock, holding
from store.names import device_id, safe_id
from store.run_record import RunRecord

IMPORT_ENGINE = "native"
_RENAME = reader_aliases()          # another reader's name -> the preamble key (engine.interface.outputs)
_PREAMBLE_BOOL = ("moe_stream", "cache_auto", "force_cache", "o_direct", "overlap", "load_all", "chatml")
TEXT_CHARS = 200          # a string from a file is stored escaped and cut to this (model names, errors)
NOTES_SHOWN = 5
_PREAMBLE_KEYS = ("model", "arch", "n_layer", "n_expert", "n_expert_used", "threads", "n_ctx", "moe_stream",
                  "cache_mb", "cache_cycle_mb", "cache_auto", "cache_floor_mb", "cache_ceil_mb", "force_cache",
                  "io_threads", "o_direct", "overlap", "prefetch", "dense_weights")


@dataclass(frozen=True)
class ImportReport:
    """What an import found, added and skipped."""

    out_dir: str
    found: int
    added: int
    skipped: int                                  # already in the directory
    outcomes: dict[str, int] = field(default_factory=dict)
    per_source: dict[str, int] = field(default_factory=dict)
    skipped_dirs: tuple[str, ...] = ()            # campaign directories inside the sources, not read
    notes: tuple[str, ...] = ()                   # values stored as missing, over the runs added

    def to_dict(self) -> dict[str, Any]:
        """`import --json`."""
        return {"format": "bmoe-fleet.import", "version": 1, "dir": self.out_dir, "found": self.found,
                "added": self.added, "skipped": self.skipped, "outcomes": dict(self.outcomes),
                "per_source": dict(self.per_source), "skipped_dirs": list(self.skipped_dirs),
                "notes": list(self.notes)}

    def text(self) -> str:
        """`import`: a summary line, then one per source, skipped folder and note."""
        lines = [f"imported {self.added} of {self.found} runs into {printable(self.out_dir)}"
                 + (f" ({self.skipped} were already there)" if self.skipped else "")]
        for src, n in self.per_source.items():
            lines.append(f"  {printable(src)}: {n} runs")
        for folder in self.skipped_dirs:
            lines.append(f"  skipped {printable(folder)}: a campaign directory, not upstream runs")
        if self.outcomes:
            lines.append("  outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items())))
        if self.notes:
            lines.append(f"  {len(self.notes)} values stored as missing (each run's run.json lists its notes):")
            lines += [f"    {printable(n)}" for n in self.notes[:NOTES_SHOWN]]
            if len(self.notes) > NOTES_SHOWN:
                lines.append(f"    … and {len(self.notes) - NOTES_SHOWN} more")
        return "\n".join(lines)


@dataclass(frozen=True)
class Imported:
    cell: Cell
    record: RunRecord
    files: dict[str, Path | bytes]               # run-folder file name (store.names) -> source file or content


def import_runs(sources: Sequence[str | os.PathLike], out_dir: str | os.PathLike,
                device: str = "imported") -> ImportReport:
    """Import every run under each source folder into out_dir (created, or extended)."""
    if not sources:
        raise CampaignError("import: give at least one source folder")
    root = Path(out_dir).resolve()
    folders = []
    for src in sources:
        p = Path(src)
        shown = printable(str(src))  # a folder name is data: shown escaped
        if not p.is_dir():
            raise CampaignError(f"import: {shown}: not a folder")
        folder = p.resolve()
        if folder == root or root in folder.parents:
            raise CampaignError(f"import: {shown}: is inside the output folder {printable(str(root))}; its runs are "
                                f"already this campaign's")
        if names.is_campaign_dir(folder):
            raise CampaignError(f"import: {shown}: is a bmoe-fleet campaign directory, not upstream bench data")
        folders.append(folder)
    old_plan = check_out_dir(root)
    found: list[Imported] = []
    per_source: dict[str, int] = {}
    skipped_dirs: list[str] = []
    captures: dict[Path, dict[str | None, ConsoleRun]] = {}   # each capture read once, not once per run
    for folder in folders:
        skipped_dirs += [str(d) for d in campaign_dirs(folder)]
        sessions, taken = find_sessions(source_files(folder, exclude=[root]))
        groups = discover(folder, exclude=[root], skip=taken)
        per_source[str(folder)] = len(groups) + len(sessions)
        for group in groups:
            found.append(_import_group(folder, group, device, len(found), captures))
        for session in sessions:
            found.append(_import_session(folder, session, device, len(found)))

    added, notes, counts = commit_imported(root, old_plan, found, {device: {}}, [str(f) for f in folders], device)
    return ImportReport(str(root), len(found), added, len(found) - added, dict(counts), per_source,
                        tuple(skipped_dirs), tuple(notes))


def commit_imported(root: Path, old_plan: Plan | None, found: Sequence[Imported],
                    devices: Mapping[str, Mapping[str, Any]], sources: Sequence[str],
                    device: str) -> tuple[int, list[str], Counter[str]]:
    """Write the runs found into root under its directory lock (a cell already there is skipped):
    the plan, devices/ (each label with what is known of it), models/, each run's files and run.json.
    Returns (runs added, their notes, outcomes over all found)."""
    cdir = CampaignDir(root)
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "dir": str(root), "since": time.time()}
    with holding([dir_lock(fleet_home(), root)], 0.0, owner):
        root.mkdir(parents=True, exist_ok=True)
        cdir.reconcile()
        done = set(latest_by_cell(cdir.ledger.read()))     # the cells already there
        known = {c.cell_id for c in old_plan.cells} if old_plan else set()
        new_cells = [imp.cell for imp in found if imp.cell.cell_id not in known]
        base_cells = tuple(old_plan.cells) if old_plan else ()
        order0 = len(base_cells)
        new_cells = [Cell(c.cell_id, c.device, c.model, c.engine, c.config, c.repeat, c.pass_no, order0 + i, c.argv)
                     for i, c in enumerate(new_cells)]
        if not cdir.campaign_toml_path.exists():
            cdir.write_campaign_toml(tomli_w.dumps({
                "version": FORMAT_VERSION, "name": root.name,
                "import": {"sources": list(sources), "device": device}}))
        if new_cells or old_plan is None:
            write_plan(cdir, Plan(old_plan.campaign if old_plan else root.name, base_cells + tuple(new_cells)))
        for label, identity in devices.items():
            cdir.write_device(device_id(label), {"device": label, "kind": "imported", "serial": label}, identity)
        added = 0
        notes: list[str] = []
        counts: Counter[str] = Counter()
        orders = {c.cell_id: c.order for c in new_cells}
        for imp in found:
            counts[imp.record.outcome] += 1
            cid = imp.cell.cell_id
            if cid in done:
                continue
            _write_model(cdir, imp.record)
            record = imp.record.with_(order=orders.get(cid, imp.record.order))
            tmp = cdir.start_attempt(cid, 1)
            for name, content in imp.files.items():
                CampaignDir.put(tmp, name, content)
            cdir.commit_attempt(tmp, record)
            done.add(cid)
            notes += record.notes
            added += 1
    return added, notes, counts


def check_out_dir(root: Path) -> Plan | None:
    """The plan of the import to extend (None for a new folder); anything else is refused before a
    byte is written."""
    if not root.exists():
        return None
    shown = printable(str(root))
    if not root.is_dir():
        raise CampaignError(f"import: {shown}: not a folder")
    if not any(root.iterdir()):
        return None
    cdir = CampaignDir(root)
    doc = cdir.read_campaign_toml()
    if doc is not None and "import" not in doc:
        raise CampaignError(f"import: {shown}: is a sweep's campaign directory; runs imported into it would stop the "
                            f"sweep resuming: import into a new folder")
    plan = read_plan(cdir)
    if plan is None or doc is None:
        raise CampaignError(f"import: {shown}: is not empty and holds no imported campaign (no plan.json and "
                            f"campaign.toml with [import])")
    return plan


def _write_model(cdir: CampaignDir, record: RunRecord) -> None:
    """models/<id>.json of an imported model: only what the files told."""
    if cdir.read_model(record.model_id) is not None:
        return
    c = record.config.to_dict()
    cdir.write_model(record.model_id, {**versioned.MODEL.stamp(), "name": record.model, "imported": True,
                                       **{k: c[k] for k in ("arch", "n_layer", "n_expert") if k in c}})


# ── one group ──────────────────────────────────────────────────────────────────────────────────


def _import_group(source: Path, group: RunFiles, device: str, index: int,
                  captures: dict[Path, dict[str | None, ConsoleRun]]) -> Imported:
    rel = group.folder.relative_to(source)
    where = printable("/".join(part for part in (source.name, *rel.parts, group.stem) if part))
    console = _console(group)
    section = _section(group, captures)
    metrics = read_metrics_csv(group.csv) if group.csv else None
    notes: list[str] = [*(metrics.notes if metrics else ()), *(console.notes if console else ()),
                        *(section.notes if section else ())]
    try:
        config = _config(group, console, section, metrics)
    except NumberError as e:
        raise located(e, str(group.folder / group.stem)) from None
    # a configuration value no engine could have run with is not known: left out, with a note
    config = {k: stored_text(v) for k, v in checked(config, f"{where} (configuration)", notes).items() if v is not None}
    model = stored_text(_model_name(config, group, metrics))
    config.update(model=model, budget_spec="imported", source=where)
    # free-form keys as the files state them (sorted, as imports always stored them)
    stated = {k: v for k, v in sorted(config.items()) if _jsonable(v)}
    cell_config = CellConfig.from_dict(stated)
    cid = cell_id_of(device, model, IMPORT_ENGINE, cell_config, 0, 0)
    outcome, evidence = _outcome(console, section, metrics, stated)
    result = result_of(metrics, cell_config)
    _fill_result(result, console or section, config)
    times = [p.stat().st_mtime for p in _paths(group)]
    when = min(times) if times else time.time()
    state = read_state(group.state, notes) if group.state else {}
    entry = (console.entry_state if console and console.entry_state else None) or \
            (section.entry_state if section and section.entry_state else None) or state.get("entry")
    sidecar = read_sidecar(group.sidecar, notes) if group.sidecar else None
    told = console or section
    pressure = dict(sidecar) if sidecar else dict(told.pressure or {}) if told is not None else {}
    record = run_record(cid, device, model, cell_config, index, outcome, evidence, when, notes, where,
                     engine_version=stored_text(str(metrics.preamble.get("engine", "")) if metrics else ""),
                     entry_state=dict(entry) if entry else None,
                     exit_state=dict(state["exit"]) if state.get("exit") else None, pressure=pressure,
                     o_direct=config.get("o_direct_reported"),
                     summary=dict(metrics.summary) if metrics and metrics.summary else None, result=result,
                     imported_from={"files": [str(p) for p in _paths(group)], "section": group.section})
    files: dict[str, Path | bytes] = {}
    if group.csv:
        files[names.METRICS_CSV] = group.csv
    if group.route_trace:
        files[names.ROUTE_CSV] = group.route_trace
    if group.sidecar:
        files[names.RUN_METRICS] = group.sidecar
    stdout = group.out or group.log
    if stdout:
        files[names.STDOUT_TXT] = stdout
    elif section is not None:
        files[names.STDOUT_TXT] = ("\n".join(section.lines) + "\n").encode("utf-8")
    if group.err:
        files[names.STDERR_TXT] = group.err
    return Imported(Cell(cid, device, model, IMPORT_ENGINE, cell_config, 0, 0, index, ()), record, files)


def run_record(cid: str, device: str, model: str, cell_config: CellConfig, index: int, outcome: str,
            evidence: Sequence[str], when: float, notes: list[str], where: str, *, engine_version: str = "",
            entry_state: dict | None = None, exit_state: dict | None = None, pressure: dict | None = None,
            o_direct: Any = None, summary: dict | None = None, result: dict[str, Any],
            imported_from: dict[str, Any], **more: Any) -> RunRecord:
    """One imported run's run.json (docs/campaign-dir.md "Imported runs"), checked to be strict JSON
    and to be a run record (store.run_record)."""
    record: dict[str, Any] = {
        **versioned.RUN.stamp(), "cell_id": cid, "attempt": 1, "device": device,
        "device_id": device_id(device), "model": model, "model_id": safe_id(model),
        "engine": {"kind": IMPORT_ENGINE, "version": engine_version},
        "config": cell_config.to_dict(), "argv": [], "repeat": 0, "pass": 0, "order": index, "outcome": outcome,
        "evidence": [stored_text(e) for e in evidence], "exit_status": None, "timed_out": False, "wall_s": None,
        "timeout_s": None, "gate": None, "entry_state": entry_state, "exit_state": exit_state,
        "pressure": pressure or {}, "lmk_events": [], "o_direct": o_direct, "summary": summary, "result": result,
        "pushed": [], "started_at": when, "ended_at": when, "host": socket.gethostname(),
        "imported_from": imported_from, **more, "notes": notes,
    }
    try:
        json.dumps(record, allow_nan=False)
    except ValueError as e:  # the parsers' range checks should make this unreachable: refuse, never write NaN
        raise CampaignError(f"import: {where}: a value is not strict JSON ({e})") from None
    return RunRecord.from_dict(record, f"import: {where}")


# ── one session capture ─────────────────────────────────────────────────────────────────────────


def _import_session(source: Path, capture: SessionCapture, device: str, index: int) -> Imported:
    """An upstream session capture (results.read.parse_session) as one session cell: its turns in the
    shape a live session cell's run.json has them, what the capture lacks null and noted."""
    first = capture.paths[0]
    rel = first.parent.relative_to(source)
    where = printable("/".join(part for part in (source.name, *rel.parts, first.name) if part)
                      + (f"#{capture.tag}" if capture.kind == REPORT else ""))
    notes = [*capture.notes]
    try:
        config = _session_config(capture)
    except NumberError as e:
        raise located(e, str(first)) from None
    config = {k: stored_text(v) for k, v in checked(config, f"{where} (configuration)", notes).items() if v is not None}
    path = config.get("model_path")
    name = Path(path).name.removesuffix(".gguf") if isinstance(path, str) and path else "unknown"
    model = stored_text(MODEL_ALIASES.get(name, name))
    turns = session_turns(capture)
    config.update(model=model, budget_spec="imported", source=where, turns=len(turns),
                  **({"idle_s": capture.gap.idle_s} if capture.gap is not None else {}))
    stated = {k: v for k, v in sorted(config.items()) if _jsonable(v)}
    cell_config = CellConfig.from_dict(stated)
    cid = cell_id_of(device, model, IMPORT_ENGINE, cell_config, 0, 0)
    outcome, evidence = _session_outcome(capture, turns)
    result = result_of(None, cell_config)
    last = capture.dones[-1] if capture.dones else {}
    result.update(tokens=last.get("tokens"), tok_per_s=last.get("tok_s"))   # as a live cell's last CSV summary
    hit = last.get("cache_hit_pct")
    if isinstance(hit, (int, float)) and hit != -1:   # -1: no cache, so no budget either
        result.update(cache_hit_pct=hit, budget_mib=last.get("cache_budget_mib", config.get("budget_mib")))
    notes += missing_notes(capture, where)
    when = min(p.stat().st_mtime for p in capture.paths)
    record = run_record(cid, device, model, cell_config, index, outcome, evidence, when, notes, where,
                     o_direct=config.get("o_direct_reported"), result=result,
                     imported_from={"files": [str(p) for p in capture.paths], "section": capture.tag,
                                    "capture": capture.kind},
                     turns=turns)
    return Imported(Cell(cid, device, model, IMPORT_ENGINE, cell_config, 0, 0, index, ()), record,
                     {names.STDOUT_TXT: first})


def _session_config(capture: SessionCapture) -> dict[str, Any]:
    """The report's `flags:` (the extra bmoe-cli flags), then the engine's own lines, then what
    BMOE_READY says: only what the capture states."""
    config: dict[str, Any] = {}
    if capture.flags:
        config.update(config_from_command("bmoe-cli " + capture.flags))
        config["flags"] = capture.flags
    if capture.console is not None:
        config.update(config_from_log(capture.console))
    ready = capture.ready or {}
    for key, name in (("arch", "arch"), ("n_ctx", "n_ctx"), ("n_expert_used", "top_k")):
        if key in ready:
            config[name] = ready[key]
    return _renamed(config)


def _session_outcome(capture: SessionCapture, turns: Sequence[Mapping[str, Any]]) -> tuple[str, tuple[str, ...]]:
    fatal = [e for e in capture.errors if e.get("fatal") is True]
    if fatal:
        return outcomes.ENGINE_ERROR, (str(fatal[0].get("msg", "")),)
    done = sum(t["outcome"] == "done" for t in turns)
    if capture.failures or done < len(turns) or done < 2:
        why = f"session: {done} of {len(turns)} turns answered BMOE_DONE"
        return outcomes.INVALID, ((why + f" ({'; '.join(capture.failures)})") if capture.failures else
                                  why if done >= 2 or done < len(turns) else why + ": no gap to measure",)
    return outcomes.OK, ()


def _paths(group: RunFiles) -> list[Path]:
    return [p for p in (group.csv, group.sidecar, group.log, group.out, group.err, group.route_trace, group.state,
                        group.capture) if p is not None]


def _console(group: RunFiles) -> ConsoleRun | None:
    own = [p for p in (group.out, group.err, group.log) if p is not None]
    return read_console(*own) if own else None


def _section(group: RunFiles, captures: dict[Path, dict[str | None, ConsoleRun]]) -> ConsoleRun | None:
    """The group's run in its capture (the first of that tag), the capture split once per import."""
    if group.capture is None:
        return None
    if group.capture not in captures:
        by_tag: dict[str | None, ConsoleRun] = {}
        for run in read_console_runs(group.capture):
            by_tag.setdefault(run.tag, run)
        captures[group.capture] = by_tag
    return captures[group.capture].get(group.section)


def _config(group: RunFiles, console: ConsoleRun | None, section: ConsoleRun | None, metrics) -> dict[str, Any]:
    """Least to most direct evidence: file name, driver tag, engine log lines, CSV preamble."""
    config: dict[str, Any] = {}
    config.update(config_from_name(group.stem))
    for run in (section, console):
        if run is not None:
            config.update(run.declared_config)
    for run in (section, console):
        if run is not None:
            config.update(config_from_log(run))
    config = _renamed(config)
    if metrics is not None and metrics.preamble:
        pre = metrics.preamble
        for key in _PREAMBLE_KEYS:
            if key in pre:
                value = parse_number(pre[key], pre[key])
                if key in _PREAMBLE_BOOL:
                    value = bool(value)
                if key == "o_direct":
                    config["o_direct_reported"] = int(value)
                    continue
                config["cycle_mb" if key == "cache_cycle_mb" else key] = value
    if "unknown_tokens" in config:
        config["unknown_tokens"] = list(config["unknown_tokens"])
    return config


def _renamed(config: Mapping[str, Any]) -> dict[str, Any]:
    """Parsed keys in the cell vocabulary; the engine's o_direct is what it reported, not asked."""
    out = {_RENAME.get(k, k): v for k, v in config.items()}
    if "o_direct" in out:
        out["o_direct_reported"] = int(bool(out.pop("o_direct")))
    return out


def _model_name(config: Mapping[str, Any], group: RunFiles, metrics) -> str:
    model = config.get("model")
    if isinstance(model, str) and model:
        name = Path(model).name.removesuffix(".gguf")
        return MODEL_ALIASES.get(name, name)
    if group.capture is not None:  # `gptoss-matrix.out`: the driver named its model in the file name
        m = re.match(r"[A-Za-z]+", group.capture.name)
        if m:
            return MODEL_ALIASES.get(m[0].lower(), m[0].lower())
    return "unknown"


def _outcome(console: ConsoleRun | None, section: ConsoleRun | None, metrics,
             config: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    runs = [r for r in (console, section) if r is not None]
    for r in runs:
        if r.config_error or r.arg_error:
            return outcomes.CONFIG_ERROR, ("the engine refused its flags: " + (r.config_error or r.arg_error or ""),)
    for r in runs:
        if r.runtime_error:
            return outcomes.ENGINE_ERROR, (r.runtime_error,)
    finished = (metrics is not None and metrics.summary is not None) or any(r.finished for r in runs)
    if not finished:
        return outcomes.INVALID, ("no summary line and no end-of-run lines: killed or cut short (upstream kept no exit "
                           "status)",)
    if config.get("moe_stream") and config.get("o_direct_reported") == 0 and config.get("o_direct", True):
        return outcomes.INVALID, ("o_direct=0: the engine fell back to buffered expert reads",)
    return outcomes.OK, ()


def _fill_result(result: dict[str, Any], console: ConsoleRun | None, config: Mapping[str, Any]) -> None:
    """Numbers the CSV summary lacks, from the console lines, then from the configuration."""
    if console is not None:
        if result["tok_per_s"] is None and console.generation is not None:
            result["tok_per_s"] = console.generation.tok_per_s
        if result["tokens"] is None and console.generation is not None:
            result["tokens"] = console.generation.tokens
        if result["cache_hit_pct"] is None and console.moe_cache is not None:
            result["cache_hit_pct"] = console.moe_cache.hit_pct
    if result["budget_mib"] is None:
        for key in ("budget_mib", "cache_mb"):
            if isinstance(config.get(key), (int, float)) and config.get("moe_stream", True):
                result["budget_mib"] = config[key]
                break
    if result["cycle_mb"] is None and isinstance(config.get("cache_cycle_mib"), (int, float)):
        result["cycle_mb"] = config["cache_cycle_mib"]


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
        return True
    except (TypeError, ValueError):
        return False


def stored_text(value: Any) -> Any:
    """A string from a file as stored: control characters escaped, at most TEXT_CHARS (lists item
    by item); anything else unchanged."""
    if isinstance(value, str):
        return excerpt(value, TEXT_CHARS)
    if isinstance(value, (list, tuple)):
        return [stored_text(v) for v in value]
    return value
