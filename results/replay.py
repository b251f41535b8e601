"""Replay route traces through expert-cache policies: exact global-LRU hit curves in one pass.

The access model is the engine's own (upstream `ExpertStreamSource::load_layer`, serial and
overlap paths alike), checked row by row against the residency the engine recorded:

- one lookup per unique expert per load_layer batch. A batch is one layer of one llama_decode
  call: in decode one token's top-k, in prefill ALL prompt tokens of that layer at once (the trace
  numbers those rows by token position, so prefill rows of one layer do not share a step, yet they
  are one batch). Duplicates inside a batch only promote;
- a miss inserts the entry (its layer's `expert_bytes`) at the MRU end; the batch's entries end up
  ordered by their last touch (token-major);
- after the batch the LRU tail is evicted while the cache is over budget, never evicting an entry
  the batch touched (so one huge prefill batch can overshoot until the next batch).

That policy is a stack algorithm even with per-layer entry sizes: the resident set after a batch
is every entry whose byte-weighted stack distance is <= budget, plus the batch's own entries. So
an access hits at budget B > 0 iff its previous touch was in the immediately preceding batch or
its stack distance (own bytes + bytes of distinct entries touched since) is <= B. Budget 0 is the
engine's cache-off mode: no entry is kept. See docs/replay.md.
"""

from __future__ import annotations

import heapq
import json
import math
import os
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import BmoeError
from engine.fsutil import atomic_write
from engine.units import MIB

from .parse_text import printable, safe_message
from .route_trace import PHASE_DECODE, RouteTrace, read_route_trace

POLICIES = ("lru", "layer-lru", "lfu", "belady")
PHASES = ("decode", "all")
FORMAT = "bmoe-fleet.replay"
FORMAT_VERSION = 1
CSV_HEADER = "budget_mib,policy,hit_pct_cum,hit_pct_decode,read_mib"

COLD = np.iinfo(np.int64).max  # stack distance of a first-ever lookup: misses at every budget
# Byte sums over a whole trace stay under this, so int64 never overflows (read_route_trace bounds
# entry sizes; this bounds entries x lookups). A budget above it hits like an unbounded cache.
MAX_TRACE_BYTES = 1 << 62


class ReplayError(BmoeError):
    """A replay cannot run with the traces or options given (one terminal-safe line)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(safe_message(message))


@dataclass(frozen=True, eq=False)
class AccessSequence:
    """The cache lookups the engine performs for one trace, in the order it performs them.

    Inside a batch the lookups are ordered by each expert's last touch, which is the LRU order the
    batch leaves behind; hit or miss inside a batch depends only on the state before it.
    """

    key: np.ndarray  # layer * n_expert + expert
    layer: np.ndarray
    batch: np.ndarray  # load_layer call index, non-decreasing
    entry_bytes: np.ndarray
    decode: np.ndarray  # bool: the batch is a decode step
    row_access: np.ndarray  # per trace row: index of the lookup it belongs to, -1 if none
    n_batches: int
    n_decode_batches: int

    def __post_init__(self) -> None:
        for name in ("key", "layer", "batch", "entry_bytes", "decode", "row_access"):
            getattr(self, name).setflags(write=False)

    def __len__(self) -> int:
        return len(self.key)

    def batch_bounds(self) -> np.ndarray:
        """Start index of each non-empty batch's lookups, plus len(self) at the end."""
        starts = np.flatnonzero(np.r_[True, self.batch[1:] != self.batch[:-1]]) if len(self) else np.array([], int)
        return np.r_[starts, len(self)]


