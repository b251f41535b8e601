"""The tidy run table: one row per run (every attempt) of any number of campaign directories.

A row carries who ran (device identity), what (model, its shape and token cycle, engine version,
every configuration key), what happened (outcome and its evidence), the engine's summary numbers,
the per-token distribution (results.read.tokens), the pressure it ran under (peak RSS, MemAvailable
floor, temperatures), the state it started from, and per-run flags. Budgets are MiB as the engine
reports them (`cache_mb` is the budget the run actually had: the summary's cache_budget_MiB, or
for a run that died first the last per-token budget, or the fixed value asked for).

The token cycle `cache_cycle_mb` comes, in order of preference, from the CSV preamble, from the
GGUF (when the model file is reachable: its models/*.json path, or a path given by the caller),
from the plan's own pricing (`cycle_mb` in the cell config), from the models/*.json prices, and
last from the summary's measured `token_demand_MiB`. `cycle_source` says which.

`run_row` is built from the declaration (results/read/columns.py): one function per group of
columns (`_key`, `_identity`, `_shape`, `_run`, `_summary`, `_lines`, …, `_derived` last, as it
reads the others), each naming its columns through `columns.C`; `run_row` lays their values out
in the declared order and fails when a group gives other columns than it declares.

Long because: it is one row builder, the group functions and the helpers each column's sources
need (the preamble, run.json's parts, the console, the model's shape); the rendering at the end
(render_table and the short columns, some 45 lines) shares none of that and could move to a module
of its own.
"""

from __future__ import annotations

import io
import json
import math
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from engine.contract.claim import release_of
from engine.contract.flags import flags_text
from engine.gguf.model import cycle_price_mib
from engine.interface import outputs as out_table
from engine.interface.releases import Release, reported_as
from engine.units import MIB
from results.errors import ResultsError
from results.numbers import to_float
from results.read.columns import AFTER_CONFIG, FIXED, GROUP_NAMES, C, config_column
from results.read.frames import frame_csv
from results.read.quality import outputs_of, quality_columns, read_ppl
from results.read.run_keys import MMAP, budget_asked, budget_label
from results.read.rundir import CampaignData, RunFolder, read_campaigns
from results.read.tokens import PUBLISHED_MIN_TOKENS, token_stats
from results.read.turns import turn_columns
from store import names, outcomes
from store.cells import CellConfig
from store.ledger import was_attempted
from store.run_record import RunRecord, thawed

# columns every table has, first, in this order (docs/results.md lists them all)
KEY_COLUMNS = GROUP_NAMES["key"]
# the trailer keys the run table takes, from the declared outputs (engine/interface/outputs.py);
# these four are worked out with other sources below (tokens, rates, hit % and budget)
_SUMMARY_OWN = frozenset({"tokens", "tok/s", "cache_hit_pct", "cache_budget_MiB"})
_SUMMARY = {k: v for k, v in out_table.columns(out_table.SUMMARY).items() if k not in _SUMMARY_OWN}
# BMOE_DONE keys that fill a column the trailer left empty (an imported session's last turn)
_DONE = {k: v for k, v in out_table.columns(out_table.DONE).items() if v in set(_SUMMARY.values())}
# the declared stdout/stderr lines' values: {line: {field: column}}
_LINE_COLUMNS = out_table.line_columns()
_TEXT_COLUMNS = frozenset(c for fields in _LINE_COLUMNS.values() for f, c in fields.items()
                          if f in out_table.text_fields())


class ShapeCache:
    """GGUF shapes by path, read once (headers only)."""

    def __init__(self, model_files: Mapping[str, str] | None = None):
        self.model_files = dict(model_files or {})
        self._shapes: dict[str, Any] = {}

    def shape(self, path: str | None):
        """The shape of a GGUF on this host (None when unreachable or not a MoE GGUF)."""
        if not path or not os.path.isfile(path):
            return None
        if path not in self._shapes:
            from engine.errors import ModelError
            from engine.gguf.model import load_model_shape

            try:
                self._shapes[path] = load_model_shape(path)
            except ModelError:
                self._shapes[path] = None
        return self._shapes[path]

    def for_model(self, name: str, record: Mapping[str, Any] | None):
        """A model's shape from the first of its paths that reads."""
        paths = [self.model_files.get(name)]
        if record:
            paths += [record.get("path")] + list(record.get("paths") or ())
        for p in paths:
            s = self.shape(p)
            if s is not None:
                return s
        return None


def _first(*values: Any) -> float:
    for v in values:
        x = to_float(v)
        if not math.isnan(x):
            return x
    return math.nan


def _min(*values: float) -> float:
    xs = [v for v in values if not math.isnan(v)]
    return min(xs) if xs else math.nan


def _max(*values: float) -> float:
    xs = [v for v in values if not math.isnan(v)]
    return max(xs) if xs else math.nan


def _bool(value: Any) -> bool | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip() not in ("", "0", "false", "False")
    return bool(value)


def _read_metrics(run: RunFolder):
    from results.read.parse import ParseError, read_metrics_csv

    path = run.file(names.METRICS_CSV)
    if path is None:
        return None, None
    try:
        return read_metrics_csv(path), None
    except ParseError as e:
        return None, str(e)


