"""Facts of Android that real and virtual phones share: ProcessList's oom_score_adj for each app
state, the `--apps` load spec (`cached:300MiB,perceptible:200MiB[:compressible][:active]`) that
both start as other open apps (devices/virtual/apps.py inside a virtual phone, devices/coapps.py
pushed to a real one), and the ABI names of host machines.

The adj is ProcessList.java's for the state: foreground 0, visible 100, perceptible 200, previous
700, cached 900 and up (CACHED_APP_MIN_ADJ 900; the k-th cached app at 900 + 10k, capped at
CACHED_APP_MAX_ADJ 999, the most recent first, as OomAdjuster spreads the cached LRU).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from engine.units import GIB, KIB, MIB, ascii_float

# ProcessList.java (frameworks/base/services/core/java/com/android/server/am)
FOREGROUND_APP_ADJ = 0
VISIBLE_APP_ADJ = 100
PERCEPTIBLE_APP_ADJ = 200
PREVIOUS_APP_ADJ = 700
CACHED_APP_MIN_ADJ = 900
CACHED_APP_MAX_ADJ = 999
OOM_SCORE_ADJ_MAX = 1000

HOST_ABI = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64-v8a", "arm64": "arm64-v8a",
            "armv7l": "armeabi-v7a", "i686": "x86", "riscv64": "riscv64"}

FIRST_APP_UID = 10100
STATES = {"foreground": FOREGROUND_APP_ADJ, "visible": VISIBLE_APP_ADJ,
          "perceptible": PERCEPTIBLE_APP_ADJ, "previous": PREVIOUS_APP_ADJ,
          "cached": CACHED_APP_MIN_ADJ}
# `open:PACKAGE`: an installed app opened by its launcher activity (am start), as a user opens it
OPEN = "open"
_PACKAGE = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)+", re.A)
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)[ \t]*(KiB|MiB|GiB|K|M|G)?", re.I)
_UNITS = {"": MIB, "k": KIB, "kib": KIB, "m": MIB, "mib": MIB, "g": GIB, "gib": GIB}
# an app no phone could hold: the largest phones have 24 GiB of RAM; 1 TiB leaves room for any to come
MAX_APP_BYTES = 1024 * GIB

# An `:active` app reads one byte of ACTIVE_PERCENT % of its pages every ACTIVE_PERIOD_S, in turn
# (all of them every 100 / ACTIVE_PERCENT periods): a foreground app in use keeps its memory warm.
ACTIVE_PERCENT = 4
ACTIVE_PERIOD_S = 0.1


class AppSpecError(ValueError):
    """A bad --apps item."""


@dataclass(frozen=True)
class App:
    state: str
    size_bytes: int
    compressible: bool
    name: str
    uid: int
    oom_score_adj: int
    active: bool = False

    @property
    def opened(self) -> bool:
        """An installed app opened through ActivityManager (`open:PKG`): registered with lmkd, which
        may kill it. A campaign starts every other item as ballast (devices/coapps.py: a shell
        allocator at the state's adj, which lmkd never considers on a real phone, since only
        ActivityManager registers processes with it); a virtual phone's own --apps are registered."""
        return self.state == OPEN

    def describe(self) -> str:
        if self.opened:
            return f"{self.name} (opened by ActivityManager: lmkd's to kill)"
        kind = "compressible" if self.compressible else "incompressible"
        use = ", active" if self.active else ""
        return f"{self.name} ({self.state}, oom_score_adj {self.oom_score_adj}, {self.size_bytes // MIB} MiB {kind}{use})"


def parse_apps(items: str | list[str] | tuple[str, ...]) -> list[App]:
    """`cached:300MiB,perceptible:200MiB[:compressible]` (or a list of such items) as App specs.
    An empty item (`a,,b`, a trailing comma) is refused: a lost app, not a shorter list."""
    raw = [x.strip() for x in (items.split(",") if isinstance(items, str) else items)]
    if raw == [""]:
        raw = []                                    # "" (or ("",)): no apps
    if "" in raw:
        raise AppSpecError(f"bad apps {_shown(items)}: an empty item (one app per item, none between "
                           f"two commas)")
    apps: list[App] = []
    per_state: dict[str, int] = {}
    for n, item in enumerate(raw):
        parts = item.split(":")
        if parts[0] == OPEN:
            if len(parts) != 2 or not _PACKAGE.fullmatch(parts[1]):
                raise AppSpecError(f"bad app {_shown(item)}: use open:PACKAGE, an installed app's package name "
                                   "(e.g. open:com.android.chrome)")
            apps.append(App(OPEN, 0, False, parts[1], 0, FOREGROUND_APP_ADJ))
            continue
        flags = parts[2:]
        if (len(parts) < 2 or parts[0] not in STATES or len(set(flags)) != len(flags)
                or not set(flags) <= {"compressible", "active"}):
            raise AppSpecError(f"bad app {_shown(item)}: use STATE:SIZE[:compressible][:active], STATE one of "
                               f"{', '.join(STATES)} (e.g. cached:300MiB), or open:PACKAGE")
        size = _size_bytes(parts[1], item)
        k = per_state.get(parts[0], 0)
        per_state[parts[0]] = k + 1
        adj = STATES[parts[0]]
        if parts[0] == "cached":
            adj = min(CACHED_APP_MAX_ADJ, adj + 10 * k)
        apps.append(App(parts[0], size, "compressible" in flags, f"com.bmoe.app.{parts[0]}{k + 1}",
                        FIRST_APP_UID + n, adj, "active" in flags))
    return apps


def _size_bytes(text: str, item: str) -> int:
    """An app's size (`300MiB`, `1.5G`; MiB without a unit) in bytes: ASCII digits, above 0 bytes
    and under MAX_APP_BYTES."""
    m = _SIZE.fullmatch(text)
    try:
        size = ascii_float(m[1]) * _UNITS[(m[2] or "").lower()] if m else math.nan
    except ValueError:                              # 400 digits: too large for a float
        size = math.inf
    if not size >= 1:
        raise AppSpecError(f"bad app size {_shown(text)} in {_shown(item)} (e.g. 300MiB)")
    if not size < MAX_APP_BYTES:
        raise AppSpecError(f"app size {_shown(text)} in {_shown(item)} is over {MAX_APP_BYTES // GIB} GiB: "
                           "no phone holds it")
    return int(size)


def _shown(text: str | Sequence[str]) -> str:
    """A spec quoted for an error message, cut to a line's worth (a campaign value may be any length)."""
    text = text if isinstance(text, str) else ",".join(text)
    return repr(text if len(text) <= 60 else text[:60] + "…")


def parse_load(value: str | Sequence[str]) -> list[App]:
    """One load: `cached:1GiB+perceptible:512MiB` (or a list of items); `none` or "" is no apps.
    An empty item (`a++b`, a trailing `+`) is refused, as parse_apps refuses one."""
    items = [x.strip() for x in (value.split("+") if isinstance(value, str) else list(value))]
    if items == [""] or not items:
        return []
    if "" in items:
        raise AppSpecError(f"bad load {_shown(value)}: an empty item (apps joined by one +, e.g. "
                           "cached:1GiB+perceptible:512MiB)")
    return parse_apps([x for x in items if x != "none"])