def access_sequence(trace: RouteTrace) -> AccessSequence:
    """Trace rows -> the engine's lookups. Rows of layers without a `# layer=` line (not streamed)
    are not looked up, as in the engine. (read_route_trace refuses expert ids outside
    [0, n_expert); a RouteTrace built by hand with them has those rows skipped.)"""
    rows = trace.rows
    n_expert = trace.n_expert
    max_layer = max([0, *trace.expert_bytes_by_layer])
    bytes_lut = np.zeros(max_layer + 1, dtype=np.int64)
    streamed_lut = np.zeros(max_layer + 1, dtype=bool)
    for il, nbytes in trace.expert_bytes_by_layer.items():
        if il >= 0:
            bytes_lut[il] = nbytes
            streamed_lut[il] = True

    layer = rows.layer
    streamed = (layer >= 0) & (layer <= max_layer) & streamed_lut[np.clip(layer, 0, max_layer)]
    sr = np.flatnonzero(streamed)  # rows that reach a load_layer call
    # The writer flushes one layer's rows per load_layer call, token-major. So a batch is a run of
    # rows sharing (turn, phase, layer), and in decode also the step: a prefill batch spans all
    # its tokens' positions, a decode batch is one token (which keeps one-layer models right).
    t, ph, ly, st = rows.turn[sr], rows.phase[sr], layer[sr], rows.step[sr]
    changed = (t[1:] != t[:-1]) | (ph[1:] != ph[:-1]) | (ly[1:] != ly[:-1])
    changed |= (ph[1:] == PHASE_DECODE) & (st[1:] != st[:-1])
    new_batch = np.r_[np.ones(min(1, len(sr)), dtype=bool), changed]
    batch_of_row = np.cumsum(new_batch) - 1
    n_batches = int(new_batch.sum())
    n_decode_batches = int((new_batch & (ph == PHASE_DECODE)).sum())

    expert = rows.expert[sr]
    looked_up = (expert >= 0) & (expert < n_expert)
    lr = np.flatnonzero(looked_up)
    n_keys = (max_layer + 1) * max(n_expert, 1)
    key_of_row = ly[lr] * n_expert + expert[lr]
    composite = batch_of_row[lr] * n_keys + key_of_row
    # Last touch of each (batch, key): unique over the reversed rows finds it, and ordering the
    # lookups by it reproduces the LRU order the engine's duplicate promotion leaves behind.
    uniq, first_in_reversed, inverse_reversed = np.unique(composite[::-1], return_index=True, return_inverse=True)
    last_touch = len(lr) - 1 - first_in_reversed
    order = np.argsort(last_touch, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    row_access = np.full(len(rows), -1, dtype=np.int64)
    row_access[sr[lr]] = rank[inverse_reversed.reshape(-1)[::-1]]

    acc = uniq[order]
    key = acc % n_keys
    acc_layer = key // max(n_expert, 1)
    acc_rows = sr[lr][last_touch[order]]
    return AccessSequence(
        key=key, layer=acc_layer, batch=acc // n_keys, entry_bytes=bytes_lut[acc_layer],
        decode=rows.phase[acc_rows] == PHASE_DECODE, row_access=row_access,
        n_batches=n_batches, n_decode_batches=n_decode_batches)


def _previous_access(key: np.ndarray) -> np.ndarray:
    """For each lookup, the index of the same key's previous lookup, or -1."""
    order = np.argsort(key, kind="stable")
    prev = np.full(len(key), -1, dtype=np.int64)
    same = key[order[1:]] == key[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    return prev


def _nested_reuse_bytes(prev: np.ndarray, weight: np.ndarray, q_end: np.ndarray, q_prev: np.ndarray) -> np.ndarray:
    """For each query q: sum of weight[t] over t < q_end[q] with prev[t] > q_prev[q].

    A merge-sort tree over access times, built and queried level by level in numpy: at level L the
    accesses are grouped in aligned blocks of 2**L times and sorted by `prev` inside each block, the
    prefix [0, q_end) is covered by one block per set bit of q_end, and a binary search in each
    block finds the entries above the threshold. O(N log N) to build (each level is a stable merge
    of the previous one's sorted runs) and O(N log^2 N) to query, all inside numpy.
    """
    n = len(prev)
    out = np.zeros(len(q_end), dtype=np.int64)
    if n == 0 or len(q_end) == 0:
        return out
    span = n + 1  # prev + 1 lies in [0, n]
    value = prev + 1
    threshold = q_prev + 1
    order = np.arange(n)
    width, level = 1, 0
    top = int(q_end.max())
    while width <= top:
        sorted_keys = (order >> level) * span + value[order]
        if level:
            merge = np.argsort(sorted_keys, kind="stable")
            order, sorted_keys = order[merge], sorted_keys[merge]
        cum_weight = np.r_[0, np.cumsum(weight[order])]
        sel = np.flatnonzero((q_end >> level) & 1)
        if len(sel):
            block = (q_end[sel] >> (level + 1)) << 1
            pos = np.searchsorted(sorted_keys, block * span + threshold[sel], side="right")
            out[sel] += cum_weight[(block + 1) * width] - cum_weight[pos]
        width <<= 1
        level += 1
    return out


def stack_distances(seq: AccessSequence) -> np.ndarray:
    """Per lookup, the smallest budget in bytes at which it hits: COLD for a first lookup, 0 when
    the previous touch was the batch just before (protected from that batch's eviction), else its
    own bytes + the bytes of distinct entries touched since its previous touch, up to the start of
    its batch."""
    n = len(seq)
    distance = np.full(n, COLD, dtype=np.int64)
    if n == 0:
        return distance
    prev = _previous_access(seq.key)
    batch_start = np.searchsorted(seq.batch, seq.batch, side="left")
    reused = np.flatnonzero(prev >= 0)
    p, s = prev[reused], batch_start[reused]
    cum = np.r_[0, np.cumsum(seq.entry_bytes)]
    # Distinct entries in (p, s) = all lookups there minus repeat lookups whose previous touch is
    # also there (each distinct entry counted once, at its first touch after p).
    between = cum[s] - cum[p + 1] - _nested_reuse_bytes(prev, seq.entry_bytes, s, p)
    d = seq.entry_bytes[reused] + between
    d[seq.batch[p] == seq.batch[reused] - 1] = 0
    distance[reused] = d
    return distance


def mib_to_bytes(budget_mib: float) -> int:
    """The engine budgets whole bytes: cache_max = MiB x 2**20 (fractions floored). Capped at
    MAX_TRACE_BYTES, which every trace replayed fits in, so comparisons stay inside int64."""
    return min(int(budget_mib * MIB), MAX_TRACE_BYTES)


def lru_hits(distance: np.ndarray, budget_bytes: int) -> np.ndarray:
    """Per-lookup hits of the engine's global LRU at `budget_bytes`, from stack distances."""
    if budget_bytes <= 0:
        return np.zeros(len(distance), dtype=bool)
    return distance <= budget_bytes


# ── direct simulations: one pass per budget ─────────────────────────────────────────────────────


def simulate(seq: AccessSequence, policy: str, budget_bytes: int) -> np.ndarray:
    """Per-lookup hits of `policy` at `budget_bytes`, by direct simulation with the engine's batch
    rules (lookups before eviction, eviction after the batch, the batch's entries protected)."""
    if policy not in POLICIES:
        raise ReplayError(f"unknown cache policy {policy!r} (known: {', '.join(POLICIES)})")
    if budget_bytes <= 0 or len(seq) == 0:
        return np.zeros(len(seq), dtype=bool)
    run = {"lru": _sim_lru, "layer-lru": _sim_layer_lru, "lfu": _sim_lfu, "belady": _sim_belady}[policy]
    return run(seq, budget_bytes)


def _lookup_batch(keys: list, sizes: list, start: int, end: int, cache: dict, hits: np.ndarray,
                  stamp: dict | None = None) -> int:
    """One batch's lookups, before any eviction: hits marked, misses inserted; returns the bytes
    inserted. An OrderedDict cache is kept in LRU order (a hit moves to the MRU end); `stamp`
    records each key's last lookup index (the heap-based policies' staleness check)."""
    added = 0
    ordered = isinstance(cache, OrderedDict)
    for i in range(start, end):
        k = keys[i]
        if k in cache:
            hits[i] = True
            if ordered:
                cache.move_to_end(k)
        else:
            cache[k] = sizes[i]
            added += sizes[i]
        if stamp is not None:
            stamp[k] = i
    return added


def _sim_lru(seq: AccessSequence, budget_bytes: int) -> np.ndarray:
    hits = np.zeros(len(seq), dtype=bool)
    keys, sizes = seq.key.tolist(), seq.entry_bytes.tolist()
    cache: OrderedDict[int, int] = OrderedDict()  # LRU first
    used = 0
    bounds = seq.batch_bounds().tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        used += _lookup_batch(keys, sizes, start, end, cache, hits)
        protected = end - start  # the batch's entries are exactly the MRU end
        while used > budget_bytes and len(cache) > protected:
            used -= cache.popitem(last=False)[1]
    return hits


def _sim_layer_lru(seq: AccessSequence, budget_bytes: int) -> np.ndarray:
    """Per-layer partition: every layer the trace routes gets budget // n_layers, LRU inside it. A batch
    is one layer, so the staging layer evicts (protecting its batch); a partition the batch left
    over its share is trimmed at the next batch, as the global cache's overshoot is. Without that
    trim a share under one batch would keep every layer's last batch resident at any budget."""
    hits = np.zeros(len(seq), dtype=bool)
    keys, sizes, layers = seq.key.tolist(), seq.entry_bytes.tolist(), seq.layer.tolist()
    share = budget_bytes // max(1, len(np.unique(seq.layer)))
    parts: dict[int, OrderedDict[int, int]] = {}
    used: dict[int, int] = {}
    last_il = None
    bounds = seq.batch_bounds().tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        il = layers[start]
        cache = parts.setdefault(il, OrderedDict())
        used[il] = used.get(il, 0) + _lookup_batch(keys, sizes, start, end, cache, hits)
        protected = end - start
        while used[il] > share and len(cache) > protected:
            used[il] -= cache.popitem(last=False)[1]
        if last_il is not None and last_il != il:
            while used[last_il] > share:
                used[last_il] -= parts[last_il].popitem(last=False)[1]
        last_il = il
    return hits


def _pop_valid(heap: list, resident: dict, stamp: dict):
    """The heap's best entry that is still current (key resident, not touched since), or None.
    Stale entries are discarded on the way."""
    while heap:
        entry = heap[0]
        if entry[2] in resident and stamp[entry[2]] == entry[1]:
            return entry
        heapq.heappop(heap)
    return None


def _compact(heap: list, resident: dict, stamp: dict) -> list:
    """Drop stale entries once they dominate, so a heap stays O(resident entries)."""
    if len(heap) <= 4 * len(resident) + 64:
        return heap
    heap = [e for e in heap if e[2] in resident and stamp[e[2]] == e[1]]
    heapq.heapify(heap)
    return heap


def _sim_lfu(seq: AccessSequence, budget_bytes: int) -> np.ndarray:
    """Global LFU over lookup counts kept for the whole run (an evicted entry remembers its count);
    ties go to the least recently used. The batch's own entries join the heap only after its
    eviction, which is how they are protected."""
    hits = np.zeros(len(seq), dtype=bool)
    keys, sizes = seq.key.tolist(), seq.entry_bytes.tolist()
    resident: dict[int, int] = {}
    freq: dict[int, int] = {}
    stamp: dict[int, int] = {}
    heap: list[tuple[int, int, int]] = []
    used = 0
    bounds = seq.batch_bounds().tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        used += _lookup_batch(keys, sizes, start, end, resident, hits, stamp)
        for k in keys[start:end]:
            freq[k] = freq.get(k, 0) + 1
        while used > budget_bytes and _pop_valid(heap, resident, stamp) is not None:
            used -= resident.pop(heapq.heappop(heap)[2])
        for i in range(start, end):
            heapq.heappush(heap, (freq[keys[i]], i, keys[i]))
        heap = _compact(heap, resident, stamp)
    return hits


def _sim_belady(seq: AccessSequence, budget_bytes: int) -> np.ndarray:
    """Offline eviction with future knowledge, byte-aware: evict the entry with the largest
    (batches until its next use) x (its bytes); entries never used again go first, largest first.
    With one entry size this is Belady's MIN, optimal for demand fetching; with several sizes the
    exact optimum is NP-hard and this size-weighted rule is the usual approximation."""
    hits = np.zeros(len(seq), dtype=bool)
    keys, sizes, batches = seq.key.tolist(), seq.entry_bytes.tolist(), seq.batch.tolist()
    prev = _previous_access(seq.key)
    next_access = np.full(len(seq), -1, dtype=np.int64)
    next_access[prev[prev >= 0]] = np.flatnonzero(prev >= 0)
    never = batches[-1] + 1
    next_batch = np.where(next_access >= 0, seq.batch[np.maximum(next_access, 0)], never).tolist()
    # Inside one size class "furthest next use first" is a fixed order, so each class keeps its own
    # heap; only the comparison across classes depends on the current batch.
    heaps: dict[int, list[tuple[int, int, int]]] = {}
    resident: dict[int, int] = {}
    stamp: dict[int, int] = {}
    used = 0
    bounds = seq.batch_bounds().tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        used += _lookup_batch(keys, sizes, start, end, resident, hits, stamp)
        now = batches[start]
        while used > budget_bytes:
            best = None
            for nbytes, heap in heaps.items():
                top = _pop_valid(heap, resident, stamp)
                if top is None:
                    continue
                nb = -top[0]
                score = (math.inf if nb == never else (nb - now) * nbytes, nbytes)
                if best is None or score > best[0]:
                    best = (score, heap)
            if best is None:
                break
            used -= resident.pop(heapq.heappop(best[1])[2])
        for i in range(start, end):
            heapq.heappush(heaps.setdefault(sizes[i], []), (-next_batch[i], i, keys[i]))
        for nbytes in heaps:
            heaps[nbytes] = _compact(heaps[nbytes], resident, stamp)
    return hits


# ── curves, reports and the `bmoe-fleet replay` entry point ─────────────────────────────────────


@dataclass(frozen=True)
class CurvePoint:
    """One row of upstream's curve CSV, plus whether the budget sits under the token cycle."""

    budget_mib: float
    policy: str
    hit_pct_cum: float
    hit_pct_decode: float
    read_mib: float
    under_cycle: bool

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}")
        if not (0.0 <= self.hit_pct_cum <= 100.0 and 0.0 <= self.hit_pct_decode <= 100.0 and self.read_mib >= 0):
            raise ValueError(f"impossible curve point {self}")

    def to_dict(self) -> dict[str, Any]:
        return {"budget_mib": self.budget_mib, "policy": self.policy, "hit_pct_cum": self.hit_pct_cum,
                "hit_pct_decode": self.hit_pct_decode, "read_mib": self.read_mib, "under_cycle": self.under_cycle}


def _curve_point(seq: AccessSequence, budget_mib: float, policy: str, hits: int, decode_hits: int,
                 read_bytes: int, cycle_bytes: int) -> CurvePoint:
    n, n_decode = len(seq), int(seq.decode.sum())
    return CurvePoint(
        budget_mib=float(budget_mib), policy=policy,
        hit_pct_cum=100.0 * hits / n if n else 0.0,
        hit_pct_decode=100.0 * decode_hits / n_decode if n_decode else 0.0,
        read_mib=read_bytes / MIB, under_cycle=mib_to_bytes(budget_mib) < cycle_bytes)


def simulated_point(seq: AccessSequence, policy: str, budget_mib: float, cycle_bytes: int) -> CurvePoint:
    """One budget of any policy, by direct simulation."""
    hits = simulate(seq, policy, mib_to_bytes(budget_mib))
    return _curve_point(seq, budget_mib, policy, int(hits.sum()), int(hits[seq.decode].sum()),
                        int(seq.entry_bytes[~hits].sum()), cycle_bytes)


def lru_curve(seq: AccessSequence, budgets_mib: Sequence[float], cycle_bytes: int,
              distance: np.ndarray | None = None) -> list[CurvePoint]:
    """Exact global-LRU points at every budget from one set of stack distances: a budget's hits
    are the lookups whose distance is <= it, found by binary search in the sorted distances."""
    if distance is None:
        distance = stack_distances(seq)
    order = np.argsort(distance, kind="stable")
    sorted_distance = distance[order]
    hit_bytes = np.r_[0, np.cumsum(seq.entry_bytes[order])]
    sorted_decode_distance = np.sort(distance[seq.decode])
    total_bytes = int(hit_bytes[-1])
    points = []
    for mib in budgets_mib:
        b = mib_to_bytes(mib)
        hits = int(np.searchsorted(sorted_distance, b, side="right")) if b > 0 else 0
        decode_hits = int(np.searchsorted(sorted_decode_distance, b, side="right")) if b > 0 else 0
        read_bytes = total_bytes - int(hit_bytes[hits])
        points.append(_curve_point(seq, mib, "lru", hits, decode_hits, read_bytes, cycle_bytes))
    return points


def first_decode_hit_mib(seq: AccessSequence, distance: np.ndarray) -> float | None:
    """The smallest budget at which any decode lookup hits under global LRU (to 0.001 MiB): below
    it the decode hit rate is 0 %. None when no decode lookup is ever a reuse."""
    decode = distance[seq.decode]
    reuse = decode[decode != COLD]
    return round(int(reuse.min()) / MIB, 3) if len(reuse) else None


def knee_mib(seq: AccessSequence, distance: np.ndarray) -> int | None:
    """The knee of the global-LRU hit curve (Kneedle: Satopaa et al., 2011), in whole MiB.

    Over the budgets from the first hit to the last (where every reuse hits), with both axes
    scaled to 0..1, the knee is the budget where the curve stands highest above the straight line
    between those ends: before it each MiB buys more hits than average, past it less. Counted on
    decode lookups when the trace has any (the steady state a sweep measures), else on all. Exact:
    the curve only steps at stack distances, so the knee is one of them. None when nothing is reused.
    """
    d = distance[seq.decode] if seq.decode.any() else distance
    reuse = np.sort(d[d != COLD])
    if not len(reuse):
        return None
    steps = np.unique(reuse)
    hits_at = np.searchsorted(reuse, steps, side="right") / len(reuse)      # fraction of reuses hit
    lo, hi = int(steps[0]), int(steps[-1])
    if hi == lo:
        return max(1, math.ceil(lo / MIB))
    x = (steps - lo) / (hi - lo)
    knee = int(steps[int(np.argmax(hits_at - x))])
    return max(1, math.ceil(knee / MIB))


def default_budgets_mib(cycle_mib: float) -> list[float]:
    """About twenty round budgets from 0 to 2 x T, plus T itself (to 0.1 MiB)."""
    if cycle_mib <= 0:
        return [0.0]
    raw = 2 * cycle_mib / 20
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    n_steps = math.ceil(2 * cycle_mib / step - 1e-9)
    budgets = {round(i * step, 6) for i in range(n_steps + 1)} | {round(cycle_mib, 1)}
    return sorted(budgets)


@dataclass(frozen=True)
class TraceReplay:
    """One trace's replay: its shape, its token cycle T, and the curve points."""

    path: str
    model: str
    arch: str
    n_layer: int
    n_moe_layers: int
    n_expert: int
    n_expert_used: int
    cycle_bytes: int
    lookups: int
    decode_lookups: int
    batches: int
    decode_batches: int
    dropped_rows: int
    # the smallest budget at which any decode lookup hits under global LRU (None: no reuse at all)
    first_decode_hit_mib: float | None
    knee_mib: int | None             # knee_mib(): where more MiB start buying fewer hits (decode)
    budgets_mib: tuple[float, ...]
    points: tuple[CurvePoint, ...]

    @property
    def cycle_mib(self) -> float:
        return self.cycle_bytes / MIB

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "model": self.model, "arch": self.arch, "n_layer": self.n_layer,
            "n_moe_layers": self.n_moe_layers, "n_expert": self.n_expert, "n_expert_used": self.n_expert_used,
            "cycle_mib": round(self.cycle_mib, 3), "cycle_bytes": self.cycle_bytes,
            "lookups": self.lookups, "decode_lookups": self.decode_lookups, "batches": self.batches,
            "decode_batches": self.decode_batches, "dropped_rows": self.dropped_rows,
            "first_decode_hit_mib": self.first_decode_hit_mib, "knee_mib": self.knee_mib,
            "budgets_mib": list(self.budgets_mib),
            "points": [p.to_dict() for p in self.points],
        }


