"""Captures of many runs grown from the real upstream fixtures, for the linear-import test and
benchmarks/bench_readers.py."""

from __future__ import annotations

import re

from tests.results.mutants import UPSTREAM

_SECTION_RE = re.compile(r"(?m)^(?==+ \S+ =+$)")


def driver_log(n: int) -> bytes:
    """n `==== TAG ====` sections cycling through driver-lanes.log's, each tag made unique."""
    text = (UPSTREAM / "2026-07-17" / "driver-lanes.log").read_text()
    sections = [s for s in _SECTION_RE.split(text) if s.strip()]
    out = []
    for i in range(n):
        tag_line, rest = sections[i % len(sections)].split("\n", 1)
        out.append(f"=============== {tag_line.strip('= ')}_{i} ===============\n{rest}")
    return "".join(out).encode()


def v2_capture(n: int) -> bytes:
    """A v2 (bmoe-cli 0.19.0) run's stderr and stdout, n times back to back, no separators."""
    folder = UPSTREAM / "host-v2-0.19.0"
    return ((folder / "tiny_auto.err").read_bytes() + (folder / "tiny_auto.out").read_bytes()) * n
