"""The campaign model: what to sweep, on which devices, with which engine — resolved and frozen.

A Campaign is what a campaign file means once read (harness.campaign.file reads and validates
one; harness.campaign.options builds one from a `sweep` command line): every default filled in,
paths absolute. `Campaign.to_toml()` writes it (tomli-w) as the `campaign.toml` a campaign
directory keeps; reading that back gives the same campaign. docs/campaigns.md shows a complete
file. The budget grammar of `axes.cache_mb` is harness.campaign.budgets; finding the devices over the
network is harness.campaign.device_resolution.

Device strings: `local` (this host), `virtual:NAME` (a virtual phone, found through its manager
and reached over adb like a real phone), `HOST:PORT` endpoints listed under `fleet.connect`
(`adb connect`ed first), and any other string is an adb serial on one of the `[[fleet.adb]]`
servers.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import tomli_w

from devices.adb.link import WORK_DIR as ADB_WORK_DIR
from devices.adb.server import AdbServer
from devices.base import DeviceIdentity
from engine.errors import BmoeError
from engine.fsutil import fleet_home
from engine.interface.flags import DENSE_WEIGHTS, THREADS
from engine.safetext import one_line
from harness.campaign.defaults import SWEEP
from store.engine_argv import THREADS_AUTO as THREADS_AUTO  # the campaign file spells it

FORMAT_VERSION = 1
LOCAL = "local"
VIRTUAL_PREFIX = "virtual:"
DEVICE_PREFIX = "device:"   # a model already on the devices (at that path on each)
HOST_BUILD = "host"         # the engine.native entry for this host and virtual phones
DENSE_MODES = DENSE_WEIGHTS.choices  # ahwb: Android only; elsewhere both engines fail at load
ENGINE_KINDS = ("python", "native")
# run.threads THREADS_AUTO ("auto", store.engine_argv): the device's online cores …
THREADS_AUTO_MAX = int(THREADS.default)   # … at most this many (bmoe-cli's own default)
PROBE_TOKENS_MAX = 64       # the default knee probe is short even when the sweep's runs are long
# A plan is bounded before it is expanded: 10,000 runs are weeks of phone time, and a larger
# matrix only costs memory and minutes to refuse later.
MAX_CELLS = 10_000
INT_MAX = 2 ** 31 - 1           # the engine reads its integer flags with atoi into an int
MESSAGE_CHARS = 500


class CampaignError(BmoeError):
    """A campaign file (or sweep) is wrong: one line naming the key and what is wrong with it.

    Keys and values come from the file: the message is made one terminal-safe line here, once
    for every complaint (control characters escaped, at most MESSAGE_CHARS)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(one_line(str(message), MESSAGE_CHARS))


def describe_value(value: Any) -> str:
    """A value read from a file, for a message: its TOML type and a short excerpt."""
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({number_text(value)})"
    if isinstance(value, float):
        return f"a number ({value:g})"
    if isinstance(value, str):
        return f"a string ({json.dumps(value[:60] + ('…' if len(value) > 60 else ''))})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def number_text(v: float) -> str:
    """A number for a message: a 400-digit integer is shown by its size, not its digits."""
    return f"{v:g}" if isinstance(v, float) else str(v) if abs(v) < 10 ** 30 else f"a {len(str(abs(v)))}-digit number"



# ── the resolved campaign ──────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class ModelSpec:
    """One model of the campaign: its name in the file and where the GGUF is."""

    name: str
    path: str                       # absolute: on this host, or on every device when on_device
    on_device: bool = False         # `device:PATH`: already on the devices, never pushed (harness.campaign.device_models)

    @property
    def spec(self) -> str:
        """As a campaign file writes it."""
        return DEVICE_PREFIX + self.path if self.on_device else self.path


