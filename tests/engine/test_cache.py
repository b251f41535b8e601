"""ExpertCache: the global LRU's hits, misses, evictions, rereads and budget, against a reference."""

from __future__ import annotations

import csv
import random
import time
from pathlib import Path

import pytest

from engine.stream.cache import CacheError, ExpertCache


class ReferenceLRU:
    """The documented semantics written the slow, obvious way: a Python list, LRU first."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.order: list[tuple[int, int]] = []
        self.size: dict[tuple[int, int], int] = {}
        self.evicted_ever: set[tuple[int, int]] = set()
        self.evicted_log: list[tuple[int, int]] = []
        self.hits = self.misses = self.rereads = 0

    def used(self) -> int:
        return sum(self.size[k] for k in self.order)

    def evict_first(self) -> None:
        key = self.order.pop(0)
        del self.size[key]
        self.evicted_ever.add(key)
        self.evicted_log.append(key)

    def batch(self, layer: int, experts: list[int], nbytes: int) -> tuple[list[int], list[int], list[int]]:
        unique = []
        for e in experts:  # a repeat moves the expert to its last occurrence
            if e in unique:
                unique.remove(e)
            unique.append(e)
        touched = set()
        hits, misses, retained = [], [], []
        for e in unique:
            key = (layer, e)
            if key in self.order:
                self.order.remove(key)
                self.order.append(key)
                touched.add(key)
                hits.append(e)
                self.hits += 1
            else:
                misses.append(e)
        for e in unique:
            key = (layer, e)
            if key in touched:
                self.order.remove(key)
                self.order.append(key)
                continue
            self.misses += 1
            if key in self.evicted_ever:
                self.rereads += 1
            if self.budget == 0:
                continue
            # Evict the unprotected cold end; a batch wider than the budget overshoots it.
            while self.used() + nbytes > self.budget and self.order and self.order[0] not in touched:
                self.evict_first()
            self.order.append(key)
            self.size[key] = nbytes
            touched.add(key)
            retained.append(e)
        return hits, misses, retained


def evicted_between(before: list, after: list) -> list:
    gone = set(before) - set(after)
    return [k for k in before if k in gone]


def test_hits_misses_and_exact_eviction_order():
    cache = ExpertCache(budget_bytes=300)
    assert cache.lookup_batch(0, [1, 2, 3], 100).misses == (1, 2, 3)
    assert cache.resident_keys() == [(0, 1), (0, 2), (0, 3)]
    found = cache.lookup_batch(0, [1], 100)
    assert (found.hits, found.misses) == ((1,), ())
    assert cache.resident_keys() == [(0, 2), (0, 3), (0, 1)]  # the hit moved to the MRU end
    before = cache.resident_keys()
    cache.lookup_batch(1, [7], 100)  # evicts exactly the LRU entry, (0, 2)
    assert evicted_between(before, cache.resident_keys()) == [(0, 2)]
    assert cache.resident_keys() == [(0, 3), (0, 1), (1, 7)]
    before = cache.resident_keys()
    cache.lookup_batch(2, [5], 200)  # a 200-byte entry needs two 100-byte evictions, LRU first
    assert evicted_between(before, cache.resident_keys()) == [(0, 3), (0, 1)]
    s = cache.stats()
    assert (s.lookups, s.hits, s.misses, s.evictions, s.rereads) == (6, 1, 5, 3, 0)
    assert (s.hit_bytes, s.miss_bytes, s.resident_bytes, s.entries) == (100, 600, 300, 2)


def test_a_miss_on_an_evicted_key_is_a_reread_and_a_first_miss_is_not():
    cache = ExpertCache(budget_bytes=200)
    cache.lookup_batch(0, [1, 2], 100)
    found = cache.lookup_batch(0, [3], 100)  # evicts (0, 1)
    assert found.rereads == ()
    found = cache.lookup_batch(0, [1], 100)  # (0, 1) was held and evicted: paid for twice
    assert found.rereads == (1,) and found.retained == (1,)
    found = cache.lookup_batch(0, [4], 100)  # never resident: an ordinary miss
    assert found.rereads == ()
    s = cache.stats()
    assert s.rereads == 1 and s.evictions == 3 and s.misses == 5


def test_budget_zero_streams_everything_and_keeps_nothing():
    cache = ExpertCache(budget_bytes=0)
    for _ in range(3):
        found = cache.lookup_batch(0, [1, 2, 2, 3], 100)
        assert found.misses == (1, 2, 3) and found.hits == () and found.retained == ()
    s = cache.stats()
    assert (s.lookups, s.hits, s.misses, s.evictions, s.rereads, s.resident_bytes) == (9, 0, 9, 0, 0, 0)
    assert s.hit_pct == 0.0 and cache.resident_keys() == []


def test_an_entry_bigger_than_the_budget_is_kept_until_the_next_batch():
    cache = ExpertCache(budget_bytes=250)
    cache.lookup_batch(0, [1, 2], 100)
    found = cache.lookup_batch(1, [9], 251)  # upstream keeps what the batch uses: an overshoot
    assert found.misses == (9,) and found.retained == (9,)
    assert cache.resident_keys() == [(1, 9)] and cache.resident_bytes == 251
    assert cache.stats().evictions == 2
    assert cache.lookup_batch(1, [9], 251).hits == (9,)  # it survives to the very next batch
    cache.lookup_batch(0, [1], 100)  # and is the first to go after that
    assert cache.resident_keys() == [(0, 1)] and cache.resident_bytes == 100


def test_a_batch_never_evicts_its_own_entries():
    cache = ExpertCache(budget_bytes=300)
    cache.lookup_batch(0, [1, 2, 3], 100)
    found = cache.lookup_batch(0, [1, 2, 3, 4, 5], 100)  # three hits, two misses, no room left
    assert found.hits == (1, 2, 3) and found.misses == (4, 5) and found.retained == (4, 5)
    assert cache.resident_keys() == [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5)]
    assert cache.stats().evictions == 0 and cache.resident_bytes == 500  # over budget until the next batch
    cache.lookup_batch(1, [6], 100)  # the next batch evicts down to the budget, oldest first
    assert cache.resident_keys() == [(0, 4), (0, 5), (1, 6)] and cache.resident_bytes == 300
    assert cache.stats().evictions == 3


def test_hits_are_promoted_before_any_miss_evicts():
    cache = ExpertCache(budget_bytes=300)
    cache.lookup_batch(0, [1], 100)
    cache.lookup_batch(0, [2], 100)
    cache.lookup_batch(0, [3], 100)
    # (0, 1) is the LRU entry, but this batch also uses it: the miss must evict (0, 2) instead.
    found = cache.lookup_batch(0, [4, 1], 100)
    assert found.hits == (1,) and found.retained == (4,)
    assert cache.resident_keys() == [(0, 3), (0, 4), (0, 1)]  # the batch in its own order


def test_a_repeated_expert_takes_the_place_of_its_last_use():
    cache = ExpertCache(budget_bytes=1000)
    cache.lookup_batch(0, [3, 1, 2, 3], 100)  # token-major ids: 3 was used again by the last token
    assert cache.resident_keys() == [(0, 1), (0, 2), (0, 3)]
    cache.lookup_batch(0, [2, 4, 2, 1], 100)
    assert cache.resident_keys() == [(0, 3), (0, 4), (0, 2), (0, 1)]
    assert cache.stats().lookups == 6


def test_duplicates_count_once_and_entry_sizes_are_per_layer():
    cache = ExpertCache(budget_bytes=1000)
    found = cache.lookup_batch(0, [5, 5, 5], 100)
    assert found.misses == (5,)
    cache.lookup_batch(1, [5], 300)
    cache.lookup_batch(0, [5], 100)
    cache.lookup_batch(1, [5, 5], 300)
    s = cache.stats()
    assert (s.lookups, s.hits, s.misses) == (4, 2, 2)
    assert (s.hit_bytes, s.miss_bytes, s.resident_bytes) == (400, 400, 400)


def test_set_budget_evicts_down_immediately_lru_first():
    cache = ExpertCache(budget_bytes=400)
    cache.lookup_batch(0, [1, 2, 3, 4], 100)
    cache.lookup_batch(0, [1], 100)
    cache.set_budget(250)
    assert cache.resident_keys() == [(0, 4), (0, 1)]
    assert cache.stats().evictions == 2 and cache.resident_bytes == 200
    cache.set_budget(1000)  # growing evicts nothing
    assert cache.resident_keys() == [(0, 4), (0, 1)]
    assert cache.lookup_batch(0, [2], 100).rereads == (2,)
    cache.set_budget(0)
    assert cache.resident_keys() == [] and cache.resident_bytes == 0
    assert cache.stats().evictions == 5
    with pytest.raises(CacheError):
        cache.set_budget(-1)


def test_values_are_stored_for_retained_misses_only():
    cache = ExpertCache(budget_bytes=100)
    found = cache.lookup_batch(0, [1], 100)
    assert found.retained == (1,)
    cache.store(0, 1, "bytes-of-1")
    assert cache.get(0, 1) == "bytes-of-1"
    off = ExpertCache(budget_bytes=0)  # cache off: nothing is retained, so nothing can be stored
    assert off.lookup_batch(0, [2], 100).retained == ()
    with pytest.raises(CacheError):
        off.store(0, 2, "not retained")
    with pytest.raises(CacheError):
        cache.get(0, 2)
    cache.discard(0, 1)  # a failed read: the slot goes, and it is not an eviction
    assert cache.resident_bytes == 0 and cache.stats().evictions == 0
    assert cache.lookup_batch(0, [1], 100).rereads == ()
    with pytest.raises(CacheError):
        ExpertCache(-5)


def test_speculative_entries_enter_cold_and_count_useful_once():
    cache = ExpertCache(budget_bytes=300)
    cache.lookup_batch(0, [1, 2], 100)
    assert cache.begin_speculative(1, 7) and not cache.begin_speculative(0, 1)  # resident: no read
    assert cache.integrate_speculative(1, 7, "seven", 100)
    assert cache.integrate_speculative(1, 8, "eight", 100)  # over budget until the next lookup
    assert cache.resident_keys() == [(1, 8), (1, 7), (0, 1), (0, 2)]
    found = cache.lookup_batch(1, [7], 100)
    assert found.hits == (7,) and found.speculative_hits == (7,)
    # The unused guess was the coldest entry: it went first, and the demanded ones stayed.
    assert cache.resident_keys() == [(0, 1), (0, 2), (1, 7)]
    assert cache.lookup_batch(1, [7], 100).speculative_hits == ()  # useful once, then ordinary
    s = cache.stats()
    assert (s.spec_integrated, s.spec_useful, s.evictions) == (2, 1, 1)
    # A prefetch of an evicted key is charged as a reread when it is issued, as upstream does.
    assert cache.begin_speculative(1, 8)
    assert cache.stats().rereads == 1
    assert not ExpertCache(0).begin_speculative(0, 0)  # no cache, no prefetch


@pytest.mark.parametrize("seed", range(6))
def test_matches_the_reference_on_random_traffic(seed):
    rng = random.Random(seed)
    budget = rng.choice([0, 100, 350, 700, 1500])
    sizes = {layer: rng.choice([50, 100, 150, 400]) for layer in range(6)}
    cache, ref = ExpertCache(budget), ReferenceLRU(budget)
    for step in range(400):
        layer = step % 6
        experts = [rng.randrange(12) for _ in range(rng.randint(1, 6))]
        before = cache.resident_keys()
        log_len = len(ref.evicted_log)
        found = cache.lookup_batch(layer, experts, sizes[layer])
        hits, misses, retained = ref.batch(layer, experts, sizes[layer])
        assert (list(found.hits), list(found.misses), list(found.retained)) == (hits, misses, retained)
        assert evicted_between(before, cache.resident_keys()) == ref.evicted_log[log_len:]
        assert cache.resident_keys() == ref.order
        assert cache.resident_bytes == ref.used()
        if rng.random() < 0.03:
            new_budget = rng.choice([0, 100, 350, 700, 1500])
            cache.set_budget(new_budget)
            ref.budget = new_budget
            while ref.used() > new_budget:
                ref.evict_first()
    s = cache.stats()
    assert (s.hits, s.misses, s.rereads, s.evictions) == (ref.hits, ref.misses, ref.rereads, len(ref.evicted_log))
    assert s.mgmt_s > 0


def upstream_lookup(state: dict, layer: int, experts: list[int], nbytes: int, budget: int) -> None:
    """bmoe-cli's serial load_layer, transcribed: touch every id in order (a miss enters at the
    MRU end at once), then evict from the LRU end while over budget, stopping at the first
    entry this batch stamped. Resident bytes may overshoot until the next batch."""
    lru, size, stamp, ever = state["lru"], state["size"], state["stamp"], state["ever"]
    state["gen"] += 1
    seen = set()
    for e in experts:
        key = (layer, e)
        if e in seen:  # already staged in this batch: promoted again, nothing else
            lru.remove(key)
            lru.append(key)
            continue
        seen.add(e)
        stamp[key] = state["gen"]
        state["lookups"] += 1
        if key in size:
            state["hits"] += 1
            lru.remove(key)
        else:
            state["rereads"] += key in ever
            size[key] = nbytes
        lru.append(key)
    while sum(size.values()) > budget and lru and stamp[lru[0]] != state["gen"]:
        key = lru.pop(0)
        del size[key]
        ever.add(key)
        state["evictions"] += 1


@pytest.mark.parametrize("seed", range(4))
def test_agrees_with_upstreams_algorithm(seed):
    # Budgets below one batch included: both overshoot until the next batch.
    rng = random.Random(100 + seed)
    sizes = {layer: rng.choice([50, 100, 150]) for layer in range(5)}
    budget = [120, 600, 1500, 4000][seed]
    cache = ExpertCache(budget)
    state = {"lru": [], "size": {}, "stamp": {}, "ever": set(), "gen": 0}
    state.update(lookups=0, hits=0, rereads=0, evictions=0)
    for step in range(600):
        layer = step % 5
        experts = [rng.randrange(10) for _ in range(rng.randint(1, 4))]  # repeats included
        cache.lookup_batch(layer, experts, sizes[layer])
        upstream_lookup(state, layer, experts, sizes[layer], budget)
        assert cache.resident_keys() == state["lru"]
    s = cache.stats()
    assert (s.lookups, s.hits, s.rereads, s.evictions) == (
        state["lookups"], state["hits"], state["rereads"], state["evictions"]
    )
    assert s.hits < s.lookups
    if budget >= 1500:  # under a cycle of 5 layers x ~2.5 experts the hit rate is exactly 0: the cliff
        assert s.hits > 0


def _seconds_per_lookup(n_resident: int) -> float:
    cache = ExpertCache(budget_bytes=n_resident)
    for e in range(n_resident):
        cache.lookup_batch(0, [e], 1)
    best = float("inf")
    next_expert = n_resident
    for _ in range(5):
        t0 = time.perf_counter()
        for _i in range(2000):
            # every lookup a miss that evicts the LRU entry, plus a hit: a list pays O(n) for both
            cache.lookup_batch(0, [next_expert, next_expert - 1], 1)
            next_expert += 1
        best = min(best, time.perf_counter() - t0)
    return best / 2000


def test_bookkeeping_cost_does_not_grow_with_the_number_of_entries():
    # A list-based LRU pays O(entries) per lookup: 100x the entries would cost ~100x. O(1) stays flat.
    small, large = _seconds_per_lookup(1_000), _seconds_per_lookup(100_000)
    assert large < small * 4, (small, large)


UPSTREAM = Path(__file__).parents[1] / "fixtures" / "upstream" / "host-v2-0.19.0"


def summary(csv_name: str) -> dict[str, str]:
    line = next(ln for ln in (UPSTREAM / csv_name).read_text().splitlines() if ln.startswith("# summary "))
    return dict(kv.split("=", 1) for kv in line.split()[2:])


def replay_route_trace(budget_bytes: int) -> ExpertCache:
    """bmoe-cli's routing of the tiny model, fed to the cache batch by batch as the engine saw it:
    one prefill batch per layer (every prompt token's ids, token-major), then one per decode step."""
    rows = list(csv.DictReader(ln for ln in (UPSTREAM / "tiny_auto.route.csv").read_text().splitlines()
                               if not ln.startswith("#")))
    batches: dict[tuple[int, int, int], list[int]] = {}
    for r in rows:  # the file is in engine order: step, layer, slot
        phase, step, layer = int(r["phase"]), int(r["step"]), int(r["layer"])
        key = (phase, 0 if phase == 0 else step, layer)  # a prefill is one batch per layer
        batches.setdefault(key, []).append(int(r["expert"]))
    cache = ExpertCache(budget_bytes)
    for (_phase, _step, layer), experts in sorted(batches.items()):
        cache.lookup_batch(layer, experts, 196_608)
    return cache


def test_replaying_upstreams_routing_reproduces_its_cache_counters():
    # The generated bytes are identical in every mode, so the auto run's route trace is also the
    # routing of the forced 2 MiB run (tiny_progress), whose summary counted the churn.
    forced = summary("tiny_progress.csv")
    s = replay_route_trace(2 * (1 << 20)).stats()
    assert (s.evictions, s.rereads) == (int(forced["evictions"]), int(forced["rereads"])) == (230, 208)
    assert f"{s.hit_pct:.1f}" == forced["cache_hit_pct"] == "14.9"
    assert f"{s.resident_bytes / (1 << 20):.1f}" == forced["cache_resident_MiB"]
    auto = summary("tiny_auto.csv")  # auto sized 6 MiB: the whole bank, so nothing is evicted
    s = replay_route_trace(6 * (1 << 20)).stats()
    assert (s.evictions, s.rereads) == (int(auto["evictions"]), int(auto["rereads"])) == (0, 0)
    assert f"{s.hit_pct:.1f}" == auto["cache_hit_pct"] == "88.7"
