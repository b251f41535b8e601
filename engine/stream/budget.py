"""The expert-cache budget, validated and sized exactly as bmoe-cli 0.19.0 does it.

Sources (Helldez/BigMoeOnEdge): core/src/config.cpp validate() for the refusals and their text,
cli/main.cpp for how --cache-mb is parsed and what exit status each refusal gets,
core/src/moe/expert_stream_source.cpp init() for `auto`. Text printed by bmoe-cli is reproduced
byte for byte ("—", "→" included). The cycle guard is the seed's proposal (docs/cache-sizing.md
upstream): bmoe-cli 0.19.0 has none, so its warning and `cache_cycle_mb` are bmoe-py's own.

One deliberate extension: upstream sizes `auto` from /proc/meminfo MemAvailable alone. A process
inside a memory cgroup (a container, a virtual phone) can be killed long before MemAvailable runs
out, so bmoe-py takes the smaller of MemAvailable and the cgroup's headroom.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

import psutil

from engine.errors import BmoeError
from engine.gguf.model import ModelShape
from engine.units import MIB, ascii_int

CACHE_MIN_MB = 1500  # MoeStreamConfig::cache_min_mb: smallest non-pathological fixed budget
CACHE_FLOOR_MB_DEFAULT = 1536
CACHE_CEIL_MB_DEFAULT = 0  # 0 = no cap beyond the whole expert bank
IO_THREADS_DEFAULT = 4
IO_THREADS_MAX = 8
PREFETCH_LAYERS_MAX = 8
# Modes that move the dense set out of reclaimable page cache into anon buffers during init.
_DENSE_CONVERTING = ("anon", "ahwb")
# cgroup v1 reports "no limit" as PAGE_COUNTER_MAX pages; anything this large is unlimited.
_CGROUP_UNLIMITED = 1 << 62


class ConfigError(BmoeError):
    """A flag combination bmoe-cli's validate() refuses: `config error: …` on stderr, exit 1."""

    exit_status = 1

    @property
    def line(self) -> str:
        return f"config error: {self}"


@dataclass(frozen=True)
class CacheFlags:
    """The streaming flags the budget depends on, as bmoe-cli's RunConfig holds them."""

    moe_stream: bool = True
    cache_mb: int = 0
    cache_auto: bool = False
    cache_floor_mb: int = CACHE_FLOOR_MB_DEFAULT
    cache_ceil_mb: int = CACHE_CEIL_MB_DEFAULT
    force_cache: bool = False
    io_threads: int = IO_THREADS_DEFAULT
    prefetch_layers: int = 0
    dense_weights: str = "anon"

    @property
    def cache_on(self) -> bool:
        """"The LRU cache is on": a fixed budget or auto-sizing."""
        return self.cache_mb > 0 or self.cache_auto


def validate(flags: CacheFlags) -> None:
    """Raise ConfigError with bmoe-cli's text for the first refused field, in its order.

    Without --moe-stream nothing here is checked: upstream ignores every cache flag then.
    """
    if not flags.moe_stream:
        return
    if not 1 <= flags.io_threads <= IO_THREADS_MAX:
        raise ConfigError(f"moe.io_threads must be in [1, {IO_THREADS_MAX}]")
    if flags.cache_mb < 0:
        raise ConfigError("moe.cache_mb must be >= 0")
    if 0 < flags.cache_mb < CACHE_MIN_MB and not flags.force_cache:
        raise ConfigError(
            f"moe.cache_mb={flags.cache_mb} is in the pathological band (< {CACHE_MIN_MB} MiB): a cache "
            "smaller than one token's routed working set thrashes and is slower than no cache. Use 0 to "
            f"disable the cache, a value >= {CACHE_MIN_MB}, or set force_cache to override."
        )
    if not 0 <= flags.prefetch_layers <= PREFETCH_LAYERS_MAX:
        raise ConfigError(f"moe.prefetch_layers must be in [0, {PREFETCH_LAYERS_MAX}]")
    if flags.cache_auto and flags.cache_mb > 0:
        raise ConfigError(
            "moe.cache_auto and an explicit moe.cache_mb are mutually exclusive: choose auto-sizing "
            "(cache_mb = 0, cache_auto) or a fixed budget (cache_mb > 0)."
        )
    if flags.cache_floor_mb < 0:
        raise ConfigError("moe.cache_floor_mb must be >= 0")
    if flags.cache_ceil_mb < 0:
        raise ConfigError("moe.cache_ceil_mb must be >= 0 (0 = no explicit ceiling)")
    if flags.prefetch_layers > 0 and not flags.cache_on:
        raise ConfigError(
            "moe.prefetch_layers requires the LRU cache (cache_mb > 0 or cache_auto): speculative reads "
            "land in the per-layer cache buffers, which do not exist with the cache off."
        )


