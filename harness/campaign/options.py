"""The campaign a `bmoe-fleet sweep` command line means, validated exactly as a campaign file is.

The options become the data a file would hold, read by harness.campaign.file.parse_campaign: one
set of checks and messages for both. No --device means $ANDROID_SERIAL (as a file without
`fleet.devices`); no --adb means the server adb's environment names (devices.adb.default_server).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devices.adb.server import AdbServer
from engine.errors import BmoeError
from engine.interface.releases import NEXT
from harness.campaign import flags as flag_rules
from harness.campaign.budgets import PLANNER
from harness.campaign.defaults import PYTHON_ENGINE, SWEEP
from harness.campaign.file import parse_campaign
from harness.campaign.model import FORMAT_VERSION, HOST_BUILD, Campaign, CampaignError
from store.names import safe_id


def campaign_from_options(devices: Sequence[str], models: Sequence[str], cache_mb: Sequence[str],
                          dense_weights: Sequence[str] = SWEEP.dense_weights,
                          n_expert_used: Sequence[int] = SWEEP.n_expert_used,
                          io_threads: Sequence[int] = SWEEP.io_threads,
                          cache_ceil_mb: Sequence[int] = SWEEP.cache_ceil_mb,
                          repeats: int = SWEEP.repeats, n_predict: int = SWEEP.n_predict, adb: Sequence[str] = (),
                          reverse_pass: bool = False, name: str = SWEEP.name, timeout_s: float | None = None,
                          device_timeout_s: float | None = None,
                          extra: Mapping[str, Mapping[str, Any]] | None = None,
                          engine: str = SWEEP.engine, engine_builds: Mapping[str, str] | None = None,
                          threads: str | None = None, engine_args: Sequence[str] = (),
                          flags: Sequence[str] = (), apps: Sequence[str] = (), run_as: Sequence[str] = (),
                          turns: int | None = None,
                          idle_s: float | None = None, gap_apps: str | None = None,
                          planner: bool = False, adaptive: bool = False, resolution_mb: int | None = None,
                          max_error_pct: float | None = None) -> Campaign:
    """The campaign a `bmoe-fleet sweep` command line means (validated like a file). `engine` is
    bmoe-py or the path of a bmoe-cli binary: its `host` build, the lib*.so* beside it included;
    `engine_builds` maps an ABI to the bmoe-cli built for it (`--engine arm64-v8a=PATH`,
    sweep_engines), an [engine.native.ABI] entry each, so real phones need no campaign file.
    A model `device:PATH` is already on the devices. `threads` is run.threads ("auto" or a
    number); each `engine_args` item is split like a shell line into run.engine_args; each
    `flags` item is `NAME=V1,V2`, an [axes.flags] entry with typed values (harness.campaign.flags); each
    `apps` item one load of other apps (`cached:1GiB+perceptible:512MiB`, `none`), axes.apps;
    `run_as` how the engine is started (`shell`, `app-service`, `app-top`), axes.run_as;
    `turns`, `idle_s` and `gap_apps` are run.turns, run.idle_s and run.gap_apps (session cells).
    `planner` (sweep --plan) adds the "planner" budget: the engine's own planner picks it on each
    device; bmoe-py then claims bmoe-cli NEXT, the release that has the planner (engine.claim).
    `adaptive`, `resolution_mb` and `max_error_pct` are the [plan] table (harness.plan.adaptive)."""
    model_table: dict[str, str] = {}
    for path in models:
        base = safe_id(Path(path).name.removesuffix(".gguf"))
        key, n = base, 1
        while key in model_table:
            n += 1
            key = f"{base}-{n}"
        model_table[key] = path
    servers = []
    for text in adb:
        try:
            s = AdbServer.parse(text)
        except BmoeError as e:
            raise CampaignError(f"--adb: {e}") from None
        servers.append({"host": s.host, "port": s.port})
    run: dict[str, Any] = {"repeats": repeats, "n_predict": n_predict, "reverse_pass": reverse_pass}
    if timeout_s is not None:
        run["timeout_s"] = timeout_s
    if device_timeout_s is not None:
        run["device_timeout_s"] = device_timeout_s
    for key, value in (("turns", turns), ("idle_s", idle_s), ("gap_apps", gap_apps)):
        if value is not None:
            run[key] = value
    data: dict[str, Any] = {
        "version": FORMAT_VERSION, "name": name,
        "fleet": {"devices": list(devices), "adb": servers},
        "models": model_table,
        "axes": {"cache_mb": list(cache_mb), "dense_weights": list(dense_weights),
                 "n_expert_used": list(n_expert_used), "io_threads": list(io_threads),
                 "cache_ceil_mb": list(cache_ceil_mb)},
        "run": run,
    }
    if apps:
        data["axes"]["apps"] = list(apps)
    if run_as:
        data["axes"]["run_as"] = list(run_as)
    plan = {key: value for key, value in (("adaptive", adaptive or None), ("resolution_mb", resolution_mb),
                                          ("max_error_pct", max_error_pct)) if value is not None}
    if plan:
        data["plan"] = plan
    if planner and PLANNER not in data["axes"]["cache_mb"]:
        data["axes"]["cache_mb"].append(PLANNER)
    if engine != PYTHON_ENGINE or engine_builds:
        native = {HOST_BUILD: {"cli": _engine_binary(engine)}} if engine != PYTHON_ENGINE else {}
        native.update((abi, {"cli": _engine_binary(path, f"--engine {abi}=")}) for abi, path in (engine_builds or {}).items())
        data["engine"] = {"kind": "native", "native": native}
    elif planner:
        data["engine"] = {"claim": str(NEXT)}
    _sweep_threads_and_flags(data, threads, engine_args, flags,
                             {"dense_weights": tuple(dense_weights) == SWEEP.dense_weights,
                              "n_expert_used": tuple(n_expert_used) == SWEEP.n_expert_used,
                              "io_threads": tuple(io_threads) == SWEEP.io_threads})
    for section, values in (extra or {}).items():
        data.setdefault(section, {}).update(values)
    if not servers:
        del data["fleet"]["adb"]
    if not devices:                          # the file's rule: no device named means $ANDROID_SERIAL
        del data["fleet"]["devices"]
    return parse_campaign(data, source="sweep", base_dir=os.getcwd(), default_name=name)


def _sweep_threads_and_flags(data: dict[str, Any], threads: str | None, engine_args: Sequence[str],
                             flags: Sequence[str], defaulted: Mapping[str, bool]) -> None:
    """The sweep's --threads, --engine-arg and --flag as campaign data. A --flag that maps onto an
    axis replaces that axis' default; against values given with the axis' own option it is
    refused by parse_campaign, as in a file."""
    if threads is not None:
        data["run"]["threads"] = int(threads) if threads.strip().isdigit() else threads.strip()
    args: list[str] = []
    for text in engine_args:
        try:
            args += shlex.split(text)
        except ValueError as e:
            raise CampaignError(f"--engine-arg: {text!r}: {e}") from None
    if args:
        data["run"]["engine_args"] = args
    table: dict[str, Any] = {}
    for text in flags:
        try:
            name, values = flag_rules.parse_option(text)
        except ValueError as e:
            raise CampaignError(f"--flag: {e}") from None
        if name in table:
            raise CampaignError(f"--flag: {name} is given twice; list its values once (NAME=V1,V2)")
        table[name] = values
        axis = flag_rules.MAPPED.get(name)
        if axis and defaulted.get(axis):
            data["axes"].pop(axis, None)
    if table:
        data["axes"]["flags"] = table


def _engine_binary(text: str, given: str = "--engine ") -> str:
    path = os.path.abspath(os.path.expanduser(text))
    if not os.path.isfile(path):
        what = f"is neither {PYTHON_ENGINE} nor a file" if given == "--engine " else "is no file"
        raise CampaignError(f"{given.rstrip()}: {json.dumps(text)} {what} (give the path of a bmoe-cli binary)")
    if not os.access(path, os.X_OK):
        raise CampaignError(f"{given.rstrip()}: {path} is not executable")
    return path


_ABI = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")


def sweep_engines(values: Sequence[str], preset: str | None = None) -> tuple[str, dict[str, str]]:
    """`sweep --engine` values (repeatable) as campaign_from_options' `engine` and `engine_builds`:
    at most one of bmoe-py or a host bmoe-cli PATH, and any number of ABI=PATH (one per ABI: the
    build real phones of that ABI run, `ro.product.cpu.abi`). A value that is an existing file is a
    path even with `=` in it. A preset that checks the engine's flags on this host (community,
    app) needs the host build beside ABI builds."""
    plain: list[str] = []
    builds: dict[str, str] = {}
    for value in values:
        abi, sep, path = value.partition("=")
        if not sep or os.path.isfile(os.path.expanduser(value)) or "/" in abi:
            plain.append(value)
            continue
        if not _ABI.fullmatch(abi) or not path:
            raise CampaignError(f"--engine {json.dumps(value)}: expected bmoe-py, PATH or ABI=PATH (ABI as the phone "
                                "reports it, e.g. arm64-v8a)")
        if abi in builds:
            raise CampaignError(f"--engine: two builds for ABI {abi}; give one --engine {abi}=PATH")
        builds[abi] = path
    if len(plain) > 1:
        raise CampaignError(f"--engine: {' and '.join(map(json.dumps, plain))}: give one engine for this host and "
                            "virtual phones, and ABI=PATH for real phones")
    engine = plain[0] if plain else PYTHON_ENGINE
    if builds and engine == PYTHON_ENGINE and plain:
        raise CampaignError(f"--engine {PYTHON_ENGINE} cannot go with ABI=PATH builds of bmoe-cli: one engine runs "
                            "every cell")
    if builds and engine == PYTHON_ENGINE and preset in ("community", "app"):
        raise CampaignError(f"--preset {preset} checks the engine's flags on this host: give its host build too "
                            "(--engine PATH) beside the ABI=PATH ones")
    return engine, builds

