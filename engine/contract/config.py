"""bmoe-py's command line, parsed the way bmoe-cli 0.19.0 parses it (cli/main.cpp upstream).

The harness treats bmoe-py and bmoe-cli as interchangeable, so the flags, defaults, messages
and exit codes are the engine's, not click's: `unknown arg: X` + usage and exit 1, `missing
value for X` exit 1, a bad `--dense-weights` exit 2, `config error: …` exit 1.

A flag bmoe-cli knows but bmoe-py does not implement (`--chatml`, `--ubatch`, `--mtp`, …, listed in
`NOT_IMPLEMENTED`) is answered exactly as bmoe-cli answers an unknown flag, so a harness cell that
asks for one is a `config_error`, never a measurement of something else. docs/engine-contract.md
lists every flag. `--help` (usage) is written from the table too: the flags bmoe-py takes at the
release it claims, then the ones it refuses (tests/engine/test_help.py holds the two together).
"""

from __future__ import annotations

import math
import re
import sys
import textwrap
from dataclasses import dataclass

import numpy as np

from engine.contract import claim
from engine.errors import BmoeError
from engine.interface import flags as interface
from engine.interface.flags import (
    AUTO,
    CACHE_MB,
    DENSE_WEIGHTS,
    HELP,
    IO_THREADS,
    MODEL,
    MOE_STREAM,
    NO_PROBE_MEM,
    PROBE_IO,
    PROGRESS,
    THREADS,
    VERSION,
)
from engine.interface.flags import LIST_ARCHS as LIST_ARCHS_FLAG
from engine.interface.releases import NEXT, V0_19, Release
from engine.stream import drop, substitute
from engine.stream.budget import CACHE_MIN_MB, IO_THREADS_MAX, CacheFlags, ConfigError, validate
from engine.units import ascii_int

# ahwb is accepted as bmoe-cli accepts it; like bmoe-cli off Android, the load then fails.
DENSE_MODES = DENSE_WEIGHTS.choices
# bmoe-cli 0.19.0 flags bmoe-py does not implement: each is refused as an unknown flag would be.
NOT_IMPLEMENTED = interface.refused_by_bmoe_py(V0_19)
# Env overrides bmoe-cli honours for features bmoe-py lacks: refused at validation, never ignored.
_ENV_NOT_IMPLEMENTED = {"BMOE_OVERLAP": "moe.overlap", "BMOE_PREDICT_LOG": "moe.predict_log",
                        "BMOE_PREDICT_PREFETCH": "moe.predict_prefetch"}
# The architectures bmoe-py's forward pass runs (engine/gguf/hparams.py SUPPORTED_ARCHS).
LIST_ARCHS = ("qwen3moe", "gpt-oss")


class UsageExit(BmoeError):
    """Parsing stopped: print `message` (to stderr unless `to_stdout`) and exit with `code`."""

    def __init__(self, message: str, code: int, to_stdout: bool = False, with_usage: bool = False,
                 release: Release = claim.DEFAULT):
        super().__init__(message)
        self.code = code
        self.to_stdout = to_stdout
        self.with_usage = with_usage
        self.release = release     # the claimed release, whose usage text follows the message


