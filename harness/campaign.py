"""The campaign file: what to sweep, on which devices, with which engine (TOML, `version = 1`).

A campaign file is read strictly: an unknown key, a wrong type, a missing model, an unknown
device or `auto` glued to a number is a one-line CampaignError naming the key, raised before
anything is written. `Campaign.to_toml()` writes the resolved campaign (every default filled in,
paths absolute) that a campaign directory keeps as `campaign.toml`; reading it back gives the same
campaign. docs/campaigns.md shows a complete file.

Device strings: `local` (this host), `virtual:NAME` (a virtual phone, found through its manager
and reached over adb like a real phone), `HOST:PORT` endpoints listed under `fleet.connect`
(`adb connect`ed first), and any other string is an adb serial on one of the `[[fleet.adb]]`
servers.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
import shlex
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devices.adb import DEFAULT_ADB_PORT, AdbServer
from devices.adb import WORK_DIR as ADB_WORK_DIR
from devices.base import DeviceIdentity
from engine.budget import CACHE_MIN_MB, IO_THREADS_MAX
from engine.errors import BmoeError
from engine.safetext import one_line
from harness import flags as flag_rules
from harness.defaults import PYTHON_ENGINE, SWEEP

FORMAT_VERSION = 1
LOCAL = "local"
VIRTUAL_PREFIX = "virtual:"
DEVICE_PREFIX = "device:"   # a model already on the devices (at that path on each)
HOST_BUILD = "host"         # the engine.native entry for this host and virtual phones
DENSE_MODES = ("mmap", "warm", "anon", "ahwb")  # ahwb: Android only; elsewhere both engines fail at load
ENGINE_KINDS = ("python", "native")
# cache_mb values that are not a budget: no --moe-stream (the mmap baseline), or no --moe-stream
# and --no-mmap (every weight resident in anonymous memory; bmoe-py only).
NO_STREAM_MODES = ("mmap", "resident")
THREADS_AUTO = "auto"       # run.threads: the device's online cores …
THREADS_AUTO_MAX = 4        # … at most this many (bmoe-cli's own default)
PROBE_TOKENS_MAX = 64       # the default knee probe is short even when the sweep's runs are long
# budgets relative to a measure of the model: its token cycle (from the header) or the knee of the
# LRU curve replayed from a route-traced probe run on the device (harness.probe)
_RELATIVE_RE = re.compile(r"^(cycle|knee)\s*(?:\*\s*(\d+(?:\.\d+)?|\.\d+))?$")
_PHONE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# Bounds every numeric setting is checked against when the file is read (docs/campaigns.md).
# A plan is bounded before it is expanded: 10,000 runs are weeks of phone time, and a larger
# matrix only costs memory and minutes to refuse later.
MAX_CELLS = 10_000
INT_MAX = 2 ** 31 - 1           # the engine reads its integer flags with atoi into an int
MAX_SECONDS = 30 * 24 * 3600    # timeouts and waits: 30 days
MAX_RETRIES = 20                # the backoff doubles per retry
MAX_BACKOFF_S = 3600.0
MAX_FACTOR = 1000.0             # cycle*F, knee*F
MAX_EXPERTS = 65536             # as route traces are read (docs/decisions.md)
MAX_THREADS = 1024
CPU_TEMP_RANGE_C = (-50.0, 200.0)
MAX_MEM_MB = 2 ** 30            # 1 PiB of MemAvailable
MESSAGE_CHARS = 500
_ENDPOINT = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")


class CampaignError(BmoeError):
    """A campaign file (or sweep) is wrong: one line naming the key and what is wrong with it.

    Keys and values come from the file: the message is made one terminal-safe line here, once
    for every complaint (control characters escaped, at most MESSAGE_CHARS)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(one_line(str(message), MESSAGE_CHARS))


def fleet_home() -> Path:
    """~/.bmoe-fleet, or $BMOE_FLEET_HOME (where locks, staged engines and virtual phones live)."""
    return Path(os.environ.get("BMOE_FLEET_HOME", Path.home() / ".bmoe-fleet"))


def safe_id(text: str) -> str:
    """A device or model string made safe as one path component (it is data, never a path)."""
    out = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.")
    return out[:80] or "x"


