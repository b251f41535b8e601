"""Recommended command lines: the chosen runs' own typed configuration, with a fixed budget or
as auto, put through the function that built the argv they ran with (store.engine_argv).

Every command line a recommendation prints is the one that was measured (issue 12, issue 26 item
2): the chosen runs' `CellConfig` with only its budget changed (and `--force-cache` exactly when
the engines need it), written by `settings_argv`, which leaves out the run's own files, prompt and
token count. The stored argv stays the record of what ran (settings_of reads it back; a test holds
the two equal on every run). Imported runs, which kept no argv, get theirs rebuilt from their table
columns (rebuilt_settings).
"""

from __future__ import annotations

import json
import shlex
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.flags import needs_force
from engine.interface.flags import (
    CACHE_CEIL_MB,
    CACHE_FLOOR_MB,
    CACHE_MB,
    DENSE_WEIGHTS,
    FORCE_CACHE,
    IO_THREADS,
    MOE_STREAM,
    N_EXPERT_USED,
    RUN,
    SESSION,
    THREADS,
)
from engine.interface.flags import with_role as _with_role
from results.read.run_keys import text_of as _text
from store.cells import CellConfig
from store.engine_argv import settings_argv

# argv elements that belong to one run, not to its settings (engine.interface.flags' RUN role):
# its files, prompt and length; and those without a value, a session cell's --session, how the
# harness drove the run (harness/turns.py), not a setting: a recommended command line runs one-shot
RUN_ONLY = frozenset(s for f in _with_role(RUN) if f.takes_value for s in f.spellings)
RUN_ONLY_ALONE = frozenset(s for f in _with_role(SESSION) for s in f.spellings)


def settings_of(argv: Sequence[str]) -> tuple[str, ...]:
    """A run's settings as its stored argv had them: without the engine, its files, prompt and
    token count (store.engine_argv.settings_argv writes the same from the run's config)."""
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


@dataclass(frozen=True)
class Measured:
    """What the chosen runs ran with: their typed configuration (None for imported runs, which
    kept no argv) and its settings, "measured" or "rebuilt", and the runs that had them."""

    settings: tuple[str, ...]
    source: str
    run_ids: tuple[str, ...]
    config: CellConfig | None = None

    def fixed(self, cache_mb: int) -> tuple[str, ...]:
        """These settings with a fixed `--cache-mb` (and `--force-cache` exactly when the engines need it)."""
        if self.config is None:
            return with_fixed_budget(self.settings, cache_mb)
        return tuple(settings_argv(self.config.with_(moe_stream=True, no_mmap=False, cache_auto=False,
                                                     cache_mb=int(cache_mb), force_cache=needs_force(cache_mb))))

    def auto(self, ceil_mb: int, floor_mb: int | None = None) -> tuple[str, ...]:
        """These settings as `--cache-mb auto` with this ceiling, and the floor they were measured with."""
        if self.config is None:
            return with_auto(self.settings, ceil_mb, floor_mb)
        floor = self.config.cache_floor_mb if self.config.cache_floor_mb is not None else floor_mb
        return tuple(settings_argv(self.config.with_(moe_stream=True, no_mmap=False, cache_auto=True,
                                                     cache_ceil_mb=int(ceil_mb), cache_floor_mb=floor,
                                                     force_cache=False)))

    @property
    def asked_mib(self) -> float | None:
        """The fixed budget these runs asked for (None: auto, no cache flag, or unreadable)."""
        if self.config is not None:
            c = self.config
            return None if c.cache_auto or not c.moe_stream or c.cache_mb is None else float(c.cache_mb)
        value = flag_value(self.settings, CACHE_MB.typed)
        try:
            return float(value) if value is not None else None
        except ValueError:
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


_BUDGET_FLAGS = ((CACHE_FLOOR_MB.typed, True), (CACHE_CEIL_MB.typed, True), (CACHE_MB.typed, True))


def _without_budget(settings: Sequence[str]) -> list[str]:
    """The settings with every budget flag taken out (a recommendation sets its own)."""
    s = _without(settings, FORCE_CACHE.typed, False)
    for flag, takes_value in _BUDGET_FLAGS:
        s = _without(s, flag, takes_value)
    return s