def _samples(run: RunFolder) -> pd.DataFrame | None:
    from results.read.parse_csv import read_samples_csv

    path = run.file(names.SAMPLES_CSV)
    if path is None:
        return None
    try:
        frame = read_samples_csv(path)
    except (ValueError, OSError):
        return None
    return frame if len(frame) else None


def _reclaim_columns(reclaim: Mapping[str, Any], tokens: float) -> dict[str, Any]:
    """run.json's `reclaim` (devices/reclaim.py) as run-table columns: the device's swap-in and
    swap-out MiB per generated token (counted over the whole run: load, prefill and decode), the
    engine's VmSwap high and its RssAnon and RssFile low and high, PSI avg10 highs, zram's high,
    and which files the device refused."""
    per_tok = _per_token(tokens)

    def mib(key: str) -> float:
        return to_float(reclaim.get(key)) / 1024

    return {
        C.swap_in_mib_per_tok: mib("swap_in_kb") / per_tok,
        C.swap_out_mib_per_tok: mib("swap_out_kb") / per_tok,
        C.vm_swap_max_mib: mib("vm_swap_max_kb"),
        C.rss_anon_min_mib: mib("rss_anon_min_kb"), C.rss_anon_max_mib: mib("rss_anon_max_kb"),
        C.rss_file_min_mib: mib("rss_file_min_kb"), C.rss_file_max_mib: mib("rss_file_max_kb"),
        C.psi_some_avg10_max: to_float(reclaim.get("psi_some_avg10_max")),
        C.psi_full_avg10_max: to_float(reclaim.get("psi_full_avg10_max")),
        C.zram_used_max_mib: mib("zram_used_max_kb"),
        C.reclaim_refused: " ".join(str(x) for x in reclaim.get("refused") or ()),
        C.reclaim_samples: to_float(reclaim.get("samples")),
    }


def _top_k(config: CellConfig, pre: Mapping[str, str], model_rec: Mapping[str, Any] | None, shape) -> float:
    k = to_float(pre.get("n_expert_used"))
    if not math.isnan(k) and k > 0:
        return k
    k = to_float(config.n_expert_used)
    if not math.isnan(k) and k > 0:
        return k
    for v in ((model_rec or {}).get("top_k"), shape.top_k if shape is not None else None):
        k = to_float(v)
        if not math.isnan(k) and k > 0:
            return k
    return math.nan


def _cycle(pre: Mapping[str, str], summary: Mapping[str, Any], config: CellConfig,
           model_rec: Mapping[str, Any] | None, shape, k: float,
           releases: tuple[Release, Release] | None = None) -> tuple[float, str]:
    v = to_float(pre.get("cache_cycle_mb"))
    if not math.isnan(v):
        # bmoe-py prints one decimal; upstream from 0.21 an integer rounded up (%d of a ceil); the
        # plan priced the same quantity to three
        planned = to_float(config.cycle_mb)
        same = not math.isnan(planned) and abs(planned - v) <= 0.051
        if releases is not None and out_table.cycle_is_rounded_up(releases[0]) and not math.isnan(planned):
            same = same or 0 <= v - planned < 1
        return (planned if same else v), "csv"
    if shape is not None and not math.isnan(k) and k >= 1:
        return cycle_price_mib(shape.cycle_bytes(min(int(k), shape.n_expert))), "gguf"
    v = to_float(config.cycle_mb)
    if not math.isnan(v) and v > 0:
        return v, "plan"
    for price in (model_rec or {}).get("prices") or ():
        if not math.isnan(k) and int(price.get("top_k", -1)) == int(k):
            return float(price["cycle_mib"]), "models-json"
    layers = (model_rec or {}).get("layers")
    if layers and not math.isnan(k):
        n_expert = int((model_rec or {}).get("n_expert") or k)
        return cycle_price_mib(sum(int(x["expert_bytes"]) for x in layers) * min(int(k), n_expert)), "models-json"
    v = to_float(summary.get("token_demand_MiB"))
    if not math.isnan(v) and v > 0:
        return v, "token_demand"
    return math.nan, ""


def _entry(entry: Mapping[str, Any] | None, gate: Mapping[str, Any] | None) -> dict[str, Any]:
    """Entry-state fields from the runner's DeviceState or an imported driver's ENTRY STATE."""
    e = dict(entry or {})
    g = dict(gate or {})
    cpu = to_float(e.get("cpu_temp_mc"))
    if math.isnan(cpu):
        temps = [to_float(v) for v in (e.get("temperatures_c") or {}).values()]
        temps += [to_float(v) / 1000 for v in (e.get("thermal_mc") or {}).values()]
        temps = [t for t in temps if not math.isnan(t)]
        cpu = max(temps) * 1000 if temps else math.nan
    capped = None
    policies = e.get("cpufreq")
    if isinstance(policies, list) and policies:
        capped = any(bool(p.get("capped")) for p in policies)
    elif isinstance(e.get("cpufreq_khz"), dict) and e["cpufreq_khz"]:
        capped = any(to_float(p.get("scaling_max")) < to_float(p.get("hw_max")) for p in e["cpufreq_khz"].values())
    return {
        C.entry_mem_available_kb: to_float(e.get("mem_available_kb")),
        C.entry_cpu_temp_mc: cpu,
        C.entry_battery_temp_dc: _first(e.get("battery_temp_dc"), e.get("batt_temp_dC")),
        C.entry_thermal_status: to_float(e.get("thermal_status")),
        C.entry_freq_capped: capped,
        C.gate_waited_s: _first(g.get("waited_s"), e.get("waited_s")),
        C.gate_gave_up: bool(g.get("gave_up")) if g else False,
        C.gate_reason: str(g.get("reason") or ""),
    }


