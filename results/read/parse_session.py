"""Read upstream's session captures: the turns of one `--session` engine and the status samples
taken through the idle gap between them (upstream's `scripts/rewarm-ab.sh`, docs/formats.md
"Session captures").

That script runs two turns of one session with an idle gap timed from turn 1's `BMOE_DONE`, and
keeps three things, each of which reads here as one SessionCapture:

- **engine**: `rewarm-ab-TAG.out`, the engine's stdout and stderr (`BMOE_READY` / `BMOE_BEGIN` /
  `BMOE_PROGRESS` / `BMOE_DONE` / `BMOE_ERROR` lines and the engine's own log lines), with
  `rewarm-ab-TAG.mem` beside it: `-- idle 240s from turn 1 done --`, then one
  `t=N VmSwap: X kB VmRSS: Y kB` line per 10 s (either field empty when the process was gone);
- **report**: the script's own stdout saved to a file: `== TAG: engine pid PID, flags: …`,
  `== TAG swap through the idle gap:` and the .mem's lines, `== TAG turns:` and the `BMOE_DONE`
  (and `rewarm`) lines with everything from `,"text"` on replaced by `}` (the script's `sed`), one
  such block per TAG;
- **jsonl**: `BMOE_DONE` summaries one a line (`BMOE_DONE {…}` or bare `{…}`), as upstream's
  bench-data keeps them (`turns-TAG.jsonl`, beside `idle-TAG.mem`).

A .mem pairs with the engine capture or JSON-lines file of the same TAG in its folder (the name
minus `rewarm-ab-`, `turns-` or `idle-`). Strict where a capture says what a turn did: a
`BMOE_DONE` whose JSON does not parse (cut short; the script's cut parses) or is no object (a
JSON-lines file whose first summary is `BMOE_DONE null` is read, and refused), a .mem line that is no
`t=N …` sample, or a last line cut mid-way refuses the capture with `file:line: what`
(ParseError). Lenient elsewhere: unknown keys of `BMOE_DONE` are kept, the engine's other lines
are left to results.read.parse_console, impossible values are stored as missing with a note.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from engine.app import protocol
from results.read.console_records import ConsoleRun
from results.read.parse_console import EVENT_RE, event_json, parse_console
from results.read.parse_text import NumberError, ParseError, located, one_line, read_lines, to_number
from results.read.parse_values import checked

ENGINE, REPORT, JSONL = "engine", "report", "jsonl"
CAPTURE_SUFFIXES = (".out", ".log", ".txt")          # where an engine capture or a saved report may be
TAG_PREFIXES = ("rewarm-ab-", "turns-", "idle-")      # the script's and upstream bench-data's file names
SCRIPT_TURNS = 2                                      # rewarm-ab.sh sends two requests
_DROPPED_KEYS = ("text", "reasoning")                 # the answer, not a measurement (the script cuts it too)
_MEM_HEADER_RE = re.compile(r"^-- idle ([0-9]+(?:\.[0-9]+)?)s from turn 1 done --\s*$")
_SAMPLE_RE = re.compile(r"^t=([0-9]+)\s*(?:VmSwap:\s*([0-9]+)\s+kB)?\s*(?:VmRSS:\s*([0-9]+)\s+kB)?\s*$")
_REPORT_START_RE = re.compile(r"^== (\S+): engine pid (\S*), flags:(.*)$")
_REPORT_SECTION_RE = re.compile(r"^== (\S+) (swap through the idle gap|turns):\s*$")
# the script's own words when a step failed (it prints them instead of the step's output)
_SCRIPT_FAILURES = ("engine failed to load", "turn 1 never finished", "turn 2 never finished")


@dataclass(frozen=True)
class GapSample:
    """One `t=N` line of a .mem: seconds since turn 1's BMOE_DONE, as the script counts them (its
    10 s sleeps), and the engine's VmSwap / VmRSS (None when the field was empty)."""

    t_s: int
    vm_swap_kb: int | None
    vm_rss_kb: int | None


@dataclass(frozen=True)
class GapLog:
    """The samples of one idle gap (a .mem file, or the report's copy of it)."""

    where: str                         # the file (and line) it was read from
    idle_s: float
    samples: tuple[GapSample, ...]


