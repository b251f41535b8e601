"""click's number types, reading ASCII decimal only (engine.units, docs/decisions/ascii-numbers.md).

click.INT and click.FLOAT call int() and float(), which take other scripts' digits (`--repeats ٣`
is 3), `_` (`--top-k 1_0`) and Unicode space; these refuse them as click refuses any other
non-number (a usage error, exit 2), and are click's own types otherwise (ranges, help, metavars).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from engine.units import ascii_float, ascii_int


class _Ascii(click.ParamType):
    """Checks a string value with `read` (ValueError: not ASCII decimal), then converts as the
    click type it is mixed into."""

    read: Callable[[str], object]

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            try:
                self.read(value)
            except ValueError:
                self.fail(f"{value[:60]!r} is not an ASCII decimal number", param, ctx)
        return super().convert(value, param, ctx)


class AsciiInt(_Ascii, click.types.IntParamType):
    read = staticmethod(ascii_int)


class AsciiIntRange(_Ascii, click.IntRange):
    read = staticmethod(ascii_int)


class AsciiFloat(_Ascii, click.types.FloatParamType):
    read = staticmethod(ascii_float)


class AsciiFloatRange(_Ascii, click.FloatRange):
    read = staticmethod(ascii_float)


INT = AsciiInt()
FLOAT = AsciiFloat()
