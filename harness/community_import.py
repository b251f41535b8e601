"""`bmoe-fleet import REPORT… -o DIR`: community benchmark reports, checked, as runs of a campaign
directory (docs/decisions/community-import.md).

A report is upstream's `benchmark-report` issue as GitHub renders it (a `.md`/`.txt` file holding the
issue body, or bench-report.sh's output alone), or that issue exported as JSON (`gh issue view N
--json url,author,createdAt,body,title`, or the REST API's issue object), which also says who
reported it, when, and where. results.read.community_report reads it; results.read.community_checks
judges it. A rejected report writes nothing and is listed with one line per rule it broke; an
accepted one becomes one cell with one attempt (outcome ok), written by harness.importer like any
imported run: the report's numbers in the trailer's vocabulary as its `summary`, the engine lines it
quotes as stdout.txt, the report itself as report.md, and its provenance in run.json: where it came
from, who reported it and when, the form's fields, the sha256 of the text, and what each check read.

Importing the same report again adds nothing: its cell id hashes the issue URL (or, without one, the
text's sha256) and what it states.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engine.safetext import printable
from engine.units import MIB
from harness.campaign.model import CampaignError
from harness.importer import IMPORT_ENGINE, Imported, check_out_dir, commit_imported, run_record, stored_text
from harness.plan.grid import Cell, cell_id_of
from results.read.community_checks import PROTOCOL_TOKENS, RULES, Verdict, check_report, device_class
from results.read.community_report import CommunityReport, as_dict, parse_report
from results.read.parse_console import PERF_PREFIXES
from store import names, outcomes
from store.cells import CellConfig

PROVENANCE_KIND = "community-report"
MAX_REPORT_BYTES = 4 * MIB        # an issue body is at most 65,536 characters; a file far larger is not one
_ISSUE_URL_RE = re.compile(r"^https://github\.com/(?P<repo>[\w.-]+/[\w.-]+)/issues/(?P<number>[0-9]+)")
_SHARD_SUFFIX_RE = re.compile(r"-[0-9]+-of-[0-9]+$")
_MIB_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*MiB$")
# bench-report.sh's run table, column -> the CSV `# summary` trailer key it printed (bench-report.sh at 37d88175)
RUN_COLUMNS = {"Decode tok/s": "tok/s", "Prefill tok/s": "prefill_tps", "Stall s/tok": "stall_s/tok",
               "Compute s/tok": "compute_s/tok", "Cache hit": "cache_hit_pct", "majflt/tok": "majflt/tok",
               "Load s": "load_s", "Cache": "cache_budget_MiB"}


@dataclass(frozen=True)
class ReportSource:
    """One report as given: its text and what the file said about it."""

    path: str
    text: str
    url: str | None = None
    reporter: str | None = None
    reported_at: str | None = None      # ISO 8601, as GitHub gives it
    title: str | None = None


@dataclass(frozen=True)
class CommunityImport:
    out_dir: str
    accepted: tuple[dict[str, Any], ...] = ()      # {source, cell_id, device, added}
    rejected: tuple[dict[str, Any], ...] = ()      # {source, reasons: [{rule, reason}]}

    def to_dict(self) -> dict[str, Any]:
        return {"format": "bmoe-fleet.community-import", "version": 1, "dir": self.out_dir,
                "accepted": list(self.accepted), "rejected": list(self.rejected)}

    def text(self) -> str:
        lines = [f"community reports: {len(self.accepted)} accepted, {len(self.rejected)} rejected"
                 + (f" into {printable(self.out_dir)}" if self.accepted else "")]
        for a in self.accepted:
            lines.append(f"  accepted {printable(a['source'])}: cell {a['cell_id']}"
                         + ("" if a["added"] else " (already there)"))
        for r in self.rejected:
            for why in r["reasons"]:
                lines.append(f"  rejected {printable(r['source'])}: {printable(why['reason'])}")
        return "\n".join(lines)


def read_source(path: str | os.PathLike) -> ReportSource:
    """A report file: JSON (an exported issue) or text. Refused with one line when it is neither."""
    p = Path(path)
    shown = printable(str(path))
    if not p.is_file():
        raise CampaignError(f"import: {shown}: not a file")
    if p.stat().st_size > MAX_REPORT_BYTES:
        raise CampaignError(f"import: {shown}: {p.stat().st_size:,} bytes is no issue body (at most "
                            f"{MAX_REPORT_BYTES:,} read)")
    try:
        raw = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise CampaignError(f"import: {shown}: not UTF-8 text (byte {e.start})") from None
    if p.suffix.lower() != ".json":
        return ReportSource(str(p), raw)
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise CampaignError(f"import: {shown}: not JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("body"), str):
        raise CampaignError(f"import: {shown}: an exported issue has a text `body`; this JSON has none")
    author = data.get("author") if isinstance(data.get("author"), dict) else data.get("user")
    login = author.get("login") if isinstance(author, dict) else None
    url = data.get("url") or data.get("html_url")
    when = data.get("createdAt") or data.get("created_at")
    title = data.get("title")
    return ReportSource(str(p), data["body"], url=url if isinstance(url, str) else None,
                        reporter=login if isinstance(login, str) else None,
                        reported_at=when if isinstance(when, str) else None,
                        title=title if isinstance(title, str) else None)


def import_reports(paths: Sequence[str | os.PathLike], out_dir: str | os.PathLike,
                   url: str | None = None) -> CommunityImport:
    """Check each report; write the accepted ones into out_dir (created, or an earlier import
    extended). `url` names where a single text report came from (an issue's address)."""
    if not paths:
        raise CampaignError("import: give at least one report")
    if url is not None and len(paths) != 1:
        raise CampaignError("import: --url names one report's source: give one report with it")
    root = Path(out_dir).resolve()
    sources = [read_source(p) for p in paths]
    if url is not None:
        sources = [ReportSource(s.path, s.text, url, s.reporter, s.reported_at, s.title) for s in sources]
    old_plan = check_out_dir(root)
    found: list[Imported] = []
    devices: dict[str, dict[str, Any]] = {}
    accepted: list[tuple[str, Imported]] = []
    rejected: list[dict[str, Any]] = []
    for src in sources:
        report = parse_report(src.text)
        verdict = check_report(report)
        shown = src.url or src.path
        if not verdict.accepted:
            rejected.append({"source": shown, "reasons": [r.to_dict() for r in verdict.rejections]})
            continue
        imp, label, identity = _imported(src, report, verdict, len(found))
        found.append(imp)
        devices.setdefault(label, identity)
        accepted.append((shown, imp))
    out: list[dict[str, Any]] = []
    if found:
        before = {c.cell_id for c in old_plan.cells} if old_plan else set()
        commit_imported(root, old_plan, found, devices, [s.url or s.path for s in sources], "community")
        out = [{"source": shown, "cell_id": imp.cell.cell_id, "device": imp.cell.device,
                "added": imp.cell.cell_id not in before} for shown, imp in accepted]
    return CommunityImport(str(root), tuple(out), tuple(rejected))


def _label(src: ReportSource, report: CommunityReport) -> str:
    """The device label of a report: its issue (`community:OWNER/REPO#N`), else its text's hash."""
    m = _ISSUE_URL_RE.match(src.url or "")
    return f"community:{m['repo']}#{m['number']}" if m else f"community:{report.sha256[:12]}"


def _num(text: str | None) -> float | None:
    if text is None:
        return None
    t = text.strip().removesuffix("%").strip()
    m = _MIB_RE.match(t)
    try:
        return float(m[1] if m else t.replace(",", ""))
    except ValueError:
        return None


def _whole(text: str | None) -> int | None:
    v = _num(text)
    return int(v) if v is not None and v == int(v) else None


def _model(report: CommunityReport) -> str:
    name = report.run_line.get("model_file") or report.run.get("Model") or ""
    name = _SHARD_SUFFIX_RE.sub("", Path(name).name.removesuffix(".gguf"))
    if not name and report.field("model"):
        name = report.field("model").split()[0].strip(",")
    return stored_text(name) or "unknown"


def _summary(report: CommunityReport, tokens: Any) -> dict[str, Any]:
    """The run's numbers in the CSV trailer's vocabulary: the quoted trailer, else bench-report's table."""
    out: dict[str, Any] = {}
    for column, key in RUN_COLUMNS.items():
        value = _num(report.run.get(column))
        if value is not None:
            out[key] = value
    read = _num(report.run.get("Flash/token"))
    if read is not None and isinstance(tokens, int):
        out["read_MiB"] = read * tokens          # bench-report prints read_MiB / tokens, rounded to 1 MiB
    if isinstance(tokens, int):
        out["tokens"] = tokens
    out.update(report.csv_summary)
    return out


def _reported_epoch(src: ReportSource) -> float:
    if src.reported_at:
        try:
            return datetime.fromisoformat(src.reported_at.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    return Path(src.path).stat().st_mtime


def _imported(src: ReportSource, report: CommunityReport, verdict: Verdict,
              index: int) -> tuple[Imported, str, dict[str, Any]]:
    label = _label(src, report)
    model = _model(report)
    tokens = verdict.facts.get("tokens")
    cores_threads = (report.machine.get("Cores / threads used") or "").split("/")
    config: dict[str, Any] = {
        "model": model, "arch": report.run_line.get("arch") or report.csv_preamble.get("arch"),
        "n_expert_used": _whole(report.run.get("k")), "io_threads": _whole(report.run.get("Lanes")),
        "n_ubatch": _whole(report.run.get("ubatch")),
        "threads": _whole(cores_threads[1]) if len(cores_threads) == 2 else None,
        "n_predict": _whole(report.run_line.get("tokens")), "moe_stream": bool(verdict.facts.get("streamed")),
        "budget_spec": "imported",
        "source": src.url or f"report sha256:{report.sha256[:16]}",
    }
    if report.extra_flags not in (None, "none"):
        config["flags"] = report.extra_flags
    config = {k: stored_text(v) for k, v in config.items() if v is not None}
    cell_config = CellConfig.from_dict(dict(sorted(config.items())))
    cid = cell_id_of(label, model, IMPORT_ENGINE, cell_config, 0, 0)
    summary = _summary(report, tokens)
    hit = summary.get("cache_hit_pct")
    result = {"tokens": tokens, "tok_per_s": summary.get("tok/s"),
              "cache_hit_pct": None if hit is None or hit == -1 else hit,
              "budget_mib": summary.get("cache_budget_MiB"), "cycle_mb": None}
    engine = verdict.facts.get("engine")
    provenance = {
        "kind": PROVENANCE_KIND, "source": src.url or src.path, "file": src.path,
        "issue": ({"repo": m["repo"], "number": int(m["number"])} if (m := _ISSUE_URL_RE.match(src.url or ""))
                  else None),
        "title": src.title, "reporter": src.reporter, "reported_at": src.reported_at,
        "imported_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "sha256": report.sha256, "report_file": names.REPORT_MD,
        **{k: v for k, v in as_dict(report).items() if k != "fields"},
        "fields": {k: v for k, v in report.fields.items() if k != "report"},   # the result itself is report.md
        "checks": {"rules": list(RULES), "protocol_tokens": PROTOCOL_TOKENS, "read": verdict.facts},
    }
    notes = [f"{src.path}: numbers from the report's own table (no CSV came with it)"] if not report.csv_summary else []
    record = run_record(cid, label, model, cell_config, index, outcomes.OK, (), _reported_epoch(src), notes,
                        src.url or src.path, engine_version=str(engine or ""),
                        o_direct=None if report.console is None or report.console.streaming is None
                        else int(report.console.streaming.o_direct),
                        summary=summary, result=result,
                        imported_from={"files": [src.path], "section": None, "capture": PROVENANCE_KIND},
                        provenance=provenance)
    files: dict[str, Path | bytes] = {names.REPORT_MD: report.text.encode("utf-8")}
    if report.console is not None:
        quoted = [line for line in report.console.lines if line.startswith((*PERF_PREFIXES, "bmoe:"))]
        files[names.STDOUT_TXT] = ("\n".join(quoted) + "\n").encode("utf-8")    # the engine's lines it quotes
    identity = {"hardware": stored_text(report.field("hardware")), "os": stored_text(report.field("os")),
                "device_class": device_class(report),
                "machine": {k: stored_text(v) for k, v in report.machine.items()}, "first_reported_at": time.time()}
    return Imported(Cell(cid, label, model, IMPORT_ENGINE, cell_config, 0, 0, index, ()), record, files), label, identity


def render(result: CommunityImport, as_json: bool) -> str:
    return json.dumps(result.to_dict(), indent=2) if as_json else result.text()