@dataclass(frozen=True)
class SessionCapture:
    """One session as a capture tells it."""

    kind: str                          # ENGINE, REPORT or JSONL
    tag: str
    paths: tuple[Path, ...]            # the files it was read from
    dones: tuple[Mapping[str, Any], ...]    # each turn's BMOE_DONE object, in order, without its text
    errors: tuple[Mapping[str, Any], ...] = ()   # BMOE_ERROR objects
    requests: int | None = None        # BMOE_BEGIN lines (an engine capture), or the script's 2
    gap: GapLog | None = None
    flags: str | None = None           # the report's `flags:` (the extra bmoe-cli flags)
    pid: str | None = None
    console: ConsoleRun | None = None  # the engine's own lines (an engine capture; a report's rewarm lines)
    ready: Mapping[str, Any] | None = None
    failures: tuple[str, ...] = ()     # the script's `turn 2 never finished` and the like
    notes: tuple[str, ...] = ()


def capture_tag(path: Path) -> str:
    """`rewarm-ab-off.out`, `turns-off.jsonl`, `idle-off.mem` -> `off`."""
    stem = path.name.split(".")[0]
    for prefix in TAG_PREFIXES:
        if stem.startswith(prefix) and len(stem) > len(prefix):
            return stem[len(prefix):]
    return stem


# ── what each file is ──────────────────────────────────────────────────────────────────────────


def is_gap_log(lines: Sequence[str]) -> bool:
    return bool(lines) and bool(_MEM_HEADER_RE.match(lines[0]))


def is_report(lines: Sequence[str]) -> bool:
    return any(_REPORT_START_RE.match(line) for line in lines)


def is_engine_capture(lines: Sequence[str]) -> bool:
    """A `--session` engine's output: it says BMOE_READY (or answered a turn), which a one-shot
    `--progress` run never prints."""
    return any(line.startswith((protocol.READY + " ", protocol.DONE + " ")) for line in lines)


def is_done_lines(lines: Sequence[str]) -> bool:
    """A JSON-lines file of BMOE_DONE summaries: its first non-blank line is one (`BMOE_DONE …`,
    however damaged, or a bare `{…"tokens"…}`), or a later line says `BMOE_DONE {`. A damaged
    first summary (`BMOE_DONE null`) is then read, and refused, rather than the file skipped."""
    first = next((line.strip() for line in lines if line.strip()), "")
    return (first.startswith(protocol.DONE) or (first.startswith("{") and '"tokens"' in first)
            or any(line.startswith(protocol.DONE + " {") for line in lines))


# ── readers ────────────────────────────────────────────────────────────────────────────────────


def done_object(text: str, where: str, notes: list[str]) -> Mapping[str, Any]:
    """The JSON of one BMOE_DONE line (after the kind), its answer text dropped, impossible values
    stored as missing with a note. ParseError when it is not a JSON object."""
    try:
        obj = event_json(text.strip())
    except NumberError as e:
        raise located(e, where) from None
    except ValueError:
        raise ParseError(f"{where}: {protocol.DONE} is not JSON (cut short?): {one_line(text)}") from None
    if not isinstance(obj, dict):
        raise ParseError(f"{where}: {protocol.DONE} is not a JSON object: {one_line(text)}")
    kept = {k: v for k, v in obj.items() if k not in _DROPPED_KEYS}
    return MappingProxyType(checked(kept, where, notes))


def gap_lines(lines: Sequence[str], where: Any, cut_last: bool) -> GapLog:
    """The header and `t=N` lines of a .mem (or the report's copy). `where(i)` names line i;
    `cut_last`: the last line had no newline, so it must be a whole sample."""
    head = _MEM_HEADER_RE.match(lines[0]) if lines else None
    if head is None:
        raise ParseError(f"{where(0)}: not a gap log: the first line is not `-- idle Ns from turn 1 done --`")
    samples = []
    for i in range(1, len(lines)):
        line = lines[i]
        if not line.strip():
            continue
        m = _SAMPLE_RE.match(line)
        if m is None:
            raise ParseError(f"{where(i)}: not a status sample (t=N VmSwap: X kB VmRSS: Y kB): {one_line(line)}")
        if cut_last and i == len(lines) - 1 and m[3] is None:
            raise ParseError(f"{where(i)}: the last line is cut short (no newline, no VmRSS): {one_line(line)}")
        try:
            samples.append(GapSample(int(to_number(m[1], "t")),
                                     None if m[2] is None else int(to_number(m[2], "vm_swap_kb")),
                                     None if m[3] is None else int(to_number(m[3], "vm_rss_kb"))))
        except NumberError as e:
            raise located(e, where(i)) from None
    try:
        idle_s = to_number(head[1], "idle_s")     # as read: float() would round 2^64 - 1 up to 2^64
    except NumberError as e:
        raise located(e, where(0)) from None
    assert not isinstance(idle_s, str)           # the header's pattern holds a numeral
    return GapLog(where(0), idle_s, tuple(samples))


