"""The run table's columns, declared: name, type, unit, group, meaning and the release each appears in.

The run table (results.read.table `run_row`, `build_table`) is what `table`, `report`,
`recommend` and `compare` read, and what the results database (results/db/) stores. This module
declares it, as llama-bench's `get_fields` / `get_field_type` declare its table: one `Column` per
column, in the order `build_table` gives them. `docs/results.md`'s column list is generated from
it (`bmoe-fleet db columns --md`), and a test holds `build_table` on the suite's campaigns to it
(names, order, each value's type). `run_row` is built from it: one function per group of `GROUPS`
gives that group's columns, and `run_row` lays them out in the order declared here (a group that
gives other columns than this module declares for it fails the row). Code names a column through
`C` (`C.tok_s`), never as a string literal: tests/results/test_column_literals.py holds the reader
packages to that (docs/decisions/column-names.md).

Two kinds of column:

- **fixed** columns every row has, whatever the run (`COLUMNS` without `config_key`);
- **configuration** columns: one per key of the run's `config` object (docs/campaign-dir.md,
  "Cell"), present when some run of the table has that key, sorted by key between the session
  columns and `run_as` (as `run_row` adds them; a key whose name is taken by a fixed column gets
  `config_` before it, or a suffix: `cache_mb_config`). The keys declared are store.cells
  `CellConfig`'s and the ones an import keeps (engine/interface/outputs.py `config=True`, and the
  importer's own); a key no one declared still reaches the table (and the database, inside
  `config`), undeclared. `run_as`, `engine_flags`, `engine_args` and `apps` are fixed columns
  that take a configuration key's place when the first run's config has that key.

Types: `int`, `float` (NaN where unknown), `bool` (`nullable`: None where unknown), `text`,
`json` (text holding a JSON document: a list or an object) and `value` (a configuration value as
run.json has it: a number, text, true/false or null; a list or an object as its JSON text).

Long because: it is a declaration of some 240 columns, one line or two each.
"""

from __future__ import annotations

import json
import keyword
import math
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.interface import outputs as out_table
from results.read import quality as q
from store.cells import CellConfig

# config: a store.cells.CellConfig; args: a command line, a tuple of str. Both are objects in the
# table and JSON text where it is written (written_frame, the results database)
TYPES = ("int", "float", "bool", "text", "json", "value", "config", "args")
RELEASE = "0.1.0"              # bmoe-fleet's release the columns below appeared in (pyproject's version)
ENGINE = "<engine>"            # meaning and unit: the engine output's own (engine/interface/outputs.py)


@dataclass(frozen=True)
class Column:
    """One column of the run table."""

    name: str
    type: str                  # one of TYPES
    unit: str                  # "" when the value has none (text, flags, counts of nothing)
    group: str                 # one of GROUPS
    meaning: str
    since: str = RELEASE       # the bmoe-fleet release the column appears in
    nullable: bool = False     # bool/value: None where unknown (float uses NaN, text "")
    engine_release: str = ""   # an engine output's column: the bmoe-cli release that first writes it ("" older)
    config_key: str = ""       # a configuration column: its key in run.json's config (present when a run has it)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "unit": self.unit, "group": self.group,
                "meaning": self.meaning, "since": self.since, "nullable": self.nullable,
                "engine_release": self.engine_release, "config_key": self.config_key}


GROUPS = {
    "key": "the first columns of every table",
    "identity": "which campaign, run, device and engine",
    "shape": "the model's shape and token cycle",
    "run": "how the run went, and how it was started",
    "summary": "the engine's summary numbers (its CSV trailer, else its BMOE_DONE line)",
    "lines": "values of the engine's stdout and stderr lines, where the trailer left them empty",
    "derived": "worked out from other columns",
    "reclaim": "the device's memory reclaim while the engine ran (run.json's `reclaim`)",
    "distribution": "the per-token distribution (results/read/tokens.py)",
    "pressure": "memory and temperature around the run, and the state it started from",
    "turns": "a session run's turns and the idle gaps between them (results/read/turns.py)",
    "config": "the cell's configuration keys (run.json's `config`)",
    "apps": "the other apps, lmkd, and the engine as the app (phones)",
    "cpu": "the cores the run had and the engines that shared them",
    "quality": "what a run generated, against a lossless run of the same question (results/read/quality.py); "
               "set across the table's runs once they are framed, never stored per run",
}


def _c(name: str, type_: str, unit: str, group: str, meaning: str, **kw: Any) -> Column:
    return Column(name, type_, unit, group, meaning, **kw)


def _e(name: str, type_: str = "float", group: str = "summary") -> Column:
    """A column an engine output fills: meaning, unit and release from its declaration."""
    return Column(name, type_, "", group, ENGINE)


