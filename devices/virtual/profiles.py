"""Real phones' published figures for `virtual up --profile NAME`, scaled to this host.

Each row is what the maker publishes (RAM, cores, storage class, launch Android) plus the storage
class's sequential read rate and the zram sizing the phone is assumed to use. Scaling, stated once:
RAM and zram are multiplied by SCALE (1/8: an 8 GB phone becomes a 1 GiB virtual phone, so two
or three fit on a small host), cores by SCALE too (rounded, at least 1: a 2-core host cannot give
9 cores, and phones should not share them); the read rate is kept as published, its MB/s converted to MiB/s (it is what a
miss costs; the host's disk must be faster than it for the throttle to be the limit, see
docs/virtual-phones.md). Flags given explicitly override the profile's values.

Sources:
- Pixel 8: store.google.com/product/pixel_8_specs (8 GB LPDDR5X, Google Tensor G3 with 9 cores:
  1 Cortex-X3, 4 A715, 4 A510; 128/256 GB UFS 3.1; launched with Android 14).
- Galaxy S24: samsung.com Galaxy S24 specifications (8 GB, 8 or 10-core SoC: Snapdragon 8 Gen 3
  for Galaxy has 8 cores; 256 GB UFS 4.0; One UI 6.1 / Android 14).
- Redmi Note 12: mi.com Redmi Note 12 specs (4/6/8 GB, Snapdragon 685 with 8 cores, UFS 2.2,
  MIUI 14 / Android 13).
- Galaxy A05: samsung.com Galaxy A05 specifications (4 GB, MediaTek Helio G85 with 8 cores,
  64/128 GB eMMC 5.1, Android 13).
- Read rates: the storage class's typical sequential read, from the interface vendors' figures:
  UFS 4.0 4200 MB/s (Samsung Semiconductor's UFS 4.0 announcement), UFS 3.1 2100 MB/s (Samsung's
  UFS 3.1 figure), UFS 2.2 1000 MB/s (JEDEC UFS 2.x HS-G3 x2 ~1.2 GB/s raw), eMMC 5.1 250 MB/s
  (JEDEC eMMC 5.1 HS400 400 MB/s bus, ~250 read measured).
- zram: none of these makers publishes its zram size; each row uses the default of this project
  (half the RAM, the common Android device setting, docs/decisions/vphone-zram.md) and lz4.
- lmkd: Android's ro.lmk.* defaults of the release (lmkd_policy.py), none overridden: these are not
  low-RAM (ro.config.low_ram) devices.
- celsius-zones: not a real phone but a vendor's unit, on the default phone's figures: CPU
  thermal zones that count whole °C (`45`, not `45000`), as some vendors' do (the unit every
  thermal reader has to normalise; devices/virtual/thermal.py). Its RAM, cores and flash are a
  mid-range phone's: 4 GB, 8 cores, UFS 2.2, Android 14.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.units import GIB, MIB

SCALE = 1 / 8


@dataclass(frozen=True)
class Profile:
    name: str
    model: str
    manufacturer: str
    soc: str
    ram_bytes: int          # as published
    cores: int              # as published
    storage: str            # storage class
    read_mbps: int          # the class's sequential read, MB/s
    android: int            # launch release
    zram_fraction: float = 0.5
    lmk: dict = field(default_factory=dict)
    source: str = ""
    thermal_unit: str = "mC"    # what its CPU zones count in (thermal.UNITS)

    def scaled(self) -> dict:
        """The values `virtual up` takes, scaled to this host (module doc)."""
        ram = int(self.ram_bytes * SCALE) & ~(MIB - 1)
        return {"ram_bytes": ram, "zram_bytes": int(ram * self.zram_fraction) & ~(MIB - 1),
                "cpus": max(1, round(self.cores * SCALE)),
                # --storage-mbps is MiB/s; the makers publish MB/s
                "storage_mbps": round(self.read_mbps * 1_000_000 / MIB),
                "android": self.android, "model": self.model, "manufacturer": self.manufacturer,
                "soc": self.soc, "lmk": dict(self.lmk), "thermal_unit": self.thermal_unit}


PROFILES = {p.name: p for p in (
    Profile("pixel8", "Pixel 8", "Google", "tensor-g3", 8 * GIB, 9, "UFS 3.1", 2100, 14,
            source="store.google.com/product/pixel_8_specs"),
    Profile("galaxy-s24", "Galaxy S24", "samsung", "sm8650", 8 * GIB, 8, "UFS 4.0", 4200, 14,
            source="samsung.com Galaxy S24 specifications"),
    Profile("redmi-note12", "Redmi Note 12", "Xiaomi", "sm6225", 4 * GIB, 8, "UFS 2.2", 1000, 13,
            source="mi.com Redmi Note 12 specs"),
    Profile("galaxy-a05", "Galaxy A05", "samsung", "mt6769", 4 * GIB, 8, "eMMC 5.1", 250, 13,
            source="samsung.com Galaxy A05 specifications"),
    Profile("celsius-zones", "vphone-celsius", "bmoe", "sm8550", 4 * GIB, 8, "UFS 2.2", 1000, 14,
            source="a vendor's thermal unit, not a phone (module doc)", thermal_unit="C"),
)}


class ProfileError(Exception):
    """A phone `virtual up` cannot make from what it was given (one line)."""


class UnknownProfile(ProfileError):
    pass


# a phone's figures where neither a profile nor a flag gives them
DEFAULTS: dict[str, Any] = {"model": "vphone", "manufacturer": "bmoe", "soc": "sm8550", "android": 14, "cpus": 0,
                            "storage_mbps": 0, "lmk": {}, "thermal_unit": "mC"}


def get(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UnknownProfile(f"no phone profile {name!r}: choose one of {', '.join(sorted(PROFILES))}") from None


def settings(profile: str | None, given: Mapping[str, Any], ram_bytes: int | None, zram_bytes: int | None,
             default_zram: Callable[[int], int]) -> tuple[int, dict[str, Any]]:
    """`virtual up`'s phone, as (RAM bytes, the rest of devices.virtual.manager.up's settings): the
    defaults, the profile's scaled figures over them, the flags given (None: not given) over those.
    RAM given without zram drops the profile's zram (it was for the profile's RAM); with neither,
    zram is default_zram(RAM)."""
    base = dict(DEFAULTS)
    if profile:
        base.update(get(profile).scaled())
    base.update({k: v for k, v in given.items() if v is not None})
    if ram_bytes is not None:
        base["ram_bytes"] = ram_bytes
        if zram_bytes is None:
            base.pop("zram_bytes", None)
    if "ram_bytes" not in base:
        raise ProfileError("give --ram or --profile")
    if zram_bytes is not None:
        base["zram_bytes"] = zram_bytes
    elif "zram_bytes" not in base:
        base["zram_bytes"] = default_zram(base["ram_bytes"])
    return base.pop("ram_bytes"), base
