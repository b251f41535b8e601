"""Read bmoe-cli console captures (`.log`, `.out`, `.err`) into structured end-of-run values.

A capture is whatever a driver kept: the prompt and the generated text (raw bytes included), the
end-of-run stdout block (`generation:`, `compute:`, `prefill:`, `moe-stream:`, `moe-cache:`,
`moe-overlap:`, `moe-prefetch:`, `moe-spec-gate:`), stderr's `bmoe:` load lines and errors,
`--progress` `BMOE_*` JSON lines, llama.cpp's load log, and in upstream's bench logs the
`bench-run.sh` pressure lines (`peak_rss_kb=…`) and a cooling gate's `ENTRY STATE:` line.
Older builds print fewer terms (no `cache mgmt`, no `shards=`, `(auto, resized N×)`): every
variant in the upstream data parses, and each field is None when its line is absent.

Stdout lines are matched at the start of a line. Stderr lines are searched anywhere in a line,
because a capture that merged both streams can glue a `bmoe:` line to generated text that ended
without a newline. A line that starts like a known end-of-run line but does not match its shape is
kept in `unparsed` rather than dropped, so a new engine variant shows up instead of vanishing.

Numbers are range-checked as they are read (results.read.parse_values): a numeral no engine prints is
refused with the file, line and line kind (too large; or in digits no engine prints, `١٢`, `1_0`,
anywhere in an engine's line, even where its shape would still match without that number);
nan/inf and impossible values (a negative time, a hit rate over 100 %, a bool, a part over its
whole) become None, and `notes` says which.

The judgements other modules make of a run from its lines (harness.run.classify: did O_DIRECT hold,
was the command line taken or refused; harness.campaign.engine_probe: why a flag was refused;
results.analysis.community: did it stream) are functions here too (`o_direct_seen`, `accepted_line`,
`is_refusal`, `is_error`, `says_why`, `streamed`), built from the same line starts as the shapes,
so an engine line is matched in this module alone (tests/test_engine_lines.py).

Long because: it is one reader of one capture format, its line shapes declared as tables read top
to bottom and the loop that applies them; the multi-run split at the end finds where a run starts
with the same private shapes (`_match`, `_STDERR`, PERF_PREFIXES), the judgements share the shapes'
line starts, and the records it fills already live in results.read.console_records.
"""

from __future__ import annotations

import bisect
import functools
import json
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields as dataclass_fields
from dataclasses import is_dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from engine.interface import outputs as out_table
from engine.interface.flags import CACHE_MB, MODEL
from results.read.console_records import (
    CacheAuto,
    CacheChurn,
    ComputeUse,
    ConsoleRun,
    CycleWarning,
    DenseAnon,
    DenseWarmup,
    Generation,
    MoeCache,
    MoeStream,
    Prefetch,
    Prefill,
    SpecGate,
    StreamingOn,
)
from results.read.parse_config import LOG_NUMBER_RE, config_from_command, config_from_tag
from results.read.parse_text import (
    NUMBER,
    NumberError,
    ParseError,
    excerpt,
    foreign_numeral,
    located,
    read_lines,
    to_number,
)
from results.read.parse_values import checked, inconsistent, note, problem

N = f"({NUMBER})"
# How the engine's lines begin, where a shape below and a verdict after the shapes (o_direct_seen …
# says_why) both read them. Plain text: no regex metacharacters.
STREAMING_ON = "bmoe: expert streaming ON"     # stderr at load: experts stream, with these settings
GENERATION = "generation:"                       # stdout: the end-of-run block's first line
CONFIG_ERROR, UNKNOWN_ARG, MISSING_VALUE = "config error:", "unknown arg:", "missing value for"   # refusals
RUNTIME_ERROR = "error"                          # `error: …`, a run that failed
SEPARATOR_RE = re.compile(r"^={5,}\s+(.*?)\s+={5,}\s*$")
# separators that close a driver's log instead of opening a run (`ALL DONE`, `MMAP DONE` are
# printed bare; the 2026-07-17 drivers print `=== DONE ===`)
END_TAGS = frozenset({"DONE", "ALL DONE", "MMAP DONE"})
_TAG_PARAMS_RE = re.compile(r"^(\S+)\s+\((.*)\)$")
# end-of-run lines (after `generation:`); a line that starts like one and matches no shape is kept in `unparsed`
PERF_PREFIXES = (GENERATION, "compute:", "prefill:", "moe-", "mtp:", "ngram:", "mode:", "ppl:", "ppl-policy:",
                 "plan: predicted")

# What one line says: ConsoleRun fields by name (values of several types, hence Any), the pressure
# values of a sidecar line, or a `BMOE_*` event.
Fields = dict[str, Any]
Event = tuple[str, Mapping[str, object]]
Found = tuple[Literal["event"], Event] | tuple[Literal["fields", "pressure"], Fields]


# ── line shapes ────────────────────────────────────────────────────────────────────────────────
# Each handler turns a match into ConsoleRun fields. Separators (— → ×) are matched loosely with
# `.*?` so a capture that went through the wrong code page still parses.

def _num(text: str) -> float:
    """A matched numeral as a number (an int stays an int: the records' floats take both).
    NumberError for one no engine prints; ValueError when it is no numeral (the line then has
    another shape)."""
    value = to_number(text)
    if isinstance(value, str):
        raise ValueError(text)
    return value


