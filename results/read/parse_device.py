"""Device-side records around a run: pressure sidecars, `.state` snapshots, cooling-gate entry states.

- `.metrics` sidecar (upstream `scripts/bench-run.sh`): `key=value` lines sampled around one run,
  `peak_rss_kb`, `mem_avail_{before,floor,after}_kb`, `batt_temp_{before,max,after}_dC`,
  `cpu_temp_{before,max}_mC`, later `charge_{before,after}_uah`. A probe that printed nothing
  leaves `key=` (None here). Upstream also named one per-token CSV `.metrics` (2026-07-15): that is
  refused here with a pointer to read_metrics_csv.
- `.state` (2026-07-15): `--- BEFORE ---` / `--- AFTER ---` sections of `date:`, `policyN:`
  cpufreq, `meminfo:`, `battery_temp_dC:`, `Thermal Status:` and thermalservice `Temperature{…}`.
- driver logs (2026-07-17): per cell, `ENTRY STATE: batt=… dC, memavail=… kB, freq=…[, waited=…s]`
  followed by the run's output and its sidecar lines.

Entry/exit states use one key vocabulary: mem_available_kb, batt_temp_dC, cpu_temp_mC, …
Numbers are range-checked as they are read (results.read.parse_values): one no engine or probe prints
is refused, nan/inf and impossible ones (a negative size) become None, with a line appended to the
caller's `notes` list.
"""

from __future__ import annotations

import re
from pathlib import Path

from results.read.console_records import ConsoleRun
from results.read.parse_console import read_console_runs
from results.read.parse_csv import looks_like_metrics_csv
from results.read.parse_text import NumberError, ParseError, foreign_numeral, located, one_line, read_lines, to_number
from results.read.parse_values import checked

SidecarValue = int | float | None
_SECTION_RE = re.compile(r"^---\s*(\w+)\s*---\s*$")
_SECTIONS = {"before": "entry", "after": "exit", "entry": "entry", "exit": "exit"}
_TEMPERATURE_RE = re.compile(r"Temperature\{mValue=([^,}]*),.*?mName=([^,}]+)")
_MEMINFO_RE = re.compile(r"(\w+):\s*([0-9]+)\s*kB")
_STATE_KEYS = {"battery_temp_dC": "batt_temp_dC", "Thermal Status": "thermal_status"}


def read_sidecar(path: str | Path, notes: list[str] | None = None) -> dict[str, SidecarValue]:
    lines, _ = read_lines(path)
    if looks_like_metrics_csv(lines):
        raise ParseError(f"{path}: is a per-token metrics CSV, not a pressure sidecar (read it with read_metrics_csv)")
    values: dict[str, SidecarValue] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        key, sep, text = line.strip().partition("=")
        try:
            value = to_number(text.strip(), key)
        except NumberError as e:
            raise located(e, f"{path}:{number}") from None
        if not sep or not key.isidentifier() or (isinstance(value, str) and value):
            raise ParseError(f"{path}:{number}: not a key=value pressure line: {one_line(line)}")
        values.update(checked({key: value if value != "" else None}, f"{path}:{number}",
                              notes if notes is not None else []))
    return values


def read_state(path: str | Path, notes: list[str] | None = None) -> dict[str, dict[str, object]]:
    """{"entry": {...}, "exit": {...}} from a `.state` snapshot file."""
    lines, _ = read_lines(path)
    states: dict[str, dict[str, object]] = {}
    current: dict[str, object] | None = None
    for number, line in enumerate(lines, start=1):
        where = f"{path}:{number}"
        if m := _SECTION_RE.match(line):
            if m[1].lower() not in _SECTIONS:
                raise ParseError(f"{where}: unknown state section {one_line(m[1])}")
            current = states.setdefault(_SECTIONS[m[1].lower()], {})
        elif current is None:
            if line.strip():
                raise ParseError(f"{path}: not a device state file: line {number} is {one_line(line)} "
                                 f"(expected '--- BEFORE ---')")
        else:
            try:
                values = _state_line(line)
            except NumberError as e:
                raise located(e, where) from None
            for key, value in checked(values, where, notes if notes is not None else []).items():
                if isinstance(value, dict):
                    merged = current.get(key)
                    if not isinstance(merged, dict):
                        merged = current[key] = {}
                    merged.update(value)
                else:
                    current[key] = value
    if not states:
        raise ParseError(f"{path}: not a device state file (no '--- BEFORE ---' section)")
    return states


def _state_line(line: str) -> dict[str, object]:
    """The values one state line adds (a temperature, a cpufreq policy, meminfo, a key: value)."""
    if m := _TEMPERATURE_RE.search(line):
        value = to_number(m[1], m[2].strip())
        return {"temperatures_c": {m[2].strip(): value}} if isinstance(value, (int, float)) else {}
    if not line.strip():
        return {}
    key, _, text = line.partition(":")
    key, text = key.strip(), text.strip()
    if re.fullmatch(r"policy[0-9]+", key):
        # cpufreq sysfs values are kHz
        return {"cpufreq_khz": {key: {k: to_number(v, k) for k, v in re.findall(r"(\w+)=(\S+)", text)}}}
    if key == "meminfo":
        if (foreign := foreign_numeral(text)) is not None:    # `MemFree: ٣٠٠ kB` would be left out unseen
            raise foreign
        return {f"{_snake(name)}_kb": to_number(kb, name) for name, kb in _MEMINFO_RE.findall(text)}
    if key == "date":
        return {"date": text}
    return {_STATE_KEYS.get(key, key if "_" in key else _snake(key)): to_number(text, key) if text else None}


def _snake(name: str) -> str:
    """`MemAvailable` -> `mem_available`, `Thermal Status` -> `thermal_status`."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).replace(" ", "_").lower().replace("__", "_")


def entry_exit(run: ConsoleRun) -> dict[str, dict[str, object]]:
    """A run's entry and exit state from its cooling-gate line and its sidecar lines. The gate's
    values win on entry: they are what it decided on (the sidecar samples a moment later)."""
    entry: dict[str, object] = {}
    exit_: dict[str, object] = {}
    for key, value in (run.pressure or {}).items():
        for marker, state in (("_before", entry), ("_after", exit_)):
            if marker in key:
                state[key.replace(marker, "").replace("mem_avail_", "mem_available_")] = value
    entry.update(run.entry_state or {})
    return {"entry": entry, "exit": exit_}


def read_driver_log(path: str | Path) -> dict[str, dict[str, dict[str, object]]]:
    """{cell tag: {"entry": {...}, "exit": {...}}} for a driver log of tagged cells."""
    runs = [(run.tag, run) for run in read_console_runs(path) if run.tag is not None]
    if not runs:
        raise ParseError(f"{path}: no '==== TAG ====' cells: not a driver log")
    return {tag: entry_exit(run) for tag, run in runs}

