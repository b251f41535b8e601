"""Engine flag settings as the engine reads them: argv, a canonical text, a label for people, and
when a fixed budget needs `--force-cache`.

A setting is a flag and a value typed as in TOML: `false` leaves the flag out, `true` passes it
alone, an integer, a float or a string passes it with that value, rendered exactly (`0.1` stays
`0.1`). Both sides of the engine contract render settings with these functions: the harness when
it builds a cell's command line (harness.plan.grid), the results when they name the flags a run had
(results.read.table), so two runs with the same text ran the same command line. Which flags a campaign
may pass through is the harness's rule (harness.campaign.flags).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from engine.stream.budget import CACHE_MIN_MB

FlagValue = bool | int | float | str


def needs_force(cache_mb: float) -> bool:
    """Both engines refuse a fixed budget in 1..CACHE_MIN_MB-1 MiB (the pathological band) without
    `--force-cache`."""
    return 0 < cache_mb < CACHE_MIN_MB


def render_value(value: FlagValue) -> str:
    """One value as the engine reads it: integers and strings as written, floats by repr (0.1 -> "0.1")."""
    return repr(value) if isinstance(value, float) else str(value)


def flag_argv(flags: Mapping[str, FlagValue] | Sequence[tuple[str, FlagValue]]) -> list[str]:
    """argv of flag settings: false -> absent, true -> the flag alone, else the flag and its value."""
    items = flags.items() if isinstance(flags, Mapping) else flags
    out: list[str] = []
    for name, value in items:
        if value is False:
            continue
        out.append(name)
        if value is not True:
            out.append(render_value(value))
    return out


def flags_text(flags: Mapping[str, FlagValue] | None) -> str:
    """The flags a run had, as one canonical string (sorted by name, absent ones dropped): two
    runs with the same text ran the same command line, whatever order their campaigns listed them."""
    return shlex.join(flag_argv(sorted((flags or {}).items())))


# the budget the engine's own planner picks (`--auto`): the axes.cache_mb value, the run table's
# budget_asked and the start of its budget label
PLANNER_BUDGET = "planner"


def flags_label(flags: Mapping[str, FlagValue] | None) -> str:
    """Human form for progress lines and the dry run: `--prefetch 2, no --no-think`."""
    parts = [f"no {n}" if v is False else n if v is True else f"{n} {render_value(v)}"
             for n, v in (flags or {}).items()]
    return ", ".join(parts)
