"""Exact global-LRU hit curves of a route trace in one pass: the engine's access model, stack
distances, the curve points, the first decode hit and the knee.

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

The other policies are simulated directly (results.replay.policy_replay); `bmoe-fleet replay` and its
report are results.replay.replay.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.units import MIB
from results.read.route_trace import PHASE_DECODE, RouteTrace
from results.replay.choices import POLICIES

COLD = np.iinfo(np.int64).max  # stack distance of a first-ever lookup: misses at every budget
# Byte sums over a whole trace stay under this, so int64 never overflows (read_route_trace bounds
# entry sizes; this bounds entries x lookups). A budget above it hits like an unbounded cache.
MAX_TRACE_BYTES = 1 << 62


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


def previous_access(key: np.ndarray) -> np.ndarray:
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
    prev = previous_access(seq.key)
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
        """The point as the JSON output holds it."""
        return {"budget_mib": self.budget_mib, "policy": self.policy, "hit_pct_cum": self.hit_pct_cum,
                "hit_pct_decode": self.hit_pct_decode, "read_mib": self.read_mib, "under_cycle": self.under_cycle}


def curve_point(seq: AccessSequence, budget_mib: float, policy: str, hits: int, decode_hits: int,
                read_bytes: int, cycle_bytes: int) -> CurvePoint:
    """A curve point from a policy's hit counts and read bytes at one budget."""
    n, n_decode = len(seq), int(seq.decode.sum())
    return CurvePoint(
        budget_mib=float(budget_mib), policy=policy,
        hit_pct_cum=100.0 * hits / n if n else 0.0,
        hit_pct_decode=100.0 * decode_hits / n_decode if n_decode else 0.0,
        read_mib=read_bytes / MIB, under_cycle=mib_to_bytes(budget_mib) < cycle_bytes)


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
        points.append(curve_point(seq, mib, "lru", hits, decode_hits, read_bytes, cycle_bytes))
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
