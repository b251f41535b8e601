"""`--drop-cold-experts F`: cache-aware expert dropping, as bmoe-cli 0.19.0 does it (lossy).

Read from Helldez/BigMoeOnEdge at 2d4f2b1, the commit the peer build was made from:
core/src/moe/router_hook.cpp (`RouterHook::apply_drop`, `set_drop_policy`, `drop_armed`,
`close_drop_layer`, and the topk callback that counts and opens each layer), core/src/config.cpp
(`validate()`'s two refusals), core/src/engine/session.cpp (the top-k warning at load; the
counters a run reports are taken after the prefill), cli/main.cpp (the flags and the `moe-drop:`
line). docs/decisions/drop-cold-experts.md says what bmoe-py matches and how it was checked.

Per routed token, with k slots and the weights as the expert products apply them:

- a slot is dropped when it is not the top-weighted one (the first maximum), its expert is a cache
  miss before the layer's read, and its weight is below F / k, all in float32;
- a dropped slot's weight becomes 0 and its id the top slot's expert, so the layer's read skips
  the dropped expert (a repeated id is no second lookup) and its product adds exactly 0;
- with renormalisation (the default; `--drop-no-renorm` turns it off) the kept weights are
  multiplied by total / kept, both float32 sums in slot order.

When: in decode, and in prefill too with `--drop-in-prefill`. Upstream decides at the layer's
last weight node, which it learns from a graph in which it watched that node: a graph where the
policy was armed, or any graph of a route-traced run. So a layer drops only from its second such
graph on: the first decode drops nothing unless the prefill was traced or armed (checked on the
peer build: 72 against 74 dropped on the tiny model, with and without `--route-trace`). A layer
decided there loads late ("deferred"): the router's callback has already issued the next layers'
`--prefetch` guesses, so they are issued before this layer's read, not after it, and residency is
asked after they are integrated (StreamingExpertSource.resident_before_read).

Counts: every routed slot while F > 0 (upstream counts at the topk, in every phase); a run reports
what its decode loop added.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from engine.stream.budget import ConfigError

F32 = np.float32
# MoeStreamConfig::drop_low_topk_warn: at top-k this narrow or narrower, the load warns
WARN_AT_OR_BELOW_TOP_K = 4

# which of a layer's routed experts the cache holds before its read (the router's ids, in routing order)
Residency = Callable[[int, Sequence[int]], list[bool]]
# (layer, the dropped slots [n_tokens, k]) after each decision
DropObserver = Callable[[int, np.ndarray], None]


def validate(frac: float, cache_on: bool) -> None:
    """bmoe-cli's validate() for the drop threshold, in its order (streaming runs only: without
    --moe-stream the flag is ignored, as upstream ignores it)."""
    if frac > 0.0 and not cache_on:
        raise ConfigError(
            "moe.drop_cold_frac requires the LRU cache (cache_mb > 0 or cache_auto): with the cache off every "
            "expert is a miss, so the policy stops being cache-aware and degenerates into an unconditional weight "
            "cut — which is what n_expert_used already does, without pretending to consult residency.")
    if not 0.0 <= frac <= 1.0:  # written so that a nan is refused too
        raise ConfigError(
            "moe.drop_cold_frac must be in [0, 1] (0 = off). Above 1.0 the threshold can exceed the largest "
            "weight in a routing, which would discard every expert of a layer; 1.0 is the uniform share "
            "1/n_expert_used and the useful maximum.")


def warning(frac: float, top_k: int) -> str:
    """The load-time warning on a narrow routing ("" when the top-k is wide enough)."""
    if not 0 < top_k <= WARN_AT_OR_BELOW_TOP_K:
        return ""
    return (f"bmoe: WARNING drop-cold-experts={frac:.2f} with top-k {top_k} — the threshold is "
            f"{100.0 * frac / top_k:.1f}% of the routing here, against 12.5% at the top-k 8 this was measured on. "
            "Expect it to discard much more, and check output quality on your own task.")


class DropPolicy:
    """The policy for one loaded model: called with each layer's routing before its read, it edits
    the expert ids and weights in place (engine.forward.graph.Model's `route_hook`)."""

    def __init__(self, frac: float, n_layer: int, resident: Residency, *, renorm: bool = True,
                 in_prefill: bool = False, traced: bool = False, on_drop: DropObserver | None = None):
        """resident: the source's residency before a layer's read, asked where upstream asks it
        (StreamingExpertSource.resident_before_read: the next layers' prefetch issued first).
        traced: a route trace watches every layer's weights, so the policy learns them in any
        phase. on_drop: told every decision (the route trace's `dropped` column)."""
        self.frac = F32(frac)
        self.renorm = renorm
        self.in_prefill = in_prefill
        self.traced = traced
        self.on_drop = on_drop
        self._resident = resident
        self._watched = [False] * n_layer     # upstream's term_variant_ >= 0: the layer can decide
        self.decoding = False                 # the batch's phase, set before each pass (set_batch_phase)
        self.routed = 0
        self.dropped = 0

    @property
    def armed(self) -> bool:
        return bool(self.frac > 0) and (self.decoding or self.in_prefill)

    def __call__(self, layer: int, ids: np.ndarray, weights: np.ndarray) -> None:
        """One layer's routing, ids [n_tokens, k] and float32 weights [n_tokens, k], in slot order."""
        if self.frac > 0:
            self.routed += ids.size
        armed = self.armed
        if armed and self._watched[layer]:
            mask = self._apply(layer, ids, weights)
            if self.on_drop is not None:
                self.on_drop(layer, mask)
        if armed or self.traced:
            self._watched[layer] = True

    def _apply(self, layer: int, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        n, k = ids.shape
        resident = self._resident(layer, [int(e) for e in ids.ravel()])
        threshold = F32(self.frac / F32(k))
        mask = np.zeros((n, k), dtype=bool)
        for j in range(n):
            w = [F32(x) for x in weights[j]]
            best, total = 0, F32(0.0)
            for s in range(k):
                total = F32(total + w[s])
                if w[s] > w[best]:
                    best = s
            kept = F32(0.0)
            for s in range(k):
                if s != best and not resident[j * k + s] and w[s] < threshold:
                    mask[j, s] = True
                else:
                    kept = F32(kept + w[s])
            dropped = int(mask[j].sum())
            if not dropped:
                continue
            self.dropped += dropped
            ids[j, mask[j]] = ids[j, best]
            weights[j, mask[j]] = F32(0.0)
            if self.renorm and kept > 0:
                scale = F32(total / kept)
                for s in range(k):
                    if not mask[j, s]:
                        weights[j, s] = F32(w[s] * scale)
        return mask