def _opt(text: str | None) -> float | None:
    """An optional group's numeral; None when the group is absent."""
    return None if text is None else _num(text)


def _count(text: str) -> int:
    """A digits-only group's numeral."""
    value = _num(text)
    if not isinstance(value, int):
        raise ValueError(text)
    return value


def _whole(text: str) -> int | float:
    """A whole MiB count printed as `1815` or `1815.0`; nan stays nan (stored as missing later)."""
    value = _num(text)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _generation(m: re.Match[str]) -> Fields:
    return {"generation": Generation(_count(m[1]), _num(m[2]), _num(m[3]))}


def _compute(m: re.Match[str]) -> Fields:
    return {"compute": ComputeUse(_num(m[1]), _num(m[2]), _count(m[3]), _num(m[4]))}


def _prefill(m: re.Match[str]) -> Fields:
    return {"prefill": Prefill(_count(m[1]), _num(m[2]), _num(m[3]), _num(m[4]), _num(m[5]))}


def _moe_stream(m: re.Match[str]) -> Fields:
    return {"moe_stream": MoeStream(_num(m[1]), _num(m[2]), _num(m[3]), _num(m[4]), _opt(m[5]), _num(m[6]),
                                    _num(m[7]))}


def _moe_cache(m: re.Match[str]) -> Fields:
    detail = m[4] or ""
    resized = re.search(r"resized\s+([0-9]+)", detail)
    return {"moe_cache": MoeCache(_num(m[1]), _num(m[2]), _opt(m[3]), detail.startswith("auto"),
                                  _count(resized[1]) if resized else None)}


def _churn(m: re.Match[str]) -> Fields:
    return {"cache_churn": CacheChurn(_count(m[1]), _count(m[2]), _num(m[3]), m[4].strip().lstrip("—-– ").strip())}


def _prefetch(m: re.Match[str]) -> Fields:
    return {"prefetch": Prefetch(_num(m[1]), _count(m[2]), _count(m[3]), _num(m[4]), m[5])}


def _cycle_warning(m: re.Match[str]) -> Fields:
    return {"cycle_warning": CycleWarning(_whole(m[1]), _whole(m[2]), _count(m[3]) if m[3] else None)}


def _streaming(m: re.Match[str]) -> Fields:
    values = dict(re.findall(r"(\w+)=(\S+)", m[1]))
    try:
        return {"streaming": StreamingOn(
            n_expert=_num(values.pop("n_expert")), o_direct=values.pop("o_direct") == "1",
            io_threads=_num(values.pop("io_threads")), cache_mib=_num(values.pop("cache")),
            shards=_num(values.pop("shards")) if "shards" in values else None,
            extra=MappingProxyType(values))}
    except (KeyError, ValueError):
        return {}  # a different shape: the caller keeps the line in `unparsed`


def _dense_anon(m: re.Match[str]) -> Fields:
    return {"dense_anon": DenseAnon(m[1], _num(m[2]), _count(m[3]), None)}


