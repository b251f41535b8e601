"""A community benchmark report, as upstream defines it, read into one record.

Upstream (Helldez/BigMoeOnEdge) collects community numbers through its `benchmark-report` issue
form (.github/ISSUE_TEMPLATE/benchmark-report.yml at ecd7b568). GitHub renders a submitted form
as Markdown: one `### Label` heading per field, its value under it, `_No response_` for an empty
optional field, a textarea with `render:` inside a fenced block. The `Measured result` field holds
what `scripts/bench-report.sh` prints (at 37d88175): a **Machine** table, a `**Run** — engine V
(REV), model `FILE` (G GiB, arch `A`), N tokens` line, a run table, an `Extra flags:` line; or
the engine's own end-of-run lines plus the CSV's `# summary` trailer. Reports are also pasted
without the form (upstream's #192 is bench-report.sh's block alone), so every part is looked
for in the whole text, and a report may carry any subset of them.

The engine's lines are read by results.read.parse_console (the parser the importer uses), the CSV
lines by parse_text's key=value readers. Nothing here judges the numbers:
results.read.community_checks does.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from results.read.console_records import ConsoleRun
from results.read.parse_console import parse_console
from results.read.parse_text import NumberError, kv_pairs, parse_kv, to_number

# the form's field labels (benchmark-report.yml at ecd7b568) -> its field ids
FORM_FIELDS = {"Hardware": "hardware", "OS / kernel": "os", "Model and quantization": "model",
               "Engine version or commit": "engine", "Measured result": "report", "Exact command": "command",
               "Anything unusual": "notes", "Raw data": "attach"}
NO_RESPONSE = "_No response_"          # GitHub's rendering of an optional field left empty
# bench-report.sh's two tables, told apart by a column only each has
MACHINE_KEY = "Storage read (512 KiB, O_DIRECT)"
RUN_KEY = "Decode tok/s"
_HEADING_RE = re.compile(r"^### (.+?)\s*$")
_FENCE_RE = re.compile(r"^\s*(```|~~~)")
_RUN_LINE_RE = re.compile(
    r"\*\*Run\*\*\s*[—–-]+\s*engine (?P<engine>\S+) \((?P<rev>[^)]*)\), model `(?P<model_file>[^`]+)` "
    r"\((?P<model_gib>[0-9]+(?:\.[0-9]+)?) GiB, arch `(?P<arch>[^`]*)`\), (?P<tokens>[0-9]+) tokens")
_EXTRA_RE = re.compile(r"^Extra flags: `(?P<flags>[^`]*)`")
_CSV_LINE_RE = re.compile(r"^# (?!summary\b)[A-Za-z_]+=")
_SUMMARY_PREFIX = "# summary"


@dataclass(frozen=True, eq=False)
class CommunityReport:
    """What one report states. Every mapping holds text as written (numbers are the checks' to read)
    except `csv_summary`, read as the importer reads a CSV trailer."""

    text: str                              # the report as given, newlines normalised to \\n
    sha256: str                            # of `text` encoded as UTF-8
    fields: Mapping[str, str]              # form field id -> value ("" for `_No response_`); empty without the form
    machine: Mapping[str, str]             # bench-report's Machine row, by column
    run: Mapping[str, str]                 # its Run table row, by column
    run_line: Mapping[str, str]            # its `**Run** — engine …` line: engine, rev, model_file, model_gib, arch, tokens
    extra_flags: str | None                # its `Extra flags:` (None: no such line)
    console: ConsoleRun | None             # the engine's own lines the report quotes (None: it quotes none)
    csv_preamble: Mapping[str, str]        # `# key=value` lines of a quoted CSV
    csv_summary: Mapping[str, int | float | str]   # a quoted `# summary` trailer
    problems: tuple[str, ...] = ()         # what could not be read (a damaged number, two runs in one report)

    def field(self, name: str) -> str:
        return self.fields.get(name, "")


def report_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def parse_report(text: str) -> CommunityReport:
    """One report's text (the issue body, or bench-report.sh's output) as a CommunityReport."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").lstrip("\ufeff")
    lines = text.split("\n")
    fields = _form_fields(lines)
    body = [line for line in lines if not _FENCE_RE.match(line)]
    tables = _tables(body)
    machine = next((t for t in tables if MACHINE_KEY in t), {})
    run = next((t for t in tables if RUN_KEY in t), {})
    run_line = next((m.groupdict() for line in body if (m := _RUN_LINE_RE.search(line))), {})
    extra = next((m["flags"] for line in body if (m := _EXTRA_RE.match(line.strip()))), None)
    problems: list[str] = []
    console = _console(body, problems)
    preamble: dict[str, str] = {}
    summary: dict[str, int | float | str] = {}
    for line in body:
        stripped = line.strip()
        if stripped.startswith(_SUMMARY_PREFIX):
            try:
                summary = {k: to_number(v, k) for k, v in kv_pairs(stripped[len(_SUMMARY_PREFIX):])}
            except NumberError as e:
                problems.append(f"the quoted `# summary` trailer: {e}")
        elif _CSV_LINE_RE.match(stripped):
            preamble.update(parse_kv(stripped[1:]))
    return CommunityReport(text=text, sha256=report_sha256(text), fields=MappingProxyType(fields),
                           machine=MappingProxyType(machine), run=MappingProxyType(run),
                           run_line=MappingProxyType(run_line), extra_flags=extra, console=console,
                           csv_preamble=MappingProxyType(preamble), csv_summary=MappingProxyType(summary),
                           problems=tuple(problems))


