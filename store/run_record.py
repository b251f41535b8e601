"""One attempt's record, run.json (format `bmoe-fleet.run`; docs/campaign-dir.md, "run.json"), typed.

The worker (harness.run.worker) and the importers (harness.importer, harness.community_import)
build one, `CampaignDir.commit_attempt` writes it, and status and the results side read it
(`CampaignDir.read_run`, `results.read.rundir.RunFolder.record`). It is checked when built: a key of the
wrong type, or an outcome that is not one of store.outcomes' names, is one line naming the file
and the key (StoreError).

As with the cell config (store.cells.CellConfig), the JSON stays what it always was, byte for
byte: `to_dict` gives the keys the record has, in the order they were written, keys no writer
of today knows are kept as read in `extra`, and a key an older run.json lacks (reclaim, cpu,
quality, attempted …) reads as its field's empty value (None, "", (), an empty mapping). Nested
objects that readers only pass on (the gate, the states, the engine, the CPU share …) stay
read-only mappings and tuples, as read; the record itself is never changed (`with_` gives a new one).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from store import outcomes, versioned
from store.cells import CellConfig
from store.errors import StoreError


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


# JSON's scalars, taken as they are without a call each (run.json holds some 200 values a run, and
# every command that reads a campaign freezes them all: benchmarks/bench_results_db.py)
SCALARS = frozenset({str, int, float, bool, type(None)})


def frozen(value: Any) -> Any:
    """A JSON value made read-only: objects as read-only mappings, arrays as tuples (all the way down)."""
    if type(value) in SCALARS:
        return value
    if isinstance(value, Mapping):
        return MappingProxyType({k: v if type(v) in SCALARS else frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(v if type(v) in SCALARS else frozen(v) for v in value)
    return value


def thawed(value: Any) -> Any:
    """A frozen value back as the JSON value it was read from (dicts and lists)."""
    if type(value) in SCALARS:
        return value
    if isinstance(value, CellConfig):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {k: v if type(v) in SCALARS else thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [v if type(v) in SCALARS else thawed(v) for v in value]
    return value


@dataclass(frozen=True, eq=False)
class RunRecord:
    """One attempt of one cell as run.json holds it (docs/campaign-dir.md, "run.json")."""

    cell_id: str = ""
    attempt: int = 0
    device: str = ""                        # the device spec the cell was planned for
    device_id: str = ""
    model: str = ""
    model_id: str = ""
    engine: Mapping[str, Any] = field(default_factory=_empty)   # kind, version, sha256 … (harness.run.staging)
    config: CellConfig = field(default_factory=CellConfig)      # what ran ("-t auto" resolved)
    argv: tuple[str, ...] = ()              # the command line that ran (an import: none)
    repeat: int = 0
    pass_no: int = 0                        # run.json's `pass`
    order: int = 0
    outcome: str = ""                       # one of store.outcomes.OUTCOMES
    evidence: tuple[str, ...] = ()
    exit_status: int | None = None
    timed_out: bool = False
    wall_s: float | None = None
    timeout_s: float | None = None
    gate: Mapping[str, Any] | None = None
    entry_state: Mapping[str, Any] | None = None
    exit_state: Mapping[str, Any] | None = None
    pressure: Mapping[str, Any] = field(default_factory=_empty)
    lmk_events: tuple[Mapping[str, Any], ...] = ()
    o_direct: int | bool | None = None      # whether O_DIRECT was in effect (1/0 or true/false; null unknown)
    summary: Mapping[str, Any] | None = None
    result: Mapping[str, Any] | None = None
    pushed: tuple[Any, ...] = ()
    started_at: float | None = None
    ended_at: float | None = None
    host: str = ""
    attempted: bool | None = None           # false: recorded without running (store.ledger.was_attempted)
    probe: bool | None = None
    cpu: Mapping[str, Any] | None = None    # the cores and the engines sharing them (harness.run.cpushare)
    oom_score_adj: int | None = None
    pid: int | None = None
    reclaim: Mapping[str, Any] | None = None
    apps: tuple[Mapping[str, Any], ...] = ()            # the other apps open beside it
    turns: tuple[Mapping[str, Any], ...] = ()           # a session cell's turns (harness.run.turns)
    others_hard_killed: tuple[str, ...] = ()
    collateral: tuple[Mapping[str, Any], ...] = ()      # over adb: what lmkd took instead (harness.run.app_verdict)
    lmkd_setting: Mapping[str, Any] | None = None
    app_verdicts: tuple[Mapping[str, Any], ...] = ()
    app_verdicts_problem: str = ""
    quality: Mapping[str, Any] | None = None            # the scoring run (harness.run.quality)
    imported_from: Mapping[str, Any] | None = None      # an import's source files
    provenance: Mapping[str, Any] | None = None         # a community report's (harness.community_import)
    notes: tuple[str, ...] = ()                         # an import's values stored as missing
    extra: Mapping[str, Any] = field(default_factory=_empty)   # keys no writer of today knows, as read
    keys: tuple[str, ...] = ()              # the keys this record has, in their written order
    where: str = field(default="run.json", compare=False)     # the file, for errors

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> StoreError:
            return StoreError(f"{self.where}: run.json key {key!r} {why}")

        for key in self.keys:
            if key in self.extra or key in _STAMP:
                continue
            name = _ATTR.get(key)
            if name is None:
                raise bad(key, "is neither a known key nor kept in extra")
            value = getattr(self, name)
            if not _CHECKS[name](value):
                raise bad(key, f"is {type(value).__name__} {_shown(value)}, not {_KINDS[name]}")
        if not self.cell_id:
            raise bad("cell_id", "is missing or empty")
        if self.attempt < 1:
            raise bad("attempt", "is missing or not a positive attempt number")
        if self.outcome not in outcomes.OUTCOMES:
            raise bad("outcome", f"is {self.outcome!r}, not one of {', '.join(outcomes.OUTCOMES)}")
        if any(k in _ATTR for k in self.extra) or any(k not in self.keys for k in self.extra):
            raise bad(next(iter(self.extra)), "does not match the record's keys")

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], where: str | os.PathLike) -> RunRecord:
        """A run.json document through the versioned reader (store.versioned.upgrade: a newer format
        refused, an older one upgraded), then typed and checked; `where` names it in errors."""
        data = versioned.upgrade(dict(doc), versioned.RUN.name, where)
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            name = _ATTR.get(key)
            if key in _STAMP:
                continue
            if name is None:
                extra[key] = value
            elif name == "config":
                if not isinstance(value, Mapping):
                    raise StoreError(f"{where}: run.json key 'config' is {type(value).__name__}, not an object")
                try:
                    known[name] = CellConfig.from_dict(value)
                except (TypeError, ValueError) as e:
                    raise StoreError(f"{where}: run.json key 'config': {e}") from None
            else:
                known[name] = frozen(value)
        return cls(**known, extra=MappingProxyType(extra), keys=tuple(data), where=str(where))

    @classmethod
    def read(cls, path: str | os.PathLike) -> RunRecord:
        """One run.json file."""
        return cls.from_dict(versioned.read_json(path, versioned.RUN.name), path)

    @classmethod
    def from_bytes(cls, data: bytes, where: str | os.PathLike) -> RunRecord:
        """run.json's bytes (as the results database keeps them); `where`: the file they are of."""
        return cls.from_dict(versioned.parse_json(data, versioned.RUN.name, where), where)

    def to_dict(self) -> dict[str, Any]:
        """run.json as written: its keys, in their order (the format and version as read, upgraded)."""
        out: dict[str, Any] = {}
        for key in self.keys:
            if key in _STAMP:
                out[key] = versioned.RUN.stamp()[key]
            elif key in self.extra:
                out[key] = self.extra[key]
            else:
                out[key] = thawed(getattr(self, _ATTR[key]))
        return out

    def has(self, key: str) -> bool:
        """Whether run.json holds this key (an older record may lack it)."""
        return key in self.keys

    def with_(self, **changes: Any) -> RunRecord:
        """This record with some keys (run.json's names) set; new ones after the others."""
        return RunRecord.from_dict({**self.to_dict(), **changes}, self.where)

    def __eq__(self, other: object) -> bool:
        # as the JSON objects compare (and so, like the dict it stands for, it is not hashable)
        return isinstance(other, RunRecord) and self.to_dict() == other.to_dict()


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_STAMP = ("format", "version")
_ATTR = {f.name: f.name for f in dataclasses.fields(RunRecord) if f.name not in ("extra", "keys", "where", "pass_no")}
_ATTR["pass"] = "pass_no"


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _map(v: Any) -> bool:
    return isinstance(v, Mapping)