def _console(run: RunFolder):
    """What the run printed (its stdout and stderr, read as one capture); None when neither was
    kept or the capture does not read."""
    from results.read.parse_console import parse_console
    from results.read.parse_text import NumberError, ParseError, read_lines

    lines: list[str] = []
    for name in (names.STDOUT_TXT, names.STDERR_TXT):
        path = run.file(name)
        if path is not None:
            try:
                lines += read_lines(path)[0]
            except (OSError, ValueError):
                continue
    if not lines:
        return None
    try:
        return parse_console(lines)
    except (ParseError, NumberError, ValueError):
        return None


def release_range(engine_version: str) -> tuple[Release, Release] | None:
    """The bmoe-cli releases a run's engine may be, from the version it reported (`0.19.0` is 0.19
    or the 0.20.0 build that still said 0.19.0), or the one bmoe-py claims; None for bmoe-py at its
    default or an unknown engine."""
    claimed = release_of(engine_version)            # bmoe-py speaking a release (engine.claim)
    if claimed is not None:
        return claimed, claimed
    try:
        return reported_as(engine_version)
    except ValueError:
        return None


def _release_columns(engine_version: str) -> dict[str, Any]:
    """Which releases the engine may be, and what its release-dependent figures mean."""
    span = release_range(engine_version)
    if span is None:
        return {C.engine_release: "", C.engine_release_max: "", C.stall_basis: "", C.o_direct_basis: ""}
    oldest, newest = span
    return {C.engine_release: str(oldest), C.engine_release_max: str(newest),
            C.stall_basis: out_table.stall_basis(oldest, newest),
            C.o_direct_basis: "outcome" if out_table.o_direct_is_outcome(oldest) else "requested"}


def _line_columns(console, row: Mapping[str, Any]) -> dict[str, Any]:
    """The declared lines' values as run-table columns, where the CSV trailer left them empty."""
    out: dict[str, Any] = {}
    for column in dict.fromkeys(c for fields in _LINE_COLUMNS.values() for c in fields.values()):   # table order
        if column not in row:
            out[column] = "" if column in _TEXT_COLUMNS else math.nan
    if console is None:
        return out
    for line, fields in _LINE_COLUMNS.items():
        for field, column in fields.items():
            value = console.value(line, field)
            if value is None:
                continue
            if column in _TEXT_COLUMNS:
                if not (row.get(column) or out.get(column)):
                    out[column] = str(value)
            elif math.isnan(to_float(row.get(column, out.get(column)))):
                out[column] = to_float(value)
    return out


@dataclass
class _Run:
    """What a run's columns are worked out from, read once: its record and files, its campaign's
    device and model records, and the values more than one group of columns needs."""

    camp: CampaignData
    run: RunFolder
    rec: RunRecord
    config: CellConfig
    model_rec: Mapping[str, Any] | None
    pre: dict[str, Any]                 # the metrics CSV's preamble
    summary: dict[str, Any]             # run.json's summary, else the CSV's trailer
    result: dict[str, Any]
    shape: Any                          # the model's GGUF shape, None where unreachable
    k: float                            # the top-k the run applied
    engine_version: str
    cycle: float
    cycle_source: str
    stats: Any                          # results.read.tokens.TokenStats, None without per-token rows
    parse_problem: str | None
    console: Any                        # what the run printed, parsed (None where nothing reads)
    mode: str
    planner: bool
    stream: bool | None
    auto: bool | None
    budget: float
    tokens: float
    tok_s: float