@dataclass(frozen=True)
class NativeBuild:
    """One bmoe-cli build ([engine.native.ABI]): the binary and the libraries pushed with it."""

    abi: str                        # arm64-v8a, x86_64 … as the device reports it, or "host"
    cli: str                        # bmoe-cli on this host (absolute)
    libs: tuple[str, ...] = ()      # shared libraries pushed next to it (default: the lib*.so* beside cli)


@dataclass(frozen=True)
class EngineSpec:
    """[engine]: which engine every cell runs, and the builds a native engine has per ABI."""

    kind: str = "python"            # python = bmoe-py (this project's engine) | native = bmoe-cli
    python: str = sys.executable    # interpreter that runs bmoe-py on a device (a path the device sees)
    native: tuple[NativeBuild, ...] = ()
    claim: str = ""                 # python: the bmoe-cli release bmoe-py speaks (BMOE_PY_RELEASE; "" = 0.19.0)

    @property
    def stray_names(self) -> tuple[str, ...]:
        """Process names (comm) an engine of this kind runs under, for stray stopping."""
        return ("bmoe-py",) if self.kind == "python" else ("bmoe-cli",)

    @property
    def staged_name(self) -> str:
        """The file name the engine is staged under on a device."""
        return "bmoe-py" if self.kind == "python" else "bmoe-cli"

    def build_for(self, abi: str) -> NativeBuild | None:
        """The engine.native entry named `abi`, if any."""
        return next((b for b in self.native if b.abi == abi), None)

    @staticmethod
    def build_keys(identity: DeviceIdentity) -> tuple[str, ...]:
        """The engine.native keys that can serve a device, best first. This host and virtual phones
        execute this host's binaries (a virtual phone reports a phone ABI but runs host programs):
        `host`, then their host ABI's own entry. A real phone runs only a build for its ABI."""
        if identity.host_abi:
            return (HOST_BUILD, identity.host_abi)
        return (identity.abi,)

    def build_for_device(self, identity: DeviceIdentity) -> NativeBuild | None:
        """The best engine.native entry that runs on this device (build_keys order), if any."""
        return next((b for key in self.build_keys(identity) if (b := self.build_for(key)) is not None), None)

    def missing_build(self, identity: DeviceIdentity, device: str, sweep: bool = False) -> str:
        """Why no engine.native entry serves a device (one line, naming the key to add, or with
        `sweep` the `sweep --engine` value that adds it)."""
        keys = self.build_keys(identity)
        runs = (f"ABI {identity.abi}, runs this host's {identity.host_abi} binaries" if identity.host_abi
                else f"ABI {identity.abi}")
        have = ", ".join(b.abi for b in self.native) or "none"
        add = (f"give --engine {'PATH' if keys[0] == HOST_BUILD else keys[0] + '=PATH'} (a bmoe-cli built for it)"
               if sweep else f"add [engine.native.{keys[0]}] cli = \"…\"")
        return f"engine.native: no build for device {device} ({runs}); have {have}: {add}"


# axes.run_as: the value that starts the engine from the shell, and those that start it as the app
# (the adj each registers at: ProcessList's PERCEPTIBLE_APP_ADJ for upstream's RunService, a
# foreground service; FOREGROUND_APP_ADJ for the app on top)
RUN_AS_SHELL = "shell"
RUN_AS_APP = {"app-service": 200, "app-top": 0}
RUN_AS = (RUN_AS_SHELL, *RUN_AS_APP)