def default_adb_server() -> AdbServer:
    port = os.environ.get("ANDROID_ADB_SERVER_PORT", "")
    return AdbServer("127.0.0.1", int(port) if port.isdigit() else DEFAULT_ADB_PORT)


# ── the resolved campaign ──────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: str                       # absolute: on this host, or on every device when on_device
    on_device: bool = False         # `device:PATH`: already on the devices, never pushed (harness.device_models)

    @property
    def spec(self) -> str:
        """As a campaign file writes it."""
        return DEVICE_PREFIX + self.path if self.on_device else self.path


@dataclass(frozen=True)
class NativeBuild:
    abi: str                        # arm64-v8a, x86_64 … as the device reports it, or "host"
    cli: str                        # bmoe-cli on this host (absolute)
    libs: tuple[str, ...] = ()      # shared libraries pushed next to it (default: the lib*.so* beside cli)


@dataclass(frozen=True)
class EngineSpec:
    kind: str = "python"            # python = bmoe-py (this project's engine) | native = bmoe-cli
    python: str = sys.executable    # interpreter that runs bmoe-py on a device (a path the device sees)
    native: tuple[NativeBuild, ...] = ()

    @property
    def stray_names(self) -> tuple[str, ...]:
        """Process names (comm) an engine of this kind runs under, for stray stopping."""
        return ("bmoe-py",) if self.kind == "python" else ("bmoe-cli",)

    @property
    def staged_name(self) -> str:
        return "bmoe-py" if self.kind == "python" else "bmoe-cli"

    def build_for(self, abi: str) -> NativeBuild | None:
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
        return next((b for key in self.build_keys(identity) if (b := self.build_for(key)) is not None), None)

    def missing_build(self, identity: DeviceIdentity, device: str) -> str:
        """Why no engine.native entry serves a device (one line, naming the key to add)."""
        keys = self.build_keys(identity)
        runs = (f"ABI {identity.abi}, runs this host's {identity.host_abi} binaries" if identity.host_abi
                else f"ABI {identity.abi}")
        have = ", ".join(b.abi for b in self.native) or "none"
        return (f"engine.native: no build for device {device} ({runs}); have {have}: add "
                f"[engine.native.{keys[0]}] cli = \"…\"")


@dataclass(frozen=True)
class Axes:
    cache_mb: tuple[int | str, ...] = SWEEP.cache_mb
    cache_ceil_mb: tuple[int, ...] = SWEEP.cache_ceil_mb   # applies to `auto` values only
    cache_floor_mb: int = 1536
    dense_weights: tuple[str, ...] = SWEEP.dense_weights
    n_expert_used: tuple[int, ...] = SWEEP.n_expert_used   # 0 = the model's own top-k
    io_threads: tuple[int, ...] = SWEEP.io_threads
    # `-t` as an axis ([axes.flags] "-t" = [1, 2]); empty: every cell takes run.threads
    threads: tuple[int | str, ...] = ()
    # any other engine flag as an axis, in file order: (flag, values); harness.flags renders them
    flags: tuple[tuple[str, tuple[bool | int | float | str, ...]], ...] = ()

    def flag_table(self) -> dict[str, list]:
        """[axes.flags] as a file writes it: the -t axis under "-t", then every other flag."""
        return ({"-t": list(self.threads)} if self.threads else {}) | {n: list(v) for n, v in self.flags}


@dataclass(frozen=True)
class RunSettings:
    n_predict: int = SWEEP.n_predict
    prompt: str = "The capital of Japan is"
    # -t: an integer, or "auto" = the device's online cores (at most THREADS_AUTO_MAX), read on
    # the device right before each run (harness.cpushare) and recorded; the plan keeps "auto"
    threads: int | str = SWEEP.threads
    engine_args: tuple[str, ...] = ()            # passed through to every cell (harness.flags)
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
    retries: int = 3
    retry_backoff_s: float = 2.0
    lock_wait_s: float = 0.0


@dataclass(frozen=True)
class GateSettings:
    cpu_temp_max_c: float = 45.0
    mem_available_min_mb: int = 0
    max_wait_s: float = 300.0
    poll_s: float = 2.0

    @property
    def cpu_temp_max_mc(self) -> int:
        return int(round(self.cpu_temp_max_c * 1000))

    @property
    def mem_available_min_kb(self) -> int:
        return self.mem_available_min_mb * 1024