# ---- available memory -----------------------------------------------------------------------
def mem_available_from_meminfo(text: str) -> int | None:
    """MemAvailable in bytes from /proc/meminfo text; None when the line is missing."""
    m = re.search(r"^MemAvailable:\s+([0-9]+)\s*kB", text, re.MULTILINE)
    return int(m[1]) * 1024 if m else None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _read_int(path: str) -> int | None:
    text = _read(path)
    if text is None:
        return None
    text = text.strip()
    if text == "max":
        return None  # v2's "no limit"
    try:
        return ascii_int(text)
    except ValueError:
        return None


def _stat_field(stat_text: str | None, *names: str) -> int:
    """The first of `names` present in a memory.stat text (hierarchical totals first)."""
    if not stat_text:
        return 0
    fields = dict(line.split(None, 1) for line in stat_text.splitlines() if " " in line)
    for name in names:
        if name in fields:
            try:
                return int(fields[name])
            except ValueError:
                return 0
    return 0


@dataclass(frozen=True)
class _Mount:
    root: str  # the part of the hierarchy mounted (mountinfo field 4)
    point: str
    fstype: str
    super_options: frozenset[str]


def _mounts(mountinfo_text: str) -> list[_Mount]:
    out = []
    for line in mountinfo_text.splitlines():
        pre, sep, post = line.partition(" - ")
        if not sep:
            continue
        a, b = pre.split(), post.split()
        if len(a) < 5 or len(b) < 3:
            continue
        unescape = lambda s: re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), s)  # noqa: E731
        out.append(_Mount(unescape(a[3]), unescape(a[4]), b[0], frozenset(b[2].split(","))))
    return out


def _cgroup_dirs(mount: _Mount, cgroup_path: str) -> list[str]:
    """Directories from the process's cgroup up to the top of the mounted hierarchy."""
    rel = os.path.relpath(cgroup_path, mount.root) if cgroup_path.startswith(mount.root) else "."
    if rel.startswith(".."):
        rel = "."  # the process sits outside what is mounted here (a namespace): use the top
    here = os.path.normpath(os.path.join(mount.point, rel))
    dirs = [here]
    while here != mount.point and here.startswith(mount.point):
        here = os.path.dirname(here)
        dirs.append(here)
    return dirs


def _headroom(limit: int, usage: int, file_bytes: int) -> int:
    """Bytes still allocatable under one limit, counting file pages as reclaimable.

    The kernel reclaims a cgroup's page cache before it OOM-kills it, just as MemAvailable
    counts the page cache as available system-wide.
    """
    return max(0, min(limit, limit - usage + file_bytes))


def cgroup_headroom_bytes(
    proc_cgroup: str = "/proc/self/cgroup", mountinfo: str = "/proc/self/mountinfo"
) -> int | None:
    """The tightest memory headroom over this process's cgroup and its ancestors (v1 or v2).

    None when no memory limit applies (no memory controller, or unlimited all the way up).
    """
    cgroup_text, mounts_text = _read(proc_cgroup), _read(mountinfo)
    if not cgroup_text or not mounts_text:
        return None
    mounts = _mounts(mounts_text)
    v1_path = v2_path = None
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        if hier == "0" and controllers == "":
            v2_path = path
        elif "memory" in controllers.split(","):
            v1_path = path
    best: int | None = None

    def consider(value: int | None) -> None:
        nonlocal best
        if value is not None:
            best = value if best is None else min(best, value)

    if v1_path is not None:
        for m in mounts:
            if m.fstype == "cgroup" and "memory" in m.super_options:
                for d in _cgroup_dirs(m, v1_path):
                    limit = _read_int(os.path.join(d, "memory.limit_in_bytes"))
                    usage = _read_int(os.path.join(d, "memory.usage_in_bytes"))
                    if limit is None or usage is None or limit >= _CGROUP_UNLIMITED:
                        continue
                    stat = _read(os.path.join(d, "memory.stat"))
                    file_bytes = _stat_field(stat, "total_inactive_file", "inactive_file") + _stat_field(
                        stat, "total_active_file", "active_file"
                    )
                    consider(_headroom(limit, usage, file_bytes))
                break
    if v2_path is not None:
        for m in mounts:
            if m.fstype == "cgroup2":
                for d in _cgroup_dirs(m, v2_path):
                    usage = _read_int(os.path.join(d, "memory.current"))
                    if usage is None:
                        continue
                    stat = _read(os.path.join(d, "memory.stat"))
                    file_bytes = _stat_field(stat, "inactive_file") + _stat_field(stat, "active_file")
                    # memory.high throttles into reclaim long before memory.max kills: both bind.
                    for knob in ("memory.max", "memory.high"):
                        limit = _read_int(os.path.join(d, knob))
                        if limit is not None and limit < _CGROUP_UNLIMITED:
                            consider(_headroom(limit, usage, file_bytes))
                break
    return best


