"""`Key:   N kB` files of /proc (meminfo, PID/status), read the same way by the engine and devices."""

from __future__ import annotations

import os
import re

_KB_LINE = re.compile(r"^([\w()]+):\s+([0-9]+)\s*kB", re.MULTILINE)   # Active(file) too
_KB_VALUE = re.compile(rb"\s+([0-9]+)\s*kB")    # what follows "Key:" on such a line


def parse_kb_fields(text: str) -> dict[str, int]:
    """{'MemAvailable': 123456, 'VmHWM': …} in kB from /proc/meminfo or /proc/PID/status text."""
    return {m[1]: int(m[2]) for m in _KB_LINE.finditer(text)}


def read_kb_fields(path: str) -> dict[str, int]:
    try:
        with open(path) as fh:
            return parse_kb_fields(fh.read())
    except OSError:
        return {}


class KbFile:
    """One such file kept open and read again on each call (a /proc file regenerates its text at
    every read from offset 0): the per-token memory columns without an open, a close and a parse
    of every line per token (~50 us each in Python against ~10 us for the read itself)."""

    READ_BYTES = 1 << 16

    def __init__(self, path: str, keys: tuple[str, ...]):
        self.keys = keys
        self._needles = [("\n" + key + ":").encode() for key in keys]
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY)   # not inherited (PEP 446)
        except OSError:
            self._fd = None

    def values(self) -> dict[str, int]:
        """{key: kB} for each of `keys` the file has ({} when it cannot be read), as
        parse_kb_fields reads them."""
        if self._fd is None:
            return {}
        try:
            data = b"\n" + os.pread(self._fd, self.READ_BYTES, 0)
        except OSError:
            return {}
        out: dict[str, int] = {}
        for key, needle in zip(self.keys, self._needles):
            at = data.find(needle)
            if at < 0:
                continue
            m = _KB_VALUE.match(data, at + len(needle))
            if m:
                out[key] = int(m[1])
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
