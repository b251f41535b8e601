"""The campaign a `bmoe-fleet sweep` command line means, validated exactly as a campaign file is.

The options (declared in harness.campaign.sweep_options, each with the campaign key it sets) become
the data a file would hold, read by harness.campaign.file.parse_campaign: one set of checks and
messages for both. No --device means $ANDROID_SERIAL (as a file without `fleet.devices`); no --adb
means the server adb's environment names (devices.adb.default_server).
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
from engine.units import is_digits
from harness.campaign import flags as flag_rules
from harness.campaign.budgets import PLANNER
from harness.campaign.defaults import PYTHON_ENGINE
from harness.campaign.file import parse_campaign
from harness.campaign.model import FORMAT_VERSION, HOST_BUILD, Campaign, CampaignError
from harness.campaign.sweep_options import BY_DEST, SWEEP_OPTIONS
from store.names import safe_id


def campaign_from_options(devices: Sequence[str], models: Sequence[str], cache_mb: Sequence[str], *,
                          extra: Mapping[str, Mapping[str, Any]] | None = None,
                          engine_builds: Mapping[str, str] | None = None, **options: Any) -> Campaign:
    """The campaign a `bmoe-fleet sweep` command line means (validated like a file). Each keyword
    is a sweep option's value, named by its `dest` in harness.campaign.sweep_options, which gives
    its default and the campaign key it goes to; `engine` is bmoe-py or the path of a bmoe-cli
    binary (its `host` build, the lib*.so* beside it included) and `engine_builds` maps an ABI to
    the bmoe-cli built for it (`--engine arm64-v8a=PATH`, sweep_engines). `extra` is campaign data
    laid over the options' (a preset's prompt, the demo's gate)."""
    unknown = sorted(set(options) - {o.dest for o in SWEEP_OPTIONS if o.key})
    if unknown:
        raise TypeError(f"campaign_from_options() got an unexpected keyword argument {unknown[0]!r}")
    values = {o.dest: o.default for o in SWEEP_OPTIONS if o.key}
    values.update(options, devices=devices, models=models, cache_mb=cache_mb)
    # the values that are more than copied, converted in this order (the first mistake is the one
    # reported); --plan's is the budgets with the planner's added
    adds_planner = values["planner"] and PLANNER not in values["cache_mb"]
    converted: dict[str, Any] = {
        "models": _model_table(values["models"]), "adb": _servers(values["adb"] or ()),
        "engine": _engine_table(values["engine"], engine_builds or {}),
        "engine_args": _engine_args(values["engine_args"] or ()), "flags": _flag_table(values["flags"] or ()),
        "threads": _threads(values["threads"]), "planner": [*values["cache_mb"], PLANNER] if adds_planner else None}
    data: dict[str, Any] = {"version": FORMAT_VERSION}
    for option in SWEEP_OPTIONS:
        if option.key is None:
            continue
        value = converted.get(option.dest, values[option.dest])
        if isinstance(value, tuple):
            value = list(value)
        if not option.keep_empty and (value is None or value is False or (isinstance(value, list | dict) and not value)):
            continue
        table, _, key = option.key.rpartition(".")
        (data.setdefault(table, {}) if table else data)[key] = value
    if values["planner"] and "engine" not in data:     # bmoe-py has the planner when it claims NEXT
        data["engine"] = {"claim": str(NEXT)}
    for name in converted["flags"]:     # a --flag that maps onto an axis replaces that axis' default
        axis = BY_DEST.get(flag_rules.MAPPED.get(name, ""))
        if axis and axis.key == f"axes.{axis.dest}" and tuple(values[axis.dest]) == axis.default:
            data["axes"].pop(axis.dest, None)
    for section, section_values in (extra or {}).items():
        data.setdefault(section, {}).update(section_values)
    return parse_campaign(data, source="sweep", base_dir=os.getcwd(), default_name=values["name"])


def _model_table(models: Sequence[str]) -> dict[str, str]:
    """--model paths as [models]: each named after its file, numbered when two share a name."""
    table: dict[str, str] = {}
    for path in models:
        base = safe_id(Path(path).name.removesuffix(".gguf"))
        key, n = base, 1
        while key in table:
            n += 1
            key = f"{base}-{n}"
        table[key] = path
    return table


def _servers(adb: Sequence[str]) -> list[dict[str, Any]]:
    """--adb HOST:PORT values as [[fleet.adb]] tables."""
    servers = []
    for text in adb:
        try:
            s = AdbServer.parse(text)
        except BmoeError as e:
            raise CampaignError(f"--adb: {e}") from None
        servers.append({"host": s.host, "port": s.port})
    return servers


def _engine_table(engine: str, builds: Mapping[str, str]) -> dict[str, Any] | None:
    """--engine as [engine]: None for bmoe-py alone, else kind native with a build per ABI."""
    if engine == PYTHON_ENGINE and not builds:
        return None
    native = {HOST_BUILD: {"cli": _engine_binary(engine)}} if engine != PYTHON_ENGINE else {}
    native.update((abi, {"cli": _engine_binary(path, f"--engine {abi}=")}) for abi, path in builds.items())
    return {"kind": "native", "native": native}


def _threads(threads: str | None) -> int | str | None:
    """-t as run.threads: a number, or "auto" as given (parse_campaign checks it)."""
    if threads is None:
        return None
    return int(threads) if is_digits(threads.strip()) else threads.strip()


def _engine_args(engine_args: Sequence[str]) -> list[str]:
    """--engine-arg values as run.engine_args: each split like a shell line."""
    args: list[str] = []
    for text in engine_args:
        try:
            args += shlex.split(text)
        except ValueError as e:
            raise CampaignError(f"--engine-arg: {text!r}: {e}") from None
    return args


def _flag_table(flags: Sequence[str]) -> dict[str, Any]:
    """--flag NAME=V1,V2 values as [axes.flags] (typed values, harness.campaign.flags); one that
    maps onto an axis is refused with values given with the axis' own option by parse_campaign,
    as in a file."""
    table: dict[str, Any] = {}
    for text in flags:
        try:
            name, values = flag_rules.parse_option(text)
        except ValueError as e:
            raise CampaignError(f"--flag: {e}") from None
        if name in table:
            raise CampaignError(f"--flag: {name} is given twice; list its values once (NAME=V1,V2)")
        table[name] = values
    return table


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

