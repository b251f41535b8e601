"""Reading a campaign file (TOML, `version = 1`) into a harness.campaign.model.Campaign.

A campaign file is read strictly: an unknown key, a wrong type, a missing model, an unknown
device or `auto` glued to a number is a one-line CampaignError naming the key, raised before
anything is written. Every numeric setting has bounds (below, docs/campaigns.md). What adb's
environment supplies is taken here, where a file leaves it out: the adb server
(devices.adb.default_server) when no `[[fleet.adb]]` is given and a device needs one, and the
device ($ANDROID_SERIAL) when `fleet` names none. Writing is Campaign.to_toml().

Long because: it is one strict reader, the file's tables read top to bottom by `parse_campaign`
through one `_Reader` whose every complaint names its key, with the bounds and per-key checks
beside it; split by table, the reader and the checks that cross tables (run against plan, axes
against the fleet) would be passed between modules.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from devices.adb.server import DEFAULT_ADB_PORT, ENV_SERIAL, AdbServer, default_serial, default_server
from devices.base import OOM_SCORE_ADJ_MAX, DeviceError
from engine.contract.claim import CLAIM_ENV, claimed
from engine.interface.flags import AUTO, BMOE_PY
from engine.interface.releases import NEXT
from engine.safetext import one_line
from engine.stream.budget import IO_THREADS_MAX
from engine.units import MIB
from harness.campaign import flags as flag_rules
from harness.campaign.budgets import PLANNER, parse_cache_value
from harness.campaign.defaults import QUALITY
from harness.campaign.model import (
    DENSE_MODES,
    DEVICE_PREFIX,
    ENGINE_KINDS,
    FORMAT_VERSION,
    INT_MAX,
    LOCAL,
    MAX_CELLS,
    RUN_AS,
    RUN_AS_APP,
    THREADS_AUTO,
    VIRTUAL_PREFIX,
    Axes,
    Campaign,
    CampaignError,
    EngineSpec,
    GateSettings,
    ModelSpec,
    NativeBuild,
    PlanSettings,
    RunSettings,
    check_cell_bound,
    describe_value,
    number_text,
)
from store.names import safe_id

_PHONE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_ENDPOINT = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}$")
# Bounds every numeric setting is checked against when the file is read (docs/campaigns.md).
MAX_SECONDS = 30 * 24 * 3600    # timeouts and waits: 30 days
MAX_RETRIES = 20                # the backoff doubles per retry
MAX_BACKOFF_S = 3600.0
MAX_EXPERTS = 65536             # as route traces are read (docs/decisions/impossible-values.md)
MAX_THREADS = 1024
CPU_TEMP_RANGE_C = (-50.0, 200.0)
MAX_MEM_MB = (1 << 50) // MIB   # 1 PiB of MemAvailable
MAX_TURNS = 1000                # turns of one session cell


_SCHEMA: dict[str, tuple[str, ...]] = {
    "": ("version", "name", "fleet", "models", "engine", "axes", "run", "gate", "plan"),
    "fleet": ("devices", "connect", "adb", "virtual_home"),
    "fleet.adb": ("host", "port"),
    "engine": ("kind", "python", "native", "claim"),
    "engine.native.*": ("cli", "libs"),
    "axes": ("cache_mb", "cache_ceil_mb", "cache_floor_mb", "dense_weights", "n_expert_used", "io_threads", "flags", "apps",
             "run_as"),
    "run": tuple(RunSettings.__dataclass_fields__),
    "gate": tuple(GateSettings.__dataclass_fields__),
    "plan": tuple(PlanSettings.__dataclass_fields__),
}


class _Reader:
    """Typed access to one parsed TOML document; every complaint names its key."""

    def __init__(self, source: str, base_dir: Path):
        self.source = source
        self.base_dir = base_dir

    def fail(self, key: str, problem: str) -> CampaignError:
        where = f"{self.source}: " if self.source else ""
        return CampaignError(f"{where}{key}: {problem}" if key else f"{where}{problem}")

    def table(self, data: Any, key: str, schema: str) -> dict[str, Any]:
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise self.fail(key, f"expected a table, got {describe_value(data)}")
        known = _SCHEMA[schema]
        for k in data:
            if k not in known:
                raise self.fail(_join(key, k), f"unknown key (known here: {', '.join(known)})")
        return data

    def scalar(self, table: Mapping[str, Any], key: str, prefix: str, kind: type | tuple, default: Any,
               check=None, what: str = "") -> Any:
        full = _join(prefix, key)
        if key not in table:
            return default
        value = table[key]
        return self.value(value, full, kind, check, what)

    def value(self, value: Any, full: str, kind: type | tuple, check=None, what: str = "") -> Any:
        kinds = kind if isinstance(kind, tuple) else (kind,)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if float in kinds and int not in kinds and isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > 2 ** 1000:           # float() would overflow: no setting is that large
                raise self.fail(full, f"must be a finite number, got {number_text(value)}")
            value, ok = float(value), True
        if not ok:
            raise self.fail(full, f"expected {what or _kind_name(kinds)}, got {describe_value(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise self.fail(full, f"must be a finite number, got {value}")
        if isinstance(value, str) and "\0" in value:   # no path, name or argument can hold one
            raise self.fail(full, "holds a NUL character")
        if check is not None:
            problem = check(value)
            if problem:
                raise self.fail(full, problem)
        return value

    def list_of(self, table: Mapping[str, Any], key: str, prefix: str, kind: type | tuple, default: tuple,
                check=None, what: str = "", allow_scalar: bool = True, allow_empty: bool = False) -> tuple:
        full = _join(prefix, key)
        if key not in table:
            return default
        raw = table[key]
        if not isinstance(raw, list):
            if not allow_scalar:
                raise self.fail(full, f"expected a list, got {describe_value(raw)}")
            raw = [raw]
        if not raw and not allow_empty:
            raise self.fail(full, "is empty: give at least one value")
        return tuple(self.value(v, f"{full}[{i}]", kind, check, what) for i, v in enumerate(raw))

    def path(self, text: str, key: str, must_exist: bool = True) -> str:
        if not text:
            raise self.fail(key, "is empty: give a file path")
        p = Path(os.path.expanduser(text))
        if not p.is_absolute():
            p = self.base_dir / p
        p = Path(os.path.abspath(p))
        try:
            exists = p.is_file()
            other = not exists and p.exists()    # /dev/zero, a FIFO, a folder: there, but no file
        except OSError as e:                     # a name too long, a loop of links …
            raise self.fail(key, f"{(e.strerror or str(e)).lower()}: {one_line(str(p), 120)}") from None
        if must_exist and other:
            raise self.fail(key, f"not a regular file: {one_line(str(p), 240)}")
        if must_exist and not exists:
            raise self.fail(key, f"no such file {one_line(str(p), 240)}")
        return str(p)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _kind_name(kinds: tuple) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _at_least(n: float, most: float | None = None):
    """A number >= n (and <= most when given): every numeric key has an upper bound too."""
    def check(v: float) -> str | None:
        if v < n:
            return f"must be at least {number_text(n)}, got {number_text(v)}"
        if most is not None and v > most:
            return f"must be at most {number_text(most)}, got {number_text(v)}"
        return None
    return check


def _above(n: float, most: float):
    return lambda v: f"must be above {number_text(n)}, got {number_text(v)}" if not v > n else (
        f"must be at most {number_text(most)}, got {number_text(v)}" if v > most else None)


def _in_range(lo: int, hi: int):
    return lambda v: None if lo <= v <= hi else f"must be in {lo}..{hi}, got {number_text(v)}"


def parse_campaign(data: Mapping[str, Any], source: str = "", base_dir: str | os.PathLike | None = None,
                   default_name: str = "campaign") -> Campaign:
    """Validate a parsed campaign document; relative paths are relative to base_dir."""
    rd = _Reader(source, Path(base_dir or os.getcwd()))
    if "import" in data:
        raise rd.fail("import", "this file records runs brought in by `bmoe-fleet import`; it is not a campaign "
                                "to run")
    top = rd.table(dict(data), "", "")
    if "version" not in top:
        raise rd.fail("version", f"missing (write version = {FORMAT_VERSION} at the top)")
    version = rd.scalar(top, "version", "", int, None)
    if version > FORMAT_VERSION:
        raise rd.fail("version", f"{number_text(version)} is newer than this bmoe-fleet reads ({FORMAT_VERSION}); upgrade it")
    if version < 1:
        raise rd.fail("version", f"must be {FORMAT_VERSION}, got {number_text(version)}")
    name = rd.scalar(top, "name", "", str, default_name,
                     check=lambda v: None if v.strip() else "is empty")

    all_devices, connect, servers, virtual_home = _fleet(rd, rd.table(top.get("fleet"), "fleet", "fleet"))

    raw_models = top.get("models")
    if raw_models is None:
        raise rd.fail("models", "missing: name at least one model, e.g. [models] demo = \"demo.gguf\"")
    if not isinstance(raw_models, dict) or not raw_models:
        raise rd.fail("models", "expected a table of NAME = \"path.gguf\" with at least one model")
    models = []
    basenames: dict[str, str] = {}
    for model_name, model_path in raw_models.items():
        key = f"models.{model_name}"
        if safe_id(model_name) != model_name:
            raise rd.fail(key, "a model name may use letters, digits, '_', '.', '-' only")
        text = rd.value(model_path, key, str, what="a file path")
        if text.startswith(DEVICE_PREFIX):   # already on the devices: nothing staged, no name clash
            models.append(ModelSpec(model_name, _device_path(rd, text, key), on_device=True))
            continue
        path = rd.path(text, key)
        base = os.path.basename(path)
        if base in basenames:
            raise rd.fail(key, f"has the same file name as models.{basenames[base]} ({base}); phones stage "
                               "models by file name, rename one")
        basenames[base] = model_name
        models.append(ModelSpec(model_name, path))

    eng = rd.table(top.get("engine"), "engine", "engine")
    kind = rd.scalar(eng, "kind", "engine", str, "python",
                     check=lambda v: None if v in ENGINE_KINDS else f"must be one of {', '.join(ENGINE_KINDS)}, got {json.dumps(v)}")
    python = rd.scalar(eng, "python", "engine", str, "") or sys.executable
    natives = []
    raw_native = eng.get("native", {})
    if not isinstance(raw_native, dict):
        raise rd.fail("engine.native", f"expected tables [engine.native.ABI], got {describe_value(raw_native)}")
    for abi, build in raw_native.items():
        key = f"engine.native.{abi}"
        t = rd.table(build, key, "engine.native.*")
        if "cli" not in t:
            raise rd.fail(f"{key}.cli", "missing: the bmoe-cli binary for this ABI")
        cli = rd.path(rd.scalar(t, "cli", key, str, ""), f"{key}.cli")
        if "libs" in t:
            libs = tuple(rd.path(p, f"{key}.libs[{i}]")
                         for i, p in enumerate(rd.list_of(t, "libs", key, str, (), allow_empty=True)))
        else:
            libs = libs_beside(cli)
        names = [os.path.basename(p) for p in libs]
        clash = next((n for n in names if names.count(n) > 1), None)
        if clash:
            raise rd.fail(f"{key}.libs", f"two libraries named {clash}: they are pushed into one folder")
        natives.append(NativeBuild(abi, cli, libs))
    if kind == "native" and not natives:
        raise rd.fail("engine.native", "missing: engine.kind = \"native\" needs [engine.native.ABI] cli = \"…\"")
    claim = rd.scalar(eng, "claim", "engine", str, "", check=_claim_problem)
    if claim and kind != "python":
        raise rd.fail("engine.claim", "is bmoe-py's (the bmoe-cli release it speaks); a native engine is the "
                                      "release it was built from")
    engine = EngineSpec(kind=kind, python=python, native=tuple(natives), claim=claim)

    ax = rd.table(top.get("axes"), "axes", "axes")
    mapped, flags = _flag_axes(rd, ax)

    def axis(name: str, kind: type, default: tuple, check) -> tuple:
        if name in mapped:                   # given as a flag ([axes.flags] "--io-threads" = […])
            return mapped[name]
        return tuple(dict.fromkeys(rd.list_of(ax, name, "axes", kind, default, check=check)))

    cache_values = []
    for i, v in enumerate(rd.list_of(ax, "cache_mb", "axes", (int, str, float, bool), Axes.cache_mb)):
        try:
            cache_values.append(parse_cache_value(v))
        except ValueError as e:
            raise rd.fail(f"axes.cache_mb[{i}]" if isinstance(ax.get("cache_mb"), list) else "axes.cache_mb",
                          str(e)) from None
    if PLANNER in cache_values and kind == "python" and not claim_has_planner(claim):
        raise rd.fail("axes.cache_mb", f"\"{PLANNER}\" runs the engine's own planner, which bmoe-py has only when "
                                       f"it speaks bmoe-cli {NEXT} or later: set engine.claim = \"{NEXT}\"")
    axes = Axes(
        cache_mb=tuple(dict.fromkeys(cache_values)),
        cache_ceil_mb=tuple(dict.fromkeys(rd.list_of(ax, "cache_ceil_mb", "axes", int, Axes.cache_ceil_mb,
                                                     check=_at_least(0, INT_MAX)))),
        cache_floor_mb=rd.scalar(ax, "cache_floor_mb", "axes", int, Axes.cache_floor_mb,
                                 check=_at_least(0, INT_MAX)),
        dense_weights=axis("dense_weights", str, Axes.dense_weights, _dense_problem),
        n_expert_used=axis("n_expert_used", int, Axes.n_expert_used, _AXIS_CHECKS["n_expert_used"][1]),
        io_threads=axis("io_threads", int, Axes.io_threads, _AXIS_CHECKS["io_threads"][1]),
        threads=mapped.get("threads", ()),
        flags=flags,
        apps=tuple(dict.fromkeys(apps_load(v) for v in rd.list_of(ax, "apps", "axes", str, (), check=_apps_problem))),
        run_as=tuple(dict.fromkeys(rd.list_of(ax, "run_as", "axes", str, (), check=_run_as_problem))),
    )

    r = rd.table(top.get("run"), "run", "run")
    d = RunSettings()
    run = RunSettings(
        n_predict=rd.scalar(r, "n_predict", "run", int, d.n_predict, check=_at_least(1, INT_MAX)),
        prompt=rd.scalar(r, "prompt", "run", str, d.prompt, check=lambda v: None if v else "is empty"),
        threads=_threads_value(rd.scalar(r, "threads", "run", (int, str), d.threads, check=_threads_problem)),
        host_threads_max=rd.scalar(r, "host_threads_max", "run", int, d.host_threads_max, check=_at_least(1, 256)),
        engine_args=rd.list_of(r, "engine_args", "run", str, (), check=flag_rules.arg_problem, allow_scalar=False,
                               allow_empty=True),
        repeats=rd.scalar(r, "repeats", "run", int, d.repeats, check=_at_least(1, MAX_CELLS)),
        reverse_pass=rd.scalar(r, "reverse_pass", "run", bool, d.reverse_pass),
        route_trace=rd.scalar(r, "route_trace", "run", bool, d.route_trace),
        probe_tokens=rd.scalar(r, "probe_tokens", "run", int, d.probe_tokens, check=_at_least(0, INT_MAX)),
        o_direct=rd.scalar(r, "o_direct", "run", bool, d.o_direct),
        timeout_s=rd.scalar(r, "timeout_s", "run", float, d.timeout_s, check=_above(0, MAX_SECONDS)),
        device_timeout_s=rd.scalar(r, "device_timeout_s", "run", float, d.device_timeout_s,
                                   check=_above(0, MAX_SECONDS)),
        retries=rd.scalar(r, "retries", "run", int, d.retries, check=_at_least(0, MAX_RETRIES)),
        retry_backoff_s=rd.scalar(r, "retry_backoff_s", "run", float, d.retry_backoff_s,
                                  check=_at_least(0, MAX_BACKOFF_S)),
        lock_wait_s=rd.scalar(r, "lock_wait_s", "run", float, d.lock_wait_s, check=_at_least(0, MAX_SECONDS)),
        oom_score_adj=rd.scalar(r, "oom_score_adj", "run", int, d.oom_score_adj,
                                check=_at_least(0, OOM_SCORE_ADJ_MAX)),
        turns=rd.scalar(r, "turns", "run", int, d.turns, check=_at_least(1, MAX_TURNS)),
        idle_s=rd.scalar(r, "idle_s", "run", float, d.idle_s, check=_at_least(0, MAX_SECONDS)),
        gap_apps=apps_load(rd.scalar(r, "gap_apps", "run", str, d.gap_apps, check=_apps_problem)),
        quality=rd.scalar(r, "quality", "run", str, d.quality, check=_quality_problem),
    )
    if run.turns == 1 and (run.idle_s or run.gap_apps):
        raise rd.fail("run.idle_s" if run.idle_s else "run.gap_apps",
                      "has no gap to apply to: set run.turns to 2 or more (a session cell)")
    if (run.turns - 1) * run.idle_s >= run.timeout_s:
        raise rd.fail("run.timeout_s", f"{number_text(run.timeout_s)} s is not longer than the session's gaps "
                                       f"({run.turns - 1} x {number_text(run.idle_s)} s of run.idle_s)")
    for flag, _values in flags:
        if flag in run.engine_args:
            raise rd.fail(_flag_key(flag), "is in run.engine_args too: give it in one place")
    g = rd.table(top.get("gate"), "gate", "gate")
    dg = GateSettings()
    gate = GateSettings(
        cpu_temp_max_c=rd.scalar(g, "cpu_temp_max_c", "gate", float, dg.cpu_temp_max_c,
                                 check=_at_least(*CPU_TEMP_RANGE_C)),
        mem_available_min_mb=rd.scalar(g, "mem_available_min_mb", "gate", int, dg.mem_available_min_mb,
                                       check=_at_least(0, MAX_MEM_MB)),
        max_wait_s=rd.scalar(g, "max_wait_s", "gate", float, dg.max_wait_s, check=_at_least(0, MAX_SECONDS)),
        poll_s=rd.scalar(g, "poll_s", "gate", float, dg.poll_s, check=_above(0, MAX_BACKOFF_S)),
    )
    pl = rd.table(top.get("plan"), "plan", "plan")
    dp = PlanSettings()
    plan = PlanSettings(
        adaptive=rd.scalar(pl, "adaptive", "plan", bool, dp.adaptive),
        resolution_mb=rd.scalar(pl, "resolution_mb", "plan", int, dp.resolution_mb, check=_at_least(0, INT_MAX)),
        max_error_pct=rd.scalar(pl, "max_error_pct", "plan", float, dp.max_error_pct, check=_above(0, 1000.0)),
    )
    for key in ("resolution_mb", "max_error_pct"):
        if key in pl and not plan.adaptive:
            raise rd.fail(f"plan.{key}", "applies to an adaptive plan only: set plan.adaptive = true (sweep "
                                         "--adaptive)")
    if plan.adaptive and run.reverse_pass:
        raise rd.fail("run.reverse_pass", "an adaptive plan decides each budget from the runs before it: it has no "
                                          "whole sequence to run again backwards (leave plan.adaptive or this out)")
    campaign = Campaign(name=name.strip(), devices=all_devices, models=tuple(models), engine=engine, axes=axes,
                        run=run, gate=gate, plan=plan, adb=tuple(dict.fromkeys(servers)), connect=connect,
                        virtual_home=virtual_home, source=source)
    if problem := run_as_devices_problem(axes.run_as, all_devices):
        raise rd.fail("axes.run_as", problem)
    if any(axes.apps) and "local" in all_devices:
        raise rd.fail("axes.apps", "other apps run on phones (their lmkd decides who is killed): not on local")
    if run.gap_apps and "local" in all_devices:
        raise rd.fail("run.gap_apps", "other apps run on phones (their lmkd decides who is killed): not on local")
    check_cell_bound(campaign)
    return campaign


def _fleet(rd: _Reader, fleet: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...], list[AdbServer],
                                                           str | None]:
    """[fleet]: (every device, the endpoints to `adb connect`, the adb servers, virtual_home). A
    fleet naming no device takes $ANDROID_SERIAL; adb servers not given come from adb's
    environment (devices.adb.default_server), and only when a device needs one."""
    if "devices" in fleet or "connect" in fleet:
        devices = rd.list_of(fleet, "devices", "fleet", str, (), check=_device_problem, allow_empty=True)
    else:
        serial = default_serial()
        if serial is None:
            raise rd.fail("fleet.devices", f"missing: name at least one device (local, a serial, virtual:NAME), "
                                           f"or set {ENV_SERIAL}")
        devices = (rd.value(serial, ENV_SERIAL, str, check=_device_problem),)
    connect = rd.list_of(fleet, "connect", "fleet", str, (), allow_empty=True,
                         check=lambda v: None if _ENDPOINT.match(v) else f"{json.dumps(v)} is not HOST:PORT")
    servers = []
    raw_adb = fleet.get("adb", [])
    if isinstance(raw_adb, dict):
        raw_adb = [raw_adb]
    if not isinstance(raw_adb, list):
        raise rd.fail("fleet.adb", f"expected [[fleet.adb]] tables, got {describe_value(raw_adb)}")
    for i, entry in enumerate(raw_adb):
        key = f"fleet.adb[{i}]"
        t = rd.table(entry, key, "fleet.adb")
        host = rd.scalar(t, "host", key, str, "127.0.0.1", check=lambda v: None if v else "is empty")
        port = rd.scalar(t, "port", key, int, DEFAULT_ADB_PORT, check=_in_range(1, 65535))
        servers.append(AdbServer(host, port))
    virtual_home = rd.scalar(fleet, "virtual_home", "fleet", str, None)
    if virtual_home is not None:
        virtual_home = str(Path(os.path.abspath(rd.base_dir / os.path.expanduser(virtual_home))))
    all_devices = tuple(dict.fromkeys(list(devices) + list(connect)))
    if not all_devices:
        raise rd.fail("fleet.devices", "is empty: name at least one device")
    if any(d != LOCAL for d in all_devices) and not servers:
        try:
            servers.append(default_server())
        except DeviceError as e:         # a malformed ADB_SERVER_SOCKET …: the variable is named
            raise rd.fail("", f"{e} (it names the adb server where [[fleet.adb]] or --adb gives none)") from None
    return all_devices, connect, servers, virtual_home


def libs_beside(cli: str) -> tuple[str, ...]:
    """The shared libraries a build keeps beside its binary (bmoe-cli's RUNPATH is $ORIGIN):
    every lib*.so* file in the binary's folder. They go to the device with it."""
    folder = Path(cli).parent
    return tuple(str(p) for p in sorted(folder.glob("lib*.so*")) if p.is_file())


def _device_path(rd: _Reader, text: str, key: str) -> str:
    """The path of a `device:PATH` model: absolute, normalised; on `local` a path on this host."""
    path = text[len(DEVICE_PREFIX):]
    if not path.startswith("/"):
        raise rd.fail(key, f"{json.dumps(text)}: a device path is absolute, e.g. device:/sdcard/Download/model.gguf")
    if any(ord(c) < 32 for c in path):
        raise rd.fail(key, f"{json.dumps(text)}: a device path cannot hold control characters")
    path = posixpath.normpath(path)
    if path in ("/", "//"):
        raise rd.fail(key, f"{json.dumps(text)}: names no file")
    return path


def _threads_problem(value: int | str) -> str | None:
    if isinstance(value, str):
        return None if value.strip().lower() == THREADS_AUTO else \
            f"expected an integer or \"{THREADS_AUTO}\" (the device's cores), got {json.dumps(value)}"
    return _at_least(1, MAX_THREADS)(value)


def _threads_value(value: int | str) -> int | str:
    return THREADS_AUTO if isinstance(value, str) else value


def _quality_problem(value: str) -> str | None:
    return None if value in QUALITY else f"expected one of {', '.join(QUALITY)}, got {json.dumps(value)}"


def _run_as_problem(value: str) -> str | None:
    return None if value in RUN_AS else f"expected one of {', '.join(RUN_AS)}, got {value!r}"


def run_as_devices_problem(run_as: Sequence[str], devices: Sequence[str]) -> str | None:
    """An app value of axes.run_as needs virtual phones only: a real phone's shell cannot make an app
    run a command (the engine runs in the app only as the app's own child)."""
    if not any(v in RUN_AS_APP for v in run_as):
        return None
    other = [d for d in devices if not d.startswith(VIRTUAL_PREFIX)]
    return (f"{', '.join(v for v in run_as if v in RUN_AS_APP)} runs the engine as the app, which only a virtual "
            f"phone can (`am run-as-app`); {', '.join(other)} is not one" if other else None)


def apps_load(value: str) -> str:
    """One value of the apps axis as a cell records it: its items joined by "+" ("" for none)."""
    return "+".join(a.strip() for a in value.split("+") if a.strip() and a.strip() != "none")


def _apps_problem(value: str) -> str | None:
    from devices.android import AppSpecError, parse_load

    try:
        parse_load(value)
    except AppSpecError as e:
        return f"{e} (several apps in one value: joined by +; none: no apps)"
    return None


def _claim_problem(value: str) -> str | None:
    try:
        claimed({CLAIM_ENV: value})
    except ValueError as e:
        return str(e)
    return None


def claim_has_planner(claim: str) -> bool:
    """Does bmoe-py, claiming this release ("" = its default), take the planner's flags?"""
    return AUTO.taken_by(BMOE_PY, claimed({CLAIM_ENV: claim}))


def _dense_problem(value: str) -> str | None:
    return None if value in DENSE_MODES else f"must be one of {', '.join(DENSE_MODES)}, got {json.dumps(value)}"


# the axes a flag can map onto (harness.campaign.flags.MAPPED): value type and check, as the axis itself reads them
_AXIS_CHECKS: dict[str, tuple[type | tuple[type, ...], Callable[[Any], str | None]]] = {
    "threads": ((int, str), _threads_problem),
    "n_expert_used": (int, _at_least(0, MAX_EXPERTS)),
    "io_threads": (int, _in_range(1, IO_THREADS_MAX)),
    "dense_weights": (str, _dense_problem),
}


def _flag_key(name: str) -> str:
    return f"axes.flags.{json.dumps(name)}"


def _flag_axes(rd: _Reader, ax: Mapping[str, Any]) -> tuple[dict[str, tuple], tuple]:
    """[axes.flags]: (the axes some flags map onto -> their values, every other flag with its
    values). A flag the harness sets, or that is not a flag, is refused naming its key."""
    raw = ax.get("flags", {})
    if not isinstance(raw, dict):
        raise rd.fail("axes.flags", f"expected a table of \"--flag\" = [values], got {describe_value(raw)}")
    mapped: dict[str, tuple] = {}
    flags = []
    for name, given in raw.items():
        key = _flag_key(name)
        problem = flag_rules.name_problem(name)
        if problem:
            raise rd.fail(key, problem)
        values = given if isinstance(given, list) else [given]
        if not values:
            raise rd.fail(key, "is empty: give at least one value (false leaves the flag out)")
        target = flag_rules.MAPPED.get(name)
        if target is None:
            for i, v in enumerate(values):
                problem = flag_rules.value_problem(v)
                if problem:
                    raise rd.fail(f"{key}[{i}]", problem)
            flags.append((name, flag_rules.unique_values(values)))
            continue
        if target in mapped or target in ax:
            where = "the -t axis" if target == "threads" else f"axes.{target}"
            raise rd.fail(key, f"sets {where} twice: give its values in one place")
        kind, check = _AXIS_CHECKS[target]
        typed = [rd.value(v, f"{key}[{i}]", kind, check) for i, v in enumerate(values)]
        if target == "threads":
            typed = [_threads_value(v) for v in typed]
        mapped[target] = tuple(dict.fromkeys(typed))
    return mapped, tuple(flags)


def _device_problem(text: str) -> str | None:
    if not text.strip() or text != text.strip() or any(c.isspace() or not c.isprintable() for c in text):
        return f"{json.dumps(text)} is not a device (local, a serial, virtual:NAME or HOST:PORT)"
    if text.startswith(VIRTUAL_PREFIX) and not _PHONE_NAME.match(text[len(VIRTUAL_PREFIX):]):
        return f"{json.dumps(text)}: a virtual phone name uses letters, digits, '_', '.', '-'"
    return None


def load_campaign(path: str | os.PathLike) -> Campaign:
    """Read and validate a campaign file. Nothing is written; errors are one line."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise CampaignError(f"{p}: cannot read: {e.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8").removeprefix("\ufeff"))   # an editor's UTF-8 BOM
    except UnicodeDecodeError:
        raise CampaignError(f"{p}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise CampaignError(f"{p}: not valid TOML: {e}") from None
    except ValueError as e:     # tomllib lets int()'s own refusal of a 4,300-digit integer out
        raise CampaignError(f"{p}: not a campaign: {str(e)[:120]}") from None
    except RecursionError:      # [[[[…]]]] nested past Python's stack
        raise CampaignError(f"{p}: not a campaign: arrays or tables nested too deep") from None
    stem = p.stem if p.stem != "campaign" else p.resolve().parent.name
    return parse_campaign(data, source=str(p), base_dir=p.resolve().parent, default_name=stem or "campaign")

