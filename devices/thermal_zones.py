"""Which thermal zone is the CPU's: one filter for the gate (devices.base.DeviceState.cpu_temp_mc,
read by harness/run/gate.py) and the ~1 Hz run sampler (devices/adb/runs.py), so both gate on
and record the same sensor.

A zone is a CPU zone when its type names a CPU (`CPU_ZONE`: upstream's `cpu-*`, Qualcomm's
`cpuss-*`, MediaTek's `mtktscpu`, x86's `x86_pkg_temp` …), and the hottest CPU zone left after
three filters is the one used:

- **Trip points.** A zone whose type contains `trip` (`cpu-hw-trip-0` on Qualcomm phones) reports
  a trip threshold, not a temperature: upstream's benchmark-method page (Helldez/BigMoeOnEdge)
  saw it read a constant 95 °C, which a 45 °C gate never passes.
- **Constant zones.** A zone that read the same value in every read, over at least
  `CONSTANT_MIN_READS` reads spanning at least `CONSTANT_MIN_SPAN_S` seconds, is taken for a
  constant whatever its name (`ZoneHistory`, kept per device across its reads: the gate's polls
  and the run's samples). The span is long on purpose: a real sensor at 1 °C resolution can hold
  one value for seconds while an idle phone cools, and dropping it would let a hot phone run.
  A zone that moves once is a sensor for good.
- **Units.** sysfs says m°C, but some vendors' zones report °C or tenths of °C. `to_mc` decides by
  magnitude, for temperatures a phone can have (−40 … 150 °C): |value| ≥ 1500 is m°C,
  150 ≤ |value| < 1500 tenths, |value| < 150 °C. The two readings this gets wrong are a m°C
  sensor under 1.5 °C (read as tenths) and a tenths sensor under 15.0 °C (read as °C). A value
  outside −40 … 150 °C after that (a disabled sensor's −273000) is no temperature: the zone is
  ignored.

The zone used and those ignored (with why) are in each DeviceState's `to_dict()`, so every run's
`entry_state`/`exit_state` and its gate record name the sensor (docs/campaign-dir.md).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass

CPU_ZONE = re.compile(r"^(cpu|cpuss|x86_pkg|soc_thermal|cpu_thermal|tsens_tz_sensor|mtktscpu|apc)", re.I)
TRIP_ZONE = re.compile(r"trip", re.I)
MIN_C, MAX_C = -40, 150                 # a temperature a phone can have
MC_FROM = 1500                          # |raw| at or over this: millidegrees
TENTHS_FROM = 150                       # |raw| at or over this (and under MC_FROM): tenths of a degree
CONSTANT_MIN_READS = 5
CONSTANT_MIN_SPAN_S = 60.0


def to_mc(raw: int) -> int | None:
    """A zone's raw reading in m°C, its unit decided by magnitude (module docstring); None when it
    is no temperature a phone can have."""
    size = abs(raw)
    mc = raw if size >= MC_FROM else raw * 100 if size >= TENTHS_FROM else raw * 1000
    return mc if MIN_C * 1000 <= mc <= MAX_C * 1000 else None


def parse_zones(text: str) -> tuple[dict[str, int], dict[str, str]]:
    """`TYPE=VALUE` lines (one per zone, as the phone's state and sample scripts print them) into
    m°C per zone type (a repeated type gets `#2`, `#3` …), and the zones whose value is no
    temperature (zone -> why)."""
    zones: dict[str, int] = {}
    bad: dict[str, str] = {}
    for line in text.splitlines():
        kind, sep, value = line.partition("=")
        value = value.strip()
        if not sep or not kind or not re.fullmatch(r"-?[0-9]{1,12}", value):
            continue
        key, n = kind, 1
        while key in zones or key in bad:
            n += 1
            key = f"{kind}#{n}"
        mc = to_mc(int(value))
        if mc is None:
            bad[key] = f"reads {value}: no temperature in any unit (m°C, tenths, °C)"
        else:
            zones[key] = mc
    return zones, bad


def cpu_zone(zones_mc: Mapping[str, int], constant: Collection[str] = ()) -> tuple[str | None, dict[str, str]]:
    """The CPU zone to use (the hottest CPU zone that is neither a trip point nor constant; None
    when there is none), and the CPU zones left out, each with why."""
    ignored: dict[str, str] = {}
    best: str | None = None
    for name, mc in zones_mc.items():
        if not CPU_ZONE.match(name):
            continue
        if TRIP_ZONE.search(name):
            ignored[name] = "a trip point (its type names one)"
        elif name in constant:
            ignored[name] = f"constant (the same value in every read for {CONSTANT_MIN_SPAN_S:g} s or more)"
        elif best is None or mc > zones_mc[best]:
            best = name
    return best, ignored


@dataclass
class _Seen:
    first_value: int
    first_at_s: float
    last_at_s: float
    reads: int = 1
    moved: bool = False


class ZoneHistory:
    """What one device's zones read so far (thread-safe: the run's sampler reads while the caller
    may too): which zones never moved."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}
        self._lock = threading.Lock()

    def observe(self, zones_mc: Mapping[str, int], at_s: float) -> tuple[str, ...]:
        """Record one read (`at_s`: a monotonic clock); returns the zones constant so far."""
        with self._lock:
            for name, mc in zones_mc.items():
                seen = self._seen.get(name)
                if seen is None:
                    self._seen[name] = _Seen(mc, at_s, at_s)
                    continue
                seen.reads += 1
                seen.last_at_s = max(seen.last_at_s, at_s)
                seen.moved = seen.moved or mc != seen.first_value
            return tuple(sorted(name for name, s in self._seen.items() if not s.moved and s.reads >= CONSTANT_MIN_READS
                                and s.last_at_s - s.first_at_s >= CONSTANT_MIN_SPAN_S))