def _facts(camp: CampaignData, run: RunFolder, shapes: ShapeCache) -> _Run:
    rec = run.record
    config = rec.config
    model_rec = camp.models.get(rec.model)
    metrics, parse_problem = _read_metrics(run)
    pre = dict(metrics.preamble) if metrics is not None else {}
    summary = dict(rec.summary or (metrics.summary if metrics is not None and metrics.summary else {}) or {})
    result = dict(rec.result or {})
    shape = shapes.for_model(rec.model, model_rec)
    k = _top_k(config, pre, model_rec, shape)
    engine_version = str(rec.engine.get("version") or pre.get("engine") or "")
    cycle, cycle_source = _cycle(pre, summary, config, model_rec, shape, k, release_range(engine_version))
    rows = metrics.rows if metrics is not None else None
    stats = token_stats(rows) if rows is not None and len(rows) else None

    console = _console(run)
    mode = str(console.value("mode", "mode") or "") if console is not None else ""
    # the engine's planner chose (--auto): what ran is the plan's, never the cell's placeholders
    planner = bool(config.planner or config.extra.get("auto_plan"))
    planned = _plan_of(console) if planner else {}
    stream = None if planner else _bool(config.moe_stream)
    if stream is None and pre.get("moe_stream") is not None:
        stream = _bool(pre.get("moe_stream"))
    if mode:
        # the engine's own word on what ran (after 0.24: `mode: mmap` is a baseline, not this engine)
        stream = mode == "expert streaming"
    if stream is None and planner:
        stream = planned.get("moe_stream")
    auto = _bool(config.cache_auto)
    if auto is None and pre.get("cache_auto") is not None:
        auto = _bool(pre.get("cache_auto"))
    last_budget = math.nan
    if rows is not None and len(rows) and "cache_budget_mib" in rows.columns:
        last_budget = to_float(rows["cache_budget_mib"].iloc[-1])
    fixed = math.nan if auto else _first(pre.get("cache_mb"), planned.get("cache_mb") if planner else config.cache_mb)
    # an auto run killed before its first token has no per-token budget: its stderr said what it sized
    sized = _auto_sized_mib(run, console) if auto and math.isnan(_first(summary.get("cache_budget_MiB"),
                                                               result.get("budget_mib"), last_budget)) else math.nan
    budget = _first(summary.get("cache_budget_MiB"), result.get("budget_mib"), last_budget, sized, fixed)
    if stream is False:
        budget = math.nan                      # no streaming: there is no expert cache at all
    tokens = _first(summary.get("tokens"), result.get("tokens"), stats.tokens if stats else None)
    tok_s = _first(stats.mean_tok_s if stats else None, summary.get("tok/s"), result.get("tok_per_s"))
    return _Run(camp, run, rec, config, model_rec, pre, summary, result, shape, k, engine_version, cycle,
                cycle_source, stats, parse_problem, console, mode, planner, stream, auto, budget, tokens, tok_s)


def _key(f: _Run) -> dict[str, Any]:
    """The key columns: what ran where, how it went, its rate, hit rate, budget and memory."""
    rec, config, pre, stats = f.rec, f.config, f.pre, f.stats
    hit = _first(f.summary.get("cache_hit_pct"), f.result.get("cache_hit_pct"))
    if not math.isnan(hit) and hit < 0:
        hit = math.nan                         # -1: not measured (no cache)
    pressure = dict(rec.pressure)
    samples = _samples(f.run)
    sample_floor = sample_hwm = math.nan
    if samples is not None:
        if "mem_available_kb" in samples.columns:
            sample_floor = to_float(samples["mem_available_kb"].min())
        if "vm_hwm_kb" in samples.columns:
            sample_hwm = to_float(samples["vm_hwm_kb"].max())
    csv_floor_kb = stats.mem_available_min_mib * 1024 if stats else math.nan
    csv_rss_kb = stats.rss_max_mib * 1024 if stats else math.nan
    budget, cycle = f.budget, f.cycle
    under = bool(f.stream is not False and not math.isnan(budget) and budget > 0 and not math.isnan(cycle)
                 and budget < cycle)
    return {
        C.device: rec.device,
        C.model: rec.model,
        C.engine: f.engine_version or str(rec.engine.get("kind") or ""),
        C.cache_mb: budget,
        C.cache_auto: bool(f.auto),
        C.cache_ceil_mb: to_float(config.cache_ceil_mb if config.cache_ceil_mb is not None
                                  else pre.get("cache_ceil_mb")),
        C.dense_weights: str(config.dense_weights or pre.get("dense_weights") or ""),
        C.n_expert_used: f.k,
        C.repeat: rec.repeat,
        C.outcome: rec.outcome,
        C.tokens: f.tokens,
        C.tok_s: f.tok_s,
        C.cache_hit_pct: hit,
        C.cache_cycle_mb: cycle,
        C.under_cycle: under,
        C.mem_avail_floor_kb: _min(to_float(pressure.get("mem_avail_floor_kb")), sample_floor, csv_floor_kb),
        C.peak_rss_kb: _max(to_float(pressure.get("peak_rss_kb")), sample_hwm, csv_rss_kb),
    }


def _identity(f: _Run) -> dict[str, Any]:
    """Which campaign, run, device and engine, and which releases that engine may be."""
    rec, camp, run = f.rec, f.camp, f.run
    identity = camp.devices.get(rec.device) or {}
    return {
        C.campaign: camp.label,
        C.campaign_dir: str(camp.root),
        C.run_id: run.run_id,
        C.run_dir: str(run.path),
        C.cell_id: rec.cell_id,
        C.attempt: rec.attempt,
        C.latest: run.latest,
        C.imported: camp.imported,
        C.device_id: rec.device_id,
        C.device_kind: str(identity.get("kind") or ""),
        C.device_model: str(identity.get("model") or ""),
        C.device_manufacturer: str(identity.get("manufacturer") or ""),
        C.device_soc: str(identity.get("soc") or ""),
        C.android_release: str(identity.get("android_release") or ""),
        C.ram_total_kb: to_float(identity.get("ram_total_kb")),
        C.engine_kind: str(rec.engine.get("kind") or ""),
        C.engine_sha256: str(rec.engine.get("sha256") or ""),
        **_release_columns(f.engine_version),
    }