def _check_options(budgets_mib: Sequence[float] | None, policies: Sequence[str]) -> None:
    if not policies:
        raise ReplayError(f"no cache policy given (known: {', '.join(POLICIES)})")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ReplayError(f"unknown cache policy {unknown[0]!r} (known: {', '.join(POLICIES)})")
    if budgets_mib is not None and (not budgets_mib or any(not math.isfinite(b) or b < 0 for b in budgets_mib)):
        raise ReplayError("budgets must be one or more finite MiB values >= 0")


def replay_trace(trace: RouteTrace, budgets_mib: Sequence[float] | None = None,
                 policies: Sequence[str] = ("lru",)) -> TraceReplay:
    """Curve points for one parsed trace: `lru` from stack distances, the others simulated."""
    _check_options(budgets_mib, policies)
    seq = access_sequence(trace)
    if len(seq) == 0:
        raise ReplayError(f"{trace.path}: no expert lookups to replay (no rows of a streamed layer)")
    if len(seq) * int(seq.entry_bytes.max()) >= MAX_TRACE_BYTES:
        raise ReplayError(f"{trace.path}: {len(seq)} lookups of up to {int(seq.entry_bytes.max())} bytes: too many "
                          f"bytes to replay (2^62 or more)")
    cycle = trace.cycle_bytes
    if budgets_mib is None:
        budgets_mib = default_budgets_mib(cycle / MIB)
    budgets = tuple(dict.fromkeys(float(b) for b in budgets_mib))
    distance = stack_distances(seq)
    points: list[CurvePoint] = []
    for policy in policies:
        if policy == "lru":
            points += lru_curve(seq, budgets, cycle, distance)
        else:
            points += [simulated_point(seq, policy, b, cycle) for b in budgets]
    return TraceReplay(
        path=trace.path, model=trace.model, arch=trace.arch, n_layer=trace.n_layer,
        n_moe_layers=len(trace.expert_bytes_by_layer), n_expert=trace.n_expert, n_expert_used=trace.n_expert_used,
        cycle_bytes=cycle, lookups=len(seq), decode_lookups=int(seq.decode.sum()), batches=seq.n_batches,
        decode_batches=seq.n_decode_batches, dropped_rows=int(trace.rows.dropped.sum()),
        first_decode_hit_mib=first_decode_hit_mib(seq, distance),
        knee_mib=knee_mib(seq, distance), budgets_mib=budgets, points=tuple(points))