def read_gap_log(path: Path) -> GapLog:
    lines, newline = read_lines(path)
    return gap_lines(lines, lambda i: f"{path}:{i + 1}", cut_last=not newline)


def read_done_lines(path: Path, gap: GapLog | None = None) -> SessionCapture:
    """A JSON-lines file: one `BMOE_DONE {…}` or `{…}` per non-blank line."""
    lines, _ = read_lines(path)
    notes: list[str] = []
    dones = []
    for i, line in enumerate(lines):
        text = line.strip()
        if not text:
            continue
        body = text.removeprefix(protocol.DONE + " ")
        if not body.startswith("{"):
            raise ParseError(f"{path}:{i + 1}: not a {protocol.DONE} summary: {one_line(text)}")
        dones.append(done_object(body, f"{path}:{i + 1}", notes))
    return SessionCapture(JSONL, capture_tag(path), (path,), tuple(dones), gap=gap, notes=tuple(notes))


def read_engine_capture(path: Path, gap: GapLog | None = None) -> SessionCapture:
    """The engine's merged stdout and stderr in `--session` mode."""
    lines, newline = read_lines(path)
    notes: list[str] = []
    dones, errors = [], []
    ready = None
    begins = 0
    for i, line in enumerate(lines):
        m = EVENT_RE.match(line)
        if m is None:
            continue
        where = f"{path}:{i + 1}"
        kind = "BMOE_" + m[1]
        if kind == protocol.DONE:
            if not newline and i == len(lines) - 1:
                raise ParseError(f"{where}: the last {protocol.DONE} is cut short (no newline)")
            dones.append(done_object(m[2], where, notes))
        elif kind == protocol.BEGIN:
            begins += 1
        elif kind in (protocol.ERROR, protocol.READY):
            try:
                obj = event_json(m[2])
            except NumberError as e:
                raise located(e, where) from None
            except ValueError:
                continue           # a cut line of these tells nothing a turn measured
            if isinstance(obj, dict):
                if kind == protocol.READY:
                    ready = MappingProxyType(checked(obj, where, notes))
                else:
                    errors.append(MappingProxyType(checked(obj, where, notes)))   # its id is a turn's
    console = parse_console(lines, paths=(str(path),))
    return SessionCapture(ENGINE, capture_tag(path), (path,), tuple(dones), tuple(errors), begins, gap,
                          console=console, ready=ready, notes=(*notes, *console.notes))


def read_report(path: Path) -> list[SessionCapture]:
    """The script's printed report: one SessionCapture per `== TAG: engine pid` block."""
    lines, newline = read_lines(path)

    def where(i: int) -> str:
        return f"{path}:{i + 1}"

    starts = [i for i, line in enumerate(lines) if _REPORT_START_RE.match(line)]
    out = []
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        last_block = end == len(lines)
        out.append(_report_block(path, lines, start, end, where, cut_last=last_block and not newline))
    return out


