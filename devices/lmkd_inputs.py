"""What Android's lmkd reads when it decides, as a phone's shell can read it.

lmkd (AOSP system/memory/lmkd `lmkd.cpp`, `mp_event_psi`) decides on each wakeup from
`/proc/meminfo` (MemFree, SwapTotal, SwapFree, the file LRU), `/proc/vmstat`
(`workingset_refault_file`, or the older single `workingset_refault`), memory PSI, the zone
watermarks it sums from `/proc/zoneinfo` (`calc_zone_meminfo`: min/low/high plus each zone's
largest `protection`, over the zones that are present) and its `ro.lmk.*` properties. Over adb a
real lmkd never considers the engine (only ActivityManager registers processes with it), so the
harness samples these inputs beside the engine's pressure and replays lmkd's decision
(devices.lmkd_policy) with the engine counted as an app (harness.run.app_verdict).

A value a phone withholds (SELinux denies `/proc/pressure/memory` and often `/proc/zoneinfo` to the
shell on user builds) is None, never 0, and the replay names the rule it could not evaluate.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

from devices.lmkd_policy import LmkProps, Reading, Watermarks, watermarks

# the /proc/meminfo lines a sample reads (lmkd's meminfo fields, and MemAvailable for the policy's
# own check of what reclaim could still free)
MEMINFO_KEYS = ("MemFree", "MemAvailable", "SwapTotal", "SwapFree", "Active(file)", "Inactive(file)")
MEMINFO_GREP = ("grep -E '^(MemFree|MemAvailable|SwapTotal|SwapFree|Active\\(file\\)|Inactive\\(file\\)):' "
                "/proc/meminfo")
ZONEINFO = "/proc/zoneinfo"
PROPS_PREFIX = "ro.lmk."


@dataclass(frozen=True)
class LmkdSample:
    """One sample of what an lmkd wakeup reads (kB; counters cumulative). None: not readable."""

    free_kb: int | None = None
    available_kb: int | None = None
    swap_total_kb: int | None = None
    swap_free_kb: int | None = None
    file_lru_kb: int | None = None               # Active(file) + Inactive(file)
    workingset_refault_file: int | None = None   # pages
    psi_full_total_us: int | None = None         # /proc/pressure/memory `full ... total=`

    def reading(self, now_s: float) -> Reading | None:
        """lmkd_policy's input for this sample, or None without the three values every rule needs."""
        if self.free_kb is None or self.swap_total_kb is None or self.swap_free_kb is None:
            return None
        return Reading(free_kb=self.free_kb, swap_total_kb=self.swap_total_kb, swap_free_kb=self.swap_free_kb,
                       file_lru_kb=self.file_lru_kb or 0, workingset_refault_file=self.workingset_refault_file or 0,
                       psi_full_total_us=self.psi_full_total_us, now_s=now_s,
                       available_kb=self.available_kb if self.available_kb is not None else self.free_kb)


COLUMNS = tuple(f"lmkd_{f.name}" for f in fields(LmkdSample))


def parse_sample(meminfo_kb: Mapping[str, int], vmstat_text: str, psi_text: str) -> LmkdSample:
    """A sample from /proc/meminfo's values (kB, parsed), /proc/vmstat's text and memory PSI's text."""
    active, inactive = meminfo_kb.get("Active(file)"), meminfo_kb.get("Inactive(file)")
    return LmkdSample(free_kb=meminfo_kb.get("MemFree"), available_kb=meminfo_kb.get("MemAvailable"),
                      swap_total_kb=meminfo_kb.get("SwapTotal"), swap_free_kb=meminfo_kb.get("SwapFree"),
                      file_lru_kb=active + inactive if active is not None and inactive is not None else None,
                      workingset_refault_file=refault_file(vmstat_text), psi_full_total_us=psi_full_total_us(psi_text))


def refault_file(vmstat_text: str) -> int | None:
    """`workingset_refault_file` (kernel 5.9+), else the older `workingset_refault`, in pages."""
    found = dict(re.findall(r"^(workingset_refault(?:_file)?) ([0-9]{1,20})$", vmstat_text, re.M | re.A))
    value = found.get("workingset_refault_file", found.get("workingset_refault"))
    return int(value) if value is not None else None