_FIXED: tuple[Column, ...] = (
    # the key columns (results.read.table KEY_COLUMNS), first in every table
    _c("device", "text", "", "key", "the device as the campaign names it (`local`, `virtual:small`, an adb serial's alias)"),
    _c("model", "text", "", "key", "the model as the campaign names it"),
    _c("engine", "text", "", "key", "the engine's version as it reported it (`bmoe-py 0.1.0`, `0.19.0`), else its kind"),
    _c("cache_mb", "float", "MiB", "key", "the expert cache budget the run had: the summary's cache_budget_MiB, else the last "
       "per-token budget, the size auto said, or the fixed value asked; NaN without streaming"),
    _c("cache_auto", "bool", "", "key", "--cache-mb auto"),
    _c("cache_ceil_mb", "float", "MiB", "key", "the cap on auto (--cache-ceil-mb; 0: none)"),
    _c("dense_weights", "text", "", "key", "--dense-weights (anon, mmap, …)"),
    _c("n_expert_used", "float", "count", "key", "the top-k the run applied"),
    _c("repeat", "int", "count", "key", "the cell's repeat number"),
    _c("outcome", "text", "", "key", "ok, lmk_killed, killed, config_error, engine_error, timeout, device_lost, invalid, "
       "push_failed (store/outcomes.py)"),
    _c("tokens", "float", "count", "key", "tokens generated"),
    _c("tok_s", "float", "tok/s", "key", "decode rate: the per-token mean (tokens / Σ wall), else the summary's"),
    _c("cache_hit_pct", "float", "%", "key", "cumulative cache hit rate; NaN where not measured"),
    _c("cache_cycle_mb", "float", "MiB", "key", "one token's worst-case routed expert bytes at the run's top-k "
       "(`cycle_source` says from where)"),
    _c("under_cycle", "bool", "", "key", "streamed, budget > 0 and budget < cycle"),
    _c("mem_avail_floor_kb", "float", "kB", "key", "the lowest MemAvailable: sidecar, samples and the engine's own"),
    _c("peak_rss_kb", "float", "kB", "key", "the engine's highest RSS: sidecar VmHWM, samples and the engine's own"),
    # identity
    _c("campaign", "text", "", "identity", "the campaign's label (its name, or name@folder when two share a name)"),
    _c("campaign_dir", "text", "", "identity", "the campaign directory on this host"),
    _c("run_id", "text", "", "identity", "campaign/cell/attempt: unique over the table"),
    _c("run_dir", "text", "", "identity", "the attempt's folder on this host"),
    _c("cell_id", "text", "", "identity", "the cell (c-… a planned cell, p-… a knee probe)"),
    _c("attempt", "int", "count", "identity", "the attempt number of the cell"),
    _c("latest", "bool", "", "identity", "the cell's latest attempt"),
    _c("imported", "bool", "", "identity", "written by `bmoe-fleet import`"),
    _c("device_id", "text", "", "identity", "the device record's id (devices/<id>.json)"),
    _c("device_kind", "text", "", "identity", "local, virtual or adb"),
    _c("device_model", "text", "", "identity", "ro.product.model"),
    _c("device_manufacturer", "text", "", "identity", "ro.product.manufacturer"),
    _c("device_soc", "text", "", "identity", "ro.soc.model"),
    _c("android_release", "text", "", "identity", "ro.build.version.release"),
    _c("ram_total_kb", "float", "kB", "identity", "MemTotal"),
    _c("engine_kind", "text", "", "identity", "python (bmoe-py) or native (bmoe-cli)"),
    _c("engine_sha256", "text", "", "identity", "the engine binary's sha256, when recorded"),
    # shape
    _c("arch", "text", "", "shape", "the model's architecture"),
    _c("n_layer", "float", "count", "shape", "the model's blocks"),
    _c("n_expert", "float", "count", "shape", "experts per MoE layer"),
    _c("cycle_source", "text", "", "shape", "where cache_cycle_mb came from: csv, gguf, plan, models-json, token_demand"),
    _c("model_top_k", "float", "count", "shape", "the model's own top-k (its GGUF header or model record)"),
    _c("expert_bank_mib", "float", "MiB", "shape", "every expert of the model: the most any cache can hold"),
    _c("expert_entry_mib", "float", "MiB", "shape", "the widest single expert entry"),
    _c("moe_stream", "bool", "", "shape", "experts streamed (False: mmap or resident, a baseline); None where unknown",
       nullable=True),
    _c("budget_label", "text", "", "shape", "the budget as a person reads it, as results.read.run_keys.budget_label spells it"),
    _c("planner", "bool", "", "shape", "the engine's planner chose the budget (--auto)"),
    # run
    _c("pass", "int", "count", "run", "the pass (0 forward, 1 reverse)"),
    _c("order", "int", "count", "run", "the cell's position in its device's run sequence"),
    _c("evidence", "text", "", "run", "why the outcome, its lines joined by ` | `"),
    _c("exit_status", "float", "", "run", "the engine's exit status"),
    _c("timed_out", "bool", "", "run", "the run hit its timeout"),
    _c("wall_s", "float", "s", "run", "the run's wall time"),
    _c("killed", "bool", "", "run", "lmk_killed or killed"),
    _c("infra", "bool", "", "run", "an infrastructure outcome (device_lost, push_failed)"),
    _c("started_at", "float", "s", "run", "Unix time the run started"),
    _c("ended_at", "float", "s", "run", "Unix time the run ended"),
    _c("attempted", "bool", "", "run", "False: recorded without running the engine (store.ledger.was_attempted)"),
    _c("o_direct", "float", "", "run", "run.json's o_direct: 1 expert reads bypassed the page cache (`o_direct_basis`)"),
    _c("has_route_trace", "bool", "", "run", "the run left a route trace (route.csv)"),
    _c("probe", "bool", "", "run", "a knee probe's route-trace run, not a sweep point"),
    _c("argv", "args", "", "run", "the command line (a tuple of str; a JSON list where written)"),
    _c("config", "config", "", "run", "run.json's typed configuration (a CellConfig; a JSON object where written): a "
       "recommendation's argv is built from it"),
    _c("csv_problem", "text", "", "run", "why the metrics CSV did not read, or empty"),
    # summary (the trailer's keys, engine/interface/outputs.py)
    _c("s_per_tok", "float", "s/token", "summary", "decode seconds per token: the summary's s/tok, else 1 / tok_s"),
    _c("tok_s_summary", "float", "tok/s", "summary", "the summary's own tok/s (else run.json's result)"),
    _e("read_mib"), _e("compute_s_per_tok"), _e("io_s_per_tok"), _e("n_prompt"), _e("load_s"), _e("prefill_s"),
    _e("stall_s_per_tok"), _e("mgmt_s_per_tok"), _e("cache_resident_mib"),
    _c("majflt_per_tok", "float", "count/token", "summary", "major faults per token: the engine's, else the "
       "device's sampled ones (run.json's reclaim)"),
    _e("cpu_s_per_tok"), _e("token_demand_mib"), _e("layer_demand_mib"), _e("experts_routed"),
    _e("experts_dropped"), _e("experts_reranked"), _e("experts_substituted"), _e("loop_overhead_s_per_tok"),
    _e("spec_drafted"), _e("spec_accepted"), _e("spec_decodes"), _e("spec_draft_s_per_tok"), _e("drafted_steps"),
    _e("ra_committed"), _e("ra_passthrough"), _e("ra_agree_pct"), _e("evictions"), _e("rereads"),
    _e("prefill_cpu_s"), _e("prefill_read_mib"), _e("prefill_io_s"), _e("prefill_stall_s"), _e("prefill_mgmt_s"),
    _e("row_table_mib"), _e("row_resident_mib"), _e("row_rows"), _e("row_reads"), _e("row_read_mib"),
    _e("row_evictions"), _e("row_io_errors"),
    # the declared stdout/stderr lines' values the trailer lacks
    _e("plan_predicted_s_per_tok", group="lines"), _e("plan_measured_s_per_tok", group="lines"),
    _e("plan_error_pct", group="lines"), _e("plan_credited_hit_pct", group="lines"),
    _c("spec_source", "text", "", "lines", "the draft source of a speculative run (mtp, ngram), else empty"),
    _c("spec_accept_pct", "float", "%", "lines", "drafts accepted: the engine's line, else accepted / drafted"),
    _c("tokens_per_decode", "float", "x", "lines", "tokens per verify decode: the engine's line, else tokens / decodes"),
    _c("effective_tok_s", "float", "tok/s", "lines", "the rate with drafting included: the engine's line, else "
       "1 / (s_per_tok + spec_draft_s_per_tok)"),
    _c("drafted_steps_pct", "float", "%", "lines", "verify decodes that had a draft: the engine's line, else "
       "drafted_steps / spec_decodes"),
    _e("mtp_head_read_mib", group="lines"),
    _e("mode", "text", "lines"), _e("mode_cache", "text", "lines"),
    _e("drain_s_per_tok", group="lines"), _e("adopt_s_per_tok", group="lines"),
    _c("drop_pct", "float", "%", "lines", "routed slots --drop-cold-experts discarded: the line's, else dropped / routed"),
    _e("drop_threshold", group="lines"),
    _c("substituted_pct", "float", "%", "lines", "examined slots --expert-substitute sent to a resident expert: the "
       "line's, else substituted / reranked"),
    _e("ra_gemv_ms_per_tok", group="lines"), _e("ra_issue_ms_per_tok", group="lines"),
    _e("ra_wd_ms_per_tok", group="lines"),
    _e("ppl", group="lines"), _e("ppl_nll", group="lines"), _e("ppl_scored", group="lines"),
    _e("ppl_hit_pct", group="lines"),
    _e("plan_flags", "text", "lines"), _e("plan_cache_mb", group="lines"), _e("plan_regime", "text", "lines"),
    _e("plan_cost_ms_per_tok", group="lines"), _e("plan_declined", "text", "lines"), _e("plan_lines", group="lines"),
    # what the engine's reported version means
    _c("engine_release", "text", "", "identity", "the oldest bmoe-cli release the engine may be (empty: bmoe-py at "
       "its default, or unknown)"),
    _c("engine_release_max", "text", "", "identity", "the newest it may be (0.19.0 builds include 0.20.0's)"),
    _c("stall_basis", "text", "", "identity", "what stall_s_per_tok measures for that release"),
    _c("o_direct_basis", "text", "", "identity", "what o_direct says: `outcome` (0.24 on) or `requested`"),
    _c("baseline", "bool", "", "derived", "no expert streaming: an mmap or resident baseline"),
    _c("read_mib_per_tok", "float", "MiB/token", "derived", "read_mib / tokens"),
    # reclaim (devices/reclaim.py)
    _c("swap_in_mib_per_tok", "float", "MiB/token", "reclaim", "the device's pswpin over the whole run per token"),
    _c("swap_out_mib_per_tok", "float", "MiB/token", "reclaim", "the device's pswpout over the whole run per token"),
    _c("vm_swap_max_mib", "float", "MiB", "reclaim", "the engine's VmSwap high"),
    _c("rss_anon_min_mib", "float", "MiB", "reclaim", "the engine's RssAnon low"),
    _c("rss_anon_max_mib", "float", "MiB", "reclaim", "the engine's RssAnon high"),
    _c("rss_file_min_mib", "float", "MiB", "reclaim", "the engine's RssFile low"),
    _c("rss_file_max_mib", "float", "MiB", "reclaim", "the engine's RssFile high"),
    _c("psi_some_avg10_max", "float", "%", "reclaim", "memory PSI some avg10, highest"),
    _c("psi_full_avg10_max", "float", "%", "reclaim", "memory PSI full avg10, highest"),
    _c("zram_used_max_mib", "float", "MiB", "reclaim", "zram's used memory, highest"),
    _c("reclaim_refused", "text", "", "reclaim", "the files the device would not let the shell read, space-separated"),
    _c("reclaim_samples", "float", "count", "reclaim", "how many samples these came from"),
    # the per-token distribution (results/read/tokens.py, as upstream's bench-analyze.py)
    _c("mean_tok_s", "float", "tok/s", "distribution", "tokens / Σ wall_ms"),
    _c("median_tok_s", "float", "tok/s", "distribution", "median per-token rate"),
    _c("p5_tok_s", "float", "tok/s", "distribution", "5th percentile per-token rate"),
    _c("p95_tok_s", "float", "tok/s", "distribution", "95th percentile per-token rate"),
    _c("min_tok_s", "float", "tok/s", "distribution", "1000 / the slowest token's wall_ms"),
    _c("max_tok_s", "float", "tok/s", "distribution", "1000 / the fastest token's wall_ms"),
    _c("steady_from_step", "float", "count", "distribution", "the step the steady state starts at (runs of 16+ tokens)"),
    _c("steady_tokens", "float", "count", "distribution", "tokens in the steady state"),
    _c("steady_mean_tok_s", "float", "tok/s", "distribution", "the steady state's mean rate"),
    _c("wall_ms_mean", "float", "ms", "distribution", "mean per-token wall time"),
    _c("io_ms_mean", "float", "ms", "distribution", "mean per-token read time"),
    _c("compute_ms_mean", "float", "ms", "distribution", "mean per-token compute time"),
    _c("mgmt_ms_mean", "float", "ms", "distribution", "mean per-token cache management time"),
    # pressure and entry state
    _c("mem_avail_before_kb", "float", "kB", "pressure", "MemAvailable before the run (the sidecar's)"),
    _c("mem_avail_after_kb", "float", "kB", "pressure", "MemAvailable after the run"),
    _c("cpu_temp_before_mc", "float", "m°C", "pressure", "CPU temperature before the run"),
    _c("cpu_temp_max_mc", "float", "m°C", "pressure", "CPU temperature, highest during the run"),
    _c("batt_temp_max_dc", "float", "d°C", "pressure", "battery temperature, highest during the run"),
    _e("route_ahead", group="derived"), _e("drop_cold_frac", group="derived"),
    _e("substitute_lambda", group="derived"),
    _c("entry_mem_available_kb", "float", "kB", "pressure", "MemAvailable when the run started"),
    _c("entry_cpu_temp_mc", "float", "m°C", "pressure", "the hottest CPU zone when the run started"),
    _c("entry_battery_temp_dc", "float", "d°C", "pressure", "battery temperature when the run started"),
    _c("entry_thermal_status", "float", "", "pressure", "Android's thermal status when the run started"),
    _c("entry_freq_capped", "bool", "", "pressure", "a cpufreq policy under its hardware maximum at entry; None "
       "where unknown", nullable=True),
    _c("gate_waited_s", "float", "s", "pressure", "how long the gate waited for the device to cool and free memory"),
    _c("gate_gave_up", "bool", "", "pressure", "the gate gave up waiting"),
    _c("gate_reason", "text", "", "pressure", "what the gate waited for"),
    # a session run's turns (results/read/turns.py; NaN and empty for a one-shot run)
    _c("turns", "float", "count", "turns", "the session's turns"),
    _c("turn_hit_pct", "json", "%", "turns", "the engine's cumulative hit % at each turn's end, a JSON list"),
    _c("turn_demand_hit_pct", "json", "%", "turns", "each turn's own hit % by bytes, a JSON list"),
    _c("turn_read_mib", "json", "MiB", "turns", "each turn's flash read, a JSON list"),
    _c("turn_s_per_tok", "json", "s/token", "turns", "each turn's decode s/token, a JSON list"),
    _c("turn_majflt_per_tok", "json", "count/token", "turns", "each turn's major faults per token, a JSON list"),
    _c("gap_reread_mib", "float", "MiB", "turns", "the most a turn after a gap read above the warm need"),
    _c("gap_vm_swap_max_mib", "float", "MiB", "turns", "the engine's VmSwap high over the gaps"),
    _c("gap_rss_file_min_mib", "float", "MiB", "turns", "the engine's RssFile low over the gaps"),
    _c("gap_vm_rss_min_mib", "float", "MiB", "turns", "the engine's VmRSS low over the gaps"),
    _c("gap_taken", "text", "", "turns", "why its cache counts as taken in a gap, or empty"),
)

