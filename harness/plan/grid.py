"""The matrix of cells a campaign makes, in the order each device runs them.

A cell is one engine run: (device, model, engine, config, repeat, pass). Its `cell_id` hashes
exactly those, so planning the same campaign again gives the same ids and a re-run finds what is
done. Run order is a variable (docs/method.md rule 5): on each device every config runs its repeat r
before any config runs repeat r+1, and an optional second pass runs the whole first pass again in
reverse. Budgets written relative to the model's token cycle (`cycle*1.2`) are priced from the
GGUF header at the top-k the cell applies; a budget in the engine's pathological band (1..1499
MiB) gets `--force-cache`, and the cell records that the harness added it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.contract.flags import flags_label, needs_force
from engine.errors import ModelError
from engine.gguf.model import ModelShape, cycle_price_mib, load_model_shape
from engine.interface.flags import FLAGS
from harness.campaign.budgets import PLANNER, budget_from_cycle, cycle_factor, is_knee, parse_cache_value
from harness.campaign.defaults import QUALITY_AUTO, QUALITY_ON
from harness.campaign.model import (
    LOCAL,
    RUN_AS_SHELL,
    THREADS_AUTO,
    THREADS_AUTO_MAX,
    Campaign,
    CampaignError,
    ModelSpec,
    check_cell_bound,
    device_work_dir,
    remote_model_path,
)
from results.read.run_keys import budget_asked, budget_label
from store import versioned
from store.campaign_dir import CampaignDir
from store.cells import CellConfig
from store.engine_argv import engine_argv
from store.quality import args_without_levers, flags_without_levers, lossy_levers, quality_group

CELL_KEYS = ("cell_id", "device", "model", "engine", "config", "repeat", "pass", "order", "argv")


@dataclass(frozen=True)
class Cell:
    """One engine run to make (docs/campaign-dir.md, "Cell")."""

    cell_id: str
    device: str
    model: str
    engine: str
    config: CellConfig
    repeat: int
    pass_no: int
    order: int                       # position in its device's run sequence
    argv: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The cell as plan.json holds it."""
        return {"cell_id": self.cell_id, "device": self.device, "model": self.model, "engine": self.engine,
                "config": self.config.to_dict(), "repeat": self.repeat, "pass": self.pass_no, "order": self.order,
                "argv": list(self.argv)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Cell:
        """A cell from plan.json."""
        return cls(d["cell_id"], d["device"], d["model"], d["engine"], CellConfig.from_dict(d["config"]),
                   int(d["repeat"]), int(d["pass"]), int(d["order"]), tuple(d["argv"]))

    def label(self) -> str:
        """A short human description of the config (progress lines, dry-run)."""
        c = self.config
        budget = budget_label(budget_asked(vars(c)), ceil_mb=c.cache_ceil_mb, spec=c.budget_spec,
                              forced=bool(c.force_cache_auto), probe_tokens=c.n_predict if c.probe else None)
        flags = flags_label(c.engine_flags)
        return (f"{self.model} {budget} dense={c.dense_weights} k={c.n_expert_used} t={c.threads}"
                + (f" io={c.io_threads}" if c.moe_stream else "") + (f" [{flags}]" if flags else "")
                + (f" apps={c.apps}" if c.apps else "") + (f" as={c.run_as}" if c.run_as else "")
                + (f" turns={c.turns} idle={c.idle_s:g}s" if c.turns and c.idle_s is not None else "")
                + (f" gap-apps={c.gap_apps}" if c.gap_apps else "")
                + (" quality-reference" if c.quality_reference else "")
                + f" r{self.repeat} p{self.pass_no}")


@dataclass(frozen=True)
class Plan:
    """A campaign's cells in run order, and the knee probes they need."""

    campaign: str
    cells: tuple[Cell, ...]
    models: Mapping[str, ModelShape] = field(default_factory=dict, compare=False)
    top_ks: Mapping[str, tuple[int, ...]] = field(default_factory=dict, compare=False)
    # one route-traced probe per (device, model, top-k) that has "knee" budgets (harness.plan.probe)
    probes: tuple[Cell, ...] = ()
    quality: bool = field(default=False, compare=False)     # run.quality resolved (with_quality)

    def probe_for(self, cell: Cell) -> Cell:
        """The route-trace probe behind a knee cell."""
        return next(p for p in self.probes if (p.device, p.model, p.config.n_expert_used) ==
                    (cell.device, cell.model, cell.config.n_expert_used))

    def for_device(self, device: str) -> list[Cell]:
        """One device's cells, in their run order."""
        return sorted((c for c in self.cells if c.device == device), key=lambda c: c.order)

    @property
    def devices(self) -> list[str]:
        """The devices the cells name, in plan order."""
        return list(dict.fromkeys(c.device for c in self.cells))

    def cell(self, cell_id: str) -> Cell:
        """A cell by id."""
        return next(c for c in self.cells if c.cell_id == cell_id)

    def to_dict(self) -> dict[str, Any]:
        """plan.json."""
        return {**versioned.PLAN.stamp(), "campaign": self.campaign,
                "cells": [c.to_dict() for c in self.cells], "probes": [c.to_dict() for c in self.probes]}

    def text(self) -> str:
        """The dry-run listing: per device, each cell in run order with its exact command line."""
        lines = [f"campaign {self.campaign}: {len(self.cells)} cells on {len(self.devices)} device(s)"]
        if any(c.config.threads == THREADS_AUTO for c in self.cells + self.probes):
            lines.append(f"-t <{THREADS_AUTO}>: each device's online cores, at most {THREADS_AUTO_MAX}, read on the "
                         "device right before each run")
        if self.quality:
            added = sum(1 for c in self.cells if c.config.quality_reference)
            lines.append(f"quality: on: every cell writes its answer (--progress), {added} lossless reference "
                         "cell(s) added; with bmoe-cli 0.24 or later a --ppl scoring run follows each cell")
        for name, shape in self.models.items():
            prices = ", ".join(f"top-k {k}: cycle {shape.cycle_mib(k):.1f} MiB" for k in self.top_ks.get(name, ()))
            lines.append(f"model {name} ({shape.paths[0]}): {shape.arch}, {shape.n_layer} layers x "
                         f"{shape.n_expert} experts; {prices}")
        for device in self.devices:
            cells = self.for_device(device)
            lines.append("")
            lines.append(f"{device}: {len(cells)} cells")
            for p in (p for p in self.probes if p.device == device):
                lines.append(f"  probe {p.cell_id}  {p.label()} (before its first knee cell)")
                lines.append(f"       {shlex.join(p.argv)}")
            for c in cells:
                lines.append(f"  #{c.order:<3} {c.cell_id}  {c.label()}")
                lines.append(f"       {shlex.join(c.argv)}")
        return "\n".join(lines)


def cell_id_of(device: str, model: str, engine: str, config: CellConfig, repeat: int, pass_no: int) -> str:
    """A cell's stable id: a hash of what it runs (so a re-plan finds what is done)."""
    key = json.dumps({"device": device, "model": model, "engine": engine, "config": config.to_dict(),
                      "repeat": repeat, "pass": pass_no}, sort_keys=True, separators=(",", ":"))
    return "c-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def load_shapes(campaign: Campaign) -> dict[str, ModelShape]:
    """Each model's shape from its GGUF header (a model that is no MoE GGUF names its key)."""
    shapes = {}
    for m in campaign.models:
        try:
            shapes[m.name] = load_model_shape(m.path)
        except ModelError as e:
            raise CampaignError(f"{_src(campaign)}models.{m.name}: {e}") from None
    return shapes


def _src(campaign: Campaign) -> str:
    return f"{campaign.source}: " if campaign.source else ""


def configs_for(campaign: Campaign, model: ModelSpec, shape: ModelShape) -> list[CellConfig]:
    """Every distinct engine configuration the axes give for one model, in axis order."""
    a = campaign.axes
    out: dict[str, CellConfig] = {}
    for k_axis in a.n_expert_used:
        k = k_axis or shape.top_k or 0
        if k < 1:
            raise CampaignError(f"{_src(campaign)}axes.n_expert_used: model {model.name} has no top-k of its "
                                "own; give an explicit value")
        if k > shape.n_expert:
            raise CampaignError(f"{_src(campaign)}axes.n_expert_used: {k} is above model {model.name}'s "
                                f"n_expert of {shape.n_expert}")
    for spec in a.cache_mb:
        ceilings = a.cache_ceil_mb if spec == "auto" else (0,)
        for ceil in ceilings:
            for dense in a.dense_weights:
                for k_axis in a.n_expert_used:
                    k = k_axis or shape.top_k or 0      # >= 1: checked above
                    cycle_mb = cycle_price_mib(shape.cycle_bytes(k))
                    for io in a.io_threads:
                        for threads in a.threads or (campaign.run.threads,):
                            for flags in _flag_settings(campaign):
                                for load in a.apps or ("",):
                                    for how in a.run_as or (RUN_AS_SHELL,):
                                        c = _config(spec, ceil, dense, k, io, cycle_mb, campaign, threads, flags)
                                        c = c.with_(apps=load) if load else c    # no apps: the cell id it always had
                                        # from the shell: the cell id it always had too
                                        c = c.with_(run_as=how) if how != RUN_AS_SHELL else c
                                        c = _with_turns(c, campaign)
                                        out.setdefault(json.dumps(c.to_dict(), sort_keys=True), c)
    return list(out.values())


def _with_turns(config: CellConfig, campaign: Campaign) -> CellConfig:
    """A session cell's turns, idle gap and gap apps (harness.run.turns); a one-shot cell (turns 1) keeps
    the config, so the cell id, it always had."""
    r = campaign.run
    if r.turns <= 1:
        return config
    return config.with_(turns=r.turns, idle_s=r.idle_s, **({"gap_apps": r.gap_apps} if r.gap_apps else {}))


def _flag_settings(campaign: Campaign) -> list[dict[str, Any]]:
    """Every combination of the [axes.flags] values, in file order (one empty setting without any)."""
    names = [name for name, _ in campaign.axes.flags]
    return [dict(zip(names, values)) for values in itertools.product(*(v for _, v in campaign.axes.flags))]


_NEEDS_CACHE = frozenset(s for f in FLAGS if f.needs_cache for s in f.spellings)


def without_cache(flags: Mapping[str, Any]) -> dict[str, Any]:
    """A flag setting for a cell without the LRU cache (cache 0, mmap, resident): the flags that need
    the cache (engine.interface.flags `needs_cache`: the drop, the substitution) left out, as the
    engine refuses them there ("requires the LRU cache") and upstream's app sends them only with a
    cache on. False keeps the key, so the cell is the one the axis' own `false` value plans."""
    return {name: (False if name in _NEEDS_CACHE else value) for name, value in flags.items()}


def _config(spec: int | str, ceil: int, dense: str, k: int, io: int, cycle_mb: float,
            campaign: Campaign, threads: int | str, flags: Mapping[str, Any]) -> CellConfig:
    planner = spec == PLANNER
    stream = spec not in ("mmap", "resident") and not planner
    auto = spec == "auto"
    cache_mb: int | None
    if isinstance(spec, str) and spec.startswith("cycle"):
        cache_mb = budget_from_cycle(cycle_mb, cycle_factor(spec))
    elif is_knee(spec):
        cache_mb = None                      # resolved on the device from its probe (harness.plan.probe)
    elif isinstance(spec, int):
        cache_mb = spec
    else:
        cache_mb = 0
    force = stream and cache_mb is not None and needs_force(cache_mb)
    if not planner and not auto and (not stream or cache_mb == 0):
        flags = without_cache(flags)
    r = campaign.run
    config = CellConfig.planned(
        moe_stream=stream, no_mmap=spec == "resident", cache_mb=cache_mb, cache_auto=auto,
        cache_ceil_mb=ceil if auto else 0, cache_floor_mb=campaign.axes.cache_floor_mb,
        force_cache=force, force_cache_auto=force, dense_weights=dense, n_expert_used=k,
        io_threads=io if stream else 0, threads=threads, n_predict=r.n_predict, prompt=r.prompt,
        o_direct=r.o_direct, route_trace=r.route_trace and stream, budget_spec=str(spec), cycle_mb=cycle_mb,
        engine_args=r.engine_args, engine_flags=flags)
    return config.with_(planner=True) if planner else config


def probe_config(campaign: Campaign, k: int, cycle_mb: float) -> CellConfig:
    """The probe behind "knee" budgets: a short streamed run with cache 0 (the least memory any
    streamed run needs) that writes a route trace. Routing does not depend on the cache, so its
    trace replays to every budget."""
    a = campaign.axes
    # no flag-axis values: flags such as --prefetch need a cache the probe does not have; the
    # pass-through engine_args (a chat template …) shape the tokens, so the probe keeps them
    config = _config(0, 0, a.dense_weights[0], k, a.io_threads[0], cycle_mb, campaign,
                     (a.threads or (campaign.run.threads,))[0], {})
    return config.with_(n_predict=campaign.run.probe_n_predict, route_trace=True, budget_spec="probe", probe=True)


def resolve_knee(campaign: Campaign, cell: Cell, knee_mib: int, probe_cell_id: str) -> Cell:
    """A "knee*F" cell with its budget: F x the knee (rounded to its side, as cycle*F is), and
    --force-cache if that lands in the engine's pathological band; it records the probe."""
    cache_mb = budget_from_cycle(knee_mib, cycle_factor(cell.config.budget_spec))
    config = cell.config.with_(cache_mb=cache_mb, knee_mb=knee_mib, force_cache=needs_force(cache_mb),
                               force_cache_auto=needs_force(cache_mb), probe_cell_id=probe_cell_id)
    return _with_config(campaign, cell, config)


def _with_config(campaign: Campaign, cell: Cell, config: CellConfig) -> Cell:
    """The cell with a config resolved on its device (same id), and the argv that config means."""
    model = next(m for m in campaign.models if m.name == cell.model)
    return replace(cell, config=config, argv=cell_argv(campaign, cell.device, model, config, cell.cell_id))


def auto_threads(cores: int | None, most: int = THREADS_AUTO_MAX) -> int:
    """What `-t auto` means on a device with this many usable cores: all of them, at most `most`
    (THREADS_AUTO_MAX, bmoe-cli's own default, on a phone); that default when the device did not say."""
    return min(cores, most) if cores else THREADS_AUTO_MAX


def resolve_threads(campaign: Campaign, cell: Cell, cores: int | None) -> Cell:
    """A cell whose threads are "auto", with the device's count (recorded as `threads_auto`): at
    most run.host_threads_max on this host, THREADS_AUTO_MAX on a phone."""
    if cell.config.threads != THREADS_AUTO:
        return cell
    most = campaign.run.host_threads_max if cell.device == LOCAL else THREADS_AUTO_MAX
    return _with_config(campaign, cell, cell.config.with_(threads=auto_threads(cores, most), threads_auto=True))


def cell_argv(campaign: Campaign, device: str, model: ModelSpec, config: CellConfig,
              cell_id: str) -> tuple[str, ...]:
    """The engine command line of one cell on one device, writing its outputs under the cell's id."""
    csv_path, route_path = out_paths(device, cell_id)
    return tuple(engine_argv(engine_path(campaign, device), remote_model_path(device, model), config, csv_path,
                             route_path))


def out_paths(device: str, cell_id: str) -> tuple[str, str]:
    """Where the engine writes its CSV and route trace on the device (pulled after the run)."""
    base = f"{device_work_dir(device)}/out/{cell_id}"
    return base + ".csv", base + ".route.csv"


def engine_path(campaign: Campaign, device: str) -> str:
    """Where a campaign's engine is staged on a device."""
    return f"{device_work_dir(device)}/{campaign.engine.staged_name}"


def make_plan(campaign: Campaign, shapes: Mapping[str, ModelShape] | None = None) -> Plan:
    """The cells of a campaign. Reads model headers only; writes nothing. A matrix over MAX_CELLS
    is refused before anything is expanded (a Campaign made in code skips parse_campaign's check)."""
    check_cell_bound(campaign)
    shapes = dict(shapes) if shapes is not None else load_shapes(campaign)
    per_model = {m.name: configs_for(campaign, m, shapes[m.name]) for m in campaign.models}
    quality = quality_on(campaign, {name: (cs, shapes[name].top_k) for name, cs in per_model.items()})
    if quality:
        per_model = {m.name: with_quality(campaign, per_model[m.name], shapes[m.name]) for m in campaign.models}
    top_ks = {name: tuple(sorted({_top_k(c) for c in cs})) for name, cs in per_model.items()}
    cells: list[Cell] = []
    for device in campaign.devices:
        configs = [(m, c) for m in campaign.models for c in per_model[m.name]]
        first = [(m, c, r) for r in range(campaign.run.repeats) for m, c in configs]
        passes = [(0, first)] + ([(1, list(reversed(first)))] if campaign.run.reverse_pass else [])
        order = 0
        for pass_no, sequence in passes:
            for model, config, repeat in sequence:
                cells.append(new_cell(campaign, device, model.name, config, repeat, order, pass_no))
                order += 1
    return Plan(campaign.name, tuple(cells), shapes, top_ks, probes_for(campaign, cells), quality)


def new_cell(campaign: Campaign, device: str, model: str, config: CellConfig, repeat: int, order: int,
             pass_no: int = 0) -> Cell:
    """One cell of a campaign: its id (cell_id_of) and its command line on its device."""
    cid = cell_id_of(device, model, campaign.engine.kind, config, repeat, pass_no)
    return Cell(cid, device, model, campaign.engine.kind, config, repeat, pass_no, order,
                cell_argv(campaign, device, campaign.model(model), config, cid))


def budget_config(campaign: Campaign, base: CellConfig, budget_mib: int) -> CellConfig:
    """A streamed configuration like `base` (its dense mode, top-k, lanes, threads, flags, apps, how
    it is started, turns and quality runs) at a whole-MiB budget, as the grid would plan that budget
    written as a number."""
    config = _config(budget_mib, 0, base.dense_weights, _top_k(base), int(base.io_threads or 0), _cycle_mb(base),
                     campaign, base.threads if base.threads is not None else campaign.run.threads,
                     dict(base.engine_flags))
    return _like(campaign, config, base)


def _like(campaign: Campaign, config: CellConfig, base: CellConfig) -> CellConfig:
    """A config the planner made from the axes, with the keys `base` has after them, in the order
    configs_for adds them: its other apps, how it is started, its turns and its quality runs."""
    config = config.with_(apps=base.apps) if base.apps else config
    config = _with_turns(config.with_(run_as=base.run_as) if base.run_as else config, campaign)
    return config.with_(progress=True) if base.progress else config


def quality_on(campaign: Campaign, per_model: Mapping[str, tuple[Sequence[CellConfig], int | None]]) -> bool:
    """run.quality resolved: "on", "off", or with "auto" whether a config of any model (with that
    model's own top-k) sets a lossy lever (store.quality)."""
    if campaign.run.quality != QUALITY_AUTO:
        return campaign.run.quality == QUALITY_ON
    return any(lossy_levers(c, own) for configs, own in per_model.values() for c in configs)


def with_quality(campaign: Campaign, configs: Sequence[CellConfig], shape: ModelShape) -> list[CellConfig]:
    """One model's configs with quality runs: each writes its answer (`progress`), and every group
    (store.quality.quality_group) of lossy configs without a lossless one gets a reference: the
    config at the group's smallest budget with the levers taken out, marked `quality_reference`
    (docs/decisions/quality-runs.md). Configs of a campaign with quality off never come here, so
    they keep the keys, and the cell ids, they always had."""
    marked = [c.with_(progress=True) for c in configs]
    groups: dict[str, list[CellConfig]] = {}
    for c in marked:
        groups.setdefault(quality_group(c), []).append(c)
    references = []
    for members in groups.values():
        if all(lossy_levers(c, shape.top_k) for c in members):
            references.append(_reference(campaign, min(members, key=_budget_rank), shape))
    return marked + references


def _budget_rank(config: CellConfig) -> tuple[int, float]:
    """Smaller is less memory: a fixed budget by its MiB, then auto, a knee (known once its probe
    ran), the planner's pick and last the no-streaming baselines (the whole model mapped)."""
    if config.planner:
        return (3, 0.0)
    if not config.moe_stream:
        return (4, 0.0)
    if config.cache_auto:
        return (1, 0.0)
    return (2, 0.0) if config.cache_mb is None else (0, float(config.cache_mb))


def _reference(campaign: Campaign, base: CellConfig, shape: ModelShape) -> CellConfig:
    """`base` planned again without its lossy levers (the model's own top-k, the levers out of its
    flags and engine_args), at its budget as written (a `cycle*F` priced at that top-k)."""
    k = shape.top_k or _top_k(base)
    plain = dataclasses.replace(campaign, run=dataclasses.replace(
        campaign.run, engine_args=args_without_levers(base.engine_args)))
    config = _config(parse_cache_value(base.budget_spec), int(base.cache_ceil_mb or 0), base.dense_weights, k,
                     int(base.io_threads or 0), cycle_price_mib(shape.cycle_bytes(k)), plain,
                     base.threads if base.threads is not None else campaign.run.threads,
                     flags_without_levers(base.engine_flags))
    return _like(campaign, config, base).with_(quality_reference=True)


def probes_for(campaign: Campaign, cells: Sequence[Cell]) -> tuple[Cell, ...]:
    """The route-trace probes the knee cells among `cells` need (one per device, model and top-k)."""
    engine = campaign.engine.kind
    models = {m.name: m for m in campaign.models}
    out: dict[tuple[str, str, int], Cell] = {}
    for cell in cells:
        key = (cell.device, cell.model, _top_k(cell.config))
        if not is_knee(cell.config.budget_spec) or key in out:
            continue
        config = probe_config(campaign, key[2], _cycle_mb(cell.config))
        cid = "p" + cell_id_of(*key[:2], engine, config, 0, 0)[1:]
        out[key] = Cell(cid, cell.device, cell.model, engine, config, 0, 0, -1,
                        cell_argv(campaign, cell.device, models[cell.model], config, cid))
    return tuple(out.values())


def _top_k(config: CellConfig) -> int:
    if config.n_expert_used is None:           # the planner always sets it
        raise CampaignError("a planned cell has no n_expert_used")
    return config.n_expert_used


def _cycle_mb(config: CellConfig) -> float:
    if config.cycle_mb is None:                # the planner always sets it
        raise CampaignError("a planned cell has no cycle_mb")
    return config.cycle_mb


def plan_from_dict(data: Mapping[str, Any]) -> Plan:
    """A Plan from plan.json's object (already at the current version: store.versioned)."""
    return Plan(str(data.get("campaign", "")), tuple(Cell.from_dict(c) for c in data.get("cells", ())),
                probes=tuple(Cell.from_dict(c) for c in data.get("probes", ())))


def read_plan(cdir: CampaignDir) -> Plan | None:
    """A campaign directory's plan (None when it has none)."""
    doc = cdir.read_plan_doc()
    return None if doc is None else plan_from_dict(doc)


def write_plan(cdir: CampaignDir, plan: Plan) -> None:
    """plan.json of a campaign directory."""
    cdir.write_plan_doc(plan.to_dict())


def cell_ids(cells: Sequence[Cell]) -> list[str]:
    """The ids of some cells, in order."""
    return [c.cell_id for c in cells]
