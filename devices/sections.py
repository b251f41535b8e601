"""One shell call, several files: output split at marker lines (`@@BMOENAME`, `@@RECLAIMNAME` …).

A script echoes `MARK + NAME` (NAME in capitals) before each file it prints; `split` gives each
NAME the lines after its marker, and "" the lines before the first one.
"""

from __future__ import annotations


def split(text: str, mark: str) -> dict[str, str]:
    out: dict[str, str] = {}
    current = ""
    buf: list[str] = []
    for line in text.splitlines():
        name = line[len(mark):].strip() if line.startswith(mark) else ""
        if name and name.isupper():
            out[current] = "\n".join(buf)
            current, buf = name, []
        else:
            buf.append(line)
    out[current] = "\n".join(buf)
    return out
