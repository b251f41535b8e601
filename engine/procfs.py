"""`Key:   N kB` files of /proc (meminfo, PID/status), read the same way by the engine and devices."""

from __future__ import annotations

import re

_KB_LINE = re.compile(r"^(\w+):\s+(\d+)\s*kB", re.MULTILINE)


def parse_kb_fields(text: str) -> dict[str, int]:
    """{'MemAvailable': 123456, 'VmHWM': …} in kB from /proc/meminfo or /proc/PID/status text."""
    return {m[1]: int(m[2]) for m in _KB_LINE.finditer(text)}


def read_kb_fields(path: str) -> dict[str, int]:
    try:
        with open(path) as fh:
            return parse_kb_fields(fh.read())
    except OSError:
        return {}