@dataclass(frozen=True)
class ReplayReport:
    """Every trace's replay, plus the choices that shape the text table."""

    traces: tuple[TraceReplay, ...]
    policies: tuple[str, ...]
    phase: str

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": FORMAT_VERSION, "phase": self.phase, "policies": list(self.policies),
                "traces": [t.to_dict() for t in self.traces]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @property
    def text(self) -> str:
        return "\n\n".join(_trace_text(t, self.policies, self.phase) for t in self.traces)


def _trace_text(t: TraceReplay, policies: Sequence[str], phase: str) -> str:
    k = min(t.n_expert_used, t.n_expert)
    per_layer = t.cycle_bytes / MIB / max(1, t.n_moe_layers * k)
    lines = [
        f"trace   {printable(t.path)}",
        # model and arch are the trace's own text: shown with control characters escaped
        f"model   {printable(os.path.basename(t.model)) or '?'} ({printable(t.arch) or '?'}), "
        f"{t.n_moe_layers} MoE layers, {t.n_expert} experts, top-{t.n_expert_used}",
        f"T       {t.cycle_mib:.1f} MiB token cycle ({t.n_moe_layers} layers x {per_layer:.2f} MiB x top-{k}); "
        f"budgets under T marked <T",
        f"lookups {t.lookups} in {t.batches} load_layer batches "
        f"({t.lookups - t.decode_lookups} prefill in {t.batches - t.decode_batches}, "
        f"{t.decode_lookups} decode in {t.decode_batches})",
    ]
    if t.first_decode_hit_mib is not None:
        lines.append(f"LRU     first decode hit at {t.first_decode_hit_mib:.1f} MiB; below it decode hit is 0.0 %")
    if t.knee_mib is not None:
        lines.append(f"knee    {t.knee_mib} MiB: past it each MiB buys fewer hits than on average (LRU "
                     f"{'decode' if t.decode_lookups else 'all lookups'}, Kneedle)")
    if t.dropped_rows:
        lines.append(f"note    {t.dropped_rows} dropped routings replayed as reads (the replay has no drop policy)")
    label = "decode hit%" if phase == "decode" else "hit% (all)"
    head1 = f"{'budget':>12}" + "".join(f"{p:>22}" for p in policies)
    head2 = f"{'MiB':>12}" + "".join(f"{label:>12}{'read MiB':>10}" for _ in policies)
    lines += ["", head1, head2]
    by_key = {(p.budget_mib, p.policy): p for p in t.points}
    for b in t.budgets_mib:
        row = f"{b:>9.1f}{' <T' if mib_to_bytes(b) < t.cycle_bytes else '   '}"
        for policy in policies:
            p = by_key[(b, policy)]
            hit = p.hit_pct_decode if phase == "decode" else p.hit_pct_cum
            row += f"{hit:>12.1f}{p.read_mib:>10.1f}"
        lines.append(row)
    return "\n".join(lines)