@dataclass(frozen=True)
class Campaign:
    name: str
    devices: tuple[str, ...]
    models: tuple[ModelSpec, ...]
    engine: EngineSpec = EngineSpec()
    axes: Axes = Axes()
    run: RunSettings = RunSettings()
    gate: GateSettings = GateSettings()
    adb: tuple[AdbServer, ...] = ()
    connect: tuple[str, ...] = ()
    virtual_home: str | None = None
    source: str = field(default="", compare=False)   # where it was read from, for messages

    def model(self, name: str) -> ModelSpec:
        return next(m for m in self.models if m.name == name)

    def to_dict(self) -> dict[str, Any]:
        """The resolved campaign as TOML-ready data (no None: TOML has no null)."""
        fleet: dict[str, Any] = {"devices": list(self.devices), "connect": list(self.connect)}
        if self.virtual_home is not None:
            fleet["virtual_home"] = self.virtual_home
        fleet["adb"] = [{"host": s.host, "port": s.port} for s in self.adb]
        engine: dict[str, Any] = {"kind": self.engine.kind, "python": self.engine.python}
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
                     **({"flags": a.flag_table()} if a.threads or a.flags else {})},
            "run": {k: list(v) if isinstance(v, tuple) else v
                    for k, v in ((k, getattr(r, k)) for k in RunSettings.__dataclass_fields__)},
            "gate": {k: getattr(g, k) for k in GateSettings.__dataclass_fields__},
        }

    def to_toml(self) -> str:
        data = self.to_dict()
        text = dumps_toml(data)
        if tomllib.loads(text) != data:  # the writer is ours: prove it on every write
            raise CampaignError("internal error: the campaign does not survive a TOML round trip")
        return text


# ── reading ────────────────────────────────────────────────────────────────────────────────────