def _maps(v: Any) -> bool:
    return isinstance(v, tuple) and all(isinstance(x, Mapping) for x in v)


def _strs(v: Any) -> bool:
    return isinstance(v, tuple) and all(isinstance(x, str) for x in v)


def _optional(check: Any) -> Any:
    return lambda v: v is None or check(v)


_KIND_CHECKS: dict[str, Any] = {
    "a string": lambda v: isinstance(v, str), "an integer": _int, "an integer or null": _optional(_int),
    "a number or null": _optional(_num), "a boolean": lambda v: isinstance(v, bool),
    "a boolean or null": _optional(lambda v: isinstance(v, bool)), "an object": _map,
    "an object or null": _optional(_map), "an array of objects": _maps, "an array of strings": _strs,
    "an array": lambda v: isinstance(v, tuple), "a cell config": lambda v: isinstance(v, CellConfig),
    "0, 1, a boolean or null": _optional(lambda v: isinstance(v, (bool, int))),
}
# each field's JSON type, as the worker and the importers write it
_KINDS: dict[str, str] = {
    "cell_id": "a string", "attempt": "an integer", "device": "a string", "device_id": "a string",
    "model": "a string", "model_id": "a string", "engine": "an object", "config": "a cell config",
    "argv": "an array of strings", "repeat": "an integer", "pass_no": "an integer", "order": "an integer",
    "outcome": "a string", "evidence": "an array of strings", "exit_status": "an integer or null",
    "timed_out": "a boolean", "wall_s": "a number or null", "timeout_s": "a number or null",
    "gate": "an object or null", "entry_state": "an object or null", "exit_state": "an object or null",
    "pressure": "an object", "lmk_events": "an array of objects", "o_direct": "0, 1, a boolean or null",
    "summary": "an object or null", "result": "an object or null", "pushed": "an array",
    "started_at": "a number or null", "ended_at": "a number or null", "host": "a string",
    "attempted": "a boolean or null", "probe": "a boolean or null", "cpu": "an object or null",
    "oom_score_adj": "an integer or null", "pid": "an integer or null", "reclaim": "an object or null",
    "apps": "an array of objects", "turns": "an array of objects", "others_hard_killed": "an array of strings",
    "collateral": "an array of objects", "lmkd_setting": "an object or null", "app_verdicts": "an array of objects",
    "app_verdicts_problem": "a string", "quality": "an object or null", "imported_from": "an object or null",
    "provenance": "an object or null", "notes": "an array of strings",
}
_CHECKS = {name: _KIND_CHECKS[kind] for name, kind in _KINDS.items()}
assert set(_KINDS) == set(_ATTR.values()), "every field of RunRecord has its JSON type"