def _csv_number(value: float, digits: int) -> str:
    text = f"{value:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def write_curve_csv(t: TraceReplay, path: str | Path) -> None:
    """Upstream's curve format (route-replay.py --csv), written atomically: temp file + rename."""
    path = Path(path)
    lines = [CSV_HEADER] + [
        f"{_csv_number(p.budget_mib, 1)},{p.policy},{p.hit_pct_cum:.3f},{p.hit_pct_decode:.3f},{p.read_mib:.1f}"
        for p in t.points
    ]
    atomic_write(path, "\n".join(lines) + "\n")


def replay_traces(paths: Iterable[str | Path], budgets_mib: Sequence[float] | None = None,
                  policies: Sequence[str] = ("lru",), phase: str = "decode",
                  csv_path: str | Path | None = None) -> ReplayReport:
    """`bmoe-fleet replay`: parse each trace, replay it, optionally write the curve CSV."""
    paths = [str(p) for p in paths]
    if not paths:
        raise ReplayError("no route trace given")
    if phase not in PHASES:
        raise ReplayError(f"unknown phase {phase!r} (known: {', '.join(PHASES)})")
    if csv_path is not None and len(paths) != 1:
        raise ReplayError("--csv writes upstream's one-trace curve format: pass exactly one trace (or use --json)")
    policies = tuple(dict.fromkeys(policies))
    _check_options(budgets_mib, policies)
    replays = tuple(replay_trace(read_route_trace(p), budgets_mib, policies) for p in paths)
    if csv_path is not None:
        try:
            write_curve_csv(replays[0], csv_path)
        except OSError as e:
            raise ReplayError(f"cannot write {csv_path}: {e.strerror or e}") from None
    return ReplayReport(traces=replays, policies=policies, phase=phase)
