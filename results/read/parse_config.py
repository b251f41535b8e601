"""A run's configuration from what is around its numbers: file names, driver tags, command lines,
and the engine's own load lines.

Pre-v1 CSVs carry no preamble, so upstream's file names are the only record of what ran. The
naming comes from upstream's drivers (`scripts/bench-matrix.ps1`, `bench-matrix-rework.ps1`,
`bench-prefetch.ps1`, `bench-pr23-c2000.ps1`, `gptoss-matrix.sh`, `gptoss-mmap.sh`,
`bench-warmonly.sh`, the 2026-07-17 drivers): `<model>_<token>_<token>…`, where a token is

| token | meaning | flags |
|---|---|---|
| `mmap` | no expert streaming (pure mmap baseline) | no `--moe-stream` |
| `stream` | streaming, no cache | `--moe-stream --cache-mb 0` |
| `c2000` | fixed cache of 2000 MiB | `--cache-mb 2000` |
| `l4`, `io4` | 4 read lanes | `--io-threads 4` |
| `ov` | I/O-compute overlap | `--overlap` |
| `k6` / `kdef` | top-k 6 / the model's own top-k | `--n-expert-used 6` / none (0) |
| `pf2` | temporal prefetch depth 2 | `--prefetch 2` |
| `auto` / `autocap` | auto budget / auto capped at the session's reference | `--cache-mb auto [--cache-ceil-mb N]` |
| `base` | the session's fixed-cache reference | `--cache-mb N` |
| `sg` | speculative gating (removed upstream later) | `--spec-gate` |
| `warm` / `anon` | dense-weight policy | `--dense-weights warm/anon` |
| `progress` | `--progress` JSON lines | `--progress` |

and the model is `qwen` (Qwen3-30B-A3B), `gemma` (Gemma-4-26B-A4B), `gpt`/`gptoss` (gpt-oss-120b),
with `qwen5k` meaning Qwen at a 5000 MiB cache. Keys use one vocabulary across every source:
model, moe_stream, cache_mib, cache_auto, cache_capped, cache_ceil_mib, cache_floor_mib,
budget_mib, io_threads, overlap, top_k (0 = the model's own), prefetch, spec_gate, dense_weights,
o_direct, threads, n_predict, … Only what a source states is returned: an absent key is unknown.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path

from engine.interface.flags import CACHE_MB, FLAGS, reader_keys
from results.read.console_records import ConsoleRun
from results.read.parse_text import to_number

RUN_SUFFIXES = (".route.csv", ".csv", ".metrics", ".log", ".out", ".err", ".state")
MODEL_ALIASES = {"qwen": "qwen", "gemma": "gemma", "gpt": "gpt-oss", "gptoss": "gpt-oss"}
STREAMING = {"moe_stream": True}

_TOKENS: tuple[tuple[re.Pattern, Callable[[re.Match], dict[str, object]]], ...] = (
    (re.compile(r"mmap"), lambda m: {"moe_stream": False}),
    (re.compile(r"stream"), lambda m: {**STREAMING, "cache_mib": 0}),
    (re.compile(r"c([0-9]+)"), lambda m: {**STREAMING, "cache_mib": to_number(m[1], "cache_mib")}),
    (re.compile(r"(?:l|io)([0-9]+)"), lambda m: {**STREAMING, "io_threads": to_number(m[1], "io_threads")}),
    (re.compile(r"ov"), lambda m: {**STREAMING, "overlap": True}),
    (re.compile(r"k([0-9]+)"), lambda m: {"top_k": to_number(m[1], "top_k")}),
    (re.compile(r"kdef"), lambda m: {"top_k": 0}),
    (re.compile(r"pf([0-9]+)"), lambda m: {**STREAMING, "prefetch": to_number(m[1], "prefetch")}),
    (re.compile(r"auto"), lambda m: {**STREAMING, "cache_auto": True}),
    (re.compile(r"autocap"), lambda m: {**STREAMING, "cache_auto": True, "cache_capped": True}),
    (re.compile(r"base"), lambda m: {**STREAMING, "cache_auto": False}),
    (re.compile(r"sg"), lambda m: {**STREAMING, "spec_gate": True}),
    (re.compile(r"(warm|anon)"), lambda m: {"dense_weights": m[1]}),
    (re.compile(r"progress"), lambda m: {"progress": True}),
)
_MODEL_CACHE_RE = re.compile(r"([a-z]+)([0-9]+)k")  # qwen5k: Qwen at a 5000 MiB cache
_TAG_PARAMS = {"k": "top_k", "io": "io_threads", "n": "n_predict", "t": "threads", "cache": "cache_mib"}

# bmoe-cli flags -> the key a capture's config records, and how the value reads (engine.interface.flags)
_VALUE_FLAGS = {s: key for s, (key, sets) in reader_keys().items() if sets is None}
_BOOL_FLAGS: dict[str, dict[str, object]] = {s: {key: sets} for s, (key, sets) in reader_keys().items()
                                             if sets is not None}
# flags whose value is not configuration (but must be skipped over)
_OTHER_VALUE_FLAGS = {s for f in FLAGS if f.takes_value and not f.key and f is not CACHE_MB for s in f.spellings}

_N_EXPERT_USED_RE = re.compile(r"^print_info: n_expert_used\s*=\s*([0-9]+)")
_N_EXPERT_RE = re.compile(r"^print_info: n_expert\s*=\s*([0-9]+)")
# searched, not matched: the echoed prompt is glued in front of llama.cpp's first stderr line
_MODEL_PATH_RE = re.compile(r"llama_model_loader: loaded meta data .* from (.+?) \(version")
_THREADS_RE = re.compile(r"^set_n_threads: n_threads = ([0-9]+)")
# the same lines with any value: results.read.parse_console checks it where it knows the file and
# line (a numeral no engine prints is refused there), so config_from_log reads only good ones
LOG_NUMBER_RE = re.compile(r"^(?:print_info: (n_expert_used|n_expert)\s*=|set_n_threads: (n_threads) =)\s*([0-9]+|\S+)")


def run_stem(path: str | Path) -> str:
    """`gptoss.route.csv` -> `gptoss`: the name shared by every file of one run."""
    name = Path(path).name
    for suffix in RUN_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return Path(name).stem


def config_from_name(path: str | Path) -> dict[str, object]:
    """Config spelled by an upstream file name (or driver tag): `qwen_c2000_l4_ov.csv` ->
    {model: qwen, moe_stream: True, cache_mib: 2000, io_threads: 4, overlap: True}. Tokens that
    mean nothing known are kept under `unknown_tokens`."""
    config: dict[str, object] = {}
    unknown: list[str] = []
    for position, token in enumerate(t for t in run_stem(path).split("_") if t):
        if values := _token_config(token):
            config.update(values)
        elif m := _MODEL_CACHE_RE.fullmatch(token):
            config.update(model=MODEL_ALIASES.get(m[1], m[1]), cache_mib=to_number(m[2], "cache_mib") * 1000,
                          **STREAMING)
        elif position == 0 and token.isalnum():
            config["model"] = MODEL_ALIASES.get(token, token)
        else:
            unknown.append(token)
    if unknown:
        config["unknown_tokens"] = tuple(unknown)
    return config


def config_from_tag(tag: str, params: str = "") -> dict[str, object]:
    """A driver separator's tag and optional `k=4 io=8 n=24` parameters."""
    config = config_from_name(tag)
    for key, value in re.findall(r"(\w+)=(\S+)", params):
        config[_TAG_PARAMS.get(key, key)] = to_number(value, key)
    return config