# after the configuration columns
_AFTER_CONFIG: tuple[Column, ...] = (
    _c("run_as", "text", "", "config", "how the engine was started: shell (over adb or on this host), app-service, "
       "app-top"),
    _c("engine_flags", "text", "", "config", "the cell's [axes.flags] setting as one canonical command-line string"),
    _c("engine_args", "text", "", "config", "run.engine_args, shell-joined"),
    _c("apps", "text", "", "apps", "the other apps open beside it (axes.apps)"),
    _c("apps_lmk_killed", "text", "", "apps", "those apps lmkd took while the engine ran, comma-separated"),
    _c("others_hard_killed", "text", "", "apps", "other processes lmkd killed past its soft level while it ran"),
    _c("collateral", "text", "", "apps", "registered apps lmkd killed while the engine ran: NAME (oom_score_adj N), …"),
    _c("app_top", "text", "", "apps", "lmkd's decision replayed with the engine as the app on top: kill, holds, or empty"),
    _c("app_top_kill_s", "float", "s", "apps", "when that replay killed it"),
    _c("app_top_reason", "text", "", "apps", "lmkd's reason"),
    _c("app_service", "text", "", "apps", "the same with the engine as the app's foreground service (adj 200)"),
    _c("app_service_kill_s", "float", "s", "apps", "when that replay killed it"),
    _c("app_service_reason", "text", "", "apps", "lmkd's reason"),
    _c("app_unevaluated", "text", "", "apps", "the lmkd rules whose input the phone withheld"),
    _c("cores", "float", "count", "cpu", "the cores the run had"),
    _c("cpu_threads", "float", "count", "cpu", "this engine's compute threads"),
    _c("threads_sum", "float", "count", "cpu", "compute threads of every engine on those cores"),
    _c("oversubscribed", "bool", "", "cpu", "more threads than cores"),
    _c("cpu_engines", "text", "", "cpu", "the other engines on the same cores, one phrase each"),
    _c("flags", "text", "", "derived", "under_cycle, probe, gate_gave_up, freq_capped, o_direct_off, oversubscribed"),
)

