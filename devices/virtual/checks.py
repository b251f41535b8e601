"""What `virtual up` may be given: every argument checked against its help before anything starts.

manager.up calls `check_args` first, so a bad argument is one line (a VirtualPhoneError, which
the CLI prints as `Error: …`) and nothing is made: no folder, no spec, no daemon. What depends on
this host (its cores, its RAM, its zram) is checked by manager.up next, also before anything is
made. The rules, and where they come from:

- The name is a folder's name and part of ro.product.device: letters, digits, `_`, `.`, `-`, at
  most 63 characters, the whole string (no trailing newline slips past the pattern).
- Strings that become properties (`--model`, `--manufacturer`, `--soc`) are data: shown as given,
  never a path of this host. So that getprop shows each exactly as given, each is 1 to
  PROP_VALUE_MAX_BYTES bytes (Android's PROP_VALUE_MAX, 92 with the NUL: what a property held
  before Android 8 and still holds unless it is `ro.`), with no control character (a line break
  would start another build.prop line) and no space at either end (build.prop's reader strips
  them). Then, each by where a phone carries it: the model travels in adbd's banner
  (`device::ro.product.model=…;…`), which adb splits at `:`, `;` and `=` (adb.cpp parse_banner):
  none of them; the manufacturer is Build.FINGERPRINT's first field
  (`brand/product/device:release/…`): no `/` or `:`; the SoC is ro.hardware, ro.product.board and
  ro.board.platform, from which Android's libhardware makes HAL file names
  (`<MODULE_ID>.<value>.so`, hardware/libhardware/hardware.c variant_keys): no `/`.
- `--android` is a release this project knows the SDK level of (phone.SDK_FOR_RELEASE: 9-16).
- `--abi` is one of Android's ABIs (devices/android.py HOST_ABI's values).
- Sizes: RAM at least MIN_RAM_BYTES; zram at most ZRAM_MAX_RAM_FACTOR times the RAM (fs_mgr's
  `zramsize=N%` takes 0-100 % of it; upstream's phone has 12 GB of zram for 11.4 GB of RAM:
  docs/decisions/vphone-zram.md); an app no larger than the RAM (it could never be resident).
- Counts and rates: `--cpus` and `--storage-mbps` 0 or more, the rate at most MAX_STORAGE_MBPS;
  `--swappiness` 0-200 (the kernel's range); `--port` 1-65535.
- `--apps` is ASCII (its grammar, STATE:SIZE[:compressible][:active], is), then what
  devices.android.parse_apps accepts.
- `--zram-algorithm` is a kernel compressor's name (lower-case letters, digits, `-`: lz4, zstd,
  lzo-rle, 842); whether this kernel offers it is asked when the phone has zram.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from devices.android import HOST_ABI, AppSpecError, parse_apps
from devices.virtual import profiles, variant
from devices.virtual.phone import SDK_FOR_RELEASE
from engine.errors import BmoeError
from engine.safetext import printable
from engine.units import MIB

MIN_RAM_BYTES = 32 * MIB
PROP_VALUE_MAX_BYTES = 91            # PROP_VALUE_MAX (92) less its NUL: bionic's system_properties.h
ZRAM_MAX_RAM_FACTOR = 2
MAX_STORAGE_MBPS = 100_000           # twenty times UFS 4.0's 4200 MB/s read (profiles.py): past any phone's flash
ANDROID_ABIS = tuple(sorted(set(HOST_ABI.values())))
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", re.ASCII)
_ALGORITHM = re.compile(r"[a-z0-9][a-z0-9-]{0,31}", re.ASCII)
# where each property string goes on a phone, and what that place cannot carry (module doc)
_FORBIDDEN = {"model": (":;=", "adbd's banner splits at ':', ';' and '='"),
              "manufacturer": ("/:", "it is Build.FINGERPRINT's first field, split at '/' and ':'"),
              "soc": ("/", "it is ro.hardware, which Android makes HAL file names of")}


class VirtualPhoneError(BmoeError):
    """A virtual phone cannot be started, reached or stopped."""


def check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise VirtualPhoneError(f"bad phone name {printable(repr(name))}: use letters, digits, '_', '.', '-' "
                                "(at most 63)")


def check_property(flag: str, value: str) -> None:
    """A string that becomes a property (--model, --manufacturer, --soc): one line, or the reason."""
    shown = printable(repr(value))
    size = len(value.encode("utf-8", "surrogateescape"))
    if not 0 < size <= PROP_VALUE_MAX_BYTES:
        raise VirtualPhoneError(f"--{flag} {shown}: give 1 to {PROP_VALUE_MAX_BYTES} bytes (Android's "
                                f"PROP_VALUE_MAX), not {size}")
    if printable(value) != value or any(ch in value for ch in "\t\n"):
        raise VirtualPhoneError(f"--{flag} {shown}: a control character (a line break, an escape) cannot be "
                                "a property's value")
    if value != value.strip():
        raise VirtualPhoneError(f"--{flag} {shown}: no space at either end (build.prop drops them)")
    forbidden, why = _FORBIDDEN[flag]
    bad = sorted({ch for ch in value if ch in forbidden})
    if bad:
        raise VirtualPhoneError(f"--{flag} {shown}: no {' or '.join(repr(c) for c in bad)}: {why}")


def check_apps(apps: Sequence[str], ram_bytes: int) -> None:
    """--apps: ASCII, parse_apps' grammar, no app larger than the RAM, none opened by package."""
    for item in apps:
        if not item.isascii():
            raise VirtualPhoneError(f"--apps item {printable(repr(item))}: ASCII only (STATE:SIZE[:compressible]"
                                    "[:active], e.g. cached:300MiB)")
    try:
        parsed = parse_apps(list(apps))
    except AppSpecError as e:
        raise VirtualPhoneError(str(e)) from None
    for app in parsed:
        if app.opened:
            raise VirtualPhoneError("open:PACKAGE opens an installed app for a campaign's cell; a virtual phone's "
                                    "--apps are apps of its own (STATE:SIZE)")
        if app.size_bytes > ram_bytes:
            raise VirtualPhoneError(f"--apps {app.state}:{app.size_bytes // MIB}MiB: larger than the phone's RAM "
                                    f"({ram_bytes // MIB} MiB); it could never be resident")