_STDOUT: tuple[tuple[str, re.Pattern[str], Callable[[re.Match[str]], Fields]], ...] = (
    ("generation", re.compile(rf"^{GENERATION} ([0-9]+) tokens, {N} s/token \({N} tok/s\)"), _generation),
    ("compute", re.compile(rf"^compute: {N}% CPU occupancy \({N} cpu-s/token over ([0-9]+) threads\), {N} major faults/token"),
     _compute),
    ("prefill", re.compile(rf"^prefill: ([0-9]+) tokens, {N} s \({N} tok/s\) \| model load {N} s \| TTFT {N} s"), _prefill),
    ("moe-stream", re.compile(rf"^moe-stream: read {N} MiB \({N} MiB/token\), decode {N} s/token \(compute {N}"
                rf"(?: \+ cache mgmt {N})? \+ flash I/O {N} s/token, {N} MiB/s\)"), _moe_stream),
    ("moe-cache", re.compile(rf"^moe-cache: {N}% hit, resident {N} MiB(?:, budget {N} MiB \(([^)]*)\))?"), _moe_cache),
    ("moe-cache-churn", re.compile(rf"^moe-cache: ([0-9]+) evictions, ([0-9]+) re-reads \({N}/token\)(.*)"), _churn),
    ("moe-overlap", re.compile(rf"^moe-overlap: stall {N} s/token"), lambda m: {"overlap_stall_s_per_token": _num(m[1])}),
    ("moe-prefetch", re.compile(rf"^moe-prefetch: {N} MiB speculative, ([0-9]+)/([0-9]+) experts useful \({N}%\)(?: \[([\w-]+)\])?"),
     _prefetch),
    ("moe-spec-gate", re.compile(rf"^moe-spec-gate: {N}% router prediction recall(?: \(auto-disabled below {N}%\))?"),
     lambda m: {"spec_gate": SpecGate(_num(m[1]), _opt(m[2]))}),
    ("config-error", re.compile(rf"^{CONFIG_ERROR} (.*)"), lambda m: {"config_error": m[1].strip()}),
    ("arg-error", re.compile(rf"^(?:{UNKNOWN_ARG} |{MISSING_VALUE} ).*"), lambda m: {"arg_error": m[0].strip()}),
    ("runtime-error", re.compile(rf"^{RUNTIME_ERROR}: (.*)"), lambda m: {"runtime_error": m[1].strip()}),
    ("warning", re.compile(r"^warning: (.*)"), lambda m: {"warnings": m[1].strip()}),
)
_STDERR: tuple[tuple[str, re.Pattern[str], Callable[[re.Match[str]], Fields]], ...] = (
    ("cache-auto", re.compile(rf"bmoe: cache auto.*?{N} MiB available, leaving {N} MiB free.*?{N} MiB budget \(cap {N} MiB\)"),
     lambda m: {"cache_auto": CacheAuto(_num(m[1]), _num(m[2]), _num(m[3]), _num(m[4]))}),
    ("cache-reserve", re.compile(rf"bmoe: cache auto.*?reserving {N} MiB"), lambda m: {"cache_reserve_mib": _num(m[1])}),
    ("dense-warmup", re.compile(rf"bmoe: dense warm-up.*?{N} MiB in {N} s"),
     lambda m: {"dense_warmup": DenseWarmup(_num(m[1]), _num(m[2]))}),
    ("dense-dropped", re.compile(rf"bmoe: dense-weights=\w+.*?dropped {N} MiB"), lambda m: {"dense_dropped_mib": _num(m[1])}),
    ("dense-anon", re.compile(rf"bmoe: dense-weights=(\w+).*?{N} MiB in ([0-9]+) anon buffers"), _dense_anon),
    ("streaming-on", re.compile(rf"{STREAMING_ON}\s+(.*)"), _streaming),
    ("cycle-warning", re.compile(rf"bmoe: WARNING expert cache {N} MiB is below.*?token cycle of {N} MiB(?:\s+at top-k ([0-9]+))?"),
     _cycle_warning),
    # a bad --dense-weights value is refused like a config error (exit 2 instead of 1)
    ("dense-weights-refused", re.compile(r"bmoe: (--dense-weights expects .*)"), lambda m: {"config_error": m[1].strip()}),
)
# Lines whose values are declared field by field in engine/interface/outputs.py: each group is
# named as its field, so a line's values arrive as {field: value} under the line's name
# (ConsoleRun.values). Matched at the start of a line, after the record lines above.
S = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+|nan|inf)"     # a signed numeral (`%+.0f`)
_VALUE_LINES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((name, re.compile(pattern)) for name, pattern in (
    ("plan-check", rf"^plan: predicted (?P<plan_predicted_s_per_tok>{NUMBER}) s/token, measured "
                   rf"(?P<plan_measured_s_per_tok>{NUMBER}) \((?P<plan_error_pct>{S})%\)"
                   rf"(?:; cache hits credited (?P<plan_credited_hit_pct>{NUMBER})%, measured "
                   rf"(?P<plan_measured_hit_pct>{NUMBER})%)?"),
    ("spec-accepted", rf"^(?P<spec_source>mtp|ngram): (?P<spec_accepted>[0-9]+)/(?P<spec_drafted>[0-9]+) drafts accepted "
                      rf"\((?P<spec_accept_pct>{NUMBER})%\), (?P<tokens_per_decode>{NUMBER}) tokens per verify decode "
                      rf"\((?P<spec_decodes>[0-9]+) decodes for (?P<spec_tokens>[0-9]+) tokens\)"),
    ("spec-effective", rf"^(?P<spec_source>mtp|ngram): drafting costs (?P<spec_draft_s_per_tok>{NUMBER}) s/token on top "
                       rf"of decode .*? (?P<effective_tok_s>{NUMBER}) tok/s effective "
                       rf"\(vs (?P<reported_tok_s>{NUMBER}) reported\)"),
    ("ngram-coverage", rf"^ngram: drafted on (?P<drafted_steps>[0-9]+) of (?P<spec_decodes>[0-9]+) steps "
                       rf"\((?P<drafted_steps_pct>{NUMBER})%\)"),
    ("mtp-read-split", rf"^mtp: of (?P<read_mib>{NUMBER}) MiB streamed, (?P<mtp_head_read_mib>{NUMBER}) MiB "
                       rf"\((?P<mtp_head_read_pct>{NUMBER})%\) was the head's own routing, "
                       rf"(?P<verify_read_mib>{NUMBER}) MiB the widened verify batch"),
    ("mode", r"^mode: (?P<mode>expert streaming|mmap)(?:, (?P<mode_cache>cache (?:auto|off|[0-9]+ MiB)), "
             r"dense (?P<mode_dense>[\w-]+)(?:, (?P<mode_overlap>overlap))?)?"),
    ("moe-rows", rf"^moe-rows: (?P<row_table_mib>{NUMBER}) MiB of row-gathered table\(s\) off the resident set, "
                 rf"(?P<row_resident_mib>{NUMBER}) MiB resident, (?P<row_rows>[0-9]+) rows gathered, "
                 rf"(?P<row_reads>[0-9]+) reads \((?P<row_read_mib>{NUMBER}) MiB\)"),
    ("moe-rows-failed", r"^moe-rows: (?P<row_io_errors>[0-9]+) FAILED reads"),
    ("moe-waits", rf"^moe-waits: drain (?P<drain_s_per_token>{NUMBER}) s/token \(inside compute\), "
                  rf"adopt (?P<adopt_s_per_token>{NUMBER}) s/token"),
    ("moe-drop", rf"^moe-drop: (?P<experts_dropped>[0-9]+)/(?P<experts_routed>[0-9]+) routed experts dropped "
                 rf"\((?P<drop_pct>{NUMBER})%\), threshold (?P<drop_threshold>{NUMBER}) x uniform"),
    ("moe-substitute", rf"^moe-substitute: (?P<experts_substituted>[0-9]+)/(?P<experts_reranked>[0-9]+) reranked slots went "
                       rf"to a resident expert \((?P<substituted_pct>{NUMBER})%\), margin "
                       rf"(?P<substitute_margin>{NUMBER}) x score range"),
    ("moe-route-ahead", rf"^moe-route-ahead: (?P<route_ahead_layers>[0-9]+) layers early .*? (?P<ra_committed>[0-9]+) "
                        rf"routings committed, (?P<ra_passthrough>[0-9]+) passed through; committed selection agreed "
                        rf"with the router on (?P<ra_agree_pct>{NUMBER})% of slots"),
    ("moe-route-ahead-cost", rf"^moe-route-ahead: prediction (?P<ra_gemv_ms_per_tok>{NUMBER}) ms/token of worker CPU "
                             rf"\((?P<ra_gemv_jobs>[0-9]+) GEMVs, (?P<ra_gemv_ms>{NUMBER}) ms each\) \+ "
                             rf"(?P<ra_issue_ms_per_tok>{NUMBER}) ms/token issuing the reads \+ "
                             rf"(?P<ra_wd_ms_per_tok>{NUMBER}) ms/token watchdog"),
    ("ppl", rf"^ppl: (?P<ppl>{NUMBER})\s+nll: (?P<ppl_nll>{NUMBER})\s+next-token hits: (?P<ppl_hits>[0-9]+)/"
            rf"(?P<ppl_scored>[0-9]+) \((?P<ppl_hit_pct>{NUMBER})%\)\s+(?P<ppl_seconds>{NUMBER}) s"),
    ("ppl-policy", r"^ppl-policy: (?P<experts_dropped>[0-9]+)/(?P<experts_routed>[0-9]+) routed experts dropped, "
                   r"(?P<experts_substituted>[0-9]+)/(?P<experts_reranked>[0-9]+) reranked slots substituted"),
    ("plan-reproduce", r"^plan: reproduce with\s*$"),
    ("plan-regime", r"^plan: regime (?P<plan_regime>[\w-]+)\s*$"),
    ("plan-cost", rf"^plan:   cost (?P<plan_cost_ms_per_tok>{NUMBER}) ms/token predicted, "
                  rf"(?P<plan_worst_ms_per_tok>{NUMBER}) ms/token with nothing resident"),
    ("plan-declined", r"^plan:   declined: (?P<plan_declined>.+)$"),
    ("plan-explain", r"^plan: "),
))
# the names of the lines every pattern above reads (the table's line names; a test holds them equal)
HANDLED_LINES = frozenset(name for name, _, _ in (*_STDOUT, *_STDERR)) | {name for name, _ in _VALUE_LINES}
_TEXT_FIELDS = out_table.text_fields()