@dataclass(frozen=True)
class Axes:
    """[axes]: the values swept; every cell takes one value of each."""

    cache_mb: tuple[int | str, ...] = SWEEP.cache_mb
    cache_ceil_mb: tuple[int, ...] = SWEEP.cache_ceil_mb   # applies to `auto` values only
    cache_floor_mb: int = 1536
    dense_weights: tuple[str, ...] = SWEEP.dense_weights
    n_expert_used: tuple[int, ...] = SWEEP.n_expert_used   # 0 = the model's own top-k
    io_threads: tuple[int, ...] = SWEEP.io_threads
    # `-t` as an axis ([axes.flags] "-t" = [1, 2]); empty: every cell takes run.threads
    threads: tuple[int | str, ...] = ()
    # any other engine flag as an axis, in file order: (flag, values); harness.campaign.flags renders them
    flags: tuple[tuple[str, tuple[bool | int | float | str, ...]], ...] = ()
    # the other apps open beside the engine, one load per value ("cached:1GiB+perceptible:512MiB";
    # "" is none), started on the phone before each run (devices.coapps); empty: no such axis
    apps: tuple[str, ...] = ()
    # how the engine is started (RUN_AS): "shell", over adb as a phone's user runs it (lmkd never
    # considers it), or as the app on a virtual phone ("app-service", adj 200; "app-top", adj 0),
    # registered with lmkd (devices/virtual/am.py `run-as-app`); empty: the shell alone
    run_as: tuple[str, ...] = ()

    def flag_table(self) -> dict[str, list]:
        """[axes.flags] as a file writes it: the -t axis under "-t", then every other flag."""
        return ({"-t": list(self.threads)} if self.threads else {}) | {n: list(v) for n, v in self.flags}


@dataclass(frozen=True)
class RunSettings:
    """[run]: how every cell runs (tokens, prompt, threads, repeats, timeouts, retries)."""

    n_predict: int = SWEEP.n_predict
    prompt: str = "The capital of Japan is"
    # -t: an integer, or "auto" = the device's online cores (at most THREADS_AUTO_MAX), read on
    # the device right before each run (harness.run.cpushare) and recorded; the plan keeps "auto"
    threads: int | str = SWEEP.threads
    # … except on this host (device `local`), where "auto" is at most this many: upstream's community
    # protocol runs min(8, cores) on a computer and 4 on a phone
    host_threads_max: int = THREADS_AUTO_MAX
    engine_args: tuple[str, ...] = ()            # passed through to every cell (harness.campaign.flags)
    repeats: int = SWEEP.repeats
    reverse_pass: bool = False
    route_trace: bool = False
    probe_tokens: int = 0                        # the knee probe's tokens; 0: n_predict, at most 64

    @property
    def probe_n_predict(self) -> int:
        """Tokens of the route-traced probe behind "knee" budgets. By default the sweep's own
        n_predict (at most 64): same prompt, same greedy tokens, so its trace is the sweep runs'
        trace and the replayed hit % at a run's budget is the hit % that run measures."""
        return self.probe_tokens or min(self.n_predict, PROBE_TOKENS_MAX)
    o_direct: bool = True
    timeout_s: float = SWEEP.timeout_s
    device_timeout_s: float = SWEEP.device_timeout_s    # no answer from a phone this long: device_lost
    retries: int = 3
    retry_backoff_s: float = 2.0
    lock_wait_s: float = 0.0
    # the engine's oom_score_adj (0..1000: the shell user may raise its own, never lower it; an
    # app's state: cached 900+, previous 700, perceptible 200, foreground 0); None: the adj adb's
    # shell gives it (0 on a phone, docs/decisions/engine-oom-score-adj.md)
    oom_score_adj: int | None = None
    # session cells (harness.run.turns): `turns` turns of one `--session` engine, `idle_s` seconds of
    # idle between them, `gap_apps` (one load of axes.apps' grammar, "" for none) allocating in each
    # gap; turns = 1 is the one-shot cell
    turns: int = 1
    idle_s: float = 0.0
    gap_apps: str = ""
    # output quality beside speed (QUALITY, docs/decisions/quality-runs.md): "on" runs every cell with
    # --progress, adds a lossless reference where a group has none and, at bmoe-cli 0.24 or later, a
    # --ppl scoring run after each; "auto" is on when a cell of the plan is lossy (store.quality)
    quality: str = SWEEP.quality


