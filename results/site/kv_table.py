"""The site's key-value tables (a run's summary, configuration, states; a device's identity; a
model's shape), made in Python and called by the templates as `kv(rows, caption)`.

A run page holds seven of them, about 150 rows. As a jinja macro each cell cost a call of the
macro's loop and one markupsafe `escape` (a Markup object each): an eighth to a fifth of a run
page's CPU, sampled (docs/decisions/report-speed.md). Here a table's cells are escaped by one `escape` of their text
joined by NUL, which HTML escaping leaves alone and recorded text does not hold (a table with a NUL
in a cell, or a cell that is not a plain str, escapes each cell alone). Every cell is escaped as jinja's autoescape escapes `{{ x }}`:
markupsafe's escape of the value (an object's `__html__` taken as it gives itself).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from markupsafe import Markup, escape

_SEP = "\0"


def kv(rows: Iterable[tuple[Any, Any]], caption: str = "") -> Markup:
    """A `<table class="kv">`: one row per (key, value), the caption when given, "none recorded"
    when there are no rows."""
    rows = list(rows)
    if rows and set(map(len, rows)) != {2}:
        raise ValueError("a key-value table's rows are (key, value) pairs")
    cells = list(itertools.chain.from_iterable(rows))
    head = '<table class="kv">\n' + (f"<caption>{escape(caption)}</caption>" if caption else "")
    if not cells:
        return Markup(head + "<tr><td>none recorded</td></tr></table>")
    escaped: list[str] | None = None
    if set(map(type, cells)) == {str}:      # plain text (no __html__ of its own): the run pages' tables
        joined = _SEP.join(cells)
        if joined.count(_SEP) == len(cells) - 1:
            escaped = str(escape(joined)).split(_SEP)
    if escaped is None:
        escaped = [str(escape(x)) for x in cells]
    return Markup("".join([head, *(f'<tr><th scope="row">{k}</th><td>{v}</td></tr>\n'
                                   for k, v in zip(escaped[::2], escaped[1::2])), "</table>"]))