def psi_full_total_us(text: str) -> int | None:
    m = re.search(r"^full avg10=\S+ avg60=\S+ avg300=\S+ total=([0-9]{1,20})$", text, re.M | re.A)
    return int(m[1]) if m else None


# ── read once per run: the properties and the watermarks ──────────────────────────────────────

MARK = "@@LMKD"
# one shell line: the ro.lmk.* properties as getprop lists them, then the zone table (or nothing)
RUN_COMMAND = (f"getprop | grep '^\\[{re.escape(PROPS_PREFIX)}' ; echo {MARK}ZONEINFO; "
               f"cat {ZONEINFO} 2>/dev/null; echo {MARK}PAGESIZE; getconf PAGESIZE 2>/dev/null")


@dataclass(frozen=True)
class LmkdSetting:
    """What a phone's lmkd decides with, read once per run, and where each part came from."""

    props: LmkProps
    marks: Watermarks
    marks_from: str                 # "zoneinfo" or "computed from MemTotal (zoneinfo refused)"
    props_set: tuple[str, ...]      # the ro.lmk.* names the phone sets (the rest are lmkd's defaults)


_PROP_LINE = re.compile(r"^\[(ro\.lmk\.[a-z_]+)\]: \[([^\]]*)\]$", re.M)


def parse_props(getprop_text: str) -> tuple[LmkProps, tuple[str, ...]]:
    """LmkProps from getprop's lines; a property the phone does not set keeps lmkd's default (lmkd
    reads each with property_get_* and a default), and one it sets to a value lmkd would not parse
    keeps the default too."""
    values: dict[str, object] = {}
    seen = []
    defaults = LmkProps()
    for name, text in _PROP_LINE.findall(getprop_text):
        key = name[len(PROPS_PREFIX):]
        if key not in LmkProps.__dataclass_fields__:
            continue
        default = getattr(defaults, key)
        if isinstance(default, bool):
            if text in ("true", "1", "false", "0"):
                values[key] = text in ("true", "1")
                seen.append(name)
        elif re.fullmatch(r"-?[0-9]{1,9}", text, re.A):
            values[key] = int(text)
            seen.append(name)
    return LmkProps.from_json(values), tuple(sorted(seen))


def parse_zoneinfo(text: str, page_bytes: int) -> Watermarks | None:
    """lmkd's watermarks (calc_zone_meminfo's totals) from /proc/zoneinfo: for each present zone,
    min, low and high plus its largest `protection` entry, summed, in kB; None when the text has no zone."""
    totals = [0, 0, 0]
    zones = 0
    for block in re.split(r"^Node [0-9]+, zone ", text, flags=re.M)[1:]:
        fields_ = {k: int(v) for k, v in re.findall(r"^\s+(min|low|high|present)\s+([0-9]{1,20})$", block, re.M | re.A)}
        if not fields_.get("present") or not all(k in fields_ for k in ("min", "low", "high")):
            continue
        protection = re.search(r"^\s+protection: \(([0-9, ]*)\)$", block, re.M | re.A)
        top = max((int(p) for p in protection[1].split(",") if p.strip()), default=0) if protection else 0
        for i, key in enumerate(("min", "low", "high")):
            totals[i] += fields_[key] + top
        zones += 1
    if not zones:
        return None
    kb = page_bytes // 1024
    return Watermarks(totals[0] * kb, totals[1] * kb, totals[2] * kb)


def parse_setting(text: str, ram_kb: int) -> LmkdSetting:
    """RUN_COMMAND's output; watermarks computed from the phone's RAM where zoneinfo was refused."""
    head, _, rest = text.partition(f"{MARK}ZONEINFO")
    zoneinfo, _, page = rest.partition(f"{MARK}PAGESIZE")
    page_text = page.strip()
    page_bytes = int(page_text) if re.fullmatch(r"[0-9]{4,6}", page_text, re.A) else 4096
    props, seen = parse_props(head)
    marks = parse_zoneinfo(zoneinfo, page_bytes)
    if marks is not None:
        return LmkdSetting(props, marks, "zoneinfo", seen)
    return LmkdSetting(props, watermarks(ram_kb), "computed from MemTotal (zoneinfo refused)", seen)
