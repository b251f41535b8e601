"""A cell's engine command line from its typed configuration: the one function that writes it.

The harness builds every measured argv with `engine_argv` (harness.plan.grid); a recommendation builds
the argv it ships with `settings_argv` from the chosen runs' own configuration, changed only in its
budget (results.analysis.recommend_argv), so a recommended command line is the measured one by construction,
never one edited as strings. The flag names come from engine.interface.flags.

`settings_argv` is the part that is a setting: the argv without the engine, its files, prompt,
length and the session switch (what `settings_of` in results.analysis.recommend_argv reads back from a
stored argv; tests hold the two to each other on every run of a campaign).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.contract.flags import flag_argv
from engine.interface.flags import (
    AUTO,
    CACHE_CEIL_MB,
    CACHE_FLOOR_MB,
    CACHE_MB,
    CSV,
    DENSE_WEIGHTS,
    FORCE_CACHE,
    IO_THREADS,
    MODEL,
    MOE_STREAM,
    N_EXPERT_USED,
    N_PREDICT,
    NO_MMAP,
    NO_ODIRECT,
    PLAN_EXPLAIN,
    PPL,
    PROGRESS,
    PROMPT,
    ROUTE_TRACE,
    SESSION_MODE,
    THREADS,
)
from store.cells import CellConfig

THREADS_AUTO = "auto"     # a plan's `-t` before the device says how many cores it has


def _num(value: float | int | None) -> str:
    """A number as the engine reads it: whole numbers without a decimal point (JSON may hold 230.0)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def settings_argv(c: CellConfig) -> list[str]:
    """The settings of a cell's command line, in the order the harness writes them. A plan's
    unresolved values show as placeholders (`<auto>` threads, `<knee*1>` for a knee budget). A
    setting the config does not know (an imported run's, results' rebuilt_config) is left out."""
    argv: list[str] = []
    if c.threads is not None:
        argv += [THREADS.typed, f"<{THREADS_AUTO}>" if c.threads == THREADS_AUTO else str(c.threads)]
    if c.n_expert_used is not None:
        argv += [N_EXPERT_USED.typed, str(c.n_expert_used)]
    if c.planner:
        # the engine's planner sizes the cache, the lanes and whether to stream at all; what the
        # harness still writes (threads, top-k, dense mode, O_DIRECT) it pins, as a caller's flags do
        argv += [AUTO.typed, PLAN_EXPLAIN.typed]
    elif c.moe_stream:
        budget = "auto" if c.cache_auto else f"<{c.budget_spec}>" if c.cache_mb is None else _num(c.cache_mb)
        argv += [MOE_STREAM.typed, CACHE_MB.typed, budget]
        if c.cache_auto:
            for bound, value in ((CACHE_FLOOR_MB, c.cache_floor_mb), (CACHE_CEIL_MB, c.cache_ceil_mb)):
                if value is not None:
                    argv += [bound.typed, _num(value)]
        if c.force_cache:
            argv.append(FORCE_CACHE.typed)
        if c.io_threads is not None:
            argv += [IO_THREADS.typed, str(c.io_threads)]
    elif c.no_mmap:
        argv.append(NO_MMAP.typed)
    if c.dense_weights:
        argv += [DENSE_WEIGHTS.typed, c.dense_weights]
    if c.o_direct is False:
        argv.append(NO_ODIRECT.typed)
    return argv + list(c.engine_args) + flag_argv(c.engine_flags)


def engine_argv(engine: str, model_path: str, config: CellConfig, csv_path: str,
                route_path: str | None) -> list[str]:
    """The engine command line for one config (bmoe-cli's flags; bmoe-py takes the same)."""
    c = config
    argv = [engine, MODEL.typed, model_path, PROMPT.typed, c.prompt, N_PREDICT.typed, str(c.n_predict)]
    argv += settings_argv(c)
    if c.turns is not None and c.turns > 1:
        argv.append(SESSION_MODE.typed)          # its requests come on stdin (harness.run.turns)
    argv += [CSV.typed, csv_path]
    if route_path and c.route_trace:
        argv += [ROUTE_TRACE.typed, route_path]
    if c.progress:
        argv.append(PROGRESS.typed)              # the answer's tokens on stdout (run.quality), not a setting
    return argv


# what a scoring run leaves out of its cell's command line: the generation's prompt, length and
# outputs, the token telemetry and the session switch (a value follows the first four)
_NOT_SCORED = {s: f.takes_value for f in (PROMPT, N_PREDICT, CSV, ROUTE_TRACE, PROGRESS, SESSION_MODE)
               for s in f.spellings}


def scoring_argv(argv: Sequence[str], text_path: str) -> list[str]:
    """A cell's command line made its quality scoring run (bmoe-cli 0.24's `--ppl`): the same engine,
    model and settings, levers included, without the generation's prompt, length, outputs and
    telemetry, scoring the text at `text_path` (docs/decisions/quality-runs.md)."""
    out: list[str] = list(argv[:1])
    i = 1
    while i < len(argv):
        word = argv[i]
        if word in _NOT_SCORED:
            i += 2 if _NOT_SCORED[word] else 1
            continue
        out.append(word)
        i += 1
    return out + [PPL.typed, text_path]
