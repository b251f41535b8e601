"""A virtual phone's thermal zones and CPU frequency caps.

Each zone relaxes exponentially toward ambient + gain × (busy cores), with its own time constant:
CPU zones answer in tens of seconds, the battery in minutes, as on a phone in free air. The
thermal status (Android's THROTTLING_* levels 0..6) follows the hottest CPU zone, and from
status 2 (moderate) on the cpufreq policies' scaling_max_freq is cut.

As on a production phone, a `cpu-hw-trip-0` zone reads a constant 95000: a hardware trip point,
not a sensor (upstream BigMoeOnEdge's benchmark method page, its thermal caveat: "Ignore `cpu-hw-trip-*` sensors —
those are static 95 °C trip points, not live temperatures"). It is no HAL temperature, so
`dumpsys thermalservice` neither lists it nor throttles on it. The CPU zones count in m°C, or in
the phone's unit (UNITS: °C or tenths, as some vendors' zones do; a profile's `thermal_unit`,
recorded in the getprop table as UNIT_PROP for dumpsys, which speaks °C as the HAL does).

Standalone (no package
imports): the phone's `dumpsys` loads it by path on every call, so it imports only math and os
(its two records are plain slotted classes, not dataclasses; pathlib and engine.fsutil's atomic
write only where the daemon writes the files): each of those costs about what the interpreter's
own start does.
"""

from __future__ import annotations

import math
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

THERMAL_DIR = "sys/class/thermal"               # under the phone's root
CPUFREQ_DIR = "sys/devices/system/cpu/cpufreq"

# Android's Temperature.TYPE_*: what `dumpsys thermalservice` prints as mType.
TYPE_CPU, TYPE_GPU, TYPE_BATTERY, TYPE_SKIN = 0, 1, 2, 3
# THROTTLING_LIGHT..SHUTDOWN start at these hottest-CPU temperatures (°C).
STATUS_THRESHOLDS_C = (45.0, 50.0, 55.0, 62.0, 70.0, 80.0)
STATUS_NAMES = ("NONE", "LIGHT", "MODERATE", "SEVERE", "CRITICAL", "EMERGENCY", "SHUTDOWN")
# The hardware trip zones every phone here has, and what they read (m°C, whatever the CPU unit).
TRIP_ZONES_MC = {"cpu-hw-trip-0": 95000}
UNITS = {"mC": 1000, "dC": 10, "C": 1}      # a zone unit: counts per °C
UNIT_PROP = "ro.bmoe.thermal_unit"          # the CPU zones' unit where it is not m°C


class ZoneSpec:
    """One thermal zone: its type name, Android's kind, and how it heats and cools."""

    __slots__ = ("gain_c_per_core", "kind", "tau_s", "type_name")

    def __init__(self, type_name: str, kind: int, gain_c_per_core: float, tau_s: float):
        self.type_name, self.kind, self.gain_c_per_core, self.tau_s = type_name, kind, gain_c_per_core, tau_s


class Policy:
    """One cpufreq policy: the CPUs it drives and their top frequency."""

    __slots__ = ("cpus", "first_cpu", "max_khz", "min_khz")

    def __init__(self, first_cpu: int, cpus: tuple[int, ...], max_khz: int, min_khz: int = 300000):
        self.first_cpu, self.cpus, self.max_khz, self.min_khz = first_cpu, cpus, max_khz, min_khz


# A few SoCs' cluster layouts (cores per policy, top frequencies), enough for frequency caps to
# look like the phone's. Unknown SoCs get the generic layout.
SOC_POLICIES: dict[str, tuple[Policy, ...]] = {
    "sm8650": (Policy(0, (0, 1), 2265600), Policy(2, (2, 3, 4), 3148800), Policy(5, (5, 6), 2956800),
               Policy(7, (7,), 3302400)),
    "sm8550": (Policy(0, (0, 1, 2), 2016000), Policy(3, (3, 4, 5, 6), 2803200), Policy(7, (7,), 3187200)),
    "sm8450": (Policy(0, (0, 1, 2, 3), 1785600), Policy(4, (4, 5, 6), 2496000), Policy(7, (7,), 2995200)),
    "tensor-g3": (Policy(0, (0, 1, 2, 3), 1704000), Policy(4, (4, 5, 6, 7), 2367000), Policy(8, (8,), 2910000)),
    "mt6989": (Policy(0, (0, 1, 2, 3), 2000000), Policy(4, (4, 5, 6), 2850000), Policy(7, (7,), 3250000)),
    "generic": (Policy(0, (0, 1, 2, 3), 1800000), Policy(4, (4, 5, 6, 7), 2400000)),
}


def policies_for(soc: str) -> tuple[Policy, ...]:
    return SOC_POLICIES.get(soc.lower(), SOC_POLICIES["generic"])


def zone_specs(soc: str) -> list[ZoneSpec]:
    n_cpus = sum(len(p.cpus) for p in policies_for(soc))
    zones = [ZoneSpec(f"cpu-{c // 4}-{c % 4}", TYPE_CPU, 14.0, 20.0) for c in range(n_cpus)]
    zones += [ZoneSpec("gpu", TYPE_GPU, 6.0, 30.0), ZoneSpec("skin", TYPE_SKIN, 5.0, 120.0),
              ZoneSpec("battery", TYPE_BATTERY, 4.0, 240.0)]
    return zones


