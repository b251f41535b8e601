"""`--drop-cold-experts F` replayed: hit %, flash reads and drop % of the engine's global LRU at a
set of budgets, from one route trace, in one pass over the trace for the whole set.

Why not stack distances (results.replay.lru_replay): a drop is decided from residency at the budget
(a miss under F / k is skipped), and a dropped expert is neither read nor inserted nor promoted. So
the lookups themselves depend on the budget, the cache states of two budgets no longer nest, and a
stack distance computed once for every budget has nothing to stand on. Each budget gets its own
exact cache state instead, and all of them walk the trace together: per batch (one layer of one
llama_decode) a few numpy operations over the budgets, so the Python work is per batch, not per
budget. `simulate_drop` is the same cache written plainly, one budget at a time, which the tests
hold the vectorised walk to.

The engine's rules (engine/stream/drop.py, bmoe-py's copy of bmoe-cli 0.19.0's `apply_drop`;
engine/stream/cache.py and source.py for the cache):

- per routed token: a slot is dropped when it is not the first maximum of the token's weights, its
  expert misses the cache before the layer's read, and its weight is under F / k (float32);
- the dropped slot is repointed to the top slot's expert, and the layer reads the unique ids in
  last-occurrence order (token-major), so a drop can move the top expert to the MRU end;
- when: decode, prefill too with `--drop-in-prefill`; a layer decides from its second watched pass
  on (a pass where the policy was armed, or any pass of a traced run), so an untraced run's first
  decode drops nothing;
- lookups, insertion and eviction as the lossless replay has them (docs/replay.md): one lookup per
  unique expert per batch, eviction of the LRU tail once after the batch, the batch protected.

What the replay cannot know: after a drop the hidden state differs, so a lossy run routes later
tokens differently from the trace it is replayed on. Replaying a drop run's own trace at its own
budget is exact; any other budget, or a lossless trace, carries that divergence (docs/replay.md,
"Under dropping", says how much it measured). So `drop_curve_from` replays every budget from a
lossy run's routing: a traced drop run of the same F (a LossyTrace), the one taken at the lowest
budget when there are several (docs/decisions/drop-replay.md: on every seed set measured it stayed
within 5 % at every budget, where the trace nearest each budget missed the top one), and the
lossless trace only where there is none (then the reads are a lower bound). The residency and dropped columns of a
lossy trace are its own budget's: the walk re-simulates both from the routing at every budget. `--drop-no-renorm` changes only the kept weights'
scale, which no read depends on: it enters the replay only through that divergence.
`--expert-substitute` is not replayed: it reranks on the router's scores of every expert, and a
trace carries only the chosen top-k.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from engine.units import MIB
from results.errors import ReplayError
from results.read.route_trace import PHASE_DECODE, RouteTrace
from results.replay.lru_replay import access_sequence, mib_to_bytes, stack_distances

F32 = np.float32


@dataclass(frozen=True)
class DropLever:
    """The run whose reads are replayed: its threshold and the switches that move a decision.

    traced: the run writes a route trace, so every layer is watched in the prefill and the first
    decode drops too (an untraced run's first decode only learns)."""

    frac: float
    in_prefill: bool = False
    traced: bool = False

    def __post_init__(self) -> None:
        if not (0.0 <= self.frac <= 1.0):          # written so that a nan is refused too
            raise ReplayError(f"--drop-cold-experts {self.frac} is not a threshold: 0 to 1 (the engine's range)")

    def to_dict(self) -> dict[str, Any]:
        """The lever as the JSON output holds it."""
        return {"frac": self.frac, "in_prefill": self.in_prefill, "traced": self.traced}


@dataclass(frozen=True)
class DropPoint:
    """One budget under dropping: what the engine's summary would say, predicted.

    hit % counts lookups as the engine does (a dropped expert is no lookup); read_mib is every
    batch's entry bytes read, prefill included; decode_read_mib_per_token is the flash a decoded
    token reads (the CSV's read_bytes per row, less O_DIRECT alignment); dropped and routed count
    the decode loop's slots, as experts_dropped and experts_routed do."""

    budget_mib: float
    hit_pct_cum: float
    hit_pct_decode: float
    read_mib: float
    decode_read_mib_per_token: float
    lossless_decode_read_mib_per_token: float
    dropped: int
    routed: int
    under_cycle: bool
    # the routing replayed: a lossy trace's path and the budget its run had (drop_curve_from), or
    # "" and NaN for the trace the curve was asked of
    routing_path: str = ""
    routing_budget_mib: float = math.nan

    @property
    def drop_pct(self) -> float:
        """Dropped slots over routed slots in decode, in %."""
        return 100.0 * self.dropped / self.routed if self.routed else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The point as the JSON output holds it."""
        return {"budget_mib": self.budget_mib, "hit_pct_cum": self.hit_pct_cum, "hit_pct_decode": self.hit_pct_decode,
                "read_mib": self.read_mib, "decode_read_mib_per_token": self.decode_read_mib_per_token,
                "lossless_decode_read_mib_per_token": self.lossless_decode_read_mib_per_token,
                "dropped": self.dropped, "routed": self.routed, "drop_pct": self.drop_pct,
                "under_cycle": self.under_cycle,
                **({"routing": {"path": self.routing_path, "budget_mib": self.routing_budget_mib}}
                   if self.routing_path else {})}


@dataclass(frozen=True, eq=False)
class LossyTrace:
    """A route trace written by a run with --drop-cold-experts of the lever's F, at budget_mib: a
    lossy run's routing (check_lossy holds it to the lever)."""

    trace: RouteTrace
    budget_mib: float


@dataclass(frozen=True, eq=False)
class DropRouting:
    """A trace's streamed rows as the drop policy sees them, grouped into load_layer batches.

    Per row (streamed rows only, in trace order): its cache key, its token's top key (what a drop
    repoints it to), whether it is its token's top slot, its float32 weight; per batch: its first
    row, layer, phase; and the slot count k the threshold divides by."""

    key: np.ndarray
    top_key: np.ndarray
    is_top: np.ndarray
    weight: np.ndarray
    key_bytes: np.ndarray        # entry bytes per key
    batch_start: np.ndarray      # first row of each batch, plus the row count at the end
    batch_layer: np.ndarray
    batch_decode: np.ndarray
    top_k: int
    decode_tokens: int

    @property
    def n_batches(self) -> int:
        return len(self.batch_layer)


def drop_routing(trace: RouteTrace) -> DropRouting:
    """The trace's rows of streamed layers, with each token's top slot found as the engine finds it:
    the first maximum, so a nan weight (no weight node exposed) is never above another and never
    below the threshold either."""
    rows = trace.rows
    n_expert = max(trace.n_expert, 1)
    max_layer = max([0, *trace.expert_bytes_by_layer])
    streamed_lut = np.zeros(max_layer + 1, dtype=bool)
    bytes_lut = np.zeros(max_layer + 1, dtype=np.int64)
    for il, nbytes in trace.expert_bytes_by_layer.items():
        streamed_lut[il], bytes_lut[il] = True, nbytes
    layer = rows.layer
    ok = (layer >= 0) & (layer <= max_layer) & (rows.expert >= 0) & (rows.expert < trace.n_expert)
    ok &= streamed_lut[np.clip(layer, 0, max_layer)]
    sr = np.flatnonzero(ok)
    t, ph, ly, st = rows.turn[sr], rows.phase[sr], layer[sr], rows.step[sr]
    key = ly * n_expert + rows.expert[sr]
    n = len(sr)
    # a token: its rows share (turn, phase, step, layer); a batch as in lru_replay.access_sequence
    same_layer = (t[1:] == t[:-1]) & (ph[1:] == ph[:-1]) & (ly[1:] == ly[:-1])
    new_token = np.r_[np.ones(min(1, n), dtype=bool), ~same_layer | (st[1:] != st[:-1])]
    new_batch = np.r_[np.ones(min(1, n), dtype=bool), ~same_layer | ((ph[1:] == PHASE_DECODE) & (st[1:] != st[:-1]))]
    token = np.cumsum(new_token) - 1
    token_start = np.flatnonzero(new_token)
    weight = rows.weight[sr].astype(F32)
    ranked = np.where(np.isnan(weight), F32(-np.inf), weight)
    top_of_token = np.full(len(token_start), -1, dtype=np.int64)
    if n:
        best = np.maximum.reduceat(ranked, token_start)
        at_max = np.flatnonzero(ranked == best[token])
        first = np.unique(token[at_max], return_index=True)
        top_of_token[first[0]] = at_max[first[1]]
        # the engine starts from slot 0 and moves only on a strictly greater weight: a nan first slot stays top
        nan_first = np.isnan(weight[token_start])
        top_of_token[nan_first | (top_of_token < 0)] = token_start[nan_first | (top_of_token < 0)]
    top_row = top_of_token[token] if n else np.zeros(0, dtype=np.int64)
    sizes = np.diff(np.r_[token_start, n]) if n else np.zeros(0, dtype=np.int64)
    bstart = np.flatnonzero(new_batch)
    decode_rows = ph == PHASE_DECODE
    return DropRouting(
        key=key, top_key=key[top_row], is_top=top_row == np.arange(n), weight=weight,
        key_bytes=np.repeat(bytes_lut, n_expert), batch_start=np.r_[bstart, n], batch_layer=ly[bstart],
        batch_decode=decode_rows[bstart] if n else np.zeros(0, dtype=bool),
        top_k=int(sizes.max()) if len(sizes) else max(1, trace.n_expert_used),
        decode_tokens=len(np.unique(np.stack([t[decode_rows], st[decode_rows]]), axis=1).T))


def threshold(frac: float, top_k: int) -> np.float32:
    """F / k as the engine computes it, in float32."""
    return F32(F32(frac) / F32(top_k))


def deciding_batches(routing: DropRouting, lever: DropLever) -> np.ndarray:
    """Per batch, whether its layer may drop there: armed (decode, or prefill with --drop-in-prefill)
    and the layer already watched by an earlier pass (armed, or any pass of a traced run)."""
    out = np.zeros(routing.n_batches, dtype=bool)
    if lever.frac <= 0:
        return out
    watched: set[int] = set()
    for i, (il, decode) in enumerate(zip(routing.batch_layer.tolist(), routing.batch_decode.tolist())):
        armed = decode or lever.in_prefill
        out[i] = armed and il in watched
        if armed or lever.traced:
            watched.add(il)
    return out


@dataclass
class _Totals:
    lookups: np.ndarray
    hits: np.ndarray
    decode_lookups: np.ndarray
    decode_hits: np.ndarray
    read_bytes: np.ndarray
    decode_read_bytes: np.ndarray
    dropped: np.ndarray

    @classmethod
    def zeros(cls, n: int) -> _Totals:
        return cls(*(np.zeros(n, dtype=np.int64) for _ in range(7)))


def _walk(routing: DropRouting, lever: DropLever, budgets_bytes: np.ndarray) -> _Totals:
    """Every budget's cache through the trace at once.

    State per budget: `stamp[b, key]`, the row index of the entry's last touch (-1: not resident),
    and the bytes held. Row indices order the touches, so the LRU tail is the resident entry with
    the smallest stamp: each budget keeps a pointer that walks the rows forward, and a row whose
    key (or, for a dropped row, its token's top key, which the repointed slot touched) still
    carries that row's stamp is the tail. A pointer never passes the current batch's first row:
    that is the batch's protection."""
    nb, n_keys = len(budgets_bytes), len(routing.key_bytes)
    stamp = np.full((nb, n_keys), -1, dtype=np.int64)
    used = np.zeros(nb, dtype=np.int64)
    ptr = np.zeros(nb, dtype=np.int64)
    every = np.arange(nb)
    totals = _Totals.zeros(nb)
    decides = deciding_batches(routing, lever)
    below = routing.weight < threshold(lever.frac, routing.top_k)      # nan compares False: kept
    candidate = below & ~routing.is_top
    key, top_key, key_bytes = routing.key, routing.top_key, routing.key_bytes
    bounds = routing.batch_start.tolist()
    for i in range(routing.n_batches):
        r0, r1 = bounds[i], bounds[i + 1]
        keys = key[r0:r1]
        uniq, inverse = np.unique(keys, return_inverse=True)
        resident_u = stamp[:, uniq] >= 0                                # [nb, u], before the read
        drop = None
        if decides[i] and candidate[r0:r1].any():
            drop = candidate[r0:r1][None, :] & ~resident_u[:, inverse]  # [nb, rows]
            if not drop.any():
                drop = None
        if drop is None:
            # the same touches at every budget: each key stamped with its last row in the batch
            last = np.full(len(uniq), -1, dtype=np.int64)
            np.maximum.at(last, inverse, np.arange(r0, r1))
            stamp[:, uniq] = last
        else:
            touched = np.where(drop, top_key[r0:r1][None, :], keys[None, :])
            for j in range(r1 - r0):                                    # rows in order: the last touch wins
                stamp[every, touched[:, j]] = r0 + j
            if routing.batch_decode[i]:
                totals.dropped += drop.sum(axis=1)
        looked = stamp[:, uniq] >= r0                                   # [nb, u]: looked up in this batch
        missed = looked & ~resident_u
        nbytes = key_bytes[uniq]
        read = missed @ nbytes
        lookups, hits = looked.sum(axis=1), (looked & resident_u).sum(axis=1)
        totals.lookups += lookups
        totals.hits += hits
        totals.read_bytes += read
        if routing.batch_decode[i]:
            totals.decode_lookups += lookups
            totals.decode_hits += hits
            totals.decode_read_bytes += read
        used += read
        _evict(stamp, used, ptr, budgets_bytes, r0, key, top_key, key_bytes)
    return totals


EVICT_WINDOW = 8  # rows each over-budget cache examines per numpy step of its eviction


def _evict(stamp: np.ndarray, used: np.ndarray, ptr: np.ndarray, budgets: np.ndarray, batch_row: int,
           key: np.ndarray, top_key: np.ndarray, key_bytes: np.ndarray) -> None:
    """The LRU tail out while over budget, never an entry the batch touched (stamp >= batch_row).

    Each over-budget cache looks at the next EVICT_WINDOW rows from its pointer at once: the live
    ones (an entry whose stamp is that row) are its next victims in LRU order, and it takes them
    up to the first that brings it within budget, as one-at-a-time eviction would."""
    need = np.flatnonzero((used > budgets) & (ptr < batch_row))
    step = np.arange(EVICT_WINDOW)
    while len(need):
        t = ptr[need][:, None] + step                                   # [n, W]
        valid = t < batch_row
        t = np.minimum(t, batch_row - 1)
        own, top = key[t], top_key[t]
        rows = need[:, None]
        live_own = valid & (stamp[rows, own] == t)
        live_top = valid & ~live_own & (stamp[rows, top] == t)
        live = live_own | live_top
        victim = np.where(live_own, own, top)
        freed = np.cumsum(np.where(live, key_bytes[victim], 0), axis=1)
        within = (used[need][:, None] - freed) <= budgets[need][:, None]
        done = within.any(axis=1)
        # rows consumed: through the first that brings the cache within budget, else the whole window
        consumed = np.where(done, within.argmax(axis=1) + 1, valid.sum(axis=1))
        take = live & (step[None, :] < consumed[:, None])
        b, j = np.nonzero(take)
        stamp[need[b], victim[b, j]] = -1
        used[need] -= np.where(take, key_bytes[victim], 0).sum(axis=1)
        ptr[need] += consumed
        need = need[~done & (ptr[need] < batch_row)]


def drop_curve(trace: RouteTrace, lever: DropLever, budgets_mib: Sequence[float],
               routing: DropRouting | None = None) -> list[DropPoint]:
    """Points under dropping at every budget, in one walk of the trace. Budget 0 is the engine's
    cache-off mode, where it refuses the lever: its point is the cache-off run (every routed expert
    read, nothing dropped), as a sweep's cache-0 cell runs it."""
    if routing is None:
        routing = drop_routing(trace)
    budgets = [float(b) for b in budgets_mib]
    if any(not math.isfinite(b) or b < 0 for b in budgets):
        raise ReplayError("budgets must be finite MiB values >= 0")
    as_bytes = np.array([mib_to_bytes(b) for b in budgets], dtype=np.int64)
    cached = as_bytes > 0
    totals = _walk(routing, lever, as_bytes[cached])
    # the lossless reads beside them: exact for every budget at once (stack distances)
    seq = access_sequence(trace)
    lossless = [int(seq.entry_bytes[seq.decode & (distance > nbytes if nbytes > 0 else True)].sum())
                for distance in [stack_distances(seq)] for nbytes in as_bytes.tolist()]
    zero = _cache_off(routing)
    routed = int(np.diff(routing.batch_start)[routing.batch_decode].sum()) if lever.frac > 0 else 0
    tokens = max(1, routing.decode_tokens)
    cycle = trace.cycle_bytes
    points: list[DropPoint] = []
    at = 0
    for b, nbytes, is_cached in zip(budgets, as_bytes.tolist(), cached.tolist()):
        if is_cached:
            got = {name: int(getattr(totals, name)[at]) for name in _Totals.__dataclass_fields__}
            at += 1
        else:
            got = zero
        lossless_decode = lossless[len(points)]
        points.append(DropPoint(
            budget_mib=b,
            hit_pct_cum=100.0 * got["hits"] / got["lookups"] if got["lookups"] else 0.0,
            hit_pct_decode=100.0 * got["decode_hits"] / got["decode_lookups"] if got["decode_lookups"] else 0.0,
            read_mib=got["read_bytes"] / MIB, decode_read_mib_per_token=got["decode_read_bytes"] / MIB / tokens,
            lossless_decode_read_mib_per_token=lossless_decode / MIB / tokens, dropped=got["dropped"],
            routed=routed if is_cached else 0, under_cycle=nbytes < cycle))
    return points


def _cache_off(routing: DropRouting) -> dict[str, int]:
    """Budget 0: no lookups counted, every batch's unique experts read."""
    read = decode_read = 0
    bounds = routing.batch_start.tolist()
    for i in range(routing.n_batches):
        uniq = np.unique(routing.key[bounds[i]:bounds[i + 1]])
        nbytes = int(routing.key_bytes[uniq].sum())
        read += nbytes
        decode_read += nbytes if routing.batch_decode[i] else 0
    return {"lookups": 0, "hits": 0, "decode_lookups": 0, "decode_hits": 0, "read_bytes": read,
            "decode_read_bytes": decode_read, "dropped": 0}


def simulate_drop(routing: DropRouting, lever: DropLever, budget_bytes: int) -> dict[str, int]:
    """One budget, simulated plainly as the engine runs it (the tests' and the benchmark's reference
    for the vectorised walk): drop, repoint, unique ids in last-occurrence order, lookups, one
    eviction after the batch. Returns the _Totals fields as ints."""
    if budget_bytes <= 0:
        return _cache_off(routing)
    cache: OrderedDict[int, int] = OrderedDict()      # LRU first
    used = 0
    out = dict.fromkeys(_Totals.__dataclass_fields__, 0)
    decides = deciding_batches(routing, lever)
    thr = threshold(lever.frac, routing.top_k)
    bounds = routing.batch_start.tolist()
    keys, tops, tops_flag = routing.key.tolist(), routing.top_key.tolist(), routing.is_top.tolist()
    weights = routing.weight
    for i in range(routing.n_batches):
        r0, r1 = bounds[i], bounds[i + 1]
        decode = bool(routing.batch_decode[i])
        ids = []
        for r in range(r0, r1):
            if decides[i] and not tops_flag[r] and keys[r] not in cache and weights[r] < thr:
                ids.append(tops[r])
                out["dropped"] += decode
            else:
                ids.append(keys[r])
        unique = list(dict.fromkeys(reversed(ids)))[::-1]
        for k in unique:
            hit = k in cache
            if hit:
                cache.move_to_end(k)
            else:
                cache[k] = int(routing.key_bytes[k])
                used += cache[k]
            out["lookups"] += 1
            out["hits"] += hit
            out["decode_lookups"] += decode
            out["decode_hits"] += decode and hit
            out["read_bytes"] += 0 if hit else cache[k]
            out["decode_read_bytes"] += 0 if hit or not decode else cache[k]
        while used > budget_bytes and len(cache) > len(unique):
            used -= cache.popitem(last=False)[1]
    return out


def check_lossy(lossy: LossyTrace, lever: DropLever, like: RouteTrace | None = None) -> None:
    """A ReplayError unless the trace can be a run of this lever: it dropped (a trace without dropped
    routings is a lossless run's), no dropped routing weighs F / k or more (that run's F was larger),
    and, given `like`, the same model shape. A run of a smaller F passes: the trace cannot tell."""
    trace = lossy.trace
    if not math.isfinite(lossy.budget_mib) or lossy.budget_mib <= 0:
        raise ReplayError(f"{trace.path}: a drop run's budget is a cache of more than 0 MiB, not {lossy.budget_mib:g}")
    dropped = trace.rows.dropped.astype(bool)
    if not dropped.any():
        raise ReplayError(f"{trace.path}: no dropped routings: not the trace of a --drop-cold-experts run")
    top_k = drop_routing(trace).top_k
    heaviest = float(trace.rows.weight[dropped].astype(F32).max())
    if not heaviest < threshold(lever.frac, top_k):
        raise ReplayError(f"{trace.path}: its run dropped a routing of weight {heaviest:.4g}, at or over F / k = "
                          f"{lever.frac:g} / {top_k}: a larger --drop-cold-experts than {lever.frac:g}")
    if like is not None and (trace.n_expert, trace.n_expert_used, dict(trace.expert_bytes_by_layer)) != (
            like.n_expert, like.n_expert_used, dict(like.expert_bytes_by_layer)):
        raise ReplayError(f"{trace.path}: not the model of {like.path} (experts, top-k or streamed layers differ)")


def lowest_lossy(lossy: Sequence[LossyTrace]) -> LossyTrace | None:
    """The lossy trace taken at the lowest budget (the first of a tie), None when there is none."""
    return min(lossy, key=lambda t: t.budget_mib) if lossy else None


def drop_curve_from(trace: RouteTrace, lever: DropLever, budgets_mib: Sequence[float],
                    lossy: Sequence[LossyTrace] = ()) -> list[DropPoint]:
    """drop_curve at every budget, replayed from the lossy trace taken at the lowest budget
    (lowest_lossy), from `trace` at budget 0 (the engine refuses the lever there: the run is
    lossless) and where there is none. The lossy trace's residency and drops are re-simulated at
    every budget; `lossless_decode_read_mib_per_token` stays `trace`'s, and each point names the
    routing it came from."""
    budgets = [float(b) for b in budgets_mib]
    points = drop_curve(trace, lever, budgets)
    source = lowest_lossy(lossy)
    at = [i for i, b in enumerate(budgets) if b > 0]
    if source is not None and at:
        for i, p in zip(at, drop_curve(source.trace, lever, [budgets[i] for i in at])):
            points[i] = replace(p, lossless_decode_read_mib_per_token=points[i].lossless_decode_read_mib_per_token,
                                routing_path=str(source.trace.path), routing_budget_mib=source.budget_mib)
    return points
