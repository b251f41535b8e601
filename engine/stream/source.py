"""StreamingExpertSource: routed experts from flash (engine/stream/io.py) through the LRU (engine/stream/cache.py).

It satisfies the forward pass's ExpertSource protocol (engine/forward/experts.py):

    fetch(layer, experts) -> {expert: (slice bytes, ...)}  # 1-D uint8, ExpertLayer.tensors order

called once per layer per forward batch with the batch's unique routed experts. The misses of a
batch are read together, spread over the I/O lanes; the returned arrays are read-only because a
cached entry is shared by every later hit. Passing the batch's ids in routing order (token-major,
repeats included) instead of sorted reproduces bmoe-cli's LRU order exactly; hits and misses are
the same either way.

--prefetch K follows bmoe-cli's temporal prefetch (MoeStreamConfig::prefetch_layers, RouterHook):
right after layer l's demand read, the idle lanes read the experts the *last token of the previous
pass* routed at layers l+1..l+K (its row, in slot order: upstream's prev_ids_). When the next layer
is fetched, reads that completed by then enter the cache at its LRU end, so a wrong guess is the
first thing evicted; reads still running are waited for and dropped, queued ones cancelled (the
bytes of every read that ran count in read_bytes, as upstream's reader counts them). A hit on a
prefetched entry is residency 2 in the route trace and counts once in spec_useful. With one I/O
lane there is no idle lane (upstream's lane 0 is the eval thread), so nothing speculative runs
unless prefetch_sync (`--prefetch-sync`) reads each guess on issue. A layer --drop-cold-experts
decides issues its guesses before its read instead, as upstream's deferred load does
(`resident_before_read`).

Every DENSE_PROBE_EVERY layer loads the source also samples the dense-weights residency sensor
(upstream's dense_resident_frac), when the session gave it one.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from engine.errors import BmoeError
from engine.gguf.model import ExpertLayer, ModelShape
from engine.stream.cache import CacheStats, ExpertCache
from engine.stream.io import DirectReader, IoStats
from engine.units import MIB

PREFETCH_LAYERS_MAX = 8
DENSE_PROBE_EVERY = 128  # layer loads between dense-residency samples (upstream's throttle)

# bmoe-cli's validate() text for --prefetch without a cache (core/src/config.cpp).
PREFETCH_NEEDS_CACHE = (
    "moe.prefetch_layers requires the LRU cache (cache_mb > 0 or cache_auto): speculative reads land "
    "in the per-layer cache buffers, which do not exist with the cache off."
)


class StreamError(BmoeError):
    """The source was asked for something the model or its configuration does not have."""


class Residency(enum.IntEnum):
    """The route trace's residency column. Falsy exactly on a miss, so it reads as `hit`."""

    MISS = 0
    HIT = 1
    PREFETCH_HIT = 2


AccessHook = Callable[[int, int, Residency], None]


@dataclass(frozen=True)
class StreamStats:
    io: IoStats  # demand reads only
    cache: CacheStats
    fetches: int
    fetch_s: float  # wall inside fetch()
    spec_issued: int  # speculative expert reads asked for (issued or, with no idle lane, dropped)
    spec_read_bytes: int  # payload of the speculative reads that landed before their layer (spec_read_MiB)
    spec_experts: int  # prefetched experts that entered the cache (spec_experts)
    spec_window_bytes: int  # storage bytes every speculative read pulled, used or not (part of read_bytes)
    token_demand_bytes: int  # distinct expert bytes the last completed pass routed
    layer_demand_bytes: int  # its widest layer
    dense_resident_frac: float = -1.0  # the last dense-residency sample; -1 = not sampled yet

    @property
    def window_bytes(self) -> int:
        """Everything storage delivered, demand and speculative: the CSV's read_bytes."""
        return self.io.window_bytes + self.spec_window_bytes

    @property
    def mgmt_s(self) -> float:
        """Streaming time that is not waiting on demand reads: upstream's cache-mgmt share."""
        return max(0.0, self.fetch_s - self.io.read_s)