_SCHEMA: dict[str, tuple[str, ...]] = {
    "": ("version", "name", "fleet", "models", "engine", "axes", "run", "gate"),
    "fleet": ("devices", "connect", "adb", "virtual_home"),
    "fleet.adb": ("host", "port"),
    "engine": ("kind", "python", "native"),
    "engine.native.*": ("cli", "libs"),
    "axes": ("cache_mb", "cache_ceil_mb", "cache_floor_mb", "dense_weights", "n_expert_used", "io_threads", "flags"),
    "run": tuple(RunSettings.__dataclass_fields__),
    "gate": tuple(GateSettings.__dataclass_fields__),
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
            raise self.fail(key, f"expected a table, got {_describe(data)}")
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
                raise self.fail(full, f"must be a finite number, got {_num(value)}")
            value, ok = float(value), True
        if not ok:
            raise self.fail(full, f"expected {what or _kind_name(kinds)}, got {_describe(value)}")
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
                raise self.fail(full, f"expected a list, got {_describe(raw)}")
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
        except OSError as e:                     # a name too long, a loop of links …
            raise self.fail(key, f"{(e.strerror or str(e)).lower()}: {one_line(str(p), 120)}") from None
        if must_exist and not exists:
            raise self.fail(key, f"no such file {one_line(str(p), 240)}")
        return str(p)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _kind_name(kinds: tuple) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({_num(value)})"
    if isinstance(value, float):
        return f"a number ({value:g})"
    if isinstance(value, str):
        return f"a string ({json.dumps(value[:60] + ('…' if len(value) > 60 else ''))})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def _at_least(n: float, most: float | None = None):
    """A number >= n (and <= most when given): every numeric key has an upper bound too."""
    def check(v: float) -> str | None:
        if v < n:
            return f"must be at least {_num(n)}, got {_num(v)}"
        if most is not None and v > most:
            return f"must be at most {_num(most)}, got {_num(v)}"
        return None
    return check


def _above(n: float, most: float):
    return lambda v: f"must be above {_num(n)}, got {_num(v)}" if not v > n else (
        f"must be at most {_num(most)}, got {_num(v)}" if v > most else None)


def _num(v: float) -> str:
    """A number for a message: a 400-digit integer is shown by its size, not its digits."""
    text = f"{v:g}" if isinstance(v, float) else str(v) if abs(v) < 10 ** 30 else f"a {len(str(abs(v)))}-digit number"
    return text


def _in_range(lo: int, hi: int):
    return lambda v: None if lo <= v <= hi else f"must be in {lo}..{hi}, got {_num(v)}"


def parse_cache_value(value: int | str) -> int | str:
    """One cache_mb axis value, normalised: an int MiB, "auto", "cycle*F", "knee*F", "mmap" or "resident".
    Raises ValueError, whose text is the problem, for anything else (the caller adds the key)."""
    if isinstance(value, bool):
        raise ValueError(f"expected 0, a MiB number, \"auto\", \"cycle*F\", \"mmap\" or \"resident\", "
                         f"got {_describe(value)}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a budget cannot be negative, got {_num(value)}")
        if value > INT_MAX:
            raise ValueError(f"a budget is at most {INT_MAX} MiB (the engine's int), got {_num(value)}")
        return value
    if isinstance(value, float):
        raise ValueError(f"budgets are whole MiB, got {value:g}; write an integer or \"cycle*F\"")
    if not isinstance(value, str):
        raise ValueError(f"expected a budget, got {_describe(value)}")
    text = value.strip().lower()
    if "auto" in text and re.search(r"\d", text):
        raise ValueError(f"{json.dumps(value)} mixes auto with a number (the engine refuses both at once); "
                         "write \"auto\" (with cache_ceil_mb for a cap) or the number alone")
    if text == "auto" or text in NO_STREAM_MODES:
        return text
    if re.fullmatch(r"[0-9]{1,12}", text):
        return parse_cache_value(int(text))
    m = _RELATIVE_RE.match(text) if len(text) <= 40 else None
    if m:
        factor = float(m[2]) if m[2] else 1.0
        if factor > MAX_FACTOR:
            raise ValueError(f"{json.dumps(value)}: the factor is at most {MAX_FACTOR:g}")
        if m[1] == "knee" and factor == 0:
            raise ValueError(f"{json.dumps(value)}: a knee budget needs a factor above 0 (write 0 for no cache)")
        return f"{m[1]}*{format(factor, '.12g')}"
    raise ValueError(f"{json.dumps(value[:40] + ('…' if len(value) > 40 else ''))} is not a budget: use 0, a MiB number, \"auto\", \"cycle*F\" "
                     "(F times the model's token cycle), \"knee*F\" (F times the knee of the replayed LRU "
                     "curve), \"mmap\" or \"resident\"")


def cycle_factor(spec: str) -> float:
    """The F of a "cycle*F" or "knee*F" budget."""
    return float(spec.split("*", 1)[1])


def is_knee(spec: int | str) -> bool:
    return isinstance(spec, str) and spec.startswith("knee")


def budget_from_cycle(cycle_mib: float, factor: float) -> int:
    """Whole MiB on the side of the cycle the factor asks for: under it rounds down, at or over it
    rounds up (so cycle*0.9 is really under and cycle*1.0 really holds a cycle). Never 0 (off)
    unless the factor is 0."""
    if factor == 0:
        return 0
    raw = cycle_mib * factor
    mib = math.floor(raw) if factor < 1 else math.ceil(raw - 1e-9)
    return max(1, mib)


def needs_force(cache_mb: int) -> bool:
    """The engine refuses 1..cache_min_mb-1 without --force-cache (the pathological band)."""
    return 0 < cache_mb < CACHE_MIN_MB


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
        raise rd.fail("version", f"{_num(version)} is newer than this bmoe-fleet reads ({FORMAT_VERSION}); upgrade it")
    if version < 1:
        raise rd.fail("version", f"must be {FORMAT_VERSION}, got {_num(version)}")
    name = rd.scalar(top, "name", "", str, default_name,
                     check=lambda v: None if v.strip() else "is empty")

    fleet = rd.table(top.get("fleet"), "fleet", "fleet")
    if "devices" not in fleet and "connect" not in fleet:
        raise rd.fail("fleet.devices", "missing: name at least one device (local, a serial, virtual:NAME)")
    devices = rd.list_of(fleet, "devices", "fleet", str, (), check=_device_problem, allow_empty=True)
    connect = rd.list_of(fleet, "connect", "fleet", str, (), allow_empty=True,
                         check=lambda v: None if _ENDPOINT.match(v) else f"{json.dumps(v)} is not HOST:PORT")
    servers = []
    raw_adb = fleet.get("adb", [])
    if isinstance(raw_adb, dict):
        raw_adb = [raw_adb]
    if not isinstance(raw_adb, list):
        raise rd.fail("fleet.adb", f"expected [[fleet.adb]] tables, got {_describe(raw_adb)}")
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
    needs_adb = any(d != LOCAL for d in all_devices)
    if needs_adb and not servers:
        servers.append(default_adb_server())

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
        raise rd.fail("engine.native", f"expected tables [engine.native.ABI], got {_describe(raw_native)}")
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
    engine = EngineSpec(kind=kind, python=python, native=tuple(natives))

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
    )

    r = rd.table(top.get("run"), "run", "run")
    d = RunSettings()
    run = RunSettings(
        n_predict=rd.scalar(r, "n_predict", "run", int, d.n_predict, check=_at_least(1, INT_MAX)),
        prompt=rd.scalar(r, "prompt", "run", str, d.prompt, check=lambda v: None if v else "is empty"),
        threads=_threads_value(rd.scalar(r, "threads", "run", (int, str), d.threads, check=_threads_problem)),
        engine_args=rd.list_of(r, "engine_args", "run", str, (), check=flag_rules.arg_problem, allow_scalar=False,
                               allow_empty=True),
        repeats=rd.scalar(r, "repeats", "run", int, d.repeats, check=_at_least(1, MAX_CELLS)),
        reverse_pass=rd.scalar(r, "reverse_pass", "run", bool, d.reverse_pass),
        route_trace=rd.scalar(r, "route_trace", "run", bool, d.route_trace),
        probe_tokens=rd.scalar(r, "probe_tokens", "run", int, d.probe_tokens, check=_at_least(0, INT_MAX)),
        o_direct=rd.scalar(r, "o_direct", "run", bool, d.o_direct),
        timeout_s=rd.scalar(r, "timeout_s", "run", float, d.timeout_s, check=_above(0, MAX_SECONDS)),
        retries=rd.scalar(r, "retries", "run", int, d.retries, check=_at_least(0, MAX_RETRIES)),
        retry_backoff_s=rd.scalar(r, "retry_backoff_s", "run", float, d.retry_backoff_s,
                                  check=_at_least(0, MAX_BACKOFF_S)),
        lock_wait_s=rd.scalar(r, "lock_wait_s", "run", float, d.lock_wait_s, check=_at_least(0, MAX_SECONDS)),
    )
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
    campaign = Campaign(name=name.strip(), devices=all_devices, models=tuple(models), engine=engine, axes=axes,
                        run=run, gate=gate, adb=tuple(dict.fromkeys(servers)), connect=connect,
                        virtual_home=virtual_home, source=source)
    check_cell_bound(campaign)
    return campaign


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
        raise CampaignError(f"{_src(campaign)}the campaign makes up to {total:,} cells ({product}); a campaign "
                            f"holds at most {MAX_CELLS:,}: split it, or reduce run.repeats or an axis")


