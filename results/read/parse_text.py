"""Shared ground for the bmoe-cli output parsers: the error type, bytes-to-lines, numbers, key=value.

Captures reach us from phones through adb, PowerShell and shell redirection, so text is read as
bytes and decoded leniently: a UTF-8 BOM (PowerShell's `Out-File -Encoding utf8`) is dropped,
Windows line endings are folded, and the raw bytes a tiny model generates (not valid UTF-8) become
U+FFFD instead of failing the whole file.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from engine.errors import BmoeError
from engine.safetext import excerpt
from engine.units import ASCII_SPACE, FLOAT_TEXT, is_digits
from results.errors import safe_message

BOM = "\ufeff"
# printf's %f spellings of a number, including the nan/inf a division by zero can print
NUMBER = r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+|nan|inf)"
_INT_RE = re.compile(r"-?[0-9]+")
# what to_number reads as a float: printf's %f/%g/%e spellings (no `1_0`, no hex, no padding)
_FLOAT_RE = re.compile(FLOAT_TEXT)
_KV_RE = re.compile(r"(\S+?)=(\S*)")
# The engine's counters are 64-bit and every time, size and rate it prints is far below 2^64; %f of
# the largest of them is about 30 characters. A longer numeral, or a larger value, was not printed
# by an engine: the file is damaged (and Python refuses int() past 4,300 digits anyway).
MAX_NUMBER_CHARS = 40
NUMBER_LIMIT = 2 ** 64
class ParseError(BmoeError):
    """A file cannot be read as the bmoe-cli output it was given as (one-line message).

    The message is made terminal-safe here, once for every reader: it may quote file names and
    excerpts of the offending input."""

    def __init__(self, message: str = "") -> None:
        super().__init__(safe_message(message))


class NumberError(ParseError):
    """A numeral no engine could print (too long, |value| >= 2^64, or not ASCII decimal): the file
    is damaged."""


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


def to_number(text: str, key: str = "") -> int | float | str:
    """`12` -> 12, `-1.00` -> -1.0, `nan` -> nan, anything else stays the string it was (unknown keys
    are kept). A numeral no engine could print raises NumberError naming `key` (the caller adds the
    file and line): too long or too large, or one Python would read that is not ASCII decimal
    (`١٢٣`, `１２`, `1_000`: int() reads them, no engine prints them; engine.units)."""
    if _INT_RE.fullmatch(text):
        if len(text) > MAX_NUMBER_CHARS:
            raise out_of_range(key, text)
        return check_magnitude(key, int(text), text)
    if not _FLOAT_RE.fullmatch(text):
        if _python_reads(text):
            raise not_ascii(key, text)
        return text
    if len(text) > MAX_NUMBER_CHARS:
        raise out_of_range(key, text)
    value = float(text)
    if math.isinf(value) and not text.lstrip("+-").lower().startswith("inf"):
        raise out_of_range(key, text)  # `1e400`: printf spells an infinity `inf`
    return check_magnitude(key, value, text)


def check_magnitude(key: str, value: int | float, text: str | None = None) -> int | float:
    """`value` itself when it is under NUMBER_LIMIT in size. nan and ±inf pass: they are what printf
    writes for a division by zero, and results.read.parse_values stores them as missing."""
    if not (isinstance(value, float) and math.isinf(value)) and abs(value) >= NUMBER_LIMIT:
        raise out_of_range(key, str(value) if text is None else text)
    return value


def _python_reads(text: str) -> bool:
    """float() reads `text`, and it is no ASCII decimal numeral (with ASCII space around at most)."""
    try:
        float(text)
    except ValueError:
        return False
    return not _FLOAT_RE.fullmatch(text.strip(ASCII_SPACE))


# a word holding a digit of another script (`[^\D0-9]`: a digit that is not 0-9) or ASCII digits
# joined by `_`: a numeral int() would read and no engine prints
_FOREIGN_NUMERAL_RE = re.compile(r"\S*?(?:[^\D0-9]|[0-9]_[0-9])\S*")


def foreign_numeral(line: str) -> NumberError | None:
    """The refusal of a line that holds a numeral no engine prints (`read ١٢.٥ MiB`), else None."""
    m = _FOREIGN_NUMERAL_RE.search(line)
    return not_ascii("", m[0]) if m else None


def not_ascii(key: str, text: str) -> NumberError:
    shown = f"{key}={excerpt(text, 24)}" if key else excerpt(text, 24)
    return NumberError(f"{shown}: not an ASCII decimal number (another script's digits, `_` or a Unicode space): "
                       "no engine prints one")


def out_of_range(key: str, text: str) -> NumberError:
    digits = sum(is_digits(c) for c in text)
    shown = f"{key}={excerpt(text, 24)}" if key else excerpt(text, 24)
    return NumberError(f"{shown} ({digits} digits): no engine prints a number this large")


def located(error: NumberError, where: str) -> NumberError:
    """The same refusal, prefixed with `path:line` (readers know where; to_number does not)."""
    return NumberError(f"{where}: {error}")


def parse_kv(text: str) -> dict[str, str]:
    """Whitespace-separated `key=value` tokens; tokens without `=` are skipped."""
    return dict(_KV_RE.findall(text))


def kv_pairs(text: str) -> list[tuple[str, str]]:
    """parse_kv's tokens in order, a repeated key kept each time (for a reader that must say so)."""
    return _KV_RE.findall(text)


def one_line(text: str, limit: int = 60) -> str:
    """A quotable excerpt of untrusted text for an error message that must stay on one line."""
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "…")