# every configuration key declared: (key, type, unit, meaning); the column name comes from `config_column`
_CONFIG_KEYS: tuple[tuple[str, str, str, str], ...] = (
    # store.cells.CellConfig's fields (docs/campaign-dir.md, "Cell")
    ("moe_stream", "bool", "", "--moe-stream asked (False: mmap or resident)"),
    ("no_mmap", "bool", "", "the resident baseline (--no-mmap)"),
    ("cache_mb", "float", "MiB", "--cache-mb asked (null for a knee cell in the plan)"),
    ("cache_auto", "bool", "", "--cache-mb auto asked"),
    ("cache_ceil_mb", "float", "MiB", "--cache-ceil-mb asked"),
    ("cache_floor_mb", "float", "MiB", "--cache-floor-mb: RAM auto leaves free"),
    ("force_cache", "bool", "", "the cache forced on at a budget the engine would refuse"),
    ("force_cache_auto", "bool", "", "the harness forced the cache on (a budget in 1..1499)"),
    ("dense_weights", "text", "", "--dense-weights asked"),
    ("n_expert_used", "int", "count", "the top-k the cell applies"),
    ("io_threads", "int", "count", "--io-threads (read lanes)"),
    ("threads", "value", "count", "-t: the number that ran (`auto` in a plan)"),
    ("n_predict", "int", "count", "-n: tokens asked"),
    ("prompt", "text", "", "the prompt"),
    ("o_direct", "bool", "", "O_DIRECT asked"),
    ("route_trace", "bool", "", "--route-trace asked"),
    ("budget_spec", "text", "", "the budget axis value as written (`cycle*1.2`, `knee*1`, `mmap`, …)"),
    ("cycle_mb", "float", "MiB", "the token cycle as planned"),
    ("engine_args", "json", "", "run.engine_args"),
    ("engine_flags", "json", "", "the [axes.flags] setting"),
    ("apps", "text", "", "[axes] apps"),
    ("turns", "int", "count", "run.turns of a session cell"),
    ("idle_s", "float", "s", "run.idle_s between its turns"),
    ("gap_apps", "text", "", "run.gap_apps, allocating in each gap"),
    ("run_as", "text", "", "[axes] run_as"),
    ("probe", "bool", "", "a knee probe's route-trace run"),
    ("knee_mb", "float", "MiB", "a knee cell's knee, from its probe"),
    ("probe_cell_id", "text", "", "that probe's cell"),
    ("threads_auto", "bool", "", "-t auto resolved on the device"),
    ("planner", "bool", "", "the engine's planner picks the budget (--auto)"),
    # what an import keeps as configuration (engine/interface/outputs.py config=True, harness/importer.py)
    ("model", "text", "", "the -m path as the imported run gave it"),
    ("arch", "value", "", "the model's architecture, as the imported run printed it"),
    ("n_layer", "value", "count", "the model's blocks, as printed"),
    ("n_expert", "value", "count", "experts per MoE layer, as printed"),
    ("n_ctx", "value", "count", "context size (-c)"),
    ("cache_cycle_mb", "value", "MiB", "the token cycle the imported run printed"),
    ("overlap", "value", "", "reads overlapped with compute"),
    ("prefetch", "value", "count", "the prefetch depth"),
    ("source", "text", "", "the upstream file the run was imported from"),
    ("spec_gate", "value", "", "a speculation gate was on"),
    ("budget_mib", "value", "MiB", "the budget the imported run reported"),
    ("budget_cap_mib", "value", "MiB", "auto's cap, as reported"),
    ("cache_capped", "value", "", "auto's budget was capped"),
    ("o_direct_reported", "value", "", "O_DIRECT as the imported run reported it"),
    ("model_path", "value", "", "the model path the imported run printed"),
    ("progress", "value", "", "the run printed progress lines"),
    ("shards", "value", "count", "the model's shard files"),
    ("auto_plan", "value", "", "the imported command line had --auto"),
)

