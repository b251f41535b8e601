"""Text from files and devices made safe for a terminal: one place for every package.

A GGUF string, a getprop value, a device name or a line of a capture is data. Printed raw, an
`ESC]0;…BEL` in it retitles the terminal and a bidi override reorders what follows; an error that
quotes a whole header dumps kilobytes. `printable` shows every such character as an escape;
`excerpt` also cuts the text short.
"""

from __future__ import annotations

import re

EXCERPT_CHARS = 80
# C0 and C1 controls except TAB and LF, DEL, the Unicode line/paragraph separators and the bidi
# embeddings, overrides and isolates
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every control character (ESC, BEL, CR, bidi overrides …) shown as an escape, so
    text from a file or a device can reach a terminal without acting on it."""
    return _CONTROL_RE.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """At most `limit` characters of untrusted text, control characters escaped, `…` when cut."""
    return printable(text if len(text) <= limit else text[:limit] + "…")


def one_line(text: str, limit: int = EXCERPT_CHARS) -> str:
    """An excerpt that stays on one line: newlines and tabs escaped too."""
    return excerpt(text, limit).replace("\n", "\\n").replace("\t", "\\t")