def _line_values(name: str, m: re.Match[str]) -> Fields:
    values: dict[str, object] = {}
    for key, text in m.groupdict().items():
        if text is None:
            continue
        values[key] = text if key in _TEXT_FIELDS else _num(text.removeprefix("+"))
    return {"values": {name: values}}       # plan-explain lines are counted, plan-reproduce read, by parse_console


_PRESSURE_RE = re.compile(r"^([a-z][a-z0-9_]*_(?:kb|dC|mC|uah))=(-?[0-9.]*)\s*$")
_PRESSURE_KEY_RE = re.compile(r"[a-z][a-z0-9_]*_(?:kb|dC|mC|uah)=")
_ENTRY_RE = re.compile(r"^ENTRY STATE:\s*(.*)")
EVENT_RE = re.compile(r"^BMOE_([A-Z_]+) (\{.*)")
_TOP_K_CONTINUATION_RE = re.compile(r"^at top-k ([0-9]+)")
_LOOSE_NUMBER_RE = re.compile(r'"(\w+)":(-?[0-9.]+)')
_UNIT_SUFFIXES = ("_kb", "_dC", "_mC", "_uah")
# ENTRY STATE keys of upstream's cooling gate -> our unit-suffixed names
_ENTRY_KEYS = {"batt": "batt_temp_dC", "memavail": "mem_available_kb", "freq": "scaling_max_freq_khz",
               "waited": "waited_s"}
_ENTRY_ITEM_RE = re.compile(r"(\w+)=(-?[0-9.]+)\s*([A-Za-z]*)")


# ── a run's lines as other modules judge it ────────────────────────────────────────────────────
# Verdicts on one run as it ends (the harness's and a report's), not the parse of a capture above:
# each keeps the reach its caller always had (anywhere in a line or at its start, the first line or
# the last), wider than the shapes' in places (a refusal is seen anywhere in a line).

_O_DIRECT_RE = re.compile(rf"{STREAMING_ON}\b.*?\bo_direct=([0-9]+)")
_ACCEPTED_RE = re.compile(rf"{STREAMING_ON}.*|^{GENERATION} .*", re.M)
_REFUSAL_RE = re.compile(rf"{CONFIG_ERROR}|{UNKNOWN_ARG}|{MISSING_VALUE}|expects ")
_WHY_RE = re.compile(rf"({UNKNOWN_ARG} .*|{CONFIG_ERROR} .*|{RUNTIME_ERROR}: .*)")