# config keys with a column of their own under another name (results.read.table _CONFIG_RENAMES)
CONFIG_RENAMES = {"cache_mb": "cache_mb_config", "n_expert_used": "n_expert_used_config",
                  "cycle_mb": "cycle_mb_config", "model": "model_config", "repeat": "repeat_config"}
# the fixed columns a configuration key of the same name takes the place of
CONFIG_TAKES_PLACE = frozenset({"run_as", "engine_flags", "engine_args", "apps"})


def config_column(key: str, taken: Container[str]) -> str:
    """The column a configuration key lands in, given the columns the row has before it."""
    column = CONFIG_RENAMES.get(key, key)
    return f"config_{key}" if column in taken else column


def _engine_meanings() -> dict[str, tuple[str, str, str]]:
    """{column: (meaning, unit, release)} of the engine's declared outputs (the trailer first)."""
    out: dict[str, tuple[str, str, str]] = {}
    for o in out_table.OUTPUTS:
        since = str(o.since) if o.since is not None else ""
        if o.column and o.place in (out_table.PREAMBLE, out_table.SUMMARY):
            out.setdefault(o.column, (o.meaning, o.unit, since))
        for f in o.fields:
            if f.column:
                out.setdefault(f.column, (f"{o.meaning} (its `{o.prefix}` line)", f.unit, since))
    return out


