"""A cell's engine configuration, typed (docs/campaign-dir.md, "Cell").

The planner (harness.plan.grid) makes one per cell; it is stored as the cell's `config` object in
plan.json and in each attempt's run.json, and read back by the runner, the importer and the run
table (results.read.table). It lives in the store because both the harness and results read it.

On disk it stays the JSON object it always was, byte for byte: `to_dict` gives the keys the
config has, in the order they were written (a planned cell: the planner's order; an imported
one: sorted), so re-writing a plan read from an older directory changes nothing and every
cell id (a hash of that object) stays the same. A key the object lacks reads as its field's
empty value (None, "", (), {}); `keys` says which keys it has. Keys no planner writes (an
import's `source`, `arch`, `overlap` …) are kept as read in `extra`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


def _no_flags() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, eq=False)
class CellConfig:
    """One engine configuration: what a cell runs with (the engine's flags, and how the harness
    chose them)."""

    moe_stream: bool | None = None          # --moe-stream (False: mmap or resident, no expert cache)
    no_mmap: bool | None = None             # the `resident` baseline (--no-mmap)
    cache_mb: float | None = None           # --cache-mb; null in a plan for a knee cell (from its probe)
    cache_auto: bool | None = None          # --cache-mb auto
    cache_ceil_mb: float | None = None
    cache_floor_mb: float | None = None
    force_cache: bool | None = None         # --force-cache
    force_cache_auto: bool | None = None    # the harness added --force-cache (a budget in 1..1499)
    dense_weights: str = ""
    n_expert_used: int | None = None        # the top-k the cell applies
    io_threads: int | None = None
    threads: int | str | None = None        # -t: a number, or "auto" in a plan
    n_predict: int | None = None
    prompt: str = ""
    o_direct: bool | None = None            # asked for (run.json's `o_direct` says what happened)
    route_trace: bool | None = None
    budget_spec: str = ""                   # the budget axis value as written ("cycle*1.2", "knee*1" …)
    cycle_mb: float | None = None           # the model's token cycle at this top-k, as planned
    engine_args: tuple[str, ...] = ()       # run.engine_args (present only when the campaign has some)
    engine_flags: Mapping[str, Any] = field(default_factory=_no_flags)   # [axes.flags] setting (same)
    apps: str = ""                          # [axes] apps: the other apps open beside it ("cached:1GiB+…")
    turns: int | None = None                # run.turns of a session cell (present only when > 1) …
    idle_s: float | None = None             # … run.idle_s between its turns …
    gap_apps: str = ""                      # … and run.gap_apps, allocating in each gap (only when some)
    run_as: str = ""                        # [axes] run_as: "app-service"/"app-top" runs the engine as the app
                                            # (a virtual phone's `am run-as-app`); absent: the shell, over adb
    probe: bool | None = None               # a knee probe's route-trace run
    knee_mb: float | None = None            # a knee cell's knee, from its probe (run.json only)
    probe_cell_id: str | None = None        # … and that probe's cell
    threads_auto: bool | None = None        # `-t auto` resolved on the device (run.json only)
    planner: bool | None = None             # the engine's own planner picks the budget (--auto; axes.cache_mb "planner")
    progress: bool | None = None            # --progress: the answer's tokens on stdout (run.quality on; absent when off)
    quality_reference: bool | None = None   # a lossless cell the plan added to score its group's lossy ones against
    extra: Mapping[str, Any] = field(default_factory=_no_flags)   # keys no planner writes, as read
    keys: tuple[str, ...] = ()              # the keys this config has, in their written order

    def __post_init__(self) -> None:
        unknown = [k for k in self.keys if k not in _FIELDS and k not in self.extra]
        if unknown or any(k not in self.keys for k in self.extra) or any(k in _FIELDS for k in self.extra):
            raise ValueError(f"cell config keys {list(self.keys)} do not match its values")

    @classmethod
    def planned(cls, *, moe_stream: bool, no_mmap: bool, cache_mb: int | None, cache_auto: bool,
                cache_ceil_mb: int, cache_floor_mb: int, force_cache: bool, force_cache_auto: bool,
                dense_weights: str, n_expert_used: int, io_threads: int, threads: int | str, n_predict: int,
                prompt: str, o_direct: bool, route_trace: bool, budget_spec: str, cycle_mb: float,
                engine_args: Sequence[str] = (), engine_flags: Mapping[str, Any] | None = None) -> CellConfig:
        """A config as the planner makes it: every planned key, then engine_args and engine_flags
        only when there are some (so campaigns without them keep the cell ids they always had)."""
        keys = PLANNED_KEYS + (("engine_args",) if engine_args else ()) + (("engine_flags",) if engine_flags else ())
        return cls(moe_stream=moe_stream, no_mmap=no_mmap, cache_mb=cache_mb, cache_auto=cache_auto,
                   cache_ceil_mb=cache_ceil_mb, cache_floor_mb=cache_floor_mb, force_cache=force_cache,
                   force_cache_auto=force_cache_auto, dense_weights=dense_weights, n_expert_used=n_expert_used,
                   io_threads=io_threads, threads=threads, n_predict=n_predict, prompt=prompt, o_direct=o_direct,
                   route_trace=route_trace, budget_spec=budget_spec, cycle_mb=cycle_mb,
                   engine_args=tuple(engine_args), engine_flags=MappingProxyType(dict(engine_flags or {})),
                   keys=keys)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CellConfig:
        """A config object as stored (unknown keys kept in `extra`)."""
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            if key == "engine_args":
                known[key] = tuple(value or ())
            elif key == "engine_flags":
                known[key] = MappingProxyType(dict(value or {}))
            elif key in _FIELDS:
                known[key] = value
            else:
                extra[key] = value
        return cls(**known, extra=MappingProxyType(extra), keys=tuple(data))

    def to_dict(self) -> dict[str, Any]:
        """The config object as stored: its keys, in their order."""
        out: dict[str, Any] = {}
        for key in self.keys:
            if key in self.extra:
                out[key] = self.extra[key]
            elif key == "engine_args":
                out[key] = list(self.engine_args)
            elif key == "engine_flags":
                out[key] = dict(self.engine_flags)
            else:
                out[key] = getattr(self, key)
        return out

    def with_(self, **changes: Any) -> CellConfig:
        """This config with some keys set (new ones after the others, as a dict update puts them)."""
        return CellConfig.from_dict({**self.to_dict(), **changes})

    def __eq__(self, other: object) -> bool:
        # as the JSON objects compare: same keys, same values, in any order (and so, like the dict
        # it stands for, it is not hashable)
        return isinstance(other, CellConfig) and self.to_dict() == other.to_dict()


_FIELDS = frozenset(f.name for f in dataclasses.fields(CellConfig)) - {"extra", "keys"}
# what the planner writes for every cell, in its order (docs/campaign-dir.md, "Cell")
PLANNED_KEYS = ("moe_stream", "no_mmap", "cache_mb", "cache_auto", "cache_ceil_mb", "cache_floor_mb", "force_cache",
                "force_cache_auto", "dense_weights", "n_expert_used", "io_threads", "threads", "n_predict", "prompt",
                "o_direct", "route_trace", "budget_spec", "cycle_mb")