def _report_block(path: Path, lines: Sequence[str], start: int, end: int, where: Any,
                  cut_last: bool) -> SessionCapture:
    head = _REPORT_START_RE.match(lines[start])
    assert head is not None
    tag, pid, flags = head[1], head[2], head[3].strip()
    notes: list[str] = []
    section = ""
    gap_at: list[int] = []
    dones = []
    rewarm: list[str] = []
    failures = []
    for i in range(start + 1, end):
        line = lines[i]
        if m := _REPORT_SECTION_RE.match(line):
            if m[1] != tag:
                raise ParseError(f"{where(i)}: a section of {one_line(m[1])} inside the block of {one_line(tag)}")
            section = "gap" if m[2].startswith("swap") else "turns"
            continue
        if line.strip() in _SCRIPT_FAILURES:
            failures.append(line.strip())
            continue
        if section == "gap":
            gap_at.append(i)
        elif section == "turns" and line.strip():
            at = line.find(protocol.DONE + " ")
            if at >= 0:
                if cut_last and i == end - 1 and not line.rstrip().endswith("}"):
                    raise ParseError(f"{where(i)}: the last {protocol.DONE} is cut short (no newline)")
                dones.append(done_object(line[at + len(protocol.DONE) + 1:], where(i), notes))
            elif "rewarm" in line:
                rewarm.append(line)
            else:
                raise ParseError(f"{where(i)}: in the turns section, neither a {protocol.DONE} nor a rewarm line: "
                                 f"{one_line(line)}")
    gap = None
    if gap_at:
        first = gap_at[0]
        block = [lines[i] for i in range(first, gap_at[-1] + 1)]
        gap = gap_lines(block, lambda k: where(first + k), cut_last=cut_last and gap_at[-1] == end - 1)
    console = parse_console(rewarm, paths=(str(path),)) if rewarm else None
    return SessionCapture(REPORT, tag, (path,), tuple(dones), requests=SCRIPT_TURNS, gap=gap, flags=flags,
                          pid=pid or None, console=console, failures=tuple(failures),
                          notes=(*notes, *(console.notes if console else ())))


# ── a folder's captures ────────────────────────────────────────────────────────────────────────


def find_sessions(files: Iterable[Path]) -> tuple[list[SessionCapture], set[Path]]:
    """The session captures among `files` (a folder's, already walked), and every file they were
    read from (so that the one-shot readers skip them). A .mem pairs with the engine capture or
    JSON-lines file of its TAG in its folder, or is the copy a report of that TAG already holds;
    a .mem with neither is refused: its gap has no turns."""
    mems: dict[tuple[Path, str], Path] = {}
    turns: list[tuple[str, Path]] = []
    reports: list[Path] = []
    for path in sorted(files):
        if path.name.endswith(".mem"):
            lines = read_lines(path)[0]
            if is_gap_log(lines):
                mems[(path.parent, capture_tag(path))] = path
        elif path.name.endswith(".jsonl"):
            if is_done_lines(read_lines(path)[0]):
                turns.append((JSONL, path))
        elif path.name.endswith(CAPTURE_SUFFIXES):
            lines = read_lines(path)[0]
            if is_report(lines):
                reports.append(path)
            elif is_engine_capture(lines):
                turns.append((ENGINE, path))
    found: list[SessionCapture] = []
    claimed: set[Path] = set(reports)
    for path in reports:
        found += read_report(path)
    reported = {(c.paths[0].parent, c.tag) for c in found}
    for kind, path in turns:
        mem = mems.pop((path.parent, capture_tag(path)), None)
        gap = read_gap_log(mem) if mem is not None else None
        capture = read_engine_capture(path, gap) if kind == ENGINE else read_done_lines(path, gap)
        found.append(capture if mem is None else replace(capture, paths=(path, mem)))
        claimed |= {path} | ({mem} if mem else set())
    for key, mem in sorted(mems.items()):
        if key not in reported:
            raise ParseError(f"{mem}: a gap log with no turns beside it (no rewarm-ab-{key[1]}.out, "
                             f"turns-{key[1]}.jsonl or report of {key[1]} in its folder)")
        claimed.add(mem)
    return found, claimed



# ── run.json `turns` (the shape harness/run/turns.py writes for a live session cell) ─────────────────


def _num(obj: Mapping[str, Any], key: str) -> int | float | None:
    """A number of `obj` as it is (an int stays one: float() would round 2^64 - 1 up to 2^64); None
    for anything else, a bool included."""
    v = obj.get(key)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# run.json turn key -> the BMOE_DONE key it is read from
DONE_KEYS = {"tokens": "tokens", "tok_s": "tok_s", "cache_hit_pct": "cache_hit_pct", "read_mib": "read_mib",
             "majflt_per_tok": "majflt_tok", "token_demand_mib": "token_demand_mib",
             "cache_resident_mib": "cache_resident_mib", "prefill_s": "prefill_s"}


def done_figures(done: Mapping[str, Any]) -> dict[str, Any]:
    """A turn's figures from its BMOE_DONE object (None where it has no such key), s/token its
    tok/s inverted: the same for a live session cell (harness/run/turns.py) and an imported one."""
    out: dict[str, Any] = {key: _num(done, src) for key, src in DONE_KEYS.items()}
    tok_s = out["tok_s"]
    out = {"tokens": out["tokens"], "tok_s": tok_s, "s_per_token": round(1 / tok_s, 6) if tok_s else None,
           **{k: v for k, v in out.items() if k not in ("tokens", "tok_s")}}
    return out