@dataclass(frozen=True)
class RunConfig:
    model_path: str = ""
    prompt: str = "The capital of Japan is"
    prompt_tokens: tuple[int, ...] | None = None
    n_predict: int = 128
    n_threads: int = 4
    n_ctx: int = 2048
    n_expert_used: int = 0          # 0 = the model's own top-k
    temp: float = 0.0               # float32 values, as bmoe-cli holds them (`(float) atof`)
    top_k: int = 40
    top_p: float = 0.95
    seed: int = 0xFFFFFFFF          # the engine's "random per run" sentinel
    moe_stream: bool = False
    cache_mb: int = 0
    cache_auto: bool = False
    cache_floor_mb: int = 1536
    cache_ceil_mb: int = 0
    force_cache: bool = False
    io_threads: int = 4
    o_direct: bool = True
    dense_weights: str = "anon"
    prefetch: int = 0
    prefetch_sync: bool = False     # debug/tests: each speculative read completes on issue
    drop_cold_frac: float = 0.0     # --drop-cold-experts F (float32), lossy: engine.stream.drop
    drop_renorm: bool = True        # --drop-no-renorm: the kept weights are not rescaled after a drop
    drop_prefill: bool = False      # --drop-in-prefill
    substitute_lambda: float = 0.0  # --expert-substitute L (0.24; float32), lossy: engine.stream.substitute
    # --ppl FILE, --ppl-list FILE (0.24): score texts instead of generating (engine.app.ppl)
    ppl_path: str = ""
    ppl_list: str = ""
    ppl_step: bool = False          # --ppl-step: one token per decode
    ppl_choices: tuple[str, ...] = ()   # --ppl-choices A,B,…: each one's first-token log-probability
    ppl_skip: int = 8               # --ppl-skip N (NEXT; 8 before it): leading tokens not scored
    progress: bool = False
    session: bool = False           # --session: serve JSON requests from stdin (engine.app.protocol)
    no_mmap: bool = False           # resident runs: weights in anonymous memory, not a file map
    csv_path: str = ""
    route_trace_path: str = ""
    # Env overrides bmoe-py cannot honour ({"BMOE_OVERLAP": "moe.overlap"}), refused by validate_run.
    unimplemented_env: tuple[tuple[str, str], ...] = ()
    release: Release = claim.DEFAULT  # the bmoe-cli release bmoe-py speaks (BMOE_PY_RELEASE, engine.claim)
    # the planner (engine.plan.planner; bmoe-cli after 0.24, so only at that claim): --auto runs it, --plan
    # prints it and exits, --plan-explain prints it before the run, --no-probe-io skips the read probe
    auto_plan: bool = False
    plan_only: bool = False
    plan_explain: bool = False
    probe_io: bool = True
    probe_mem_when_decisive: bool = True   # --no-probe-mem: bmoe-py never probes memory, so a no-op
    typed: frozenset[str] = frozenset()    # the flags typed, by name: what the planner may not touch


# the help's layout, bmoe-py's own: a heading before a flag, by name
_HEADINGS = {MOE_STREAM.name: "MoE expert streaming:", AUTO.name: "The hardware planner (bmoe-cli after 0.24):"}
# what bmoe-py adds to a flag's meaning in the table, by name
_NOTES = {
    MODEL.name: "bmoe-py takes any of its shards",
    THREADS.name: "the output does not depend on it",
    CACHE_MB.name: f"a fixed budget is >= {CACHE_MIN_MB} unless forced",
    IO_THREADS.name: f"1..{IO_THREADS_MAX}",
    DENSE_WEIGHTS.name: "ahwb is Android-only: the load fails here, as bmoe-cli's does",
    NO_PROBE_MEM.name: "bmoe-py never probes memory: accepted, changes nothing",
}
# how the help names a flag's value, by its kind
_METAVAR = {interface.INT: "N", interface.U32: "N", interface.FLOAT: "F", interface.TEXT: "STR",
            interface.PATH: "PATH", interface.CHOICE: "M", interface.MIB_OR_AUTO: "N|auto",
            interface.LIST: "L", interface.TOKENS: "L"}


def accepted(release: Release) -> tuple[interface.Flag, ...]:
    """The flags bmoe-py takes when it claims `release` (engine.contract.claim): the table's."""
    return interface.taken_by(interface.BMOE_PY, release)


def usage(release: Release) -> str:
    """`--help`: every flag bmoe-py takes at the claimed `release`, from the flag table
    (engine.interface.flags), then the env overrides and the bmoe-cli flags it refuses."""
    rows = []
    for f in accepted(release):
        names = ", ".join((f.short, f.name) if f.short else (f.name,))
        left = ("" if f.short else "    ") + names + "".join(", " + a for a in f.aliases)
        if f.takes_value:
            left += " " + _METAVAR[f.value]
        meaning = f.meaning + (": " + " | ".join(f.choices) if f.choices else "")
        notes = [n for n in (_NOTES.get(f.name), f"default {f.default}" if f.default else "") if n]
        rows.append((f.name, left, meaning + (f" ({'; '.join(notes)})" if notes else "")))
    width = max(len(left) for _, left, _ in rows) + 2
    lines = ["usage: bmoe-py -m <model.gguf> [options]", ""]
    for name, left, text in rows:
        if name in _HEADINGS:
            lines += ["", "  " + _HEADINGS[name]]
        lines += textwrap.wrap(text, 118, initial_indent=f"  {left:<{width}}", subsequent_indent=" " * (width + 4),
                               break_on_hyphens=False)
    envs = [f.env for f in accepted(release) if f.env]
    refused = interface.refused_by_bmoe_py(release)
    tail = [f"Env overrides (flag wins): {', '.join(envs)} ({', '.join(_ENV_NOT_IMPLEMENTED)} are refused)",
            f"Speaks bmoe-cli {release}'s flags{' (NEXT: upstream after 0.24)' if release == NEXT else ''}; "
            f"{claim.CLAIM_ENV}={claim.DEFAULT} to {NEXT} picks the release."]
    if refused:
        tail.append(f"bmoe-cli {release} flags bmoe-py does not implement are refused as unknown: {', '.join(refused)}")
    lines.append("")
    for text in tail:
        lines += textwrap.wrap(text, 118, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)
    return "\n".join(lines) + "\n"

