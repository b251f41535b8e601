"""Direct simulations of the cache policies the replay compares: one pass per budget.

`lru` is the engine's global LRU (results.replay.lru_replay computes it exactly at every budget at once;
simulating it here checks that), `layer-lru` an LRU per layer sharing the budget, `lfu` evicts
the least-used entry, `belady` the one next used furthest in the future (the optimum). Every
policy follows the engine's batch model: a batch's lookups are judged against the cache before
it, and nothing the batch touched is evicted until it is done.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from itertools import pairwise

import numpy as np

from results.errors import ReplayError
from results.replay.choices import POLICIES
from results.replay.lru_replay import AccessSequence, CurvePoint, curve_point, mib_to_bytes, previous_access


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
    move_to_end = cache.move_to_end if isinstance(cache, OrderedDict) else None
    for i in range(start, end):
        k = keys[i]
        if k in cache:
            hits[i] = True
            if move_to_end is not None:
                move_to_end(k)
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
    for start, end in pairwise(bounds):
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
    for start, end in pairwise(bounds):
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
    for start, end in pairwise(bounds):
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
    prev = previous_access(seq.key)
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
    for start, end in pairwise(bounds):
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


def simulated_point(seq: AccessSequence, policy: str, budget_mib: float, cycle_bytes: int) -> CurvePoint:
    """One budget of any policy, by direct simulation."""
    hits = simulate(seq, policy, mib_to_bytes(budget_mib))
    return curve_point(seq, budget_mib, policy, int(hits.sum()), int(hits[seq.decode].sum()),
                       int(seq.entry_bytes[~hits].sum()), cycle_bytes)