def config_from_command(line: str) -> dict[str, object]:
    """Flags of a `bmoe-cli …` command echoed into a capture (`set -x`, a harness log); {} when the
    line is no such command."""
    at = line.find("bmoe-cli")
    if at < 0:
        return {}
    try:
        argv = shlex.split(line[at:])[1:]
    except ValueError:  # an unbalanced quote in an echoed prompt
        argv = line[at:].split()[1:]
    config: dict[str, object] = {}
    args = iter(argv)
    for arg in args:
        if arg in CACHE_MB.spellings:
            value = next(args, "")
            auto = value == "auto"
            config.update({"cache_auto": True} if auto else {"cache_auto": False, "cache_mib": to_number(value, arg)})
        elif arg in _VALUE_FLAGS:
            config[_VALUE_FLAGS[arg]] = to_number(next(args, ""), arg)
        elif arg in _BOOL_FLAGS:
            config.update(_BOOL_FLAGS[arg])
        elif arg in _OTHER_VALUE_FLAGS:
            next(args, None)
    return config


def config_from_log(run: ConsoleRun) -> dict[str, object]:
    """What the engine itself reported about its configuration: budget, auto sizing, O_DIRECT,
    read lanes, dense policy, top-k, threads… Only positive evidence; absent keys are unknown.
    A number in llama.cpp's load log that no engine prints raises NumberError (no line: the
    caller names the file)."""
    config: dict[str, object] = {}
    if run.moe_stream is not None:
        config["moe_stream"] = True
    elif run.generation is not None:
        config["moe_stream"] = False  # the engine prints moe-stream: whenever streaming is on
    if run.streaming is not None:
        config.update(moe_stream=True, n_expert=run.streaming.n_expert, o_direct=run.streaming.o_direct,
                      io_threads=run.streaming.io_threads,
                      budget_mib=None if run.streaming.cache_mib is None else float(run.streaming.cache_mib))
        if run.streaming.shards is not None:
            config["shards"] = run.streaming.shards
    if run.moe_cache is not None:
        config["cache_auto"] = run.moe_cache.auto
        if run.moe_cache.budget_mib is not None:
            config["budget_mib"] = run.moe_cache.budget_mib
    if run.cache_auto is not None:
        config.update(cache_auto=True, budget_mib=run.cache_auto.budget_mib, cache_floor_mib=run.cache_auto.free_mib,
                      budget_cap_mib=run.cache_auto.cap_mib)
    if run.overlap_stall_s_per_token is not None:
        config["overlap"] = True
    if run.spec_gate is not None:
        config["spec_gate"] = True
    if run.dense_warmup is not None:
        config["dense_weights"] = "warm"
    if run.dense_anon is not None:
        config["dense_weights"] = run.dense_anon.mode
    if run.compute is not None:
        config["threads"] = run.compute.threads
    if run.cycle_warning is not None:
        config["cache_cycle_mib"] = run.cycle_warning.cycle_mib
        if run.cycle_warning.top_k is not None:
            config["top_k"] = run.cycle_warning.top_k
    for line in run.lines:  # llama.cpp's load log, when the capture kept stderr
        if m := _N_EXPERT_USED_RE.match(line):
            config["top_k"] = to_number(m[1], "n_expert_used")
        elif m := _N_EXPERT_RE.match(line):
            config["n_expert"] = to_number(m[1], "n_expert")
        elif m := _MODEL_PATH_RE.search(line):
            config["model_path"] = m[1]
        elif m := _THREADS_RE.match(line):
            config["threads"] = to_number(m[1], "n_threads")
    # a value the console reader stored as missing (None) is not evidence
    return {key: value for key, value in config.items() if value is not None}


def _token_config(token: str) -> dict[str, object]:
    for pattern, values in _TOKENS:
        if m := pattern.fullmatch(token):
            return values(m)
    return {}