def with_fixed_budget(settings: Sequence[str], cache_mb: int) -> tuple[str, ...]:
    """Rebuilt settings (an imported run's, no config to build from) with a fixed `--cache-mb`."""
    s = _without_budget(settings)
    if MOE_STREAM.typed not in s:
        s.insert(0, MOE_STREAM.typed)
    at = s.index(MOE_STREAM.typed) + 1
    budget = [CACHE_MB.typed, str(int(cache_mb))] + ([FORCE_CACHE.typed] if needs_force(cache_mb) else [])
    return tuple(s[:at] + budget + s[at:])


def with_auto(settings: Sequence[str], ceil_mb: int, floor_mb: int | None) -> tuple[str, ...]:
    """Rebuilt settings as `--cache-mb auto` with this ceiling (and the floor they were measured with)."""
    floor = flag_value(settings, CACHE_FLOOR_MB.typed)
    if floor is None and floor_mb is not None:
        floor = str(int(floor_mb))
    s = _without_budget(settings)
    if MOE_STREAM.typed not in s:
        s.insert(0, MOE_STREAM.typed)
    at = s.index(MOE_STREAM.typed) + 1
    auto = [CACHE_MB.typed, "auto"] + ([CACHE_FLOOR_MB.typed, floor] if floor is not None else []) + \
        [CACHE_CEIL_MB.typed, str(int(ceil_mb))]
    return tuple(s[:at] + auto + s[at:])


def rebuilt_settings(row: Mapping[str, Any]) -> tuple[str, ...]:
    """Settings for a run that kept no argv (imported upstream files), from its table columns."""
    s: list[str] = []
    for flag, key in ((THREADS, "threads"), (N_EXPERT_USED, "n_expert_used")):
        if _text(row.get(key)):
            s += [flag.typed, _text(row.get(key))]
    if row.get("moe_stream") is not False:
        budget = _text(row.get("cache_mb_config")) or _text(row.get("cache_mb"))
        if row.get("cache_auto"):
            s += [MOE_STREAM.typed, CACHE_MB.typed, "auto"]
            for flag, key in ((CACHE_FLOOR_MB, "cache_floor_mb"), (CACHE_CEIL_MB, "cache_ceil_mb")):
                if _text(row.get(key)):
                    s += [flag.typed, _text(row.get(key))]
        elif budget:
            s = list(with_fixed_budget(s, int(float(budget))))
        if _text(row.get("io_threads")) and _text(row.get("io_threads")) != "0":
            s += [IO_THREADS.typed, _text(row.get("io_threads"))]
    if row.get("dense_weights"):
        s += [DENSE_WEIGHTS.typed, str(row["dense_weights"])]
    for extra in ("engine_args", "engine_flags"):
        if row.get(extra):
            s += shlex.split(str(row[extra]))
    return tuple(s)


def config_of(row: Mapping[str, Any]) -> CellConfig | None:
    """The typed configuration a run ran with (the run table's `config`: run.json's, as JSON)."""
    text = row.get("config")
    return CellConfig.from_dict(json.loads(text)) if isinstance(text, str) and text else None


def argv_of_runs(run_ids: Sequence[str], rows: Mapping[str, Mapping[str, Any]], prefer_ok: bool = True) -> Measured:
    """The settings most of these runs ran with, from their typed configuration (runs the harness
    made), or rebuilt from their columns (imported runs, which kept no argv)."""
    recs = [rows[r] for r in run_ids if r in rows]
    if prefer_ok and any(r.get("outcome") == "ok" for r in recs):
        recs = [r for r in recs if r.get("outcome") == "ok"]
    measured = [(r["run_id"], config) for r in recs
                if json.loads(r.get("argv") or "[]") and (config := config_of(r)) is not None]
    if measured:
        settings = {rid: tuple(settings_argv(c)) for rid, c in measured}
        common, _ = Counter(settings.values()).most_common(1)[0]
        config = next(c for rid, c in measured if settings[rid] == common)
        return Measured(common, "measured", tuple(rid for rid, _ in measured if settings[rid] == common), config)
    if recs:
        return Measured(rebuilt_settings(recs[0]), "rebuilt", tuple(r["run_id"] for r in recs))
    return Measured((), "rebuilt", ())


def cache_flags(argv: Sequence[str]) -> tuple[str, ...]:
    """The cache part of an auto argv: what an app's per-phone default sets."""
    out = [MOE_STREAM.typed, CACHE_MB.typed, "auto"]
    for flag in (CACHE_FLOOR_MB.typed, CACHE_CEIL_MB.typed):
        v = flag_value(argv, flag)
        if v is not None:
            out += [flag, v]
    return tuple(out)
