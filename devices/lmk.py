"""Low-memory-killer evidence: lmkd's logcat lines, its `killinfo` events, and kernel kill lines.

An engine killed by Android's lmkd sees only SIGKILL (exit 137) and prints nothing; the proof
that it was the low-memory killer, and how much it held, is in these lines. Every format in
the engine contract is read:

- Android 12-14  `Kill 'NAME' (PID), uid UID, oom_score_adj ADJ to free NkB rss, NkB swap; reason: TEXT`
- Android 11     `Kill 'NAME' (PID), uid UID, oom_adj ADJ to free NkB; reason: TEXT`
- Android 10     `Kill 'NAME' (PID), uid UID, oom_adj ADJ to free NkB`
- Android 9      `Killing 'NAME' (PID), uid UID, adj ADJ …`
- events buffer  `killinfo: [pid,uid,oom_adj,min_oom_score,rss_kb,kill_reason,<meminfo kB…>]` (Android 11+),
                 then lmkd's wakeup counts, the victim's swap (Android 12+) and, since Android 13, five
                 PSI avg10 floats printed `%f` (lmkd.cpp `killinfo_log`, its event.logtags; liblog
                 logprint.cpp `android_log_printBinaryEvent`)
- old kernels    `lowmemorykiller: Killing 'NAME' (PID), adj ADJ, …` in dmesg
- the kernel's own OOM killer (`Out of memory: Killed process PID (NAME) … anon-rss:NkB …`),
  which is what kills inside a memory cgroup on a Linux host or a virtual phone.

Each line may carry logcat's prefix: `-v epoch` prints the seconds `%19lld`, padded with spaces to
19 columns (liblog logprint.cpp `android_log_formatLogLine`), so a line starts with spaces.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from devices.android import PERCEPTIBLE_APP_ADJ

# lmkd's kill_reasons enum (system/memory/lmkd), as the killinfo event carries it.
KILL_REASONS = (
    "pressure after kill", "not responding", "low swap and thrashing", "low mem and swap",
    "low mem and thrashing", "direct reclaim and thrashing", "low mem and swap util",
    "low filecache after thrashing", "low mem", "direct reclaim stuck",
)
# The meminfo fields AOSP lmkd appends to killinfo after the six process fields, in kB (some
# vendor builds add KReclaimable; those extra fields are then shifted by one).
KILLINFO_MEM_FIELDS = (
    "free_kb", "cached_kb", "swap_cached_kb", "buffers_kb", "shmem_kb", "unevictable_kb", "swap_total_kb",
    "swap_free_kb", "active_anon_kb", "inactive_anon_kb", "active_file_kb", "inactive_file_kb",
    "s_reclaimable_kb", "s_unreclaim_kb", "kernel_stack_kb", "page_tables_kb",
    "ion_heap_kb", "ion_heap_pool_kb", "cma_free_kb",
)


# What killinfo carries after the meminfo fields (lmkd.cpp killinfo_log): lmkd's wakeup figures (4),
# the victim's swap, GPU memory, thrashing and its maximum (ints), then the PSI avg10 values (floats).
KILLINFO_SWAP_INDEX = 6 + len(KILLINFO_MEM_FIELDS) + 4
KILLINFO_INTS_MAX = KILLINFO_SWAP_INDEX + 4        # a longer list is a vendor's layout: its tail is not read
KILLINFO_PSI_FIELDS = ("mem_some", "mem_full", "io_some", "io_full", "cpu_some")


@dataclass(frozen=True)
class LmkEvent:
    """One kill, as one log line told it. Fields a format does not carry are None."""

    source: str                 # lmkd | killinfo | kernel-lmk | kernel-oom
    fmt: str                    # android12+ | android11 | android10 | android9 | killinfo | kernel-lmk | kernel-oom
    pid: int
    name: str | None = None
    uid: int | None = None
    oom_score_adj: int | None = None
    rss_kb: int | None = None
    swap_kb: int | None = None
    reason: str | None = None
    timestamp: str | None = None     # as the log printed it (logcat has no year)
    memory_kb: dict[str, int] = field(default_factory=dict)
    line: str = ""
    psi_avg10: dict[str, float] = field(default_factory=dict)   # killinfo's PSI tail (Android 13+), %


# logcat prefixes: threadtime `MM-DD HH:MM:SS.mmm  PID  TID L TAG: `, time `MM-DD HH:MM:SS.mmm L/TAG(PID): `,
# brief `L/TAG(PID): `, epoch `%19lld.mmm  PID  TID L TAG: ` (the seconds space-padded), with -v year
# `YYYY-MM-DD HH:MM:SS.mmm`; dmesg `[  123.456] `.
_PREFIX_RE = re.compile(
    r"^\s*(?:(?P<ts>(?:[0-9]{4}-)?[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]\.[0-9]+|[0-9]{9,}\.[0-9]+)\s+)?"
    r"(?:\s*[0-9]+\s+[0-9]+\s+[VDIWEF]\s+(?P<tag1>[^:]+?)\s*:\s|[VDIWEF]/(?P<tag2>[^(]+?)\(\s*[0-9]+\):\s)?"
    r"(?:\[\s*(?P<ktime>[0-9]+\.[0-9]+)\]\s*)?"
)
_LMKD_12 = re.compile(
    r"Kill '(?P<name>[^']*)' \((?P<pid>[0-9]+)\), uid (?P<uid>[0-9]+), oom_score_adj (?P<adj>-?[0-9]+) "
    r"to free (?P<rss>[0-9]+)kB rss, (?P<swap>[0-9]+)k[Bb] swap(?:; reason: (?P<reason>.*))?"
)
_LMKD_11 = re.compile(
    r"Kill '(?P<name>[^']*)' \((?P<pid>[0-9]+)\), uid (?P<uid>[0-9]+), oom_adj (?P<adj>-?[0-9]+) "
    r"to free (?P<rss>[0-9]+)kB(?:; reason: (?P<reason>.*))?"
)
_LMKD_9 = re.compile(r"Killing '(?P<name>[^']*)' \((?P<pid>[0-9]+)\), uid (?P<uid>[0-9]+), adj (?P<adj>-?[0-9]+)(?P<rest>.*)")
_KERNEL_LMK = re.compile(r"lowmemorykiller: Killing '(?P<name>[^']*)' \((?P<pid>[0-9]+)\), adj (?P<adj>-?[0-9]+)(?P<rest>.*)")
_KERNEL_OOM = re.compile(
    r"(?:Memory cgroup out of memory|Out of memory)(?: \([^)]*\))?: Killed process (?P<pid>[0-9]+) \((?P<name>[^)]*)\)"
    r"(?P<rest>.*)"
)
_KILLINFO = re.compile(r"killinfo\s*:\s*\[(?P<fields>[-0-9.,\s]+)\]")
_TO_FREE = re.compile(r"to free ([0-9]+)kB")


def _prefix(line: str) -> tuple[str | None, str | None, str]:
    m = _PREFIX_RE.match(line)
    ts = (m["ts"] or m["ktime"]) if m else None
    tag = (m["tag1"] or m["tag2"]) if m else None
    return ts, (tag.strip() if tag else None), line[m.end():] if m else line


def parse_line(line: str) -> LmkEvent | None:
    """The kill a log line records, or None for any other line."""
    line = line.rstrip("\r\n")
    ts, _tag, body = _prefix(line)
    if m := _KILLINFO.search(line):
        fields = _killinfo_fields(m["fields"])
        if fields is None:
            return None
        values, psi = fields
        reason_code = values[5]
        reason = KILL_REASONS[reason_code] if 0 <= reason_code < len(KILL_REASONS) else f"reason {reason_code}"
        memory = dict(zip(KILLINFO_MEM_FIELDS, values[6:]))
        swap = values[KILLINFO_SWAP_INDEX] if KILLINFO_SWAP_INDEX < len(values) <= KILLINFO_INTS_MAX else None
        return LmkEvent("killinfo", "killinfo", values[0], uid=values[1], oom_score_adj=values[2],
                        rss_kb=values[4], swap_kb=swap, reason=reason, timestamp=ts, memory_kb=memory, line=line,
                        psi_avg10=psi)
    if m := _KERNEL_LMK.search(line):
        free = _TO_FREE.search(m["rest"])
        return LmkEvent("kernel-lmk", "kernel-lmk", int(m["pid"]), name=m["name"], oom_score_adj=int(m["adj"]),
                        rss_kb=int(free[1]) if free else None, timestamp=ts, line=line)
    if m := _LMKD_12.search(body):
        return LmkEvent("lmkd", "android12+", int(m["pid"]), name=m["name"], uid=int(m["uid"]),
                        oom_score_adj=int(m["adj"]), rss_kb=int(m["rss"]), swap_kb=int(m["swap"]),
                        reason=m["reason"], timestamp=ts, line=line)
    if m := _LMKD_11.search(body):
        fmt = "android11" if m["reason"] is not None else "android10"
        return LmkEvent("lmkd", fmt, int(m["pid"]), name=m["name"], uid=int(m["uid"]), oom_score_adj=int(m["adj"]),
                        rss_kb=int(m["rss"]), reason=m["reason"], timestamp=ts, line=line)
    if m := _LMKD_9.search(body):
        free = _TO_FREE.search(m["rest"])
        return LmkEvent("lmkd", "android9", int(m["pid"]), name=m["name"], uid=int(m["uid"]),
                        oom_score_adj=int(m["adj"]), rss_kb=int(free[1]) if free else None, timestamp=ts, line=line)
    if m := _KERNEL_OOM.search(line):
        rest = m["rest"]
        anon = re.search(r"anon-rss:([0-9]+)kB", rest)
        file_rss = re.search(r"file-rss:([0-9]+)kB", rest)
        shmem = re.search(r"shmem-rss:([0-9]+)kB", rest)
        uid = re.search(r"UID:([0-9]+)", rest)
        adj = re.search(r"oom_score_adj:(-?[0-9]+)", rest)
        rss = sum(int(x[1]) for x in (anon, file_rss, shmem) if x) if anon else None
        return LmkEvent("kernel-oom", "kernel-oom", int(m["pid"]), name=m["name"], uid=int(uid[1]) if uid else None,
                        oom_score_adj=int(adj[1]) if adj else None, rss_kb=rss,
                        reason="memory cgroup out of memory" if "Memory cgroup" in line else "out of memory",
                        timestamp=ts, line=line)
    return None


def _killinfo_fields(text: str) -> tuple[list[int], dict[str, float]] | None:
    """killinfo's list: its integers (at least the six process fields), then the PSI floats lmkd
    appends since Android 13 (named when there are the five of killinfo_log); None for a list that
    is neither (a float among the integers, too few fields)."""
    items = [v for v in text.replace(" ", "").split(",") if v]
    n_ints = next((i for i, v in enumerate(items) if not re.fullmatch(r"-?[0-9]+", v)), len(items))
    tail = items[n_ints:]
    if n_ints < 6 or not all(re.fullmatch(r"-?[0-9]+\.[0-9]+", v) for v in tail):
        return None
    psi = dict(zip(KILLINFO_PSI_FIELDS, map(float, tail))) if len(tail) == len(KILLINFO_PSI_FIELDS) else {}
    return [int(v) for v in items[:n_ints]], psi


def parse_log(lines: Iterable[str] | str) -> list[LmkEvent]:
    """Every kill in a logcat or dmesg capture, in order.

    Android 9 and old kernels wrap the kill over two lines ("…adj 900" then "to free NkB …"):
    the amount freed is taken from the continuation line.
    """
    if isinstance(lines, str):
        lines = lines.splitlines()
    events: list[LmkEvent] = []
    for line in lines:
        event = parse_line(line)
        if event is not None:
            events.append(event)
        elif (events and events[-1].rss_kb is None and events[-1].fmt in ("android9", "kernel-lmk")
              and (free := _TO_FREE.search(line))):
            events[-1] = dataclasses.replace(events[-1], rss_kb=int(free[1]), line=events[-1].line + "\n" + line)
    return events


def hard_kills_of_others(events: Iterable[LmkEvent], engine_kills: Iterable[LmkEvent]) -> list[str]:
    """The other processes lmkd killed past its soft level (oom_score_adj at or under perceptible,
    200: lmkd's soft kills stop at PERCEPTIBLE_APP_ADJ + 1 and go lower only with the min
    watermark breached or the device not responding), once each: "NAME (oom_score_adj N)"."""

    engine = {e.pid for e in engine_kills}
    out: dict[int, str] = {}
    for e in events:
        if e.pid not in engine and e.oom_score_adj is not None and e.oom_score_adj <= PERCEPTIBLE_APP_ADJ \
                and e.source in ("lmkd", "killinfo"):
            out.setdefault(e.pid, f"{e.name or e.pid} (oom_score_adj {e.oom_score_adj})")
    return list(out.values())


def kills_of(events: Iterable[LmkEvent], pids: Iterable[int] = (), names: Iterable[str] = ()) -> list[LmkEvent]:
    """The events that name one of `pids`, or a process whose name matches one of `names`.

    Android truncates a process name to 15 characters in some buffers, so names match by prefix
    either way round.
    """
    pid_set = set(pids)
    name_list = [n for n in names if n]
    out = []
    for e in events:
        if e.pid in pid_set or (e.name and any(e.name.startswith(n[:15]) or n.startswith(e.name) for n in name_list)):
            out.append(e)
    return out
