"""The global LRU expert cache: one entry per (layer, expert), a byte budget, O(1) bookkeeping.

Semantics follow bmoe-cli's ExpertStreamSource (core/src/moe/expert_stream_source.cpp):

- One lookup per unique expert per layer batch. A hit moves the entry to the most-recently-used
  end; a miss takes a slot (its bytes are read by the caller and handed over with store()). The
  batch ends up at the MRU end in the order of each expert's last occurrence in the batch (ids
  arrive token-major, so that is the order of the last token that used it), hits and misses alike.
- Entries the current batch touched are never evicted to make room for that same batch: upstream
  stamps them with the batch generation and stops evicting at the first stamped entry. Because a
  touched entry is always moved to the MRU end, "the LRU end is touched" means "everything left
  is touched", so the check is O(1). A batch wider than the budget is kept whole (the cache
  overshoots) until the next batch evicts down to the budget, as upstream does.
- An eviction drops the LRU entry; a *reread* is a miss (or a speculative read) of a key that was
  resident once and got evicted: bytes the cache had already paid for.
- Budget 0 is streaming with no cache: every lookup misses, nothing is kept, nothing is evicted
  and nothing is a reread.
- Speculative (prefetched) entries enter at the LRU end, so a wrong guess is the first thing
  reclaimed and never displaces a demanded expert; a hit on one is counted useful once.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.errors import BmoeError

Key = tuple[int, int]  # (layer, expert)


class CacheError(BmoeError):
    """The cache was used against its contract (negative budget, store without a slot...)."""


@dataclass(frozen=True)
class BatchLookup:
    """What one layer batch found. Experts are in the order they were looked up."""

    hits: tuple[int, ...]
    misses: tuple[int, ...]
    retained: tuple[int, ...]  # the misses that got a slot (the rest stream through)
    speculative_hits: tuple[int, ...]  # hits served by a prefetched entry (route trace residency 2)
    rereads: tuple[int, ...]  # misses of keys the cache had held and evicted


@dataclass(frozen=True)
class CacheStats:
    budget_bytes: int
    resident_bytes: int
    entries: int
    lookups: int
    hits: int
    misses: int
    evictions: int
    rereads: int
    hit_bytes: int
    miss_bytes: int
    mgmt_s: float
    spec_integrated: int
    spec_useful: int

    @property
    def hit_pct(self) -> float:
        return 100.0 * self.hits / self.lookups if self.lookups else 0.0


class _Entry:
    __slots__ = ("nbytes", "speculative", "value")

    def __init__(self, nbytes: int, value: Any, speculative: bool) -> None:
        self.nbytes = nbytes
        self.value = value
        self.speculative = speculative


class ExpertCache:
    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise CacheError(f"cache budget must be >= 0 bytes, got {budget_bytes}")
        self._budget_bytes = budget_bytes
        # LRU order: first = least recently used, last = most recently used.
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()
        self._ever_evicted: set[Key] = set()
        self._resident_bytes = 0
        self._lookups = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._rereads = 0
        self._hit_bytes = 0
        self._miss_bytes = 0
        self._mgmt_s = 0.0
        self._spec_integrated = 0
        self._spec_useful = 0

    # ---- lookups -------------------------------------------------------------------------
    def lookup_batch(self, layer: int, experts: Iterable[int], entry_bytes: int) -> BatchLookup:
        """Look up one layer batch's experts (duplicates count once), making room for misses.

        `experts` in routing order (token-major) gives upstream's exact LRU order; any order gives
        the same hits and misses. entry_bytes is what one expert of this layer costs resident.
        """
        t0 = time.perf_counter()
        entries = self._entries
        touched: set[Key] = set()
        # Repeats collapse onto their LAST occurrence: upstream promotes an expert again each time
        # a later token of the batch uses it, so the LRU order reflects the last token that did.
        unique = list(dict.fromkeys(int(e) for e in reversed(list(experts))))[::-1]
        hits: list[int] = []
        spec_hits: list[int] = []
        missed: list[int] = []
        # Pass 1, hits first: every entry this batch uses is moved to the MRU end (and so
        # protected) before any miss evicts, whatever order the experts arrive in.
        for expert in unique:
            key = (layer, expert)
            self._lookups += 1
            entry = entries.get(key)
            if entry is None:
                missed.append(expert)
                continue
            self._hits += 1
            self._hit_bytes += entry.nbytes
            if entry.speculative:
                entry.speculative = False
                self._spec_useful += 1
                spec_hits.append(expert)
            entries.move_to_end(key)
            touched.add(key)
            hits.append(expert)
        # Pass 2, in arrival order: hits are promoted again and misses enter behind them, so the
        # batch ends up in the MRU order upstream gives it (the order of the ids). Everything
        # moved here is already protected, so the protected block stays at the MRU end.
        retained: list[int] = []
        rereads: list[int] = []
        for expert in unique:
            key = (layer, expert)
            if key in touched:
                entries.move_to_end(key)
                continue
            self._misses += 1
            self._miss_bytes += entry_bytes
            if key in self._ever_evicted:
                self._rereads += 1
                rereads.append(expert)
            if self._make_room(entry_bytes, touched):
                entries[key] = _Entry(entry_bytes, None, False)
                self._resident_bytes += entry_bytes
                touched.add(key)
                retained.append(expert)
        # Speculative entries integrated over budget wait at the LRU end for exactly this.
        self._evict_until(self._budget_bytes, touched)
        self._mgmt_s += time.perf_counter() - t0
        return BatchLookup(tuple(hits), tuple(missed), tuple(retained), tuple(spec_hits), tuple(rereads))

    def _make_room(self, nbytes: int, protected: set[Key]) -> bool:
        """Evict unprotected LRU entries until `nbytes` fits; False only when the cache is off.

        Like upstream, a batch wider than the budget is kept whole until the next batch (the
        cache overshoots rather than dropping experts the batch is using): the replay of a route
        trace (results/replay/replay.py) relies on exactly this rule.
        """
        if self._budget_bytes == 0:
            return False
        entries = self._entries
        while self._resident_bytes + nbytes > self._budget_bytes and entries:
            if next(iter(entries)) in protected:  # from here to the MRU end belongs to this batch
                break
            self._evict_lru()
        return True

    def _evict_until(self, budget_bytes: int, protected: set[Key]) -> None:
        entries = self._entries
        while self._resident_bytes > budget_bytes and entries:
            if next(iter(entries)) in protected:
                break
            self._evict_lru()

    def _evict_lru(self) -> None:
        key, entry = self._entries.popitem(last=False)
        self._resident_bytes -= entry.nbytes
        self._evictions += 1
        self._ever_evicted.add(key)

    # ---- values --------------------------------------------------------------------------
    def store(self, layer: int, expert: int, value: Any) -> None:
        """Hand over the bytes of a retained miss once they are read."""
        entry = self._entries.get((layer, expert))
        if entry is None:
            raise CacheError(f"no slot for layer {layer} expert {expert}: it was not retained by lookup_batch")
        entry.value = value

    def get(self, layer: int, expert: int) -> Any:
        """The stored value of a resident entry (no LRU effect: lookups go through lookup_batch)."""
        entry = self._entries.get((layer, expert))
        if entry is None or entry.value is None:
            raise CacheError(f"layer {layer} expert {expert} is not resident")
        return entry.value

    def discard(self, layer: int, expert: int) -> None:
        """Drop a slot whose read failed. Not an eviction: the cache never held its bytes."""
        t0 = time.perf_counter()
        entry = self._entries.pop((layer, expert), None)
        if entry is not None:
            self._resident_bytes -= entry.nbytes
        self._mgmt_s += time.perf_counter() - t0

    def contains(self, layer: int, expert: int) -> bool:
        return (layer, expert) in self._entries

    # ---- speculation ---------------------------------------------------------------------
    def begin_speculative(self, layer: int, expert: int) -> bool:
        """Whether a prefetch of this key is worth issuing; counts the reread as upstream does.

        Upstream charges a reread when the speculative read is issued, not when it lands, so a
        cancelled prefetch of an evicted key still shows as the cache paying twice.
        """
        t0 = time.perf_counter()
        key = (layer, expert)
        worth = self._budget_bytes > 0 and key not in self._entries
        if worth and key in self._ever_evicted:
            self._rereads += 1
        self._mgmt_s += time.perf_counter() - t0
        return worth

    def integrate_speculative(self, layer: int, expert: int, value: Any, entry_bytes: int) -> bool:
        """Enter a completed prefetch at the LRU end. Room is made by the next lookup_batch."""
        t0 = time.perf_counter()
        key = (layer, expert)
        ok = self._budget_bytes > 0 and key not in self._entries
        if ok:
            self._entries[key] = _Entry(entry_bytes, value, True)
            self._entries.move_to_end(key, last=False)
            self._resident_bytes += entry_bytes
            self._spec_integrated += 1
        self._mgmt_s += time.perf_counter() - t0
        return ok

    # ---- budget --------------------------------------------------------------------------
    @property
    def budget_bytes(self) -> int:
        return self._budget_bytes

    @property
    def resident_bytes(self) -> int:
        return self._resident_bytes

    def set_budget(self, budget_bytes: int) -> None:
        """Change the budget between batches; shrinking evicts LRU entries down to it now."""
        if budget_bytes < 0:
            raise CacheError(f"cache budget must be >= 0 bytes, got {budget_bytes}")
        t0 = time.perf_counter()
        self._budget_bytes = budget_bytes
        self._evict_until(budget_bytes, set())
        self._mgmt_s += time.perf_counter() - t0

    def resident_keys(self) -> list[Key]:
        """Resident keys from least to most recently used."""
        return list(self._entries)

    def stats(self) -> CacheStats:
        return CacheStats(
            budget_bytes=self._budget_bytes,
            resident_bytes=self._resident_bytes,
            entries=len(self._entries),
            lookups=self._lookups,
            hits=self._hits,
            misses=self._misses,
            evictions=self._evictions,
            rereads=self._rereads,
            hit_bytes=self._hit_bytes,
            miss_bytes=self._miss_bytes,
            mgmt_s=self._mgmt_s,
            spec_integrated=self._spec_integrated,
            spec_useful=self._spec_useful,
        )
