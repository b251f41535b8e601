"""Output formats of `table`, `recommend` and `compare`, and where the output goes.

`--format text|csv|json|jsonl|md` (md: a GitHub table, as llama-bench's `-o md`, ready for an issue
or a pull request); `-o -` (the default) writes to stdout, `-o FILE` writes the file atomically
(temporary file + rename: a reader sees the old file or the new one; a symlink there is replaced,
a FIFO or a device refused: engine/fsutil.py). Without `--format`, a file's suffix chooses
(`.csv`, `.json`, `.jsonl`, `.md`, `.parquet`, anything else text).
Parquet (the run table only) needs pyarrow: `pip install 'bmoe-fleet[parquet]'`.

Markdown is read where GitHub renders it, so every string from a campaign (a device name, an
engine argument, a path) is text there, never markup: `md_text` escapes HTML's `<`, `>` and `&`
as entities (GitHub renders raw HTML such as `<img src=y onerror=…>`), and the backslash, the
backtick and the square brackets (a code span, a link or an image) with a backslash; in a table
cell the pipe too, and a line break is `<br>`. `md_code` puts a string in a code span that no
backtick inside it can close.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.fsutil import atomic_write, replaced_link, write_target
from results.errors import ResultsError
from store.versioned import json_safe

FORMATS = ("text", "csv", "json", "jsonl", "md")
STDOUT = "-"
_BY_SUFFIX = {".csv": "csv", ".json": "json", ".jsonl": "jsonl", ".md": "md", ".parquet": "parquet"}
PARQUET_HINT = "writing parquet needs pyarrow: pip install 'bmoe-fleet[parquet]' (or pip install pyarrow)"


def choose_format(fmt: str | None, out: str | None, allowed: Sequence[str] = FORMATS) -> str:
    """The format asked for, else the one the output file's suffix names, else text."""
    if fmt is None and out and out != STDOUT:
        suffix = Path(out).suffix.lower()
        if suffix not in _BY_SUFFIX and suffix != ".txt":
            names = ", ".join(s for s, f in _BY_SUFFIX.items() if f in allowed)
            raise ResultsError(f"{out}: write {names} or .txt, or say which with --format")
        fmt = _BY_SUFFIX.get(suffix, "text")
    fmt = fmt or "text"
    if fmt not in allowed:
        raise ResultsError(f"--format {fmt}: this command writes {', '.join(allowed)}"
                           + (f" (a {Path(out).suffix} file)" if out and out != STDOUT and fmt == _BY_SUFFIX.get(
                               Path(out).suffix.lower()) else ""))
    if fmt == "parquet" and (out is None or out == STDOUT):
        raise ResultsError("--format parquet is binary: give -o FILE.parquet")
    return fmt


def cell_text(value: Any, digits: int = 4) -> str:
    """A value as a table shows it: empty for missing, numbers to a few significant digits."""
    value = json_safe(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.{digits}g}"
    if isinstance(value, (list, tuple)):
        return " ".join(cell_text(v) for v in value)
    return str(value)


def to_json(data: Any) -> str:
    return json.dumps(json_safe(data), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def to_jsonl(records: Sequence[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(json_safe(r), ensure_ascii=False, allow_nan=False) + "\n" for r in records)


def to_csv(records: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in records:
        w.writerow([cell_text(r.get(c), 10) for c in columns])
    return buf.getvalue()


_MD_ESCAPES = str.maketrans({"\\": "\\\\", "`": "\\`", "[": "\\[", "]": "\\]",
                              "&": "&amp;", "<": "&lt;", ">": "&gt;"})


def md_text(text: str) -> str:
    """`text` as Markdown that shows it and does nothing else (module doc), on one line."""
    return text.translate(_MD_ESCAPES).replace("\r", " ").replace("\n", " ")


def md_code(text: str) -> str:
    """`text` in a code span, on one line: fenced by one backtick more than its longest run of them."""
    text = text.replace("\r", " ").replace("\n", " ")
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _md_cell(text: str) -> str:
    # a pipe ends a cell and a newline ends the row in GitHub's tables
    return text.translate(_MD_ESCAPES).replace("|", "\\|").replace("\r", " ").replace("\n", "<br>")


def to_md(records: Sequence[Mapping[str, Any]], columns: Sequence[str], headers: Sequence[str] | None = None,
          numeric: Sequence[str] = ()) -> str:
    """A GitHub table: numbers right-aligned, as llama-bench prints them."""
    heads = list(headers or columns)
    lines = ["| " + " | ".join(_md_cell(h) for h in heads) + " |",
             "|" + "|".join("---:" if c in numeric else "---" for c in columns) + "|"]
    for r in records:
        lines.append("| " + " | ".join(_md_cell(cell_text(r.get(c))) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def to_text(records: Sequence[Mapping[str, Any]], columns: Sequence[str], headers: Sequence[str] | None = None,
            numeric: Sequence[str] = ()) -> str:
    """Aligned columns for a terminal."""
    heads = list(headers or columns)
    cells = [[cell_text(r.get(c)) for c in columns] for r in records]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(heads)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if c in numeric else v.ljust(w)
                         for v, w, c in zip(values, widths, columns)).rstrip()

    return "\n".join([line(heads), line(["-" * w for w in widths])] + [line(row) for row in cells]) + "\n"


def check_out(out: str | None) -> None:
    """Refuse, before any work, an `-o` that emit would refuse (a folder, a FIFO, a device …)."""
    if out is None or out == STDOUT:
        return
    try:
        write_target(out)
    except OSError as e:
        raise ResultsError(f"{out}: cannot write: {e.strerror or e}") from None


def emit(data: str | bytes, out: str | None, what: str = "") -> str:
    """Write `data` to `out` (atomically) and return the line to print; for stdout (`-`, or no
    `-o`), return the data itself."""
    if out is None or out == STDOUT:
        return data.decode("utf-8") if isinstance(data, bytes) else data
    check_out(out)
    path = Path(out)
    link = replaced_link(path)
    try:
        atomic_write(path, data, mkdir=True)
    except OSError as e:
        raise ResultsError(f"{out}: cannot write: {e.strerror or e}") from None
    replaced = f" (a file now: it was a symlink to {link}, left as it was)" if link is not None else ""
    return f"wrote {what + ' to ' if what else ''}{out}{replaced}"