def _shape(f: _Run) -> dict[str, Any]:
    """The model's shape, where its token cycle came from, and the budget as a person reads it."""
    pre, config, shape, model_rec = f.pre, f.config, f.shape, f.model_rec
    return {
        C.arch: str(pre.get("arch") or config.extra.get("arch") or (shape.arch if shape else "") or
                    (model_rec or {}).get("arch") or ""),
        C.n_layer: _first(pre.get("n_layer"), config.extra.get("n_layer"), shape.n_layer if shape else None,
                          (model_rec or {}).get("n_layer")),
        C.n_expert: _first(pre.get("n_expert"), config.extra.get("n_expert"), shape.n_expert if shape else None,
                           (model_rec or {}).get("n_expert")),
        C.cycle_source: f.cycle_source,
        # the model's own top-k: a run under it is lossy (results.read.quality)
        C.model_top_k: _first((model_rec or {}).get("top_k"), shape.top_k if shape is not None else None,
                              pre.get("n_expert_used") if not config.n_expert_used else None),
        # the most any cache of this model can hold (a budget over it fills at the bank)
        C.expert_bank_mib: _first(shape.expert_bytes / MIB if shape else None,
                                  to_float((model_rec or {}).get("expert_bytes")) / MIB),
        C.expert_entry_mib: _first(shape.widest_expert_bytes / MIB if shape else None,
                                   max((to_float(x.get("expert_bytes")) for x in (model_rec or {}).get("layers") or ()),
                                       default=math.nan) / MIB),
        C.moe_stream: f.stream,
        C.budget_label: _budget_label(f.stream, f.auto, f.budget, config, f.planner),
        C.planner: f.planner,
    }


def _run(f: _Run) -> dict[str, Any]:
    """How the run went (its record) and how it was started."""
    rec, config = f.rec, f.config
    return {
        C.pass_: rec.pass_no,
        C.order: rec.order,
        C.evidence: " | ".join(rec.evidence),
        C.exit_status: to_float(rec.exit_status),
        C.timed_out: rec.timed_out,
        C.wall_s: to_float(rec.wall_s),
        C.killed: rec.outcome in outcomes.KILLS,
        C.infra: rec.outcome in outcomes.INFRA,
        C.started_at: to_float(rec.started_at),
        C.ended_at: to_float(rec.ended_at),
        C.attempted: was_attempted(rec),                          # False: recorded without running
        C.o_direct: to_float(rec.o_direct),
        C.has_route_trace: f.run.file(names.ROUTE_CSV) is not None,
        C.probe: bool(rec.probe or config.probe),   # a knee probe: its trace, not a sweep point
        C.argv: rec.argv,                             # a tuple of str (JSON text where written: columns.as_text)
        C.config: config,                             # the typed config a recommendation builds its argv from
        C.csv_problem: f.parse_problem or "",
    }


def _summary(f: _Run) -> dict[str, Any]:
    """The engine's summary numbers: its CSV trailer, else its last BMOE_DONE line, else the values
    of its stdout and stderr lines; majflt and compute time from the per-token rows, else the
    device's samples."""
    summary, stats, tok_s = f.summary, f.stats, f.tok_s
    out: dict[str, Any] = {C.tok_s_summary: _first(summary.get("tok/s"), f.result.get("tok_per_s"))}
    for key, column in _SUMMARY.items():
        out[column] = to_float(summary.get(key))
    last_done = next((t.get("bmoe_done") for t in reversed(f.rec.turns) if t.get("bmoe_done")), None)
    for key, column in _DONE.items():
        if last_done and math.isnan(out[column]):
            out[column] = to_float(last_done.get(key))
    out.update((c, v) for c, v in _line_columns(f.console, out).items() if c in out)
    out[C.s_per_tok] = _first(summary.get("s/tok"), 1 / tok_s if tok_s and not math.isnan(tok_s) else None)
    if math.isnan(out[C.majflt_per_tok]) and stats is not None:
        out[C.majflt_per_tok] = stats.majflt_per_tok
    if math.isnan(out[C.majflt_per_tok]):
        out[C.majflt_per_tok] = to_float((f.rec.reclaim or {}).get("maj_flt")) / _per_token(f.tokens)
    if math.isnan(out[C.compute_s_per_tok]) and stats is not None:
        out[C.compute_s_per_tok] = stats.compute_ms_mean / 1000
    return out