class StreamingExpertSource:
    def __init__(
        self,
        shape: ModelShape,
        budget_bytes: int,
        io_threads: int = 4,
        o_direct: bool = True,
        prefetch: int = 0,
        on_access: AccessHook | None = None,
        prefetch_sync: bool = False,
        top_k: int | None = None,
        dense_probe: Callable[[], float] | None = None,
    ) -> None:
        """top_k: the routing width, so the last top_k ids of a fetch are the batch's last token
        (the model's own expert_used_count when not given). dense_probe: the dense-residency
        sensor, sampled every DENSE_PROBE_EVERY layer loads."""
        if not 0 <= prefetch <= PREFETCH_LAYERS_MAX:
            raise StreamError(f"moe.prefetch_layers must be in [0, {PREFETCH_LAYERS_MAX}]")
        if prefetch > 0 and budget_bytes <= 0:
            raise StreamError(PREFETCH_NEEDS_CACHE)
        self.shape = shape
        self.prefetch_layers = prefetch
        # Test/debug only, like bmoe-cli's --prefetch-sync: wait for each prefetch right after
        # issuing it, so whether it lands before the next layer is not a race.
        self.prefetch_sync = prefetch_sync
        self.on_access = on_access
        self._layers: dict[int, ExpertLayer] = {layer.layer: layer for layer in shape.moe_layers}
        self._cache = ExpertCache(budget_bytes)
        self._started_with_cache = budget_bytes > 0
        # With the cache off nothing keeps what is read past the caller's layer: recycle buffers.
        self._reader = DirectReader(io_threads, o_direct, reuse_buffers=budget_bytes == 0)
        try:
            for path in shape.paths:  # settle o_direct for every shard now, as upstream does at init
                self._reader.open(path)
        except BaseException:
            self._reader.close()
            raise
        self._pending: dict[tuple[int, int], tuple[Future[list[tuple[np.ndarray, int]]], int]] = {}
        self._fetches = 0
        self._fetch_s = 0.0
        self._spec_issued = 0
        self._spec_read_bytes = 0
        self._spec_experts = 0
        self._top_k = top_k or shape.top_k or 0
        # Per layer, the last token's routing at its latest visit: what --prefetch bets on next.
        self._history: dict[int, tuple[int, ...]] = {}
        self._issued_early: int | None = None   # the layer resident_before_read issued for
        self.dense_probe = dense_probe
        self._dense_resident_frac = -1.0
        # Pass tracking: a layer index that does not increase starts the next token's pass.
        self._last_layer = -1
        self._demand_accum_bytes = 0
        self._layer_demand_accum_bytes = 0
        self._token_demand_bytes = 0
        self._layer_demand_bytes = 0

    # ---- the ExpertSource protocol ---------------------------------------------------------
    def fetch(self, layer: int, experts: Sequence[int]) -> Mapping[int, Sequence[np.ndarray]]:
        t0 = time.perf_counter()
        spec = self._layers.get(layer)
        if spec is None:
            raise StreamError(f"layer {layer} has no streamed experts (MoE layers: {sorted(self._layers)})")
        # Last occurrence wins, as in the cache: routing-order ids (token-major) give upstream's LRU.
        unique = tuple(dict.fromkeys(int(e) for e in reversed(list(experts))))[::-1]
        for e in unique:
            if not 0 <= e < spec.n_expert:
                raise StreamError(f"expert {e} out of range 0..{spec.n_expert - 1} in layer {layer}")
        if self._pending:
            self._integrate_prefetch()
        self._account_pass(layer, unique, spec.expert_bytes)
        if self.dense_probe is not None and (self._fetches + 1) % DENSE_PROBE_EVERY == 0:
            self._dense_resident_frac = self.dense_probe()

        found = self._cache.lookup_batch(layer, unique, spec.expert_bytes)
        out: dict[int, tuple[np.ndarray, ...]] = {}
        # The read phase runs (and is timed) even with nothing to read, as upstream's load_layer
        # times it: a streamed token's io_ms is never exactly 0, so --progress prints its BMOE_LOAD.
        per_expert = [spec.slices(e) for e in found.misses]
        try:
            data = self._reader.read_slices([s for slices in per_expert for s in slices])
        except BaseException:
            for e in found.retained:  # slots that will never receive their bytes
                self._cache.discard(layer, e)
            raise
        pos = 0
        for e, slices in zip(found.misses, per_expert):
            value = tuple(data[pos : pos + len(slices)])
            pos += len(slices)
            for arr in value:
                arr.flags.writeable = False
            out[e] = value
        for e in found.retained:
            self._cache.store(layer, e, out[e])
        for e in found.hits:
            out[e] = self._cache.get(layer, e)

        if self.on_access is not None:
            spec_hits = set(found.speculative_hits)
            hits = set(found.hits)
            for e in unique:
                residency = (
                    Residency.PREFETCH_HIT if e in spec_hits else Residency.HIT if e in hits else Residency.MISS
                )
                self.on_access(layer, e, residency)
        if self.prefetch_layers and self._issued_early != layer:
            self._issue_prefetch(layer)
            self._remember(layer, experts)
        self._issued_early = None
        self._fetches += 1
        self._fetch_s += time.perf_counter() - t0
        return {e: out[e] for e in unique}

    # ---- telemetry -----------------------------------------------------------------------
    @property
    def o_direct(self) -> bool:
        return self._reader.o_direct

    @property
    def io_threads(self) -> int:
        return self._reader.io_threads

    @property
    def budget_bytes(self) -> int:
        return self._cache.budget_bytes

    def fallback_reasons(self) -> dict[str, str]:
        return self._reader.fallback_reasons()

    def messages(self) -> list[str]:
        """bmoe-cli's load-time stderr lines from the streamer, in its order."""
        return [*self.open_messages(), self.streaming_on_line()]

    def open_messages(self) -> list[str]:
        """What opening the files printed (the O_DIRECT wrong-data fallback); upstream prints it
        before the dense-weights lines."""
        return self._reader.messages()

    def streaming_on_line(self) -> str:
        """The last load line, after the dense-weights policy has run."""
        return (f"bmoe: expert streaming ON  n_expert={self.shape.n_expert} o_direct={int(self.o_direct)} "
                f"io_threads={self.io_threads} cache={self.budget_bytes // MIB} MiB shards={len(self.shape.paths)}")

    def stats(self) -> StreamStats:
        return StreamStats(
            io=self._reader.stats(),
            cache=self._cache.stats(),
            fetches=self._fetches,
            fetch_s=self._fetch_s,
            spec_issued=self._spec_issued,
            spec_read_bytes=self._spec_read_bytes,
            spec_experts=self._spec_experts,
            spec_window_bytes=self._reader.background_window_bytes,
            token_demand_bytes=self._token_demand_bytes,
            layer_demand_bytes=self._layer_demand_bytes,
            dense_resident_frac=self._dense_resident_frac,
        )

    def is_resident(self, layer: int, expert: int) -> bool:
        return self._cache.contains(layer, expert)

    def resident_before_read(self, layer: int, routed: Sequence[int]) -> list[bool]:
        """Which of the router's `routed` ids (routing order) the cache holds before this layer's
        read: what --drop-cold-experts decides on (engine.stream.drop).

        It is upstream's deferred load (RouterHook at 2d4f2b1): when the drop policy decides a
        layer, the router's callback has already issued the next layers' prefetch and recorded
        this routing for the next token's guesses, and only then are landed guesses integrated
        (settle_spec) and residency asked. The fetch that follows reads the layer, issuing and
        recording nothing again, so its edited ids never become a guess."""
        if self.prefetch_layers:
            self._issue_prefetch(layer)
            self._remember(layer, routed)
            self._issued_early = layer
        return self.resident(layer, routed)

    def resident(self, layer: int, experts: Iterable[int]) -> list[bool]:
        """Which of `experts` the cache holds now, prefetches that landed integrated first
        (upstream's settle_spec before query_residency); what --expert-substitute prefers."""
        if self._pending:
            self._integrate_prefetch()
        return [self._cache.contains(layer, int(e)) for e in experts]

    # ---- budget --------------------------------------------------------------------------
    def set_cache_budget(self, budget_bytes: int) -> int:
        """Resize between generations, with Session::set_cache_budget_mb's rules; returns the budget.

        A source started with the cache off stays off (upstream never built the LRU buffers); a
        shrink stops at 1 byte rather than 0 (0 would switch modes under a live decode); a grow
        is capped at the whole expert bank. Shrinking evicts to the new budget immediately.
        """
        if not self._started_with_cache:
            return self._cache.budget_bytes
        if budget_bytes > self._cache.budget_bytes:
            self._cache.set_budget(min(budget_bytes, self.shape.expert_bytes))
        elif budget_bytes < self._cache.budget_bytes:
            self._cancel_prefetch()
            self._cache.set_budget(max(1, budget_bytes))
        return self._cache.budget_bytes

    # ---- internals -----------------------------------------------------------------------
    def _account_pass(self, layer: int, unique: tuple[int, ...], expert_bytes: int) -> None:
        if layer <= self._last_layer:  # the previous pass (token or prefill batch) just ended
            self._token_demand_bytes = self._demand_accum_bytes
            self._layer_demand_bytes = self._layer_demand_accum_bytes
            self._demand_accum_bytes = 0
            self._layer_demand_accum_bytes = 0
        self._last_layer = layer
        demand = len(unique) * expert_bytes
        self._demand_accum_bytes += demand
        self._layer_demand_accum_bytes = max(self._layer_demand_accum_bytes, demand)

    def _remember(self, layer: int, routed: Sequence[int]) -> None:
        """This pass's routing at `layer` (its last token's row): the next pass's guesses there."""
        ids = [int(e) for e in routed]
        self._history[layer] = tuple(ids[-self._top_k:]) if self._top_k else tuple(dict.fromkeys(reversed(ids)))[::-1]

    def _issue_prefetch(self, layer: int) -> None:
        # One lane is the caller's own: no idle lane ever picks a guess up, so (as upstream) it is
        # counted — and its reread charged — but never read, unless prefetch_sync reads it now.
        no_idle_lane = self._reader.io_threads == 1 and not self.prefetch_sync
        for ahead in range(layer + 1, layer + 1 + self.prefetch_layers):
            spec = self._layers.get(ahead)
            if spec is None:
                continue
            for e in self._history.get(ahead, ()):
                key = (ahead, e)
                if key in self._pending or not self._cache.begin_speculative(ahead, e):
                    continue
                self._spec_issued += 1
                if no_idle_lane:
                    continue
                future = self._reader.submit_slices(spec.slices(e))
                self._pending[key] = (future, spec.expert_bytes)
                if self.prefetch_sync:
                    future.exception()

    def _integrate_prefetch(self) -> None:
        """Upstream's quiesce before a layer's demand read: cancel the guesses not started, wait
        for the ones running (their bytes were pulled, but they landed too late and are dropped),
        and cache the ones that had completed, at the LRU end."""
        pending, self._pending = self._pending, {}
        landed = {key for key, (future, _) in pending.items() if future.done()}
        for key, (future, expert_bytes) in pending.items():
            if key not in landed:
                if not future.cancel():
                    future.exception()  # running: wait, so no read is still landing afterwards
                continue
            try:
                results = future.result()
            except BmoeError:
                continue  # a failed guess costs nothing but the guess; a demand read will retry
            self._spec_read_bytes += sum(data.size for data, _ in results)
            value = tuple(data for data, _ in results)
            for arr in value:
                arr.flags.writeable = False
            if self._cache.integrate_speculative(key[0], key[1], value, expert_bytes):
                self._spec_experts += 1

    def _cancel_prefetch(self) -> None:
        pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            if not future.cancel():
                future.exception()  # wait: no read may still be landing when the budget moves

    def close(self) -> None:
        self._cancel_prefetch()
        self._reader.close()

    def __enter__(self) -> StreamingExpertSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