def check_args(*, name: str, ram_bytes: int, model: str, manufacturer: str, soc: str, android: int, abi: str,
               port: int | None, apps: Sequence[str], zram_bytes: int, zram_algorithm: str, swappiness: int,
               cpus: int, storage_mbps: int, profile: str, build: str, page_size_bytes: int,
               data_quota_bytes: int, thermal_unit: str) -> None:
    """Raise VirtualPhoneError, in one line, for the first argument no phone can have (module doc)."""
    check_name(name)
    if ram_bytes < MIN_RAM_BYTES:
        raise VirtualPhoneError(f"RAM of {ram_bytes} bytes is too small (at least {MIN_RAM_BYTES // MIB} MiB)")
    for flag, value in (("model", model), ("manufacturer", manufacturer), ("soc", soc)):
        check_property(flag, value)
    if android not in SDK_FOR_RELEASE:
        raise VirtualPhoneError(f"--android {android}: give a release from {min(SDK_FOR_RELEASE)} to "
                                f"{max(SDK_FOR_RELEASE)}")
    if abi not in ANDROID_ABIS:
        raise VirtualPhoneError(f"--abi {printable(repr(abi))}: give one of Android's ABIs, {', '.join(ANDROID_ABIS)}")
    if port is not None and not 0 < port < 65536:
        raise VirtualPhoneError(f"bad port {port}: give 1 to 65535")
    if profile and profile not in profiles.PROFILES:
        raise VirtualPhoneError(f"no phone profile {printable(repr(profile))}: choose one of "
                                f"{', '.join(sorted(profiles.PROFILES))}")
    if zram_bytes < 0 or cpus < 0 or storage_mbps < 0 or data_quota_bytes < 0:
        raise VirtualPhoneError("--zram, --cpus, --storage-mbps and --data-quota take sizes and counts of 0 or more")
    if zram_bytes > ZRAM_MAX_RAM_FACTOR * ram_bytes:
        raise VirtualPhoneError(f"--zram {zram_bytes // MIB}MiB: at most {ZRAM_MAX_RAM_FACTOR} times the RAM "
                                f"({ZRAM_MAX_RAM_FACTOR * ram_bytes // MIB} MiB for {ram_bytes // MIB} MiB)")
    if not _ALGORITHM.fullmatch(zram_algorithm):
        raise VirtualPhoneError(f"--zram-algorithm {printable(repr(zram_algorithm))}: give a kernel compressor's "
                                "name (lz4, zstd, lzo-rle …)")
    if storage_mbps > MAX_STORAGE_MBPS:
        raise VirtualPhoneError(f"--storage-mbps {storage_mbps}: at most {MAX_STORAGE_MBPS} MiB/s (no phone's "
                                "flash reads faster; 0 for no throttle)")
    if not 0 <= swappiness <= 200:
        raise VirtualPhoneError(f"swappiness {swappiness} out of range (0-200)")
    try:
        variant.check(build, page_size_bytes, android, thermal_unit)
    except variant.VariantError as e:
        raise VirtualPhoneError(str(e)) from None
    check_apps(apps, ram_bytes)
