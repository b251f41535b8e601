"""Engine flags a campaign passes through: `run.engine_args` (every cell) and `[axes.flags]` (any
engine flag as an axis).

The harness builds part of every command line itself (model, prompt, tokens, budget, telemetry
paths …): a pass-through flag that set one of those again would make the record lie about what
ran, so those are refused with the key that does set them. Four flags map onto an axis the
campaign already has (`-t`/`--threads`, `--n-expert-used`, `--io-threads`, `--dense-weights`):
as an `[axes.flags]` key they become that axis. Flags that make no measurement run (`--help`,
`--session` …) are refused too. Everything else is passed through as written.

Axis values are typed as in TOML (engine.contract.flags renders them into argv; results/ renders the same
flags from a run's config with it). This module is pure (no device, no harness state).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from engine.contract.flags import FlagValue
from engine.interface import flags as interface
from engine.interface.flags import AXIS, BUDGET, HARNESS, NO_RUN, PLANNER, RUN, SESSION

_FLAG = re.compile(r"^(-[A-Za-z]|--[A-Za-z][A-Za-z0-9_-]*)$")
_INT = re.compile(r"^[+-]?[0-9]+$")
_FLOAT = re.compile(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$")

# flags the harness writes itself -> where a campaign sets what they mean (engine.interface.flags)
RESERVED: dict[str, str] = {s: f.harness for f in interface.with_role(RUN, BUDGET, HARNESS, PLANNER)
                            for s in f.spellings}
# flags that map onto an axis the campaign already has (the axis name in Axes)
MAPPED: dict[str, str] = {s: f.axis for f in interface.with_role(AXIS) for s in f.spellings}
# flags after which the engine makes no measurement run
NOT_A_RUN = interface.spellings(interface.with_role(NO_RUN, SESSION))


def name_problem(name: str) -> str | None:
    """Why `name` cannot be an `[axes.flags]` key (None when it can; mapped flags can)."""
    if not isinstance(name, str) or not _FLAG.match(name):
        return (f"{_show(name)} is not a flag: write it as the engine takes it, e.g. \"--prefetch\" or \"-c\" "
                "(its values go in the list)")
    if name in RESERVED:
        return f"{name} is set by the harness: {RESERVED[name]}"
    if name in NOT_A_RUN:
        return f"{name} makes no measurement run"
    return None


def arg_problem(arg: str) -> str | None:
    """Why one `run.engine_args` element is refused (None when it is passed through)."""
    if not arg:
        return "is empty"
    if "\0" in arg:
        return "holds a NUL character"
    name, eq, _ = arg.partition("=")
    if eq and name.startswith("--") and _FLAG.match(name):
        # bmoe-cli's parser takes no --flag=value (it says "unknown arg"); a harness-owned flag
        # written that way must not slip past the checks below
        owned = arg_problem(name)
        return owned or f"bmoe-cli takes no --flag=value form: write {name} and its value as two elements"
    if arg in RESERVED:
        return f"{arg} is set by the harness: {RESERVED[arg]}"
    if arg in MAPPED:
        axis = MAPPED[arg]
        where = "run.threads or [axes.flags] \"-t\"" if axis == "threads" else f"axes.{axis}"
        return f"{arg} is set by the harness: use {where}"
    if arg in NOT_A_RUN:
        return f"{arg} makes no measurement run"
    return None


def value_problem(value: Any) -> str | None:
    """Why one flag-axis value is refused (None when it renders into argv)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):   # TOML's integers are 64-bit; tomllib reads longer ones
        return None if -2 ** 63 <= value < 2 ** 63 else "is not a 64-bit integer: no engine flag takes it"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a number an engine can take"
    if isinstance(value, str):
        if not value:
            return "is empty (write false to leave the flag out, true to pass it alone)"
        return "holds a NUL character" if "\0" in value else None
    return f"expected true, false, a number or a string, got {type(value).__name__}"


def unique_values(values: Iterable[FlagValue]) -> tuple[FlagValue, ...]:
    """Values in order, repeats dropped by type and value (Python's 1 == True == 1.0 must not merge them)."""
    seen: dict[tuple[str, Any], FlagValue] = {}
    for v in values:
        seen.setdefault((type(v).__name__, v), v)
    return tuple(seen.values())


def parse_option(text: str) -> tuple[str, list[FlagValue]]:
    """`NAME=V1,V2` (the sweep's --flag) as a flag and typed values: true/false, integers, floats,
    anything else a string. Raises ValueError with the problem."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ValueError(f"expected NAME=V1,V2 (e.g. --prefetch=0,2), got {text!r}")
    values = [_typed(part.strip()) for part in raw.split(",")]
    if any(v == "" for v in values):
        raise ValueError(f"{text!r}: an empty value (write false to leave the flag out)")
    return name, values


def _typed(text: str) -> FlagValue:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return text


def _show(name: Any) -> str:
    return f'"{name}"' if isinstance(name, str) else repr(name)
