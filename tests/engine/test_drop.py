"""engine.stream.drop, bmoe-py's `--drop-cold-experts`, without the real engine: the decision on
hand-made routings (RouterHook::apply_drop at upstream's 2d4f2b1), when a layer may decide, and a
bmoe-py run whose trace, counters and reads say what it dropped. tests/engine/test_differential_drop.py
holds the same runs to bmoe-cli."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from engine.stream.budget import ConfigError
from engine.stream.drop import DropPolicy, validate, warning
from results.read.parse import read_metrics_csv
from tests.engine.test_engine_cli import TINY, bmoe_py

F32 = np.float32


def _policy(frac: float, resident: list[bool], **kw) -> DropPolicy:
    policy = DropPolicy(frac, n_layer=2, resident=lambda layer, routed: list(resident), **kw)
    policy.decoding = True
    return policy


def _route(ids: list[int], weights: list[float]) -> tuple[np.ndarray, np.ndarray]:
    return np.array([ids], dtype=np.int64), np.array([weights], dtype=F32)


def _decide(policy: DropPolicy, ids: np.ndarray, weights: np.ndarray) -> None:
    policy(0, ids.copy(), weights.copy())     # the first armed pass only learns the layer
    policy(0, ids, weights)


def test_a_cold_light_slot_goes_to_the_top_expert_and_the_rest_are_rescaled_in_float32():
    ids, weights = _route([5, 2, 7], [0.5, 0.3, 0.2])
    policy = _policy(1.0, [False, False, True])     # threshold 1/3: slot 1 misses and is light
    _decide(policy, ids, weights)
    scale = F32(F32(F32(F32(0.5) + F32(0.3)) + F32(0.2)) / F32(F32(0.5) + F32(0.2)))
    assert ids.tolist() == [[5, 5, 7]]
    assert weights.tolist() == [[F32(0.5) * scale, 0.0, F32(0.2) * scale]]
    assert (policy.routed, policy.dropped) == (6, 1)


def test_a_resident_or_heavy_slot_stays_and_the_top_slot_is_never_dropped():
    ids, weights = _route([1, 2, 3], [0.5, 0.3, 0.2])
    _decide(_policy(1.0, [False, True, False]), ids, weights)     # threshold 1/3: slot 1 light but resident
    assert ids.tolist() == [[1, 2, 1]]
    ids, weights = _route([1, 2, 3], [0.4, 0.35, 0.25])
    _decide(_policy(1.0, [False, False, False]), ids, weights)    # slot 1 cold but heavy
    assert ids.tolist() == [[1, 2, 1]]
    ids, weights = _route([1, 2], [0.1, 0.1])                      # both under 1/2, both cold: the first max stays
    _decide(_policy(1.0, [False, False]), ids, weights)
    assert ids.tolist() == [[1, 1]] and weights.tolist() == [[F32(0.2), 0.0]]
    ids, weights = _route([1, 2], [0.5, 0.5])                      # at the threshold: not under it
    _decide(_policy(1.0, [False, False]), ids, weights)
    assert ids.tolist() == [[1, 2]]


def test_without_renorm_the_kept_weights_stay_as_routed():
    ids, weights = _route([1, 2, 3], [0.6, 0.3, 0.1])
    _decide(_policy(0.5, [False, False, False], renorm=False), ids, weights)   # threshold 1/6
    assert ids.tolist() == [[1, 2, 1]] and weights.tolist() == [[F32(0.6), F32(0.3), 0.0]]


def test_a_layer_decides_only_after_a_pass_that_watched_it():
    ids, weights = _route([1, 2], [0.7, 0.3])
    cold = [False, False]
    policy = _policy(1.0, cold)
    policy.decoding = False
    policy(0, ids.copy(), weights.copy())       # prefill, not armed: learns nothing
    policy.decoding = True
    policy(0, ids.copy(), weights.copy())       # the first decode learns
    assert policy.dropped == 0
    policy(0, ids.copy(), weights.copy())
    assert policy.dropped == 1
    for kw in ({"traced": True}, {"in_prefill": True}):   # a traced or armed prefill learns there
        policy = _policy(1.0, cold, **kw)
        policy.decoding = False
        policy(1, ids.copy(), weights.copy())
        policy.decoding = True
        policy(1, ids.copy(), weights.copy())
        assert policy.dropped == 1, kw


def test_refusals_and_warning_are_upstreams():
    validate(0.0, cache_on=False)
    validate(1.0, cache_on=True)
    for frac, cache_on, starts in ((0.5, False, "moe.drop_cold_frac requires the LRU cache"),
                                   (1.5, True, "moe.drop_cold_frac must be in [0, 1]"),
                                   (float("nan"), True, "moe.drop_cold_frac must be in [0, 1]"),
                                   (-0.5, False, "moe.drop_cold_frac must be in [0, 1]")):
        with pytest.raises(ConfigError, match=r"^" + starts.replace("[", r"\[").replace("]", r"\]")):
            validate(frac, cache_on)
    assert warning(0.75, 8) == "" and warning(0.75, 5) == ""
    assert warning(0.75, 4).startswith("bmoe: WARNING drop-cold-experts=0.75 with top-k 4 — the threshold is 18.8% ")


@pytest.fixture(scope="module")
def drop_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("drop")
    out = {}
    for name, extra in (("off", ()), ("on", ("--drop-cold-experts", "1"))):
        r = bmoe_py("-m", TINY, "-t", 1, "-n", 16, "--moe-stream", "--cache-mb", 2, "--force-cache", *extra,
                    "--csv", d / f"{name}.csv", "--route-trace", d / f"{name}.route.csv")
        assert r.returncode == 0, r.stderr
        out[name] = (r, read_metrics_csv(d / f"{name}.csv"), pd.read_csv(d / f"{name}.route.csv", comment="#"))
    return out


def test_a_run_reports_what_it_dropped_and_reads_less(drop_runs):
    r, csv, trace = drop_runs["on"]
    _, off_csv, off_trace = drop_runs["off"]
    dropped, routed = csv.summary["experts_dropped"], csv.summary["experts_routed"]
    assert 0 < dropped < routed == 16 * 4 * 2
    assert f"moe-drop: {dropped}/{routed} routed experts dropped".encode() in r.stdout
    marked = trace[trace["dropped"] == 1]
    assert len(marked) == dropped and (marked["phase"] == 1).all()
    assert (marked["residency"] == 0).all() and (marked["expert_bytes"] == 0).all()
    # the router's choice is traced unchanged: the prefill, which drops nothing, routes alike
    cols = ["phase", "step", "layer", "slot", "expert"]
    assert trace[trace["phase"] == 0][cols].equals(off_trace[off_trace["phase"] == 0][cols])
    assert csv.preamble["drop_cold_frac"] == "1" and off_csv.preamble["drop_cold_frac"] == "0"
    assert off_csv.summary["experts_routed"] == off_csv.summary["experts_dropped"] == 0
    assert csv.summary["read_MiB"] < off_csv.summary["read_MiB"]
    assert b"bmoe: WARNING drop-cold-experts=1.00 with top-k 2" in r.stderr