# bmoe-py's flags by the kind of value they take (engine.interface.flags: name, short form, field)
_OURS = [f for f in interface.FLAGS if f.bmoe_py]
_INT_FLAGS = {s: f.field for f in _OURS if f.value == interface.INT for s in f.spellings}
_FLOAT_FLAGS = {s: f.field for f in _OURS if f.value == interface.FLOAT for s in f.spellings}
_STR_FLAGS = {s: f.field for f in _OURS if f.value in (interface.PATH, interface.TEXT) for s in f.spellings}
# switches: the field and the value they set (the deprecated dense aliases are silent, as in bmoe-cli:
# "kept so existing scripts keep working")
_BOOL_FLAGS = {s: (f.field, f.sets) for f in _OURS if f.value == interface.NONE and f.field for s in f.spellings}
_BY_KIND = {kind: {s for f in _OURS if f.value == kind for s in f.spellings}
            for kind in (interface.U32, interface.TOKENS, interface.MIB_OR_AUTO, interface.CHOICE, interface.LIST)}
# bmoe-cli names a missing value by the flag's short form where it has one (cli/main.cpp next()).
_VALUE_NAME = {s: f.typed for f in _OURS for s in f.spellings}
# the env override of each value flag (flag wins)
_ENV = {f.name: (f.env, f.field) for f in _OURS if f.env and f.takes_value}
# flags of a later release than 0.19: unknown unless bmoe-py claims that release (engine.claim)
_KNOWN = frozenset(interface.spellings(_OURS))
_SINCE = {s: f.since for f in _OURS if f.since is not None for s in f.spellings}


# C's isspace() in the "C" locale, and its digits: Python's \s and \d also take Unicode ones
_C_SPACE = " \t\n\v\f\r"
_C_INT_RE = re.compile(f"[{_C_SPACE}]*([+-]?)0*([0-9]+)")
_LONG_MAX = (1 << 63) - 1
_ULONG_MAX = (1 << 64) - 1
# strtod's decimal and hex spellings, infinity and nan (what follows the prefix is ignored)
_C_FLOAT_RE = re.compile(
    f"[{_C_SPACE}]*([+-]?(?:0x(?:[0-9a-f]+\\.?[0-9a-f]*|\\.[0-9a-f]+)(?:p[+-]?[0-9]+)?"
    "|(?:[0-9]+\\.?[0-9]*|\\.[0-9]+)(?:e[+-]?[0-9]+)?|inf(?:inity)?|nan))", re.IGNORECASE)
_FLT_OVERFLOW = 2.0 ** 128 - 2.0 ** 103   # FLT_MAX + half an ulp: rounds to infinity


def _strtol(text: str) -> int:
    """glibc's strtol(text, NULL, 10) on a 64-bit long: leading space and sign, then digits;
    0 when unreadable; an overflow saturates at LONG_MIN / LONG_MAX."""
    m = _C_INT_RE.match(text)
    if not m:
        return 0
    # past 20 digits it overflows anyway (and int() refuses 4,300)
    magnitude = int(m[2]) if len(m[2]) <= 20 else _ULONG_MAX + 1
    value = -magnitude if m[1] == "-" else magnitude
    return max(-_LONG_MAX - 1, min(_LONG_MAX, value))


def _atoi(text: str) -> int:
    """C's atoi as glibc does it, `(int) strtol(text, NULL, 10)`: junk reads 0, the engine does
    not reject it (so neither do we), and a value past int's range wraps to its low 32 bits, so
    `-n 99999999999999999999` is -1 (bmoe-cli: `n_predict must be positive`) and `-n 1e23` is 1."""
    low = _strtol(text) & 0xFFFFFFFF
    return low - (1 << 32) if low >= 1 << 31 else low


