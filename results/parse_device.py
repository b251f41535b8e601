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
"""

from __future__ import annotations

import re
from pathlib import Path
from results.parse_console import ConsoleRun, read_console_runs
from results.parse_csv import looks_like_metrics_csv
from results.parse_text import ParseError, one_line, read_lines, to_number

SidecarValue = int | float | None
_SECTION_RE = re.compile(r"^---\s*(\w+)\s*---\s*$")
_SECTIONS = {"before": "entry", "after": "exit", "entry": "entry", "exit": "exit"}
_TEMPERATURE_RE = re.compile(r"Temperature\{mValue=(-?[\d.]+),.*?mName=([^,}]+)")
_MEMINFO_RE = re.compile(r"(\w+):\s*(\d+)\s*kB")
_STATE_KEYS = {"battery_temp_dC": "batt_temp_dC", "Thermal Status": "thermal_status"}


def read_sidecar(path: str | Path) -> dict[str, SidecarValue]:
    lines, _ = read_lines(path)
    if looks_like_metrics_csv(lines):
        raise ParseError(f"{path}: is a per-token metrics CSV, not a pressure sidecar (read it with read_metrics_csv)")
    values: dict[str, SidecarValue] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        key, sep, text = line.strip().partition("=")
        value = to_number(text.strip())
        if not sep or not key.isidentifier() or (isinstance(value, str) and value):
            raise ParseError(f"{path}:{number}: not a key=value pressure line: {one_line(line)}")
        values[key] = value if value != "" else None
    return values


def read_state(path: str | Path) -> dict[str, dict[str, object]]:
    """{"entry": {...}, "exit": {...}} from a `.state` snapshot file."""
    lines, _ = read_lines(path)
    states: dict[str, dict[str, object]] = {}
    current: dict[str, object] | None = None
    for number, line in enumerate(lines, start=1):
        if m := _SECTION_RE.match(line):
            if m[1].lower() not in _SECTIONS:
                raise ParseError(f"{path}:{number}: unknown state section {one_line(m[1])}")
            current = states.setdefault(_SECTIONS[m[1].lower()], {})
        elif current is None:
            if line.strip():
                raise ParseError(f"{path}: not a device state file: line {number} is {one_line(line)} "
                                 f"(expected '--- BEFORE ---')")
        elif m := _TEMPERATURE_RE.search(line):
            current.setdefault("temperatures_c", {})[m[2].strip()] = float(m[1])
        elif line.strip():
            _state_line(current, line)
    if not states:
        raise ParseError(f"{path}: not a device state file (no '--- BEFORE ---' section)")
    return states


def _state_line(state: dict[str, object], line: str) -> None:
    key, _, text = line.partition(":")
    key, text = key.strip(), text.strip()
    if re.fullmatch(r"policy\d+", key):
        # cpufreq sysfs values are kHz
        state.setdefault("cpufreq_khz", {})[key] = {k: to_number(v) for k, v in re.findall(r"(\w+)=(\S+)", text)}
    elif key == "meminfo":
        state.update({f"{_snake(name)}_kb": int(kb) for name, kb in _MEMINFO_RE.findall(text)})
    elif key == "date":
        state["date"] = text
    else:
        state[_STATE_KEYS.get(key, key if "_" in key else _snake(key))] = to_number(text) if text else None


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
    runs = [run for run in read_console_runs(path) if run.tag is not None]
    if not runs:
        raise ParseError(f"{path}: no '==== TAG ====' cells: not a driver log")
    return {run.tag: entry_exit(run) for run in runs}

