"""What one bmoe-cli run printed, as records: the end-of-run stdout block, stderr's `bmoe:` load
lines, errors, `--progress` events, pressure and entry-state lines (results.read.parse_console reads
them).

A number a reader found impossible for its field (nan, a negative time, a hit rate over 100 %) is
stored as None with a note in `ConsoleRun.notes` (results.read.parse_values), so every measured field
is optional. Counts the line's shape reads as bare digits cannot be impossible and are plain
ints; the `bmoe: expert streaming ON` values are read as printed (`key=value`), so a damaged
file can give a float there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class Generation:
    """`generation:` tokens decoded and their rate."""

    tokens: int
    s_per_token: float | None
    tok_per_s: float | None


@dataclass(frozen=True)
class ComputeUse:
    """`compute:` CPU occupancy, CPU seconds per token, threads and major faults."""

    cpu_occupancy_pct: float | None
    cpu_s_per_token: float | None
    threads: int
    majflt_per_token: float | None


@dataclass(frozen=True)
class Prefill:
    """`prefill:` the prompt, model load and time to first token."""

    tokens: int
    prefill_s: float | None
    tok_per_s: float | None
    load_s: float | None
    ttft_s: float | None


@dataclass(frozen=True)
class MoeStream:
    """`moe-stream:` flash reads and the decode time split."""

    read_mib: float | None
    read_mib_per_token: float | None
    decode_s_per_token: float | None
    compute_s_per_token: float | None
    cache_mgmt_s_per_token: float | None  # absent before the 2026-07-13 builds
    flash_io_s_per_token: float | None
    flash_mib_per_s: float | None


@dataclass(frozen=True)
class MoeCache:
    """`moe-cache:` hit rate, resident MiB and the auto budget."""

    hit_pct: float | None
    resident_mib: float | None
    budget_mib: float | None  # printed only when the engine chose it (`--cache-mb auto`)
    auto: bool
    resized_count: int | None  # `resized N×`, printed by July 2026 builds only


@dataclass(frozen=True)
class CacheChurn:
    """`moe-cache:` evictions and re-reads."""

    evictions: int
    rereads: int
    rereads_per_token: float | None
    note: str


@dataclass(frozen=True)
class Prefetch:
    """`moe-prefetch:` speculative reads and how many were useful."""

    speculative_mib: float | None
    useful_experts: int
    experts: int
    useful_pct: float | None
    mode: str | None  # `route-ahead` / `stale-gate` in brackets, None for plain --prefetch


@dataclass(frozen=True)
class SpecGate:
    """`moe-spec-gate:` router prediction recall."""

    recall_pct: float | None
    auto_disabled_below_pct: float | None  # set when the gate switched itself off


@dataclass(frozen=True)
class CacheAuto:
    """`bmoe: cache auto` sizing: available, left free, the budget and its cap."""

    available_mib: float | None
    free_mib: float | None  # the floor left free (--cache-floor-mb)
    budget_mib: float | None
    cap_mib: float | None


@dataclass(frozen=True)
class DenseWarmup:
    """`bmoe: dense warm-up` MiB and seconds."""

    mib: float | None
    seconds: float | None


@dataclass(frozen=True)
class DenseAnon:
    """`bmoe: dense-weights=` mode, MiB and buffers (and the mmap pages dropped)."""

    mode: str
    mib: float | None
    buffers: int
    dropped_mib: float | None  # the follow-up `dropped N MiB of now-unused mmap pages` line


@dataclass(frozen=True)
class StreamingOn:
    """`bmoe: expert streaming ON` and its key=value settings."""

    n_expert: int | float | None          # as printed (`key=value`): a whole number from an engine
    o_direct: bool
    io_threads: int | float | None
    cache_mib: int | float | None
    shards: int | float | None  # absent before 0.19.0
    extra: Mapping[str, str]


@dataclass(frozen=True)
class CycleWarning:
    """`bmoe: WARNING expert cache … below … token cycle`: the budget, the cycle and the top-k."""

    budget_mib: int | float | None        # whole MiB, read as printed (`1815` or `1815.0`)
    cycle_mib: int | float | None
    top_k: int | None


@dataclass(frozen=True, eq=False)
class ConsoleRun:
    """What one engine run printed. Fields are None (or empty) when their line is absent."""

    paths: tuple[str, ...]
    lines: tuple[str, ...]
    tag: str | None = None  # the driver's separator tag, for a run split out of a multi-run capture
    declared_config: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    generation: Generation | None = None
    compute: ComputeUse | None = None
    prefill: Prefill | None = None
    moe_stream: MoeStream | None = None
    moe_cache: MoeCache | None = None
    cache_churn: CacheChurn | None = None
    overlap_stall_s_per_token: float | None = None
    prefetch: Prefetch | None = None
    spec_gate: SpecGate | None = None
    cache_auto: CacheAuto | None = None
    cache_reserve_mib: float | None = None
    dense_warmup: DenseWarmup | None = None
    dense_anon: DenseAnon | None = None
    streaming: StreamingOn | None = None
    cycle_warning: CycleWarning | None = None
    config_error: str | None = None
    arg_error: str | None = None
    runtime_error: str | None = None
    warnings: tuple[str, ...] = ()
    events: tuple[tuple[str, Mapping[str, object]], ...] = ()  # (`BMOE_` name, JSON payload), in order
    answer: str | None = None  # between `=== answer ===` and `=== perf ===` (--progress)
    pressure: Mapping[str, int | float | None] | None = None  # bench-run.sh sidecar lines
    entry_state: Mapping[str, int | float | str] | None = None  # a cooling gate's `ENTRY STATE:` line
    unparsed: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # values stored as missing (None): `path:line: key=value: why`
    # the lines engine/interface/outputs.py declares field by field (speculative, drop, route-ahead,
    # row, perplexity, mode and plan lines): {line name: {field: value}}, the last of each kind
    values: Mapping[str, Mapping[str, object]] = field(default_factory=lambda: MappingProxyType({}))

    def value(self, line: str, name: str) -> object:
        """A declared line's field, None when the line or the field is absent."""
        return (self.values.get(line) or {}).get(name)

    @property
    def finished(self) -> bool:
        """The end-of-run block was printed (a killed or refused run has none)."""
        return self.generation is not None

    @property
    def load_events(self) -> tuple[Mapping[str, object], ...]:
        """The payloads of the `BMOE_LOAD` events, in order."""
        return tuple(payload for name, payload in self.events if name == "LOAD")

    @property
    def progress(self) -> tuple[Mapping[str, object], ...]:
        """The payloads of the `BMOE_PROGRESS` events, in order."""
        return tuple(payload for name, payload in self.events if name == "PROGRESS")