def streamed(text: str) -> bool:
    """Whether an engine's output holds its `bmoe: expert streaming ON` line: it streamed experts
    (without the line it ran on mmap)."""
    return STREAMING_ON in text


def o_direct_seen(text: str) -> int | None:
    """The `o_direct=N` of the last `bmoe: expert streaming ON` line of an engine's stderr (both
    engines print it after any fallback); None when no such line says it."""
    seen = _O_DIRECT_RE.findall(text)
    return int(seen[-1]) if seen else None


def not_streamed(run: ConsoleRun) -> str | None:
    """Why a run's own lines say it did not stream experts through O_DIRECT (None: they do not say
    so): its `mode: mmap` line, an end-of-run block without the `moe-stream:` line (the engine prints
    it whenever it streams; upstream's #186), or `o_direct=0` on its streaming line (buffered reads)."""
    mode = str(run.value("mode", "mode") or "")
    if mode == "mmap":
        return "its `mode: mmap` line says the run did not stream experts (plain llama.cpp on mmap)"
    if run.generation is not None and run.moe_stream is None and run.streaming is None and not mode:
        return ("its end-of-run lines have no `moe-stream:` line, which the engine prints whenever it streams "
                "(upstream #186): plain llama.cpp on mmap")
    if run.streaming is not None and not run.streaming.o_direct:
        return f"its `{STREAMING_ON}` line says o_direct=0: the expert reads went through the page cache"
    return None


def accepted_line(text: str) -> str | None:
    """The first line by which an engine shows it took its command line: `bmoe: expert streaming
    ON …` (from there to the line's end) or a `generation: …` line, stripped; None without one."""
    seen = _ACCEPTED_RE.findall(text)
    return seen[0].strip() if seen else None


def is_refusal(line: str) -> bool:
    """Whether a line is the engine's refusal of its command line: `config error:`, `unknown arg:`,
    `missing value for` or a flag's `… expects …`, anywhere in the line."""
    return _REFUSAL_RE.search(line) is not None


def is_error(line: str) -> bool:
    """Whether a line is the engine's error line: it starts with `error` (blanks before it allowed)."""
    return line.lstrip().startswith(RUNTIME_ERROR)


def says_why(line: str) -> bool:
    """Whether a line says why the engine refused a flag or failed: `unknown arg: …`, `config
    error: …` or `error: …` anywhere in the line."""
    return _WHY_RE.search(line) is not None


# ── parsing ────────────────────────────────────────────────────────────────────────────────────


def read_console(*paths: str | Path) -> ConsoleRun:
    """One run's capture: a stdout and/or stderr file (`read_console(out, err)`), or a merged log."""
    lines: list[str] = []
    starts: list[int] = []
    for path in paths:
        starts.append(len(lines))
        lines += read_lines(path)[0]
    names = tuple(str(p) for p in paths)

    def where(index: int) -> str:
        k = max(0, bisect.bisect_right(starts, index) - 1)
        return f"{names[k]}:{index - starts[k] + 1}" if names else f"line {index + 1}"

    return parse_console(lines, paths=names, where=where)


def parse_console(lines: list[str], paths: tuple[str, ...] = (), tag: str | None = None,
                  declared_config: Mapping[str, object] | None = None,
                  where: Callable[[int], str] | None = None) -> ConsoleRun:
    """`where(index)` names the file and line of lines[index], for refusals and notes."""
    if where is None:
        def where(index: int) -> str:
            return f"{_where(paths, tag)}:{index + 1}"
    fields: Fields = {}
    warnings: list[str] = []
    events: list[Event] = []
    pressure: dict[str, int | float | None] = {}
    line_values: dict[str, dict[str, object]] = {}   # the table-declared lines' values, by line name
    unparsed: list[str] = []
    notes: list[str] = []
    answer: list[str] | None = None       # the `=== answer ===` section's lines, once seen
    collecting: list[str] | None = None   # `answer` while inside that section
    for index, line in enumerate(lines):
        if line == "=== answer ===":
            answer = collecting = []
            continue
        if line == "=== perf ===":
            collecting = None
            continue
        if collecting is not None:
            collecting.append(line)
            continue
        try:
            found = _checked_match(lines, index, where, notes)
        except NumberError as e:
            raise located(e, where(index)) from None
        if m := LOG_NUMBER_RE.match(line):      # llama.cpp's load log, which config_from_log reads
            try:
                to_number(m[3], m[1] or m[2])
            except NumberError as e:
                raise located(e, where(index)) from None
        if (engine_part := _numbers_part(line, found)) and (foreign := foreign_numeral(engine_part)) is not None:
            # a line the engine prints, with digits no engine prints (`read ١٢.٥ MiB`): damaged
            raise located(foreign, where(index))
        if found is None:
            if line.startswith(PERF_PREFIXES) or "bmoe:" in line:
                unparsed.append(line)
            continue
        if found[0] == "event":
            events.append(found[1])
            continue
        kind, values = found
        if kind == "fields" and "values" in values:
            for name, read in values["values"].items():
                if name == "plan-explain":
                    seen = line_values.setdefault(name, {"plan_lines": 0})
                    seen["plan_lines"] = int(str(seen["plan_lines"])) + 1
                    continue
                if name == "plan-reproduce":
                    command = lines[index + 1] if index + 1 < len(lines) else ""
                    if not _PLAN_COMMAND_RE.match(command):
                        # the planner indents the command line it prints after this one; anything
                        # else (or nothing: the capture ends here) is another line, not the plan's flags
                        notes.append(f"{where(index)}: `plan: reproduce with` has no command line after it: "
                                     "the plan's flags stored as missing")
                        continue
                    try:
                        read = checked(_plan_flags(command), where(index + 1), notes)   # `--cache-mb -5`
                    except NumberError as e:
                        raise located(e, where(index + 1)) from None
                line_values[name] = dict(read)
            continue
        if kind == "pressure":
            pressure.update(values)
        elif "warnings" in values:
            warnings.append(values["warnings"])
        elif "generation" in values and "generation" in fields:
            # read_console_runs splits a capture of several runs; a stdout/stderr pair cannot be split
            raise ParseError(f"{where(index)}: holds a second run's end-of-run lines; import its folder: "
                             "a capture of several runs imports as that many runs")
        else:
            fields.update(values)
    if "dense_dropped_mib" in fields:
        dropped = fields.pop("dense_dropped_mib")
        if "dense_anon" in fields:
            anon = fields["dense_anon"]
            fields["dense_anon"] = DenseAnon(anon.mode, anon.mib, anon.buffers, dropped)
    return ConsoleRun(
        paths=paths, lines=tuple(lines), tag=tag, declared_config=MappingProxyType(dict(declared_config or {})),
        warnings=tuple(warnings), events=tuple(events), answer=None if answer is None else "\n".join(answer),
        pressure=MappingProxyType(pressure) if pressure else None, unparsed=tuple(unparsed), notes=tuple(notes),
        values=MappingProxyType({k: MappingProxyType(v) for k, v in line_values.items()}), **fields)