def _resolved(columns: Sequence[Column]) -> tuple[Column, ...]:
    meanings = _engine_meanings()
    out = []
    for c in columns:
        if c.meaning == ENGINE:
            meaning, unit, since = meanings[c.name]
            c = Column(c.name, c.type, "" if unit in ("text", "bool") else unit, c.group, meaning,
                       engine_release=since)
        out.append(c)
    return tuple(out)


FIXED: tuple[Column, ...] = _resolved(_FIXED)
AFTER_CONFIG: tuple[Column, ...] = _resolved(_AFTER_CONFIG)
_BEFORE = {c.name for c in FIXED}
CONFIG: tuple[Column, ...] = tuple(
    Column(config_column(key, _BEFORE), type_, unit, "config", meaning,
           nullable=True, config_key=key)
    for key, type_, unit, meaning in sorted(_CONFIG_KEYS) if key not in CONFIG_TAKES_PLACE)
# the quality columns (results.read.quality names them): a run against its reference, which may be any run
# of the table, so they are added once the rows are framed (a database keeps each run's output instead)
_QUALITY_TYPES = {q.LOSSY_LEVERS: ("text", "", "the lossy levers the run pulled, in words (empty: lossless)"),
                  q.OUTPUT_TOKENS: ("float", "count", "its --progress decode steps"),
                  q.QUALITY_REF_CELL: ("text", "", "the lossless reference's cell id"),
                  q.QUALITY_REF_RUN: ("text", "", "the lossless reference's run id"),
                  q.QUALITY_REF_CONFLICT: ("text", "", "lossless runs of the same question whose output differs"),
                  q.AGREE_TOKENS: ("float", "count", "tokens equal to the reference's before the first that differs"),
                  q.AGREE_FRAC: ("float", "fraction", "agree_tokens over the longer output's tokens"),
                  q.AGREE_IDENTICAL: ("bool", "", "the whole output identical to the reference's"),
                  q.PPL_LOSS_PCT: ("float", "%", "100 x (ppl / the reference's ppl - 1)")}