def _lines(f: _Run, summary: Mapping[str, Any]) -> dict[str, Any]:
    """The declared lines' values the trailer lacks, each worked out from the summary where the run
    did not print it: the rate a speculative run really gave, acceptance, the drop and substitution
    shares, the draft source."""
    row = {**summary, **{c: v for c, v in _line_columns(f.console, summary).items() if c not in summary}}
    if math.isnan(to_float(row.get(C.ppl))):
        # a quality campaign's scoring run with the same flags, beside the run (results.read.quality)
        scored = read_ppl(f.run)
        for field, column in _LINE_COLUMNS.get("ppl", {}).items():
            if field in scored:
                row[column] = to_float(scored[field])
    row[C.mode] = f.mode

    def pct(part: Any, whole: Any) -> float:
        a, b = to_float(part), to_float(whole)
        return 100.0 * a / b if not math.isnan(a) and not math.isnan(b) and b > 0 else math.nan

    if not row[C.spec_source]:
        spec = str(f.pre.get("spec") or "")
        row[C.spec_source] = "" if spec in ("", "off") else spec
    if math.isnan(row[C.spec_accept_pct]):
        row[C.spec_accept_pct] = pct(row[C.spec_accepted], row[C.spec_drafted])
    if math.isnan(row[C.drafted_steps_pct]):
        row[C.drafted_steps_pct] = pct(row[C.drafted_steps], row[C.spec_decodes])
    if math.isnan(row[C.tokens_per_decode]):
        decodes, tokens = to_float(row[C.spec_decodes]), to_float(f.tokens)
        row[C.tokens_per_decode] = tokens / decodes if decodes > 0 and not math.isnan(tokens) else math.nan
    if math.isnan(row[C.effective_tok_s]):
        # decode time plus drafting time, which tok/s leaves out (CHANGELOG 0.19.0); = tok/s when nothing drafted
        per_tok, draft = to_float(row[C.s_per_tok]), to_float(row[C.spec_draft_s_per_tok])
        if not math.isnan(per_tok) and per_tok > 0:
            row[C.effective_tok_s] = 1.0 / (per_tok + (0.0 if math.isnan(draft) else draft))
    if math.isnan(row[C.drop_pct]):
        row[C.drop_pct] = pct(row[C.experts_dropped], row[C.experts_routed])
    if math.isnan(row[C.substituted_pct]):
        row[C.substituted_pct] = pct(row[C.experts_substituted], row[C.experts_reranked])
    return {c: v for c, v in row.items() if c not in summary}


def _per_token(tokens: float) -> float:
    """The divisor of a per-token figure: the tokens generated, NaN when none."""
    return tokens if tokens and not math.isnan(tokens) and tokens > 0 else math.nan


def _distribution(f: _Run) -> dict[str, Any]:
    """The per-token distribution (results.read.tokens); NaN without per-token rows."""
    out: dict[str, Any] = {}
    for field in GROUP_NAMES["distribution"]:
        value = getattr(f.stats, field) if f.stats is not None else None
        out[field] = math.nan if value is None else float(value)
    return out


def _pressure(f: _Run) -> dict[str, Any]:
    """Memory and temperature around the run (the sidecar's), and the state it started from."""
    pressure = dict(f.rec.pressure)
    return {
        C.mem_avail_before_kb: to_float(pressure.get("mem_avail_before_kb")),
        C.mem_avail_after_kb: to_float(pressure.get("mem_avail_after_kb")),
        C.cpu_temp_before_mc: to_float(pressure.get("cpu_temp_before_mC")),
        C.cpu_temp_max_mc: to_float(pressure.get("cpu_temp_max_mC")),
        C.batt_temp_max_dc: to_float(pressure.get("batt_temp_max_dC")),
        **_entry(thawed(f.rec.entry_state), thawed(f.rec.gate)),
    }


def _started(f: _Run) -> dict[str, Any]:
    """How the engine was started, as fixed columns after the configuration keys."""
    config = f.config
    return {
        # from the shell (over adb, or on this host), or as the app
        C.run_as: config.run_as or "shell",
        # the pass-through flags as the command line had them: runs with equal text ran the same flags
        C.engine_flags: flags_text(config.engine_flags),
        C.engine_args: shlex.join(str(a) for a in config.engine_args),
    }


def _apps(f: _Run) -> dict[str, Any]:
    """The other apps open beside it (axes.apps), those lmkd took while the engine ran, and the
    engine as the app."""
    rec = f.rec
    return {
        C.apps: f.config.apps,
        C.apps_lmk_killed: ",".join(a["name"] for a in rec.apps if a.get("lmk_killed")),
        # any other process lmkd killed past its soft level (perceptible or in front) while it ran
        C.others_hard_killed: ",".join(rec.others_hard_killed),
        # over adb: the registered apps lmkd killed while the engine ran (it never considers the engine),
        # and in the app: lmkd's decision replayed with the engine registered (harness/run/app_verdict.py)
        C.collateral: ",".join(f"{c.get('name')} (oom_score_adj {c.get('oom_score_adj')})" for c in rec.collateral),
        **_app_columns(rec.app_verdicts),
    }


def _derived(f: _Run, row: Mapping[str, Any]) -> dict[str, Any]:
    """Columns worked out from the other groups' (`row`): a baseline, MiB read per token, the
    route-ahead and drop settings the preamble printed, and the run's flags."""
    tokens = f.tokens
    return {
        C.baseline: f.stream is False,          # no expert streaming: mmap or resident, a baseline
        C.read_mib_per_tok: row[C.read_mib] / tokens if tokens and not math.isnan(tokens) and tokens > 0
        else math.nan,
        **{key: to_float(f.pre.get(key)) for key in (C.route_ahead, C.drop_cold_frac, C.substitute_lambda)},
        C.flags: ",".join(_flags(row)),
    }


# each group's columns, in the order columns.py declares the groups; `derived` reads the others, so
# it is worked out last (its columns still sit where columns.py puts them)
_GROUPS = (("key", _key), ("identity", _identity), ("shape", _shape), ("run", _run), ("summary", _summary),
           ("reclaim", lambda f: _reclaim_columns(dict(f.rec.reclaim or {}), f.tokens)),
           ("distribution", _distribution), ("pressure", _pressure),
           ("turns", lambda f: turn_columns(f.rec.turns)), ("config", _started), ("apps", _apps),
           ("cpu", lambda f: _cpu(f.rec.cpu)))