# run keys written to campaign.toml only when they differ from these (files written before them stay equal)
_RUN_OMITTED = {"device_timeout_s": SWEEP.device_timeout_s, "turns": 1, "idle_s": 0.0, "gap_apps": "",
                "host_threads_max": THREADS_AUTO_MAX, "quality": SWEEP.quality}


@dataclass(frozen=True)
class GateSettings:
    """[gate]: the device condition a cell waits for before it runs (a cool CPU, free RAM)."""

    cpu_temp_max_c: float = 45.0
    mem_available_min_mb: int = 0
    max_wait_s: float = 300.0
    poll_s: float = 2.0

    @property
    def cpu_temp_max_mc(self) -> int:
        """cpu_temp_max_c in millidegrees, as thermal zones report."""
        return round(self.cpu_temp_max_c * 1000)

    @property
    def mem_available_min_kb(self) -> int:
        """mem_available_min_mb in kB, as /proc/meminfo reports."""
        return self.mem_available_min_mb * 1024


@dataclass(frozen=True)
class PlanSettings:
    """[plan]: how the cells are chosen. The default is the grid (every axis value); `adaptive`
    measures a probe and cache 0, predicts, and spends cells only where the prediction is unsure
    (harness.plan.adaptive, docs/campaigns.md "The adaptive sweep")."""

    adaptive: bool = False
    # the width the kill-or-fight bracket closes to (MiB); 0: a quarter of the model's token cycle
    resolution_mb: int = 0
    # a measured cell further than this from its prediction (s/token, %) sends its group to the grid
    max_error_pct: float = 25.0


@dataclass(frozen=True)
class Campaign:
    """A campaign, resolved: every default filled in, paths absolute (harness.campaign.file reads one)."""

    name: str
    devices: tuple[str, ...]
    models: tuple[ModelSpec, ...]
    engine: EngineSpec = EngineSpec()
    axes: Axes = Axes()
    run: RunSettings = RunSettings()
    gate: GateSettings = GateSettings()
    plan: PlanSettings = PlanSettings()
    adb: tuple[AdbServer, ...] = ()
    connect: tuple[str, ...] = ()
    virtual_home: str | None = None
    source: str = field(default="", compare=False)   # where it was read from, for messages

    def model(self, name: str) -> ModelSpec:
        """The model named `name` (one of self.models)."""
        return next(m for m in self.models if m.name == name)

    @property
    def where(self) -> str:
        """`SOURCE: ` to begin a message about this campaign (empty when it was read from nowhere)."""
        return f"{self.source}: " if self.source else ""

    def to_dict(self) -> dict[str, Any]:
        """The resolved campaign as TOML-ready data (no None: TOML has no null)."""
        fleet: dict[str, Any] = {"devices": list(self.devices), "connect": list(self.connect)}
        if self.virtual_home is not None:
            fleet["virtual_home"] = self.virtual_home
        fleet["adb"] = [{"host": s.host, "port": s.port} for s in self.adb]
        engine: dict[str, Any] = {"kind": self.engine.kind, "python": self.engine.python}
        if self.engine.claim:
            engine["claim"] = self.engine.claim
        if self.engine.native:
            engine["native"] = {b.abi: {"cli": b.cli, "libs": list(b.libs)} for b in self.engine.native}
        a, r, g = self.axes, self.run, self.gate
        return {
            "version": FORMAT_VERSION,
            "name": self.name,
            "fleet": fleet,
            "models": {m.name: m.spec for m in self.models},
            "engine": engine,
            "axes": {"cache_mb": list(a.cache_mb), "cache_ceil_mb": list(a.cache_ceil_mb),
                     "cache_floor_mb": a.cache_floor_mb, "dense_weights": list(a.dense_weights),
                     "n_expert_used": list(a.n_expert_used), "io_threads": list(a.io_threads),
                     **({"flags": a.flag_table()} if a.threads or a.flags else {}),
                     **({"apps": [load or "none" for load in a.apps]} if a.apps else {}),
                     **({"run_as": list(a.run_as)} if a.run_as else {})},
            # device_timeout_s and the session keys only when set, oom_score_adj only when
            # given: campaign.toml files written before them stay equal
            "run": {k: list(v) if isinstance(v, tuple) else v
                    for k, v in ((k, getattr(r, k)) for k in RunSettings.__dataclass_fields__)
                    if (k not in _RUN_OMITTED or v != _RUN_OMITTED[k]) and v is not None},
            "gate": {k: getattr(g, k) for k in GateSettings.__dataclass_fields__},
            # only an adaptive campaign has the table: a grid's campaign.toml stays what it was
            **({"plan": {k: getattr(self.plan, k) for k in PlanSettings.__dataclass_fields__}}
               if self.plan.adaptive else {}),
        }

    def to_toml(self) -> str:
        """The resolved campaign as a campaign file (tomli-w), as a campaign directory keeps it."""
        data = self.to_dict()
        # A resumed run reads this file back as the campaign it is. tomli-w writes inf and nan,
        # which the reader refuses (every number of a campaign is finite): a value set in code,
        # never read from a file, fails here, before anything is written.
        for key, value in _leaves(data):
            if isinstance(value, float) and not math.isfinite(value):
                raise CampaignError(f"cannot write {value} to TOML: {key} must be a finite number")
        text = tomli_w.dumps(data)
        if tomllib.loads(text) != data:
            raise CampaignError("internal error: the campaign does not survive a TOML round trip")
        return text


