"""A virtual phone's logcat buffers: one file per buffer, one JSON entry per line.

Entries are [epoch_s, pid, tid, priority, tag, message]; `logcat` renders them in Android's
formats (liblog logprint.cpp): threadtime `MM-DD HH:MM:SS.mmm  PID  TID P TAG     : msg`,
time `MM-DD HH:MM:SS.mmm P/TAG     (  PID): msg`, brief `P/TAG     (  PID): msg`, tag, process,
raw. Standalone on purpose (no package imports): the phone's `logcat` tool loads it by path on
every call, so it imports json, os and time only (Entry is a slotted class, not a dataclass, and
paths are strings, pathlib being loaded only by buffer_path, which the daemon's side calls).
"""

from __future__ import annotations

import json
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from pathlib import Path

BUFFERS = ("main", "system", "radio", "events", "crash", "kernel")
DEFAULT_BUFFERS = ("main", "system", "crash")          # what `-b default` names (logcat.cpp)
UNNAMED_BUFFERS = DEFAULT_BUFFERS + ("kernel",)        # what logcat reads without -b (logcat.cpp)
PRIORITIES = "VDIWEFS"
LOGD_DIR = "data/misc/logd"  # under the phone's root


class Entry:
    """One log entry, read back from its buffer."""

    __slots__ = ("buffer", "message", "pid", "priority", "tag", "tid", "time_s")

    def __init__(self, time_s: float, pid: int, tid: int, priority: str, tag: str, message: str,
                 buffer: str = "main"):
        self.time_s, self.pid, self.tid, self.priority = time_s, pid, tid, priority
        self.tag, self.message, self.buffer = tag, message, buffer


def _path(root: str | Path, buffer: str) -> str:
    return os.path.join(root, LOGD_DIR, f"{buffer}.log")


def buffer_path(root: str | Path, buffer: str) -> Path:
    from pathlib import Path

    return Path(_path(root, buffer))


def append(root: str | Path, buffer: str, tag: str, message: str, priority: str = "I",
           pid: int | None = None, tid: int | None = None, time_s: float | None = None) -> None:
    """One write(2) per entry on an O_APPEND file: concurrent writers never interleave lines."""
    pid = os.getpid() if pid is None else pid
    line = json.dumps([time.time() if time_s is None else time_s, pid, pid if tid is None else tid,
                       priority, tag, message], ensure_ascii=False) + "\n"
    path = _path(root, buffer)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def clear(root: str | Path, buffers: Iterable[str]) -> None:
    for buffer in buffers:
        path = _path(root, buffer)
        if os.path.exists(path):
            os.truncate(path, 0)


def _parse(line: str, buffer: str) -> Entry | None:
    try:
        t, pid, tid, prio, tag, msg = json.loads(line)
        return Entry(float(t), int(pid), int(tid), str(prio), str(tag), str(msg), buffer)
    except (ValueError, TypeError):
        return None


def read(root: str | Path, buffers: Iterable[str], offsets: dict[str, int] | None = None) -> list[Entry]:
    """Entries of the buffers merged by time; `offsets` (per buffer byte offsets) is advanced so
    a follower reads only what is new."""
    entries: list[Entry] = []
    for buffer in buffers:
        path = _path(root, buffer)
        try:
            with open(path, "rb") as f:
                start = (offsets or {}).get(buffer, 0)
                if start > os.fstat(f.fileno()).st_size:
                    start = 0  # cleared since: start over
                f.seek(start)
                data = f.read()
        except FileNotFoundError:
            continue
        complete = data[:data.rfind(b"\n") + 1]
        if offsets is not None:
            offsets[buffer] = start + len(complete)
        for raw in complete.decode("utf-8", "replace").splitlines():
            entry = _parse(raw, buffer)
            if entry is not None:
                entries.append(entry)
    entries.sort(key=lambda e: e.time_s)
    return entries


def _stamp(t: float) -> str:
    lt = time.localtime(t)
    return time.strftime("%m-%d %H:%M:%S", lt) + f".{int((t % 1) * 1000):03d}"


def _epoch_stamp(t: float) -> str:
    """`-v epoch`: liblog's logprint.cpp prints the seconds with snprintf "%19lld" (right-aligned
    in 19 columns: ten digits today, so nine spaces first) and the milliseconds with ".%03ld" of
    tv_nsec / 1000000 (truncated). The same from Android 6 (the format's 2015 commit) to 16."""
    seconds = int(t // 1)
    return f"{seconds:19d}.{int((t - seconds) * 1000):03d}"


def format_entry(e: Entry, fmt: str = "threadtime", epoch: bool = False) -> str:
    stamp = _epoch_stamp(e.time_s) if epoch else _stamp(e.time_s)
    if fmt == "time":
        prefix = f"{stamp} {e.priority}/{e.tag:<8}({e.pid:5d}): "
    elif fmt == "brief":
        prefix = f"{e.priority}/{e.tag:<8}({e.pid:5d}): "
    elif fmt == "tag":
        prefix = f"{e.priority}/{e.tag:<8}: "
    elif fmt == "process":
        return "\n".join(f"{e.priority}({e.pid:5d}) {line}  ({e.tag})" for line in e.message.split("\n"))
    elif fmt == "raw":
        return e.message
    else:  # threadtime, Android's default
        prefix = f"{stamp} {e.pid:5d} {e.tid:5d} {e.priority} {e.tag:<8}: "
    # logcat repeats the prefix on every line of a multi-line message
    return "\n".join(prefix + line for line in e.message.split("\n"))


class Filter:
    """logcat filterspecs `TAG:P` and `*:P`; -s makes the default silent."""

    def __init__(self, specs: Iterable[str], silent_default: bool = False):
        self.default = "S" if silent_default else "V"
        self.tags: dict[str, str] = {}
        for spec in specs:
            tag, _, prio = spec.partition(":")
            prio = (prio or "V")[0].upper()
            if prio not in PRIORITIES:
                continue
            if tag == "*":
                self.default = prio
            else:
                self.tags[tag] = prio

    def accepts(self, e: Entry) -> bool:
        floor = self.tags.get(e.tag, self.default)
        return e.priority in PRIORITIES and PRIORITIES.index(e.priority) >= PRIORITIES.index(floor) \
            and floor != "S"


def render(entries: Iterable[Entry], fmt: str, seen_buffers: set[str], epoch: bool = False) -> Iterator[str]:
    """Lines as logcat prints them, with its `--------- beginning of BUFFER` dividers."""
    for e in entries:
        if e.buffer not in seen_buffers:
            seen_buffers.add(e.buffer)
            yield f"--------- beginning of {e.buffer}"
        yield format_entry(e, fmt, epoch)