QUALITY: tuple[Column, ...] = tuple(
    Column(name, *_QUALITY_TYPES[name][:2], "quality", _QUALITY_TYPES[name][2],
           nullable=name == q.AGREE_IDENTICAL) for name in q.COLUMNS)
# every declared column in table order; those a run's own files give (what a database stores per run)
COLUMNS: tuple[Column, ...] = FIXED + CONFIG + AFTER_CONFIG + QUALITY
STORED: tuple[Column, ...] = FIXED + CONFIG + AFTER_CONFIG
BY_NAME: Mapping[str, Column] = {c.name: c for c in COLUMNS}


GROUP_NAMES: Mapping[str, tuple[str, ...]] = {
    g: tuple(c.name for c in FIXED + AFTER_CONFIG if c.group == g) for g in GROUPS}
"""Each group's fixed columns (not the configuration keys' nor the quality columns), in table order."""


class Names:
    """The run table's columns by name, for code: `C.tok_s` is "tok_s" for every declared column
    (a Python keyword with `_` after it: `C.pass_` is "pass"); any other name is an AttributeError.
    mypy types every attribute as str; tests/results/test_column_literals.py reads every `C.<name>`
    of the tree and fails on an undeclared one, so a misspelt column fails in CI, not on a rare path."""

    __slots__ = ()

    def __getattr__(self, name: str) -> str:
        column = name[:-1] if name.endswith("_") and keyword.iskeyword(name[:-1]) else name
        if column in BY_NAME:
            return column
        raise AttributeError(f"{name!r} is no column of the run table (results/read/columns.py)")


# every declared column a class attribute, so `C.tok_s` is an ordinary attribute read (a run page
# reads some 25, and 10,000 pages called __getattr__ half a million times); __getattr__ answers the rest
for _column in COLUMNS:
    setattr(Names, _column.name + "_" if keyword.iskeyword(_column.name) else _column.name, _column.name)
del _column
C = Names()


def get_fields() -> list[str]:
    """The declared column names, in table order (llama-bench's get_fields)."""
    return [c.name for c in COLUMNS]


def get_field_type(name: str) -> str:
    """A declared column's type (llama-bench's get_field_type); KeyError for an undeclared one."""
    return BY_NAME[name].type