_GROUP_SETS = {g: frozenset(names_) for g, names_ in GROUP_NAMES.items()}
_FIXED_NAMES = tuple((c.name, c.group) for c in FIXED)
_AFTER_NAMES = tuple((c.name, c.group) for c in AFTER_CONFIG)


def run_row(camp: CampaignData, run: RunFolder, shapes: ShapeCache) -> dict[str, Any]:
    """One table row for one attempt: each group of columns (results/read/columns.py GROUPS) from
    its own function, laid out in the declared order; the configuration keys between the fixed
    columns and those after them. A group that gives other columns than it declares is an error."""
    f = _facts(camp, run, shapes)
    parts: dict[str, Mapping[str, Any]] = {}
    for group, make in _GROUPS:
        parts[group] = make(f)
        if group == "summary":
            parts["lines"] = _lines(f, parts["summary"])
    parts["derived"] = _derived(f, {c: v for part in parts.values() for c, v in part.items()})
    for group, part in parts.items():
        if part.keys() != _GROUP_SETS[group]:
            raise ResultsError(f"run_row's {group} columns are not the ones results/read/columns.py declares: "
                               f"{sorted(set(part) ^ _GROUP_SETS[group])}")
    row: dict[str, Any] = {name: parts[group][name] for name, group in _FIXED_NAMES}
    # every configuration key (those with a column of their own under another name are renamed)
    for key, value in sorted(f.config.to_dict().items()):
        row[config_column(key, row)] = json.dumps(value) if isinstance(value, (list, dict)) else value
    # after them: a fixed column a configuration key of the same name took the place of keeps that place
    row.update((name, parts[group][name]) for name, group in _AFTER_NAMES)
    return row


# the engine in the app: on top (adj 0), as its foreground service (200); each role's verdict, when and why
APP_ROLES = {"top": (C.app_top, C.app_top_kill_s, C.app_top_reason),
             "service": (C.app_service, C.app_service_kill_s, C.app_service_reason)}


