"""What the site's pages show as text, and where the pages live: numbers with their units (°C,
MiB, GHz, local time), recorded keys as a person reads them, file names and page addresses.

File names derived from device and model strings (which come from getprop: data, not names we
chose) go through slug(): safe characters only, plus a hash of the whole string.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from results.numbers import is_missing
from results.read.columns import C


def fmt_num(x: Any, digits: int = 3) -> str:
    """A number as a page shows it: a float to `digits` significant digits, whole and comma-grouped
    from 10**digits on; — when missing."""
    if is_missing(x):
        return "—"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 10 ** digits else f"{x:,.0f}"
    return str(x)


def fmt_mib(x: Any) -> str:
    """MiB with its unit (— when missing)."""
    return "—" if is_missing(x) else f"{float(x):g} MiB"


def fmt_kb(x: Any) -> str:
    """A kB count as whole MiB (— when missing)."""
    return "—" if is_missing(x) else f"{float(x) / 1024:,.0f} MiB"


def fmt_pct(x: Any) -> str:
    """A percentage to one decimal (— when missing)."""
    return "—" if is_missing(x) else f"{float(x):.1f} %"


def fmt_time(epoch: Any) -> str:
    """Epoch seconds as local time (the zone of the machine that built the site, named)."""
    if is_missing(epoch) or not isinstance(epoch, (int, float)):
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(float(epoch)))


def fmt_celsius(x: Any, per_degree: int) -> str:
    """A temperature kept in milli- (1000) or deci-degrees (10) as °C."""
    if is_missing(x) or isinstance(x, bool) or not isinstance(x, (int, float)):
        return "—"
    return f"{float(x) / per_degree:.1f} °C"


_UNITS = (("_mc", lambda x: fmt_celsius(x, 1000)), ("_mC", lambda x: fmt_celsius(x, 1000)),
          ("_dc", lambda x: fmt_celsius(x, 10)), ("_dC", lambda x: fmt_celsius(x, 10)), ("_kb", lambda x: fmt_kb(x)),
          ("_khz", lambda x: _ghz(x)))
_TIMES = ("taken_at_s", C.started_at, C.ended_at, "first_seen_at", "since")


def human_text(key: str, value: Any) -> tuple[str, str]:
    """A recorded key and value as a person reads them: m°C and d°C as °C, kB as MiB, epoch
    seconds as local time, kHz as GHz, per-zone temperatures one phrase each; the unit leaves
    the key's name once the value carries it."""
    zones, unit, when, seconds, plain = _key_forms(key)
    if key == "cpufreq" and isinstance(value, list):
        return "CPU frequency cap", ", ".join(
            f"{v.get('name')} {_ghz(v.get('scaling_max_khz'))} of {_ghz(v.get('cpuinfo_max_khz'))}"
            + (" (capped)" if v.get("capped") else "") for v in value if isinstance(v, Mapping)) or "none reported"
    if zones is not None and isinstance(value, Mapping):
        scale = 1000 if key.endswith("_mc") else 1
        return zones, ", ".join(f"{zone} {fmt_celsius(v, scale)}" for zone, v in value.items()) or "none"
    if unit is not None:
        label, fn = unit
        return label, fn(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "—"
    if when is not None:
        return when, fmt_time(value)
    if isinstance(value, bool) or value is None:
        return plain, "—" if value is None else ("yes" if value else "no")
    if isinstance(value, (int, float)):
        if seconds is not None:
            return seconds, f"{fmt_num(float(value))} s"
        return plain, fmt_num(value) if isinstance(value, float) else str(value)
    if isinstance(value, (dict, list)):
        return plain, json.dumps(value, ensure_ascii=False)
    return plain, str(value)


@functools.lru_cache(maxsize=4096)
def _key_forms(k: str) -> tuple[str | None, tuple[str, Callable[[Any], str]] | None, str | None, str | None, str]:
    """What human_text makes of a key's name, worked out once per name (a run page shows some 150):
    the label of per-zone temperatures, of a unit's value (with its formatter), of a time, of
    seconds, and the plain one."""
    zones = k.removesuffix("_mc").removesuffix("_c").replace("_", " ") if k.endswith(("_mc", "_c")) else None
    unit = next(((k[: -len(suffix)].replace("_", " "), fn) for suffix, fn in _UNITS if k.endswith(suffix)), None)
    when = k.removesuffix("_s").replace("_", " ") if k in _TIMES or k.endswith("_at") else None
    seconds = k[:-2].replace("_", " ") if k.endswith("_s") else None
    return zones, unit, when, seconds, k.replace("_", " ")


def _ghz(khz: Any) -> str:
    return "—" if is_missing(khz) or not isinstance(khz, (int, float)) else f"{float(khz) / 1e6:.2f} GHz"


def slug(text: str) -> str:
    """A file name for a device or model string: safe characters only, plus a hash of the whole
    string so two strings that sanitise alike never share a page."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.")[:60] or "x"
    return f"{base}-{hashlib.sha256(text.encode('utf-8')).hexdigest()[:8]}"


# ── the site's addresses ─────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Urls:
    """Page paths relative to the site's top folder."""

    @staticmethod
    def device(name: str) -> str:
        """A device page."""
        return f"devices/{slug(name)}.html"

    @staticmethod
    def model(name: str) -> str:
        """A model page."""
        return f"models/{slug(name)}.html"

    @staticmethod
    def run(run_id: str) -> str:
        """A run page (campaign, cell and attempt from the run id)."""
        campaign, cell, attempt = run_id.rsplit("/", 2)
        return f"runs/{slug(campaign)}/{slug(cell)}-{int(attempt)}.html"