# the line after `plan: reproduce with`: the planner's `  PROGRAM -m MODEL FLAGS`, indented (engine/plan/planner.py)
_PLAN_COMMAND_RE = re.compile(r"[ \t]+[^ \t]")


# the fields of the lines whose text is the engine's words or a user's argument echoed, not numbers
_TEXT_LINE_FIELDS = frozenset({"config_error", "arg_error", "runtime_error", "warnings"})


def _numbers_part(line: str, found: Found | None) -> str:
    """The part of a line whose numbers this reader reads, where the engine or a bench driver
    printed them: an end-of-run line, a `bmoe:` line from `bmoe:` on (generated text may precede
    it), a pressure or entry-state line; "" for anything else (generated text, the loader's log, a
    `BMOE_*` event, whose JSON holds its numbers, an error's words)."""
    if found is not None and found[0] == "fields" and set(found[1]) <= _TEXT_LINE_FIELDS:
        return ""
    if line.startswith(PERF_PREFIXES) or line.startswith("ENTRY STATE:") or _PRESSURE_KEY_RE.match(line):
        return line
    at = line.find("bmoe:")
    return line[at:] if at >= 0 else ""


def _plan_flags(command: str) -> dict[str, object]:
    """The flags of the planner's `plan: reproduce with` command line (the line after it:
    `  bmoe-cli -m MODEL FLAGS`), and the budget they pin (`--cache-mb N`; None for auto)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    if words[:1] and not words[0].startswith("-"):
        words = words[1:]                       # the program
    if words[:1] and words[0] in MODEL.spellings:
        words = words[2:]
    comment = command.find("#")
    if words[:1] and words[0].startswith("#") and comment >= 0:
        return {"plan_flags": command[comment:].strip()}     # "# streaming declined; run without …"
    out: dict[str, object] = {"plan_flags": shlex.join(words)}
    budget = next((i for i, w in enumerate(words[:-1]) if w in CACHE_MB.spellings), None)
    if budget is not None:
        value = to_number(words[budget + 1], "plan_cache_mb")
        if isinstance(value, (int, float)):
            out["plan_cache_mb"] = value
    return out


def _checked_match(lines: list[str], index: int, where: Callable[[int], str], notes: list[str]) -> Found | None:
    """_match of lines[index], its numbers range-checked, a wrapped cycle warning joined."""
    found = _match(lines[index])
    if found is None:
        return None
    if found[0] == "event":
        name, payload = found[1]
        return "event", (name, MappingProxyType(checked(payload, where(index), notes)))
    kind, values = found
    values = _plausible(values, where(index), notes)
    warning = values.get("cycle_warning")
    # the warning is one line, but it may have been wrapped before the `at top-k K` part
    if (warning is not None and warning.top_k is None and index + 1 < len(lines)
            and (more := _TOP_K_CONTINUATION_RE.match(lines[index + 1]))):
        values["cycle_warning"] = replace(warning, top_k=_count(more[1]))
    return kind, values


def _plausible(values: Fields, where: str, notes: list[str]) -> Fields:
    """A matched line's fields with every impossible number (nan, a negative time …) set to None and
    noted; a field of a record is judged by its own name (`tok_per_s`, `hit_pct`, `budget_mib`)."""
    out: Fields = {}
    for key, value in values.items():
        if is_dataclass(value) and not isinstance(value, type):
            bad: dict[str, None] = {}
            for f in dataclass_fields(value):
                reason = problem(f.name, getattr(value, f.name))
                if reason is not None:
                    notes.append(note(where, f.name, getattr(value, f.name), reason))
                    bad[f.name] = None
            record = {f.name: getattr(value, f.name) for f in dataclass_fields(value)} | bad
            for part, whole in inconsistent(record, where, notes):
                bad[part] = bad[whole] = None
            value = replace(value, **bad) if bad else value
        elif isinstance(value, str) and key.endswith(_UNIT_SUFFIXES):
            # a pressure line (`peak_rss_kb=1.2.3`) whose value is no number
            notes.append(note(where, key, value, "not a number"))
            value = None
        elif not isinstance(value, Mapping):
            value = checked({key: value}, where, notes)[key]
        else:
            value = MappingProxyType(checked(value, where, notes))
        out[key] = value
    return out


def _match(line: str) -> Found | None:
    for _name, pattern, handler in _STDOUT:
        if m := pattern.match(line):
            values = _handled(handler, m)
            return ("fields", values) if values else None
    for name, pattern in _VALUE_LINES:
        if m := pattern.match(line):
            values = _handled(functools.partial(_line_values, name), m)
            return ("fields", values) if values else None
    for _name, pattern, handler in _STDERR:
        if m := pattern.search(line):
            values = _handled(handler, m)
            return ("fields", values) if values else None
    if m := EVENT_RE.match(line):
        return "event", (m[1], _event_payload(m[2]))
    if m := _PRESSURE_RE.match(line):
        return "pressure", {m[1]: None if m[2] == "" else to_number(m[2], m[1])}
    if m := _ENTRY_RE.match(line):
        return "fields", {"entry_state": parse_entry_state(m[1])}
    return None


def _handled(handler: Callable[[re.Match[str]], Fields], m: re.Match[str]) -> Fields:
    try:
        return handler(m)
    except NumberError as e:
        raise NumberError(f"{excerpt(m[0].split(':')[0].strip(), 30)}: {e}") from None
    except ValueError:
        return {}  # a numeral-like group that is no number: the line keeps its place in `unparsed`


def event_json(text: str) -> object:
    """The JSON after a `BMOE_*` line's name, its numbers through to_number (the magnitude check of
    every reader); ValueError when it is not JSON (a line cut short). Invalid UTF-8 in a string
    arrives here as U+FFFD, which is valid JSON."""
    try:
        return json.loads(text, strict=False, parse_int=to_number, parse_float=to_number)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _event_payload(text: str) -> Mapping[str, object]:
    """A `BMOE_*` JSON object (event_json); a line cut by a kill is not JSON, so its numeric fields
    are recovered and `_cut` is set."""
    try:
        payload = event_json(text)
    except ValueError:
        payload = {key: to_number(value, key) for key, value in _LOOSE_NUMBER_RE.findall(text)}
        payload["_cut"] = True
    return MappingProxyType(payload if isinstance(payload, dict) else {"value": payload})


def parse_entry_state(text: str) -> Mapping[str, int | float | str]:
    """`batt=420 dC, memavail=6837980 kB, freq=1555200, waited=0s` -> unit-named numbers."""
    state: dict[str, int | float | str] = {}
    for key, value, unit in _ENTRY_ITEM_RE.findall(text):
        unit = unit.replace("kB", "kb")
        name = _ENTRY_KEYS.get(key, f"{key}_{unit}" if unit else key)
        state[name] = to_number(value, name)
    return MappingProxyType(state)


def _where(paths: tuple[str, ...], tag: str | None) -> str:
    where = ", ".join(paths) or "console text"
    return f"{where} [{tag}]" if tag else where


# ── the generated bytes ────────────────────────────────────────────────────────────────────────
# read from the raw capture, not from read_lines' text: a token may be half a UTF-8 sequence, which
# the engine prints raw (engine.contract.telemetry.json_escape_bytes) and a decode would turn into
# U+FFFD, so two different tokens would compare equal

_PROGRESS_START = b"BMOE_PROGRESS "
_DELTA_TEXT = b'"delta_text":"'
_ANSWER_OPEN, _ANSWER_CLOSE = b"=== answer ===\n", b"\n=== perf ===\n"
_BYTE_ESCAPES = {ord('"'): b'"', ord("\\"): b"\\", ord("/"): b"/", ord("b"): b"\b", ord("f"): b"\f",
                 ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t"}


def _json_bytes(raw: bytes, start: int) -> bytes | None:
    """The bytes of a JSON string whose text starts at `start` (after its opening quote), escapes
    undone and raw bytes kept; None when the string is not closed (a line cut by a kill) or an
    escape is not JSON's."""
    out = bytearray()
    i = start
    while i < len(raw):
        b = raw[i]
        if b == 0x22:                                        # the closing quote
            return bytes(out)
        if b != 0x5C:
            out.append(b)
            i += 1
            continue
        esc = raw[i + 1] if i + 1 < len(raw) else -1
        if esc in _BYTE_ESCAPES:
            out += _BYTE_ESCAPES[esc]
            i += 2
        elif esc == ord("u") and re.fullmatch(rb"[0-9A-Fa-f]{4}", raw[i + 2:i + 6]):
            out += chr(int(raw[i + 2:i + 6], 16)).encode("utf-8", "surrogatepass")
            i += 6
        else:
            return None
    return None


