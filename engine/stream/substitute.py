"""`--expert-substitute L` (bmoe-cli 0.24): cache-aware expert substitution, lossy.

Read from Helldez/BigMoeOnEdge's stored sources, none of them a build this project can run:
CHANGELOG.md at 006783f9 (the 0.24.0 entry), upstream's docs/cache-aware-substitution.md at a1075c28,
core/src/moe/router_hook.cpp (`RouterHook::apply_substitute`, `substitute_armed`, `rank_top_k`, the
topk callback that calls it first), core/src/config.cpp (`validate()`'s two refusals, after the drop
threshold's) and cli/main.cpp (`moe-substitute:`), in the store's versions that carry them.
docs/decisions/expert-substitute-and-ppl.md says what bmoe-py holds to and how.

Per decoded token and MoE layer, before the routing is committed: the scores the router sorted
(the softmax probabilities, taken as logs, for a softmax router; the logits for gpt-oss's
softmax-over-the-top-k router) get `L × (max − min)` of that token's finite scores added for every
expert the cache holds (prefetches that landed integrated first), and the top-k is taken again
(ties to the lower index). The weights are then the router's own for whatever ids won. A token
whose new set equals the router's counts k slots reranked and none substituted; otherwise the
experts new to the set are counted substituted and the ids are rewritten in the new order.
Decode only; a layer whose every expert is already selected, or a token whose scores span
nothing, is left alone and not counted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from engine.stream.budget import ConfigError

F32 = np.float32

# which of a layer's experts the cache holds now (StreamingExpertSource.resident)
Residency = Callable[[int, Sequence[int]], list[bool]]


def validate(lam: float, cache_on: bool) -> None:
    """bmoe-cli 0.24's validate() for the margin, in its order (after the drop threshold's)."""
    if lam > 0.0 and not cache_on:
        raise ConfigError(
            "moe.substitute_lambda requires the LRU cache (cache_mb > 0 or cache_auto): with the cache off "
            "nothing is resident, so there is nothing to prefer and the re-ranking would be the router's own.")
    if not 0.0 <= lam <= 1.0:  # written so that a nan is refused too
        raise ConfigError(
            "moe.substitute_lambda must be in [0, 1] (0 = off). At 1.0 a resident expert outranks every "
            "non-resident one whatever their scores, which is the strongest preference the margin can express.")


class SubstitutePolicy:
    """The policy for one loaded model: engine.forward.graph.Model's `rerank`, called with each
    layer's router scores and top-k ids before the weights are taken."""

    def __init__(self, lam: float, resident: Residency):
        self.lam = F32(lam)
        self._resident = resident
        self.decoding = False       # the batch's phase, set before each pass (upstream's set_batch_phase)
        self.reranked = 0
        self.substituted = 0

    @property
    def armed(self) -> bool:
        return bool(self.lam > 0) and self.decoding

    def __call__(self, layer: int, scores: np.ndarray, ids: np.ndarray, log_space: bool) -> np.ndarray:
        """scores [n_tokens, n_expert] as the router sorted them (float32), ids [n_tokens, k] its
        top-k: the ids to run, edited in place where a token's set moved."""
        n_expert, k = scores.shape[1], ids.shape[1]
        if not self.armed or n_expert <= k:
            return ids
        resident = np.array(self._resident(layer, range(n_expert)), dtype=bool)
        for j in range(ids.shape[0]):
            row = scores[j].astype(F32)
            if log_space:   # logf of each probability, correctly rounded; 0 (or less) is -inf
                with np.errstate(divide="ignore", invalid="ignore"):
                    row = np.where(row > 0, np.log(row.astype(np.float64)), -np.inf).astype(F32)
            finite = np.isfinite(row)
            if not finite.any():
                continue
            boost = F32(self.lam * F32(row[finite].max() - row[finite].min()))
            if not boost > 0:
                continue
            boosted = row.copy()
            lift = resident & finite
            boosted[lift] = (boosted[lift] + boost).astype(F32)
            pick = np.argsort(-boosted, kind="stable")[:k]      # descending, ties to the lower index
            self.reranked += k
            changed = len(set(pick.tolist()) - set(ids[j].tolist()))
            if changed:
                self.substituted += changed
                ids[j] = pick
        return ids
