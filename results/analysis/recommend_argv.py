"""Recommended command lines: the chosen runs' own typed configuration, with a fixed budget or
as auto, put through the function that built the argv they ran with (store.engine_argv).

Every command line a recommendation prints is the one that was measured
(docs/decisions/recommendations.md): the chosen runs' `CellConfig` with only its budget changed (and
`--force-cache` exactly when
the engines need it), written by `settings_argv`, which leaves out the run's own files, prompt and
token count. The stored argv stays the record of what ran (settings_of reads it back; a test holds
the two equal on every run). Imported runs, which kept no argv, get a configuration rebuilt from
their table columns (rebuilt_config), written by the same function.
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.contract.flags import needs_force
from engine.interface.flags import (
    CACHE_CEIL_MB,
    CACHE_FLOOR_MB,
    CACHE_MB,
    MOE_STREAM,
    PROGRESS,
    RUN,
    SESSION,
)
from engine.interface.flags import with_role as _with_role
from engine.units import is_digits
from results.read.columns import C
from results.read.run_keys import text_of as _text
from store.cells import CellConfig
from store.engine_argv import settings_argv
from store.outcomes import OK

# argv elements that belong to one run, not to its settings (engine.interface.flags' RUN role):
# its files, prompt and length; and those without a value, a session cell's --session, how the
# harness drove the run (harness/run/turns.py), not a setting: a recommended command line runs one-shot;
# and a quality cell's --progress, the telemetry its answer is read from (store.engine_argv leaves it out too)
RUN_ONLY = frozenset(s for f in _with_role(RUN) if f.takes_value for s in f.spellings)
RUN_ONLY_ALONE = frozenset(s for f in (*_with_role(SESSION), PROGRESS) for s in f.spellings)


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
    """What the chosen runs ran with: their typed configuration (run.json's; for imported runs,
    which kept no argv, rebuilt from their table columns: rebuilt_config), its settings, "measured"
    or "rebuilt", and the runs that had them."""

    settings: tuple[str, ...]
    source: str
    run_ids: tuple[str, ...]
    config: CellConfig | None = None

    def fixed(self, cache_mb: int) -> tuple[str, ...]:
        """These settings with a fixed `--cache-mb` (and `--force-cache` exactly when the engines need it)."""
        if self.config is None:
            return ()
        return tuple(settings_argv(self.config.with_(moe_stream=True, no_mmap=False, cache_auto=False,
                                                     cache_mb=int(cache_mb), force_cache=needs_force(cache_mb))))

    def auto(self, ceil_mb: int, floor_mb: int | None = None) -> tuple[str, ...]:
        """These settings as `--cache-mb auto` with this ceiling, and the floor they were measured with."""
        if self.config is None:
            return ()
        floor = self.config.cache_floor_mb if self.config.cache_floor_mb is not None else floor_mb
        return tuple(settings_argv(self.config.with_(moe_stream=True, no_mmap=False, cache_auto=True,
                                                     cache_ceil_mb=int(ceil_mb), cache_floor_mb=floor,
                                                     force_cache=False)))

    @property
    def asked_mib(self) -> float | None:
        """The fixed budget these runs asked for (None: auto, no cache flag, or unreadable)."""
        c = self.config
        if c is None or c.cache_auto or not c.moe_stream or c.cache_mb is None:
            return None
        return float(c.cache_mb)


def _whole(value: Any) -> int | None:
    """A table cell as a whole number (None when empty or not a number)."""
    text = _text(value)
    try:
        return int(float(text)) if text else None
    except ValueError:
        return None


def rebuilt_config(row: Mapping[str, Any]) -> CellConfig:
    """The typed configuration of a run that kept no argv (imported upstream files), from its table
    columns; store.engine_argv writes its settings as it writes every measured run's."""
    stream = row.get(C.moe_stream) is not False
    auto = bool(row.get(C.cache_auto)) and stream
    budget = _whole(row.get("cache_mb_config")) if _text(row.get("cache_mb_config")) else _whole(row.get(C.cache_mb))
    extras = tuple(a for key in (C.engine_args, C.engine_flags) if row.get(key) for a in shlex.split(str(row[key])))
    io = _whole(row.get("io_threads"))
    threads = _text(row.get("threads"))
    return CellConfig.from_dict({
        "moe_stream": stream, "cache_auto": auto, "cache_mb": None if auto or not stream else budget,
        "cache_floor_mb": _whole(row.get("cache_floor_mb")) if auto else None,
        "cache_ceil_mb": _whole(row.get(C.cache_ceil_mb)) if auto else None,
        "force_cache": bool(stream and not auto and budget is not None and needs_force(budget)),
        "io_threads": io if stream and io else None,
        "threads": (int(float(threads)) if is_digits(threads.replace(".", "", 1)) else threads) or None,
        "n_expert_used": _whole(row.get(C.n_expert_used)), "dense_weights": str(row.get(C.dense_weights) or ""),
        "engine_args": list(extras)})


def config_of(row: Mapping[str, Any]) -> CellConfig | None:
    """The typed configuration a run ran with (the run table's `config`: run.json's)."""
    config = row.get(C.config)
    return config if isinstance(config, CellConfig) else None


def argv_of_runs(run_ids: Sequence[str], rows: Mapping[str, Mapping[str, Any]], prefer_ok: bool = True) -> Measured:
    """The settings most of these runs ran with, from their typed configuration (runs the harness
    made), or rebuilt from their columns (imported runs, which kept no argv)."""
    recs = [rows[r] for r in run_ids if r in rows]
    if prefer_ok and any(r.get(C.outcome) == OK for r in recs):
        recs = [r for r in recs if r.get(C.outcome) == OK]
    measured = [(r[C.run_id], config) for r in recs
                if r.get(C.argv) and (config := config_of(r)) is not None]
    if measured:
        settings = {rid: tuple(settings_argv(c)) for rid, c in measured}
        common, _ = Counter(settings.values()).most_common(1)[0]
        config = next(c for rid, c in measured if settings[rid] == common)
        return Measured(common, "measured", tuple(rid for rid, _ in measured if settings[rid] == common), config)
    if recs:
        config = rebuilt_config(recs[0])
        return Measured(tuple(settings_argv(config)), "rebuilt", tuple(r[C.run_id] for r in recs), config)
    return Measured((), "rebuilt", (), CellConfig.from_dict({}))    # no run: the budget flags alone


def cache_flags(argv: Sequence[str]) -> tuple[str, ...]:
    """The cache part of an auto argv: what an app's per-phone default sets."""
    out = [MOE_STREAM.typed, CACHE_MB.typed, "auto"]
    for flag in (CACHE_FLOOR_MB.typed, CACHE_CEIL_MB.typed):
        v = flag_value(argv, flag)
        if v is not None:
            out += [flag, v]
    return tuple(out)