def progress_deltas(raw: bytes) -> tuple[bytes, ...] | None:
    """Each `--progress` decode step's `delta_text` as the bytes the engine generated, in order, from
    a run's raw stdout; None when it printed no `BMOE_PROGRESS` line (a run without --progress). A
    line cut short (a kill) ends the list there."""
    out: list[bytes] = []
    seen = False
    for line in raw.split(b"\n"):
        if not line.startswith(_PROGRESS_START):
            continue
        seen = True
        at = line.find(_DELTA_TEXT)
        text = _json_bytes(line, at + len(_DELTA_TEXT)) if at >= 0 else None
        if text is None:
            break
        out.append(text)
    return tuple(out) if seen else None


def answer_bytes(raw: bytes) -> bytes | None:
    """The generated text between `=== answer ===` and `=== perf ===` of a run's raw stdout, as bytes
    (None when the run printed no such section: killed, or an engine without it)."""
    start = raw.find(_ANSWER_OPEN)
    if start < 0 or (start > 0 and raw[start - 1:start] != b"\n"):
        return None
    end = raw.rfind(_ANSWER_CLOSE)
    body = start + len(_ANSWER_OPEN)
    return raw[body:end] if end >= body else None


# ── multi-run captures ─────────────────────────────────────────────────────────────────────────