@dataclass(frozen=True)
class AvailableMemory:
    """What `auto` sizes from. bytes is None when neither source could be read."""

    mem_available_bytes: int | None
    cgroup_headroom_bytes: int | None

    @property
    def bytes(self) -> int | None:
        known = [v for v in (self.mem_available_bytes, self.cgroup_headroom_bytes) if v is not None]
        return min(known) if known else None


def available_memory(
    meminfo: str | None = None,
    proc_cgroup: str = "/proc/self/cgroup",
    mountinfo: str = "/proc/self/mountinfo",
) -> AvailableMemory:
    """MemAvailable (psutil, or the given meminfo file) and the cgroup headroom, read now."""
    if meminfo is None:
        try:
            mem = int(psutil.virtual_memory().available)
        except (OSError, RuntimeError):
            mem = None
    else:
        text = _read(meminfo)
        mem = mem_available_from_meminfo(text) if text is not None else None
    return AvailableMemory(mem, cgroup_headroom_bytes(proc_cgroup, mountinfo))


# ---- auto sizing ----------------------------------------------------------------------------
@dataclass(frozen=True)
class AutoBudget:
    budget_bytes: int
    cap_bytes: int
    available_bytes: int | None  # after the dense reservation; None = unknown
    dense_reserved_bytes: int
    messages: tuple[str, ...]


def auto_budget(
    total_expert_bytes: int,
    available_bytes: int | None,
    cache_floor_mb: int = CACHE_FLOOR_MB_DEFAULT,
    cache_ceil_mb: int = CACHE_CEIL_MB_DEFAULT,
    dense_tensor_bytes: Iterable[int] = (),
) -> AutoBudget:
    """ExpertStreamSource::init's one-shot `auto` sizing.

    dense_tensor_bytes: the size of every dense tensor the dense policy is about to convert into
    anon buffers (pass nothing under mmap/warm). A tensor larger than what is available is never
    converted (it stays mapped), so it reserves nothing.
    """
    floor = max(0, cache_floor_mb) * MIB
    ceil = max(0, cache_ceil_mb) * MIB
    cap = min(ceil, total_expert_bytes) if ceil > 0 else total_expert_bytes
    min_budget = min(CACHE_MIN_MB * MIB, cap)
    avail = available_bytes or 0  # upstream: 0 means unknown
    messages: list[str] = []
    reserved = 0
    if avail > 0:
        pending = sum(b for b in dense_tensor_bytes if b <= avail)
        reserved = min(avail, pending)
        if reserved > 0:
            avail -= reserved
            messages.append(f"bmoe: cache auto — reserving {reserved // MIB} MiB for the dense-weight conversion")
    if avail == 0:
        messages.append(f"bmoe: cache auto — available memory unknown, using the {min_budget // MIB} MiB floor")
        return AutoBudget(min_budget, cap, None, reserved, tuple(messages))
    budget = min(max(avail - floor, 0, min_budget), cap)
    messages.append(
        f"bmoe: cache auto — {avail // MIB} MiB available, leaving {floor // MIB} MiB free → "
        f"{budget // MIB} MiB budget (cap {cap // MIB} MiB)"
    )
    return AutoBudget(budget, cap, avail, reserved, tuple(messages))


# ---- the cycle guard ------------------------------------------------------------------------
def cache_mb_of(budget_bytes: int) -> int:
    """The budget as the preamble's cache_mb: whole MiB, rounded down."""
    return budget_bytes // MIB