def _strtoul32(text: str) -> int:
    """`(uint32_t) strtoul(text, NULL, 10)`, as bmoe-cli reads --seed: a minus sign negates
    modulo 2^64, an overflow saturates at ULONG_MAX, then the low 32 bits."""
    m = _C_INT_RE.match(text)
    if not m:
        return 0
    magnitude = int(m[2]) if len(m[2]) <= 20 else _ULONG_MAX + 1
    value = _ULONG_MAX if magnitude > _ULONG_MAX else (-magnitude if m[1] == "-" else magnitude) & _ULONG_MAX
    return value & 0xFFFFFFFF


def _atof(text: str) -> float:
    """C's atof narrowed to a float32, as bmoe-cli stores --temp / --top-p: the longest numeric
    prefix counts, junk reads 0, and the range checks see the float32 value (past FLT_MAX an
    infinity, a nan keeps its sign: printf writes `-nan` for one)."""
    m = _C_FLOAT_RE.match(text)
    if not m:
        return 0.0
    try:
        value = float.fromhex(m[1]) if "x" in m[1].lower() else float(m[1])
    except OverflowError:               # 0x1p99999: strtod gives HUGE_VAL
        value = math.copysign(math.inf, -1.0 if m[1].startswith("-") else 1.0)
    if math.isfinite(value) and abs(value) >= _FLT_OVERFLOW:
        return math.copysign(math.inf, value)  # what the cast gives; numpy would also warn on stderr
    return float(np.float32(value))


def parse_args(argv: list[str], environ: dict[str, str]) -> RunConfig:
    try:
        release = claim.claimed(environ)
    except ValueError as e:
        raise UsageExit(f"bmoe-py: {e}", 1) from None
    values: dict[str, object] = {"release": release}
    seen: set[str] = set()
    i = 0

    def next_value(flag: str) -> str:
        nonlocal i
        if i + 1 >= len(argv):
            raise UsageExit(f"missing value for {_VALUE_NAME.get(flag, flag)}", 1)
        i += 1
        return argv[i]

    while i < len(argv):
        a = argv[i]
        seen.add(a)
        later = _SINCE.get(a)
        if later is not None and release < later:
            raise UsageExit(f"unknown arg: {a}", 1, with_usage=True, release=release)
        if a in _STR_FLAGS:
            values[_STR_FLAGS[a]] = next_value(a)
        elif a in _INT_FLAGS:
            values[_INT_FLAGS[a]] = _atoi(next_value(a))
        elif a in _FLOAT_FLAGS:
            values[_FLOAT_FLAGS[a]] = _atof(next_value(a))
        elif a in _BOOL_FLAGS:
            field, value = _BOOL_FLAGS[a]
            values[field] = value
        elif a in _BY_KIND[interface.U32]:
            values[interface.flag(a).field] = _strtoul32(next_value(a))
        elif a in _BY_KIND[interface.TOKENS]:
            raw = next_value(a)
            try:
                values[interface.flag(a).field] = tuple(ascii_int(t) for t in raw.split(",") if t.strip())
            except ValueError:
                raise UsageExit(f"bmoe: {a} expects comma-separated token ids, got '{raw}'", 2) from None
        elif a in _BY_KIND[interface.MIB_OR_AUTO]:
            v = next_value(a)
            if v == "auto":
                values["cache_auto"] = True
            else:
                values[interface.flag(a).field] = _atoi(v)
        elif a in _BY_KIND[interface.LIST]:
            # split at every comma, empty items kept; a repeated flag adds to the list (cli/main.cpp)
            field = interface.flag(a).field
            before = values.get(field, ())
            assert isinstance(before, tuple)
            values[field] = (*before, *next_value(a).split(","))
        elif a in _BY_KIND[interface.CHOICE]:
            m = next_value(a)
            choices = interface.flag(a).choices
            if m not in choices:
                raise UsageExit(f"bmoe: {a} expects {'|'.join(choices)}, got '{m}'", 2)
            values[interface.flag(a).field] = m
        elif a in LIST_ARCHS_FLAG.spellings:
            raise UsageExit("supported MoE architectures:\n" + "".join(f"  {arch}\n" for arch in LIST_ARCHS), 0,
                            to_stdout=True)
        elif a in HELP.spellings:
            raise UsageExit(usage(release), 0, to_stdout=True)
        elif a in VERSION.spellings:
            from engine import __version__

            raise UsageExit(claim.version_line(__version__, release), 0, to_stdout=True)
        else:
            raise UsageExit(f"unknown arg: {a}", 1, with_usage=True, release=release)
        i += 1

    # Environment overrides apply only where the flag was not typed (bmoe-cli's rule).
    for flag, (env, field) in _ENV.items():
        if flag not in seen and environ.get(env):
            values[field] = _atoi(environ[env])
    if PROGRESS.name not in seen and environ.get(PROGRESS.env):
        values[PROGRESS.field] = _atoi(environ[PROGRESS.env]) != 0
    # after 0.24 a streamed run given no budget sizes its cache as auto (engine.claim)
    if (claim.auto_when_alone(release) and values.get("moe_stream") and not values.get("cache_auto")
            and CACHE_MB.name not in seen and not environ.get(CACHE_MB.env)):
        values["cache_auto"] = True
    # --plan is --auto that prints its plan and exits; --probe-io asks for the planner too (cli/main.cpp)
    if values.get("plan_only"):
        values["auto_plan"] = values["plan_explain"] = True
    if any(s in seen for s in PROBE_IO.spellings):
        values["auto_plan"] = True
    values["typed"] = frozenset(interface.flag(s).name for s in seen if s in _KNOWN)
    values["unimplemented_env"] = tuple((env, field) for env, field in _ENV_NOT_IMPLEMENTED.items()
                                        if environ.get(env) and _atoi(environ[env]) != 0)
    cfg = RunConfig(**values)  # type: ignore[arg-type]
    if not cfg.model_path:
        raise UsageExit(usage(release), 1, to_stdout=True)
    return cfg


