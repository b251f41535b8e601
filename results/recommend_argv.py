"""Recommended command lines: a run's settings from its argv, with a fixed budget or as auto.

Every command line a recommendation prints is the one that was measured (issue 12): the settings
of the chosen runs' own argv with only the run's own files, prompt and token count left out
(settings_of); the budget set with `--force-cache` exactly when the engines need it; imported runs,
which kept no argv, get theirs rebuilt from their configuration (rebuilt_settings).
"""

from __future__ import annotations

import json
import shlex
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from engine.flags import needs_force
from results.run_keys import text_of as _text

# argv elements that belong to one run, not to its settings: its files, prompt and length
RUN_ONLY = frozenset({"-m", "--model", "-p", "--prompt", "-n", "--n-predict", "--csv", "--route-trace"})
# … and those without a value: a session cell's --session is how the harness drove the run
# (harness/turns.py), not a setting; a recommended command line runs one-shot, as --verify does
RUN_ONLY_ALONE = frozenset({"--session"})


def settings_of(argv: Sequence[str]) -> tuple[str, ...]:
    """A run's settings: its argv without the engine, its files, prompt and token count."""
    out: list[str] = []
    i = 1
    while i < len(argv):
        if argv[i] in RUN_ONLY:
            i += 2
            continue
        if argv[i] not in RUN_ONLY_ALONE:
            out.append(str(argv[i]))
        i += 1
    return tuple(out)


def flag_value(settings: Sequence[str], flag: str) -> str | None:
    """The value after `flag` in these settings (None when the flag is absent or last)."""
    for i, a in enumerate(settings[:-1]):
        if a == flag:
            return settings[i + 1]
    return None


def _without(settings: Sequence[str], flag: str, takes_value: bool) -> list[str]:
    out: list[str] = []
    skip = False
    for a in settings:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = takes_value
            continue
        out.append(a)
    return out


def _without_budget(settings: Sequence[str]) -> list[str]:
    """The settings with every budget flag taken out (a recommendation sets its own)."""
    s = _without(settings, "--force-cache", False)
    for flag in ("--cache-floor-mb", "--cache-ceil-mb", "--cache-mb"):
        s = _without(s, flag, True)
    return s


def with_fixed_budget(settings: Sequence[str], cache_mb: int) -> tuple[str, ...]:
    """The settings with a fixed `--cache-mb` (and `--force-cache` exactly when the engines need it)."""
    s = _without_budget(settings)
    at = s.index("--moe-stream") + 1 if "--moe-stream" in s else 0
    if "--moe-stream" not in s:
        s.insert(0, "--moe-stream")
        at = 1
    budget = ["--cache-mb", str(int(cache_mb))] + (["--force-cache"] if needs_force(cache_mb) else [])
    return tuple(s[:at] + budget + s[at:])


def with_auto(settings: Sequence[str], ceil_mb: int, floor_mb: int | None) -> tuple[str, ...]:
    """The settings as `--cache-mb auto` with this ceiling (and the floor they were measured with)."""
    floor = flag_value(settings, "--cache-floor-mb")
    if floor is None and floor_mb is not None:
        floor = str(int(floor_mb))
    s = _without_budget(settings)
    if "--moe-stream" not in s:
        s.insert(0, "--moe-stream")
    at = s.index("--moe-stream") + 1
    auto = ["--cache-mb", "auto"] + (["--cache-floor-mb", floor] if floor is not None else []) + \
        ["--cache-ceil-mb", str(int(ceil_mb))]
    return tuple(s[:at] + auto + s[at:])


def rebuilt_settings(row: Mapping[str, Any]) -> tuple[str, ...]:
    """Settings for a run that kept no argv (imported upstream files), from its configuration."""
    s: list[str] = []
    for flag, key in (("-t", "threads"), ("--n-expert-used", "n_expert_used")):
        if _text(row.get(key)):
            s += [flag, _text(row.get(key))]
    if row.get("moe_stream") is not False:
        budget = _text(row.get("cache_mb_config")) or _text(row.get("cache_mb"))
        if row.get("cache_auto"):
            s += ["--moe-stream", "--cache-mb", "auto"]
            for flag, key in (("--cache-floor-mb", "cache_floor_mb"), ("--cache-ceil-mb", "cache_ceil_mb")):
                if _text(row.get(key)):
                    s += [flag, _text(row.get(key))]
        elif budget:
            s = list(with_fixed_budget(s, int(float(budget))))
        if _text(row.get("io_threads")) and _text(row.get("io_threads")) != "0":
            s += ["--io-threads", _text(row.get("io_threads"))]
    if row.get("dense_weights"):
        s += ["--dense-weights", str(row["dense_weights"])]
    for extra in ("engine_args", "engine_flags"):
        if row.get(extra):
            s += shlex.split(str(row[extra]))
    return tuple(s)


def argv_of_runs(run_ids: Sequence[str], rows: Mapping[str, Mapping[str, Any]],
                 prefer_ok: bool = True) -> tuple[tuple[str, ...], str, tuple[str, ...]]:
    """(the settings most of these runs had, "measured" or "rebuilt", the runs that had them)."""
    recs = [rows[r] for r in run_ids if r in rows]
    if prefer_ok and any(r.get("outcome") == "ok" for r in recs):
        recs = [r for r in recs if r.get("outcome") == "ok"]
    measured = [(r["run_id"], settings_of(json.loads(r.get("argv") or "[]"))) for r in recs]
    measured = [(rid, s) for rid, s in measured if s]
    if measured:
        common, _ = Counter(s for _, s in measured).most_common(1)[0]
        return common, "measured", tuple(rid for rid, s in measured if s == common)
    if recs:
        return rebuilt_settings(recs[0]), "rebuilt", tuple(r["run_id"] for r in recs)
    return (), "rebuilt", ()


def cache_flags(argv: Sequence[str]) -> tuple[str, ...]:
    """The cache part of an auto argv: what an app's per-phone default sets."""
    out = ["--moe-stream", "--cache-mb", "auto"]
    for flag in ("--cache-floor-mb", "--cache-ceil-mb"):
        v = flag_value(argv, flag)
        if v is not None:
            out += [flag, v]
    return tuple(out)