def expected_columns(config_keys: Iterable[Iterable[str]]) -> list[str]:
    """The columns `build_table` gives for runs whose configs have these keys, in their order (the
    first run's keys first; keys a later run adds, at the end, as pandas adds them)."""
    order: dict[str, None] = {}
    for keys in config_keys:
        row: dict[str, None] = dict.fromkeys(c.name for c in FIXED)
        for key in sorted(keys):
            row[config_column(key, row)] = None
        row.update(dict.fromkeys(c.name for c in AFTER_CONFIG))
        order.update(row)
    order.update(dict.fromkeys(c.name for c in QUALITY))
    return list(order)


def type_problem(column: Column, value: Any) -> str | None:
    """Why `value` does not fit the column's declared type, or None when it does (a configuration
    column is NaN in the table where a run's config lacks its key)."""
    if column.nullable and value is None:
        return None
    if column.config_key and isinstance(value, float) and math.isnan(value):
        return None
    t = column.type
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": (isinstance(value, float) or (column.config_key != "" and isinstance(value, int)
                                                and not isinstance(value, bool))),
        "bool": isinstance(value, bool),
        "text": isinstance(value, str),
        "json": isinstance(value, str) and _is_json_document(value, column.config_key == ""),
        "value": value is None or isinstance(value, (str, int, float, bool)),
        "config": isinstance(value, CellConfig),
        "args": isinstance(value, tuple) and all(isinstance(a, str) for a in value),
    }[t]
    if ok:
        return None
    return f"{column.name}: {type(value).__name__} {value!r} is not {t}"


def as_text(column: Column, value: Any) -> Any:
    """A table value as files and the results database hold it: a config as its JSON object's text,
    a command line as a JSON list's text (what the table held before it kept the objects); any
    other value as it is."""
    if column.type == "config" and isinstance(value, CellConfig):
        return json.dumps(value.to_dict())
    if column.type == "args" and isinstance(value, tuple):
        return json.dumps(list(value))
    return value


def from_text(column: Column, text: Any) -> Any:
    """as_text's text back as the table's object (an empty or absent text: an empty one)."""
    if column.type == "config":
        doc = json.loads(text) if isinstance(text, str) and text else {}
        return CellConfig.from_dict(doc if isinstance(doc, dict) else {})
    if column.type == "args":
        doc = json.loads(text) if isinstance(text, str) and text else []
        return tuple(str(a) for a in doc) if isinstance(doc, list) else ()
    return text


OBJECT_TYPES = ("config", "args")


def written_frame(frame: Any) -> Any:
    """The run table (a DataFrame) as its written formats carry it: its object columns as text
    (as_text); the frame itself is left as it is."""
    objects = [c for c in frame.columns if c in BY_NAME and BY_NAME[c].type in OBJECT_TYPES]
    if not objects:
        return frame
    out = frame.copy()
    for name in objects:
        out[name] = [as_text(BY_NAME[name], v) for v in frame[name]]
    return out


def _is_json_document(text: str, empty_ok: bool) -> bool:
    if text == "" and empty_ok:
        return True                   # a one-shot run's turn lists, a config's missing list
    try:
        return isinstance(json.loads(text), (list, dict))
    except ValueError:
        return False


def iter_markdown() -> Iterator[str]:
    """The declared columns as Markdown, group by group (docs/results.md's column list)."""
    yield "| column | type | unit | meaning |"
    yield "|---|---|---|---|"
    for c in COLUMNS:
        kind = c.type + (" or null" if c.nullable and c.type != "value" else "")
        meaning = c.meaning + (f" (bmoe-cli {c.engine_release} on)" if c.engine_release else "")
        if c.config_key:
            meaning = f"config `{c.config_key}`: {meaning}"
        yield f"| `{c.name}` | {kind} | {c.unit} | {meaning.replace('|', chr(92) + '|')} |"


DOC_START = "<!-- the run table's columns: made by `bmoe-fleet db columns --update FILE` from results/read/columns.py -->"
DOC_END = "<!-- end of the run table's columns -->"


def updated_doc(text: str) -> str:
    """A document with the block between DOC_START and DOC_END made from the declaration."""
    if text.count(DOC_START) != 1 or text.count(DOC_END) != 1 or text.index(DOC_START) > text.index(DOC_END):
        raise ValueError(f"the document has no single block between {DOC_START!r} and {DOC_END!r}")
    head, rest = text.split(DOC_START, 1)
    _, tail = rest.split(DOC_END, 1)
    return head + DOC_START + "\n\n" + "\n".join(iter_markdown()) + "\n\n" + DOC_END + tail


def is_missing(value: Any) -> bool:
    """NaN, None: a float column's or a nullable column's unknown."""
    return value is None or (isinstance(value, float) and math.isnan(value))