def is_trip(type_name: str) -> bool:
    """A hardware trip zone (TRIP_ZONES_MC): a constant, no temperature."""
    return type_name in TRIP_ZONES_MC


def thermal_status(hottest_cpu_c: float) -> int:
    return sum(1 for t in STATUS_THRESHOLDS_C if hottest_cpu_c >= t)


class ThermalModel:
    def __init__(self, soc: str, ambient_c: float = 25.0, cpu_unit: str = "mC"):
        self.zones = zone_specs(soc)
        self.policies = policies_for(soc)
        self.ambient_c = ambient_c
        self.cpu_per_c = UNITS[cpu_unit]     # what a CPU zone's temp file counts per °C
        self.temps_c = [ambient_c + 3.0 if z.kind != TYPE_CPU else ambient_c + 6.0 for z in self.zones]

    def step(self, dt_s: float, busy_cores: float) -> None:
        for i, z in enumerate(self.zones):
            target = self.ambient_c + (6.0 if z.kind == TYPE_CPU else 3.0) + z.gain_c_per_core * busy_cores
            self.temps_c[i] = target + (self.temps_c[i] - target) * math.exp(-dt_s / z.tau_s)

    def status(self) -> int:
        cpu = [t for z, t in zip(self.zones, self.temps_c) if z.kind == TYPE_CPU]
        return thermal_status(max(cpu) if cpu else self.ambient_c)

    def cap_khz(self, policy: Policy) -> int:
        """scaling_max_freq under throttling: -10 % per status level from MODERATE on."""
        cut = max(0, self.status() - 1) * 0.10
        return max(policy.min_khz, int(policy.max_khz * (1.0 - cut)))

    # -- files ------------------------------------------------------------------------------
    def write(self, root: Path) -> None:
        """The thermal zones and cpufreq policies as the phone's /sys files, each replaced atomically."""
        from pathlib import Path  # the daemon's side only: dumpsys never writes

        base = Path(root) / THERMAL_DIR
        for i, (z, t) in enumerate(zip(self.zones, self.temps_c)):
            zone = base / f"thermal_zone{i}"
            zone.mkdir(parents=True, exist_ok=True)
            _replace(zone / "type", z.type_name + "\n")
            _replace(zone / "temp", f"{round(t * (self.cpu_per_c if z.kind == TYPE_CPU else 1000))}\n")
            _replace(zone / "mode", "enabled\n")
            _replace(zone / "policy", "step_wise\n")
        for j, (name, mc) in enumerate(TRIP_ZONES_MC.items(), start=len(self.zones)):
            zone = base / f"thermal_zone{j}"
            zone.mkdir(parents=True, exist_ok=True)
            for file, text in (("type", name), ("temp", str(mc)), ("mode", "enabled"), ("policy", "step_wise")):
                _replace(zone / file, text + "\n")
        for p in self.policies:
            folder = Path(root) / CPUFREQ_DIR / f"policy{p.first_cpu}"
            folder.mkdir(parents=True, exist_ok=True)
            cap = self.cap_khz(p)
            files = {"cpuinfo_max_freq": p.max_khz, "cpuinfo_min_freq": p.min_khz, "scaling_max_freq": cap,
                     "scaling_min_freq": p.min_khz, "scaling_cur_freq": cap,
                     "related_cpus": " ".join(map(str, p.cpus)), "affected_cpus": " ".join(map(str, p.cpus)),
                     "scaling_governor": "schedutil", "scaling_driver": "vphone-cpufreq"}
            for name, value in files.items():
                _replace(folder / name, f"{value}\n")


def _replace(path: Path, text: str) -> None:
    """Atomic rename: readers never see a half-written value (these folders are bind-mounted as
    folders, so a new inode under the same name is what the phone sees)."""
    from engine.fsutil import atomic_write  # the daemon's side only, as in write

    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    atomic_write(path, text)


def read_zones(root: str | Path, cpu_unit: str = "mC") -> list[tuple[str, float]]:
    """(type, °C) of every temperature zone as the phone's files hold them, in zone order, the
    CPU zones (`cpu-N-M`) counted in `cpu_unit`; the trip zones (no temperatures) left out."""
    out: list[tuple[str, float]] = []
    base = os.path.join(root, THERMAL_DIR)
    if not os.path.isdir(base):
        return out
    zones = [name for name in os.listdir(base) if name.startswith("thermal_zone")]
    for name in sorted(zones, key=lambda n: int(n[12:] or 0)):
        try:
            with open(os.path.join(base, name, "type")) as f:
                kind = f.read().strip()
            if is_trip(kind):
                continue
            per_c = UNITS[cpu_unit] if kind.startswith("cpu-") else 1000
            with open(os.path.join(base, name, "temp")) as f:
                out.append((kind, int(f.read()) / per_c))
        except (OSError, ValueError):
            continue
    return out