def _engine_binary(text: str) -> str:
    path = os.path.abspath(os.path.expanduser(text))
    if not os.path.isfile(path):
        raise CampaignError(f"--engine: {json.dumps(text)} is neither {PYTHON_ENGINE} nor a file (give the path of "
                            "a bmoe-cli binary)")
    if not os.access(path, os.X_OK):
        raise CampaignError(f"--engine: {path} is not executable")
    return path


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


def _dense_problem(value: str) -> str | None:
    return None if value in DENSE_MODES else f"must be one of {', '.join(DENSE_MODES)}, got {json.dumps(value)}"


# the axes a flag can map onto (harness.flags.MAPPED): value type and check, as the axis itself reads them
_AXIS_CHECKS = {
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
        raise rd.fail("axes.flags", f"expected a table of \"--flag\" = [values], got {_describe(raw)}")
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
        data = tomllib.loads(raw.decode("utf-8"))
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


def campaign_from_options(devices: Sequence[str], models: Sequence[str], cache_mb: Sequence[str],
                          dense_weights: Sequence[str] = SWEEP.dense_weights,
                          n_expert_used: Sequence[int] = SWEEP.n_expert_used,
                          io_threads: Sequence[int] = SWEEP.io_threads,
                          cache_ceil_mb: Sequence[int] = SWEEP.cache_ceil_mb,
                          repeats: int = SWEEP.repeats, n_predict: int = SWEEP.n_predict, adb: Sequence[str] = (),
                          reverse_pass: bool = False, name: str = SWEEP.name, timeout_s: float | None = None,
                          extra: Mapping[str, Mapping[str, Any]] | None = None,
                          engine: str = SWEEP.engine, threads: str | None = None, engine_args: Sequence[str] = (),
                          flags: Sequence[str] = ()) -> Campaign:
    """The campaign a `bmoe-fleet sweep` command line means (validated like a file). `engine` is
    bmoe-py or the path of a bmoe-cli binary: its `host` build, the lib*.so* beside it included.
    A model `device:PATH` is already on the devices. `threads` is run.threads ("auto" or a
    number); each `engine_args` item is split like a shell line into run.engine_args; each
    `flags` item is `NAME=V1,V2`, an [axes.flags] entry with typed values (harness.flags)."""
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
    data: dict[str, Any] = {
        "version": FORMAT_VERSION, "name": name,
        "fleet": {"devices": list(devices), "adb": servers},
        "models": model_table,
        "axes": {"cache_mb": list(cache_mb), "dense_weights": list(dense_weights),
                 "n_expert_used": list(n_expert_used), "io_threads": list(io_threads),
                 "cache_ceil_mb": list(cache_ceil_mb)},
        "run": run,
    }
    if engine != PYTHON_ENGINE:
        data["engine"] = {"kind": "native", "native": {HOST_BUILD: {"cli": _engine_binary(engine)}}}
    _sweep_threads_and_flags(data, threads, engine_args, flags,
                             {"dense_weights": tuple(dense_weights) == SWEEP.dense_weights,
                              "n_expert_used": tuple(n_expert_used) == SWEEP.n_expert_used,
                              "io_threads": tuple(io_threads) == SWEEP.io_threads})
    for section, values in (extra or {}).items():
        data.setdefault(section, {}).update(values)
    if not servers:
        del data["fleet"]["adb"]
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


# ── where things live on a device (known without connecting) ──────────────────────────────────


def is_local(device: str) -> bool:
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


# ── TOML writing (the schema above only: scalars, lists of scalars, tables, flat table arrays) ─

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def dumps_toml(data: Mapping[str, Any]) -> str:
    lines: list[str] = []
    _emit_table(lines, [], data)
    return "\n".join(lines).lstrip("\n") + "\n"


def _emit_table(lines: list[str], path: list[str], table: Mapping[str, Any]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict) and not _is_table_array(v)}
    tables = {k: v for k, v in table.items() if isinstance(v, dict)}
    arrays = {k: v for k, v in table.items() if _is_table_array(v)}
    if path and (scalars or not (tables or arrays)):
        lines.append("")
        lines.append(f"[{'.'.join(_key(p) for p in path)}]")
    for k, v in scalars.items():
        lines.append(f"{_key(k)} = {_value(v)}")
    for k, v in tables.items():
        _emit_table(lines, path + [k], v)
    for k, items in arrays.items():
        for item in items:
            lines.append("")
            lines.append(f"[[{'.'.join(_key(p) for p in path + [k])}]]")
            for ik, iv in item.items():
                lines.append(f"{_key(ik)} = {_value(iv)}")