def read_console_runs(path: str | Path) -> list[ConsoleRun]:
    """Split a capture of several runs into one ConsoleRun per run, each carrying the config its
    separator and command lines declare. Upstream drivers print `==== TAG ====` before each run;
    A/B drivers just print one run after the other, so runs are also split where a run's end-of-run
    block is followed by the next run's first line (see run_starts). A run that is not the only one
    of its section is tagged `TAG#N` (`STEM#N` without a separator, STEM the file's name)."""
    lines, _ = read_lines(path)
    return split_runs(lines, str(path))


_LOADER_START = "llama_model_loader: loaded meta data"
# the lines a run's beginning prints when the engine refuses its command line or fails
_REFUSED_OR_FAILED = (f"{CONFIG_ERROR} ", f"{UNKNOWN_ARG} ", f"{MISSING_VALUE} ", f"{RUNTIME_ERROR}: ")


def _line_kind(line: str) -> str:
    """'generation', 'end' (the rest of an end-of-run block), 'start' (a line only the beginning of
    a run prints: the engine's load lines, a --progress event, a cooling gate's entry state, an
    echoed command, an error), or '' for anything else (text, llama.cpp's log)."""
    if line.startswith(GENERATION):
        return "generation"
    if line.startswith(PERF_PREFIXES) or line == "=== perf ===" or _PRESSURE_RE.match(line):
        return "end"
    if line == "=== answer ===" or line.startswith(_LOADER_START) or _ENTRY_RE.match(line) or EVENT_RE.match(line):
        return "start"
    if "bmoe:" in line and any(p.search(line) for _, p, _ in _STDERR):
        return "start"
    if line.startswith(_REFUSED_OR_FAILED):
        return "start"
    try:
        if config_from_command(line):
            return "start"
    except NumberError:
        return "start"
    return ""


def run_starts(body: Sequence[str]) -> list[int]:
    """Where each run of a capture without separators begins. A run ends with its end-of-run
    block (`generation:` … `moe-cache:`, a bench driver's pressure lines); the next begins right
    after that block, once a line only a run's beginning prints, or a second `generation:`, shows
    that another run followed. Text after the last run's block stays with it."""
    starts = [0]
    finished = False          # the current run printed its generation line
    last_end = -1
    for index, line in enumerate(body):
        kind = _line_kind(line)
        if finished and kind in ("start", "generation"):
            starts.append(last_end + 1)
            finished = kind == "generation"
            last_end = index
            continue
        if kind == "generation":
            finished, last_end = True, index
        elif finished and kind == "end":
            last_end = index
    return starts


def split_runs(lines: list[str], path: str = "") -> list[ConsoleRun]:
    # (tag, index of the section's first line in `lines`, its lines)
    """The runs of a capture's lines: split at separators, then where one run's end-of-run block is followed by another's start."""
    sections: list[tuple[str | None, int, list[str]]] = [(None, 0, [])]
    for index, line in enumerate(lines):
        if m := SEPARATOR_RE.match(line):
            sections.append((None if m[1] in END_TAGS else m[1], index + 1, []))
        else:
            sections[-1][2].append(line)
    stem = Path(path).name.split(".")[0] if path else "run"
    split: list[tuple[str | None, int, list[str]]] = []
    for tag, first, body in sections:
        starts = run_starts(body)
        if len(starts) == 1:
            split.append((tag, first, body))
            continue
        for n, (a, b) in enumerate(zip(starts, starts[1:] + [len(body)]), start=1):
            split.append((f"{tag or stem}#{n}", first + a, body[a:b]))
    runs = []
    for tag, first, body in split:
        if tag is None and len(sections) > 1 and not any(_match(line) for line in body):
            continue  # text before the first separator or after a DONE marker

        def where(index: int, first: int = first) -> str:
            return f"{path or 'console text'}:{first + index + 1}"

        declared: dict[str, object] = {}
        try:
            if tag is not None:
                # upstream's warm-only driver adds the cell's parameters: `gptoss_k4 (k=4 io=8 n=24)`
                with_params = _TAG_PARAMS_RE.match(tag)
                tag, params = (with_params[1], with_params[2]) if with_params else (tag, "")
                declared.update(config_from_tag(tag, params))
        except NumberError as e:
            raise located(e, where(-1)) from None
        for index, line in enumerate(body):
            try:
                declared.update(config_from_command(line))
            except NumberError as e:
                raise located(e, where(index)) from None
        runs.append(parse_console(body, paths=(path,) if path else (), tag=tag, declared_config=declared,
                                  where=where))
    return runs