def extremes(columns: Mapping[str, Sequence[int | float | None]]) -> dict[str, Any]:
    """`{name}_min_kb` / `{name}_max_kb` of each column over its known values (None when none)."""
    out: dict[str, Any] = {}
    for name, values in columns.items():
        got = [v for v in values if v is not None]
        out[f"{name}_min_kb"] = min(got) if got else None
        out[f"{name}_max_kb"] = max(got) if got else None
    return out


def gap_record(gap: GapLog) -> dict[str, Any]:
    """A turn's `gap` from the samples of a .mem: no clock (start/end null), no RssFile, no apps;
    `series` keeps each sample (seconds as the script counts them from turn 1's BMOE_DONE)."""
    return {"idle_s": gap.idle_s, "start_t_s": None, "end_t_s": None, "samples": len(gap.samples),
            **extremes({"vm_swap": [s.vm_swap_kb for s in gap.samples], "vm_rss": [s.vm_rss_kb for s in gap.samples],
                        "rss_file": []}),
            "apps": [], "series": [{"t_s": s.t_s, "vm_swap_kb": s.vm_swap_kb, "vm_rss_kb": s.vm_rss_kb}
                                   for s in gap.samples]}


def session_turns(capture: SessionCapture) -> list[dict[str, Any]]:
    """run.json `turns` of an imported session: one per BMOE_DONE, then per BMOE_ERROR of another
    id, then one `unanswered` per request the capture shows no answer to. The gap (the .mem is
    timed from turn 1's BMOE_DONE) goes on turn 2."""
    answers: list[tuple[str, Mapping[str, Any]]] = [("done", d) for d in capture.dones]
    done_ids = {d.get("id") for d in capture.dones}
    answers += [("error", e) for e in capture.errors if e.get("id") not in done_ids and e.get("id") != 0]
    sent = max(len(answers), capture.requests or 0)
    out = []
    for k in range(1, sent + 1):
        kind, obj = answers[k - 1] if k <= len(answers) else ("unanswered", {})
        raw_id = obj.get("id")
        rec: dict[str, Any] = {"turn": k, "id": raw_id if isinstance(raw_id, int) else k, "outcome": kind,
                               **done_figures(obj if kind == "done" else {}), "swap_in_mib": None,
                               "sent_t_s": None, "answered_t_s": None, "evictions": None, "rereads": None}
        if kind == "error":
            rec["error"] = str(obj.get("msg", ""))[:300]
        if kind == "done":
            rec["bmoe_done"] = dict(obj)          # every key the engine gave (rewarm_s, cpu_s_tok …)
        if k == 2 and capture.gap is not None:
            rec["gap"] = gap_record(capture.gap)
        out.append(rec)
    return out


def missing_notes(capture: SessionCapture, where: str) -> list[str]:
    """What the run's `notes` say is null because upstream's capture does not have it."""
    notes = [f"{where}: not in the capture, stored as null: each turn's evictions and rereads (BMOE_DONE has no "
             f"churn counts and the session's CSV was not kept), swap_in_mib (the device's pswpin was not sampled), "
             f"sent_t_s/answered_t_s and the gap's start/end (BMOE_DONE carries no clock)"]
    if capture.gap is not None:
        notes.append(f"{where}: the gap's RssFile (the .mem samples VmSwap and VmRSS only) and apps stored as null; "
                     f"its t_s count the script's 10 s sleeps from turn 1's BMOE_DONE")
    else:
        notes.append(f"{where}: no status samples of the gap (no .mem beside the turns): the gap's VmSwap/VmRSS "
                     f"stored as null")
    absent = sorted({key for d in capture.dones for key, src in DONE_KEYS.items() if src not in d})
    if absent:
        notes.append(f"{where}: BMOE_DONE of this release has no {', '.join(DONE_KEYS[k] for k in absent)}: "
                     f"{', '.join(absent)} stored as null")
    notes.append(f"{where}: the turns' prompts are not in the capture (rewarm-ab.sh asks two different ones), so "
                 f"the gap re-read (results/read/turns.py) compares turns that may not ask for the same experts")
    return notes