def _form_fields(lines: list[str]) -> dict[str, str]:
    """The form's `### Label` sections by field id; a fenced value without its fence."""
    out: dict[str, str] = {}
    name: str | None = None
    value: list[str] = []
    fenced = False

    def close() -> None:
        if name is not None:
            kept = [line for line in value if not _FENCE_RE.match(line)]
            text = "\n".join(kept).strip()
            out[name] = "" if text == NO_RESPONSE else text

    for line in lines:
        if _FENCE_RE.match(line):
            fenced = not fenced
        heading = None if fenced else _HEADING_RE.match(line)
        if heading and heading[1] in FORM_FIELDS:
            close()
            name, value = FORM_FIELDS[heading[1]], []
        elif name is not None:
            value.append(line)
    close()
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _tables(lines: list[str]) -> list[dict[str, str]]:
    """Each Markdown table's first data row, by column name."""
    out = []
    for i in range(len(lines) - 2):
        head, rule, row = lines[i].strip(), lines[i + 1].strip(), lines[i + 2].strip()
        if head.startswith("|") and rule.startswith("|") and set(rule) <= set("|-: ") and row.startswith("|"):
            names, values = _cells(head), _cells(row)
            if len(names) == len(values):
                out.append(dict(zip(names, values, strict=True)))
    return out


def _console(lines: list[str], problems: list[str]) -> ConsoleRun | None:
    """The engine lines the report quotes, through the importer's console parser (None when it
    quotes none). Lines are taken as written, leading spaces off (a paste indents them)."""
    engine_lines = [line.strip() for line in lines]
    try:
        run = parse_console(engine_lines, paths=("report",))
    except (NumberError, ValueError) as e:      # ParseError is a ValueError: a second run's lines, a damaged number
        problems.append(str(e))
        return None
    seen = (run.generation, run.compute, run.prefill, run.moe_stream, run.moe_cache, run.streaming, run.cache_auto)
    if any(x is not None for x in seen) or run.values.get("mode"):
        return run
    return None


def as_dict(report: CommunityReport) -> dict[str, Any]:
    """The report's stated parts as plain data (provenance; no engine lines)."""
    return {"fields": dict(report.fields), "machine": dict(report.machine), "run": dict(report.run),
            "run_line": dict(report.run_line), "extra_flags": report.extra_flags,
            "csv_preamble": dict(report.csv_preamble), "csv_summary": dict(report.csv_summary)}