def _app_columns(verdicts: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """The app's replayed verdict per role: `app_top` / `app_service` ("kill", "holds", or "" when the
    run was not replayed: this host, an import, a run recorded before the replay), when and why."""
    out: dict[str, Any] = {}
    by_role = {str(v.get("role")): v for v in verdicts or () if isinstance(v, Mapping)}
    for role, (verdict, kill_s, reason) in APP_ROLES.items():
        v = by_role.get(role)
        replayed = v is not None and int(v.get("samples") or 0) > 0
        out[verdict] = ("kill" if v.get("killed") else "holds") if replayed and v is not None else ""
        out[kill_s] = to_float(v.get("at_s")) if replayed and v is not None else math.nan
        out[reason] = str(v.get("reason") or "") if v is not None else ""
    unevaluated = next((v.get("unevaluated") for v in by_role.values() if v.get("unevaluated")), ())
    out[C.app_unevaluated] = "; ".join(str(u) for u in unevaluated or ())
    return out


def _auto_sized_mib(run: RunFolder, console) -> float:
    """The budget an `auto` run was sized to, from its stderr's `bmoe: cache auto — … → B MiB
    budget` line (both engines print it at load, before anything can be killed): from the run's
    console as _console read it, else from its stderr alone (when its stdout did not read)."""
    from results.read.parse_console import parse_console
    from results.read.parse_text import ParseError, read_lines

    if console is not None and console.cache_auto is not None:
        return to_float(console.cache_auto.budget_mib)
    path = run.file(names.STDERR_TXT)
    if path is None:
        return math.nan
    try:
        found = parse_console(read_lines(path)[0]).cache_auto
    except (ParseError, ValueError, OSError):
        return math.nan
    return to_float(found.budget_mib) if found is not None else math.nan


def _cpu(cpu: Mapping[str, Any] | None) -> dict[str, Any]:
    """The cores a run had and the engines that shared them (harness.run.cpushare); unknown for runs
    recorded before the harness kept them, and for imports."""
    c = dict(cpu or {})
    return {C.cores: to_float(c.get("cores")), C.cpu_threads: to_float(c.get("threads")),
            C.threads_sum: to_float(c.get("threads_sum")), C.oversubscribed: c.get("oversubscribed") is True,
            C.cpu_engines: engines_text(c.get("engines"))}


def engines_text(engines: Sequence[Mapping[str, Any]] | None) -> str:
    """The other engines a run shared its cores with, one phrase each."""
    parts = []
    for e in engines or ():
        threads = f"{e.get('threads')} thread{'s' if e.get('threads') != 1 else ''}"
        if e.get("outside"):
            parts.append(f"pid {e.get('pid')} {e.get('name')} outside the campaign: {threads}")
        else:
            parts.append(f"{e.get('device')} {e.get('cell_id')}: {threads}")
    return "; ".join(parts)


def _plan_of(console) -> dict[str, Any]:
    """What a planner run's plan chose, from its `plan: reproduce with` line: whether it streams and
    its --cache-mb (a run killed before its CSV has only these)."""
    if console is None:
        return {}
    flags = str(console.value("plan-reproduce", "plan_flags") or "")
    if not flags:
        return {}
    out: dict[str, Any] = {"moe_stream": not flags.startswith("#")}
    budget = console.value("plan-reproduce", "plan_cache_mb")
    if budget is not None:
        out["cache_mb"] = budget
    return out


def _budget_label(stream: bool | None, auto: bool | None, budget: float, config: CellConfig,
                  planner: bool = False) -> str:
    """The run's budget_label: what it asked for, and a planner's pick (results.read.run_keys.budget_label)."""
    asked = budget_asked({"planner": planner, "moe_stream": stream, "no_mmap": config.no_mmap, "cache_auto": auto,
                          "cache_mb": budget})
    return budget_label(asked, ceil_mb=config.cache_ceil_mb,
                        chose=(MMAP if stream is False else budget) if planner else None)


def _flags(row: Mapping[str, Any]) -> list[str]:
    flags = []
    if row[C.under_cycle]:
        flags.append("under_cycle")
    tokens = row[C.tokens]
    if row[C.outcome] == outcomes.OK and not math.isnan(tokens) and tokens < PUBLISHED_MIN_TOKENS:
        flags.append("probe")
    if row[C.gate_gave_up]:
        flags.append("gate_gave_up")
    if row[C.entry_freq_capped]:
        flags.append("freq_capped")
    if row[C.moe_stream] and row[C.o_direct] == 0:
        flags.append("o_direct_off")
    if row[C.oversubscribed]:
        flags.append("oversubscribed")
    return flags


def build_table(dirs: Sequence[str | Path] | Sequence[CampaignData],
                model_files: Mapping[str, str] | None = None) -> pd.DataFrame:
    """The run table of campaign directories (paths, or CampaignData already read)."""
    camps = [d for d in dirs if isinstance(d, CampaignData)]
    if not dirs or len(camps) < len(dirs):
        camps = read_campaigns([d for d in dirs if not isinstance(d, CampaignData)])
    shapes = ShapeCache(model_files)
    rows = [run_row(c, r, shapes) for c in camps for r in c.runs]
    if not rows:
        raise ResultsError("no runs in " + ", ".join(str(c.root) for c in camps))
    frame = pd.DataFrame(rows)
    # each run against a lossless run of the same question (results.read.quality)
    frame = quality_columns(frame, outputs_of([(r, r.record.outcome) for c in camps for r in c.runs]))
    rest = [c for c in frame.columns if c not in KEY_COLUMNS]
    frame = frame[list(KEY_COLUMNS) + rest]
    return frame.sort_values([C.campaign, C.device, C.model, C.order, C.attempt],
                             kind="stable").reset_index(drop=True)


# the columns a person reads (text, md); csv, json, jsonl and parquet carry every column
SHORT_COLUMNS = (C.device, C.model, C.engine, C.budget_label, C.dense_weights, C.n_expert_used, C.repeat, C.pass_,
                 C.outcome, C.tokens, C.tok_s, C.cache_hit_pct, C.cache_cycle_mb, C.flags)
# their headers: the column's name but for these
_HEADERS = {C.budget_label: "cache", C.dense_weights: "dense", C.n_expert_used: "k", C.tok_s: "tok/s",
            C.cache_hit_pct: "hit %", C.cache_cycle_mb: "cycle MiB"}
_SHORT_HEADERS = tuple(_HEADERS.get(c, c) for c in SHORT_COLUMNS)
_NUMERIC = (C.n_expert_used, C.repeat, C.pass_, C.tokens, C.tok_s, C.cache_hit_pct, C.cache_cycle_mb)
TABLE_FORMAT = "bmoe-fleet.table"


TABLE_FORMATS = ("text", "csv", "json", "jsonl", "md", "parquet")


def table_what(frame: pd.DataFrame) -> str:
    """What a written table holds, for the line that says where it went."""
    n_camps = frame[C.campaign].nunique()
    return f"{len(frame)} runs of {n_camps} campaign{'s' if n_camps != 1 else ''}"


def render_table(frame: pd.DataFrame, fmt: str) -> str | bytes:
    """The run table as text, csv, json, jsonl, md or parquet (bytes); the CLI writes it."""
    from results import formats
    from results.read.columns import written_frame

    frame = written_frame(frame)       # the config and argv objects as the JSON text files hold
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ResultsError(f"--format parquet: {formats.PARQUET_HINT}, or write .csv instead") from None
        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        return buf.getvalue()
    if fmt == "csv":
        return frame_csv(frame)
    records = frame.to_dict("records")
    if fmt == "json":
        data = formats.to_json({"format": TABLE_FORMAT, "version": 1, "columns": list(frame.columns),
                                "runs": records})
    elif fmt == "jsonl":
        data = formats.to_jsonl(records)
    elif fmt == "md":
        data = formats.to_md(records, SHORT_COLUMNS, _SHORT_HEADERS, _NUMERIC)
    else:
        data = formats.to_text(records, SHORT_COLUMNS, _SHORT_HEADERS, _NUMERIC)
    return data


def parse_model_files(items: Sequence[str]) -> dict[str, str]:
    """`NAME=PATH` pairs (the CLI's --model-file) as a mapping."""
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ResultsError(f"--model-file expects NAME=PATH, got {item!r}")
        out[name] = path
    return out
