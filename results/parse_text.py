"""Shared ground for the bmoe-cli output parsers: the error type, bytes-to-lines, numbers, key=value.

Captures reach us from phones through adb, PowerShell and shell redirection, so text is read as
bytes and decoded leniently: a UTF-8 BOM (PowerShell's `Out-File -Encoding utf8`) is dropped,
Windows line endings are folded, and the raw bytes a tiny model generates (not valid UTF-8) become
U+FFFD instead of failing the whole file.
"""

from __future__ import annotations

import re
from pathlib import Path

from engine.errors import BmoeError

BOM = "\ufeff"
# printf's %f spellings of a number, including the nan/inf a division by zero can print
NUMBER = r"-?(?:\d+(?:\.\d*)?|\.\d+|nan|inf)"
_INT_RE = re.compile(r"-?\d+")
_KV_RE = re.compile(r"(\S+?)=(\S*)")


class ParseError(BmoeError):
    """A file cannot be read as the bmoe-cli output it was given as (one-line message)."""


def read_lines(path: str | Path) -> tuple[list[str], bool]:
    """The file's lines (BOM, CR/LF and invalid UTF-8 handled) and whether it ends with a newline.

    The flag matters for files the engine writes line by line: a last line without its newline was
    cut by a kill, and its final value may be cut too.
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ParseError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    return _split_lines(raw.decode("utf-8", errors="replace"))


def _split_lines(text: str) -> tuple[list[str], bool]:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    ends_with_newline = text.endswith("\n")
    lines = text.split("\n")
    if ends_with_newline or not text:
        lines.pop()
    # a BOM can also sit mid-file where several PowerShell captures were concatenated
    return [line.removeprefix(BOM) for line in lines], ends_with_newline


def to_number(text: str) -> int | float | str:
    """`12` -> 12, `-1.00` -> -1.0, anything else stays the string it was (unknown keys are kept)."""
    if _INT_RE.fullmatch(text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def parse_kv(text: str) -> dict[str, str]:
    """Whitespace-separated `key=value` tokens; tokens without `=` are skipped."""
    return dict(_KV_RE.findall(text))


def one_line(text: str, limit: int = 60) -> str:
    """A quotable excerpt of untrusted text for an error message that must stay on one line."""
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "…")
