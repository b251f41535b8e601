"""What a virtual phone's build variant, page size and thermal unit are, and what they show.

- **Build** (`virtual up --build user|userdebug`, default user): `ro.build.type`, `ro.debuggable`
  and the fingerprint's type. A userdebug build's logd keeps the kernel's log (logd/main.cpp:
  `ro.logd.kernel` defaults to `ro.debuggable && !ro.config.low_ram`, and logd sets it to "true"
  when it reads the kernel log); a user build's does not, so its `logcat -b kernel` is empty
  (devices/virtual/tools.py logcat). `dmesg` is refused to the shell on both: only logd, init,
  dumpstate and a few others hold `syslog_read` (system/sepolicy `public/logd.te`, `public/app.te`
  neverallow), never the shell.
- **Page size** (`--page-size 4k|16k`): 16 KiB pages from Android 15 (source.android.com
  "16 KB page size": AOSP builds them from Android 15, arm64 kernels from android14-6.1). The
  properties are source.android.com's "System properties" page for 16 KB: `ro.product.cpu.pagesize.max`
  (PRODUCT_MAX_PAGE_SIZE_SUPPORTED, 16384 where binaries are aligned for a 16 KiB kernel), and from
  Android 16 `ro.product.page_size` (TARGET_BOOTS_16K) and `ro.boot.hardware.cpu.pagesize` (init
  sets it from the running page size). The shell sees the size through `getconf PAGESIZE`
  (tools.getconf_script) and in /proc/vmstat's page counters (meminfo.vmstat_text).
- **Thermal unit** (a profile's): what the CPU zones' `temp` files count in, m°C on most phones;
  the phone's thermal HAL knows its sensors, so `dumpsys thermalservice` reads the unit from
  `ro.bmoe.thermal_unit` (thermal.UNIT_PROP, set only where it is not m°C).
"""

from __future__ import annotations

from devices.virtual.thermal import UNIT_PROP, UNITS

BUILDS = ("user", "userdebug")
PAGE_SIZES_BYTES = {"4k": 4096, "16k": 16384}
MIN_16K_ANDROID = 15


class VariantError(ValueError):
    """A build, page size or thermal unit a phone cannot have (one line)."""


def check(build: str, page_size_bytes: int, android: int, thermal_unit: str) -> None:
    """Raise VariantError, in one line, for what no phone of that release is."""
    if build not in BUILDS:
        raise VariantError(f"build {build!r} unknown: {' or '.join(BUILDS)}")
    if page_size_bytes not in PAGE_SIZES_BYTES.values():
        raise VariantError(f"page size {page_size_bytes} unknown: 4096 (4k) or 16384 (16k)")
    if page_size_bytes == 16384 and android < MIN_16K_ANDROID:
        raise VariantError(f"16 KiB pages need Android {MIN_16K_ANDROID} or later (this phone is Android {android})")
    if thermal_unit not in UNITS:
        raise VariantError(f"thermal unit {thermal_unit!r} unknown: {', '.join(UNITS)}")


def build_variant_props(build: str, page_size_bytes: int, android: int, thermal_unit: str) -> dict[str, str]:
    """The properties these choices add to a phone's getprop table (module doc)."""
    props: dict[str, str] = {}
    if build == "userdebug":
        props["ro.logd.kernel"] = "true"
    if page_size_bytes != 4096:
        props["ro.product.cpu.pagesize.max"] = str(page_size_bytes)
        if android >= 16:
            props["ro.product.page_size"] = str(page_size_bytes)
            props["ro.boot.hardware.cpu.pagesize"] = str(page_size_bytes)
    if thermal_unit != "mC":
        props[UNIT_PROP] = thermal_unit
    return props