def cycle_mb_of(cycle_bytes: int) -> int:
    """cache_cycle_mb: rounded UP, so a borderline budget is never shown on the safe side."""
    return -(-cycle_bytes // MIB)


def cycle_warning(budget_bytes: int, cycle_bytes: int, top_k: int, one_line: bool = False) -> str | None:
    """The load-time warning when the budget is below the worst-case token cycle.

    The text is the seed's (docs/cache-sizing.md upstream), on its two lines; `one_line` is
    upstream's own from 0.21 (core/src/session.cpp, the store's newest: the same words, one
    line, engine.claim decides). Compared in whole
    MiB: the budget rounded down and the cycle rounded UP, so a budget a fraction of a MiB under
    the cycle is still warned about (gpt-oss-120b at top-4 prints 1816 for its 1815.4 MiB).
    No warning with the cache off.
    """
    cache_mb, cycle_mb = cache_mb_of(budget_bytes), cycle_mb_of(cycle_bytes)
    if cache_mb > 0 and cycle_mb > 0 and cache_mb < cycle_mb:
        return (
            f"bmoe: WARNING expert cache {cache_mb} MiB is below this model's worst-case token cycle of "
            f"{cycle_mb} MiB{' ' if one_line else chr(10)}at top-k {top_k} — no entry can survive to the next "
            "token, so expect a hit rate near zero."
        )
    return None


# ---- the whole decision ---------------------------------------------------------------------
@dataclass(frozen=True)
class CacheBudget:
    """The budget a run uses, and everything the preamble and stderr say about it."""

    budget_bytes: int
    cache_auto: bool
    cache_floor_mb: int
    cache_ceil_mb: int
    force_cache: bool
    top_k: int
    cycle_bytes: int
    available_bytes: int | None = None  # auto only: what it sized from, after the dense reservation
    cap_bytes: int | None = None  # auto only
    dense_reserved_bytes: int = 0
    # stderr at load. bmoe-cli prints the auto lines, then the dense-weights and "expert streaming
    # ON" lines; bmoe-py adds the cycle warning last (bmoe-cli has none).
    auto_messages: tuple[str, ...] = ()
    warning: str | None = None

    @property
    def messages(self) -> tuple[str, ...]:
        return self.auto_messages + ((self.warning,) if self.warning else ())

    @property
    def cache_mb(self) -> int:
        return cache_mb_of(self.budget_bytes)

    @property
    def cache_cycle_mb(self) -> int:
        return cycle_mb_of(self.cycle_bytes)


def resolve_budget(
    flags: CacheFlags,
    shape: ModelShape,
    top_k: int,
    available: AvailableMemory | None = None,
    one_line_warning: bool = False,
) -> CacheBudget:
    """Validate the flags, size the budget, price the cycle. Raises ConfigError.

    `available` is read from this machine when not given (only `auto` needs it). Without
    --moe-stream the budget is 0 and no cache flag is looked at, as upstream.
    """
    validate(flags)
    cycle = shape.cycle_bytes(top_k)
    base = CacheBudget(
        budget_bytes=0,
        cache_auto=flags.cache_auto and flags.moe_stream,
        cache_floor_mb=flags.cache_floor_mb,
        cache_ceil_mb=flags.cache_ceil_mb,
        force_cache=flags.force_cache,
        top_k=top_k,
        cycle_bytes=cycle,
    )
    if not flags.moe_stream:
        return base
    if flags.cache_auto:
        if available is None:
            available = available_memory()
        # What the dense policy is about to convert: never the nextn/MTP blocks, which no decode reads.
        dense = [t.nbytes for t in shape.bound_dense_tensors] if flags.dense_weights in _DENSE_CONVERTING else []
        auto = auto_budget(shape.expert_bytes, available.bytes, flags.cache_floor_mb, flags.cache_ceil_mb, dense)
        budget = replace(
            base,
            budget_bytes=auto.budget_bytes,
            available_bytes=auto.available_bytes,
            cap_bytes=auto.cap_bytes,
            dense_reserved_bytes=auto.dense_reserved_bytes,
            auto_messages=auto.messages,
        )
    else:
        budget = replace(base, budget_bytes=flags.cache_mb * MIB)
    return replace(budget, warning=cycle_warning(budget.budget_bytes, cycle, top_k, one_line_warning))