def implemented_flags() -> set[str]:
    """Every flag parse_args accepts (the rest, bmoe-cli's included, are `unknown arg`)."""
    return set(interface.spellings(_OURS))


def validate_run(cfg: RunConfig) -> None:
    """Raise ConfigError with bmoe-cli's text for the first refused field, in validate()'s order
    (core/src/config.cpp): the run's shape, sampling when it is on, the streaming flags.

    Then one check of bmoe-py's own: an env override asking for a feature bmoe-py lacks
    (BMOE_OVERLAP, …) is refused rather than silently ignored. Where bmoe-cli itself refuses it
    (it needs --moe-stream) the text is bmoe-cli's.
    """
    if cfg.n_predict <= 0:
        raise ConfigError("n_predict must be positive")
    if cfg.n_threads <= 0:
        raise ConfigError("n_threads must be positive")
    if cfg.n_ctx <= 0:
        raise ConfigError("n_ctx must be positive")
    if cfg.n_expert_used < 0:
        raise ConfigError("n_expert_used must be >= 0 (0 = model default)")
    # Sampling ranges bind only when sampling is on: a greedy run ignores them, as upstream.
    if cfg.temp > 0.0:
        if cfg.top_k < 0:
            raise ConfigError("sampling.top_k must be >= 0 (0 disables the top-k stage)")
        if cfg.top_p <= 0.0 or cfg.top_p > 1.0:  # C's comparisons: a nan passes, as it does upstream
            raise ConfigError("sampling.top_p must be in (0, 1]")
    if not cfg.moe_stream:
        for _env, field in cfg.unimplemented_env:
            raise ConfigError(f"{field} requires moe.enabled")
    validate(cache_flags(cfg))
    if cfg.moe_stream:          # the last of validate()'s streaming checks
        drop.validate(cfg.drop_cold_frac, cache_flags(cfg).cache_on)
        substitute.validate(cfg.substitute_lambda, cache_flags(cfg).cache_on)
    for env, field in cfg.unimplemented_env:
        raise ConfigError(f"{env} asks for {field}, which bmoe-py does not implement (unset it)")


def cache_flags(cfg: RunConfig) -> CacheFlags:
    """The flags engine.stream.budget validates and sizes from."""
    return CacheFlags(moe_stream=cfg.moe_stream, cache_mb=cfg.cache_mb, cache_auto=cfg.cache_auto,
                      cache_floor_mb=cfg.cache_floor_mb, cache_ceil_mb=cfg.cache_ceil_mb,
                      force_cache=cfg.force_cache, io_threads=cfg.io_threads, prefetch_layers=cfg.prefetch,
                      dense_weights=cfg.dense_weights)


def print_usage_exit(e: UsageExit) -> int:
    stream = sys.stdout if e.to_stdout else sys.stderr
    print(str(e), file=stream, end="" if str(e).endswith("\n") else "\n")
    if e.with_usage:
        print(usage(e.release), end="")
    return e.code