def _leaves(data: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) for every scalar of TOML-ready data, list items included."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _leaves(v, f"{key}.{k}" if key else str(k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _leaves(v, f"{key}[{i}]")
    else:
        yield key, data


def cell_bound(campaign: Campaign) -> tuple[int, str]:
    """How many cells the campaign's matrix can make (an upper bound: equal configs merge when
    planned), counted without expanding it, and the product that gives it."""
    a, r = campaign.axes, campaign.run
    factors = [("devices", len(campaign.devices)), ("models", len(campaign.models)),
               ("budgets", sum(len(a.cache_ceil_mb) if v == "auto" else 1 for v in a.cache_mb)),
               ("dense modes", len(a.dense_weights)), ("top-k", len(a.n_expert_used)),
               ("io-threads", len(a.io_threads)), ("-t", max(1, len(a.threads)))]
    factors += [(name, len(values)) for name, values in a.flags]
    factors += [("run.repeats", r.repeats), ("passes", 2 if r.reverse_pass else 1)]
    total = math.prod(n for _, n in factors)
    return total, " x ".join(f"{n:,} {name}" for name, n in factors if n != 1)


def check_cell_bound(campaign: Campaign) -> None:
    """A CampaignError (one line, before anything is planned) above MAX_CELLS cells."""
    total, product = cell_bound(campaign)
    if total > MAX_CELLS:
        raise CampaignError(f"{campaign.where}the campaign makes up to {total:,} cells ({product}); a campaign "
                            f"holds at most {MAX_CELLS:,}: split it, or reduce run.repeats or an axis")


# ── where things live on a device (known without connecting) ──────────────────────────────────


def is_local(device: str) -> bool:
    """Is this campaign device string this host?"""
    return device == LOCAL


def device_work_dir(device: str) -> str:
    """Where engine, models (phones) and outputs are staged: the adb default on phones (a real
    filesystem, O_DIRECT works there), ~/.bmoe-fleet/local on this host."""
    return str(fleet_home() / "local") if is_local(device) else ADB_WORK_DIR


def remote_model_path(device: str, model: ModelSpec) -> str:
    """Phones get models in their work dir by file name; this host uses them where they are, and
    a `device:` model is run where it already is."""
    if is_local(device) or model.on_device:
        return model.path
    return f"{device_work_dir(device)}/{os.path.basename(model.path)}"

