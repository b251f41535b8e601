"""The site's key-value tables (a run's summary, configuration, states; a device's identity; a
model's shape), made in Python and called by the templates as `kv(rows, caption)`.

A run page holds seven of them, about 150 rows. As a jinja macro each cell cost a call of the
macro's loop and one markupsafe `escape` (a Markup object each): an eighth to a fifth of a run
page's CPU, sampled (docs/decisions/report-speed.md). Here a table's cells are escaped by one `escape` of their text
joined by NUL, which HTML escaping leaves alone and recorded text does not hold (a table with a NUL
in a cell escapes each cell alone). Every cell is escaped as jinja's autoescape escapes `{{ x }}`:
markupsafe's escape of the value (an object's `__html__` taken as it gives itself).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from markupsafe import Markup, escape

_SEP = "\0"


def kv(rows: Iterable[tuple[Any, Any]], caption: str = "") -> Markup:
    """A `<table class="kv">`: one row per (key, value), the caption when given, "none recorded"
    when there are no rows."""
    cells = [x for key, value in rows for x in (key, value)]
    head = '<table class="kv">\n' + (f"<caption>{escape(caption)}</caption>" if caption else "")
    if not cells:
        return Markup(head + "<tr><td>none recorded</td></tr></table>")
    texts = [str(x) for x in cells]
    joined = _SEP.join(texts)
    if joined.count(_SEP) == len(texts) - 1 and not any(hasattr(x, "__html__") for x in cells):
        escaped = str(escape(joined)).split(_SEP)
    else:
        escaped = [str(escape(x)) for x in cells]
    return Markup("".join([head, *(f'<tr><th scope="row">{escaped[i]}</th><td>{escaped[i + 1]}</td></tr>\n'
                                   for i in range(0, len(escaped), 2)), "</table>"]))