def _is_table_array(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _key(k: str) -> str:
    return k if _BARE_KEY.match(k) else _string(k)


def _string(s: str) -> str:
    # JSON's escapes are all valid TOML basic-string escapes; DEL must be escaped in TOML too.
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise CampaignError(f"cannot write {v} to TOML")
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise CampaignError(f"cannot write {type(v).__name__} to TOML")


# ── devices: from strings to things the runner can open ────────────────────────────────────────


@dataclass(frozen=True)
class DeviceRef:
    """A campaign device, resolved: how to reach it. Opening it gives a devices.base.Device."""

    spec: str                       # as the campaign names it
    kind: str                       # local | adb | virtual
    serial: str                     # the adb serial ("local" for this host)
    server: AdbServer | None = None
    phone_name: str | None = None   # virtual phones

    @property
    def device_id(self) -> str:
        return safe_id(self.spec.replace(":", "-"))

    @property
    def lock_key(self) -> str:
        """Two campaigns naming one phone differently (virtual:x, 127.0.0.1:PORT) share its serial."""
        return safe_id(self.serial.replace(":", "-"))

    @property
    def work_dir(self) -> str:
        return device_work_dir(self.spec)

    def open(self):
        if self.kind == "local":
            from devices.local import LocalDevice

            return LocalDevice(work_dir=self.work_dir)
        from devices.adb import AdbPhone

        return AdbPhone(self.serial, self.server, work_dir=self.work_dir)


def _device_key(campaign: Campaign, spec: str) -> str:
    if spec in campaign.connect:
        return f"fleet.connect[{campaign.connect.index(spec)}]"
    listed = [d for d in campaign.devices if d not in campaign.connect]
    return f"fleet.devices[{listed.index(spec)}]" if spec in listed else "fleet.devices"


def resolve_devices(campaign: Campaign) -> list[DeviceRef]:
    """Find every device of the campaign (adb servers asked, endpoints connected, virtual phones
    looked up). An absent device is a CampaignError naming its key; nothing is written."""
    from devices import adb as adbmod

    listings: dict[AdbServer, dict[str, str]] = {}

    def listing(server: AdbServer, key: str, spec: str) -> dict[str, str]:
        if server not in listings:
            try:
                adbmod.ensure_server(server)
                listings[server] = {d.serial: d.state for d in server.client().list()}
            except (BmoeError, *adbmod.TRANSPORT_ERRORS) as e:
                raise CampaignError(f"{_src(campaign)}{key}: unknown device {json.dumps(spec)}: adb server "
                                    f"{server.host}:{server.port} does not answer ({e})") from None
        return listings[server]

    def find(serial: str, key: str, spec: str) -> AdbServer | None:
        for server in campaign.adb:
            if listing(server, key, spec).get(serial) == "device":
                return server
        return None

    refs = []
    for spec in campaign.devices:
        key = _device_key(campaign, spec)
        if spec == LOCAL:
            refs.append(DeviceRef(spec, "local", LOCAL))
            continue
        if spec.startswith(VIRTUAL_PREFIX):
            from devices.virtual import manager

            name = spec[len(VIRTUAL_PREFIX):]
            try:
                info = manager.info(name, campaign.virtual_home)
            except BmoeError as e:
                raise CampaignError(f"{_src(campaign)}{key}: unknown device {json.dumps(spec)}: {e}") from None
            if not info.running or not info.serial:
                raise CampaignError(f"{_src(campaign)}{key}: virtual phone {name!r} is down; start it with "
                                    f"`bmoe-fleet virtual up --name {name} --ram …`")
            server = find(info.serial, key, spec)
            if server is None:
                server = campaign.adb[0]
                _connect(adbmod, server, info.serial, campaign, key, spec)
                listings.pop(server, None)
            refs.append(DeviceRef(spec, "virtual", info.serial, server, name))
            continue
        if spec in campaign.connect:
            server = find(spec, key, spec)
            if server is None:
                server = campaign.adb[0]
                listing(server, key, spec)
                _connect(adbmod, server, spec, campaign, key, spec)
                listings.pop(server, None)
            refs.append(DeviceRef(spec, "adb", spec, server))
            continue
        server = find(spec, key, spec)
        if server is None:
            seen = {s: st for srv in campaign.adb for s, st in listing(srv, key, spec).items()}
            where = ", ".join(f"{s.host}:{s.port}" for s in campaign.adb)
            if spec in seen:
                raise CampaignError(f"{_src(campaign)}{key}: device {json.dumps(spec)} is {seen[spec]} on adb "
                                    f"server {where} (not ready to run commands)")
            attached = ", ".join(sorted(seen)) or "none"
            raise CampaignError(f"{_src(campaign)}{key}: unknown device {json.dumps(spec)}: not attached to adb "
                                f"server {where} (attached: {attached})")
        refs.append(DeviceRef(spec, "adb", spec, server))
    return refs


def _src(campaign: Campaign) -> str:
    return f"{campaign.source}: " if campaign.source else ""


def _connect(adbmod, server: AdbServer, address: str, campaign: Campaign, key: str, spec: str) -> None:
    try:
        adbmod.connect(server, address)
    except BmoeError as e:
        raise CampaignError(f"{_src(campaign)}{key}: unknown device {json.dumps(spec)}: {e}") from None
