"""Exactness: bmoe-py's measured cumulative hit % equals the replay of its own route trace."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.gguf.model import load_model_shape
from engine.gguf.synth import synth_options, write_model
from results.read.parse import read_metrics_csv
from results.read.route_trace import read_route_trace
from results.replay.lru_replay import access_sequence, lru_curve


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("exact") / "m.gguf"
    write_model(path, synth_options("gpt-oss", layers=6, experts=16, top_k=4, hidden=256, expert_ffn=512,
                                    vocab=300, seed=21, router_skew=1.0))
    return path


def test_measured_hit_rate_equals_the_replay_of_the_runs_own_trace(model, tmp_path):
    shape = load_model_shape(model)
    cycle_mib = shape.cycle_mib(4)
    budgets = [max(1, int(cycle_mib * 0.7)), int(cycle_mib * 1.3) + 1, int(cycle_mib * 2.5) + 1]
    assert budgets[0] < cycle_mib < budgets[1]
    seen = set()
    for budget in budgets:
        csv, trace = tmp_path / f"{budget}.csv", tmp_path / f"{budget}.route.csv"
        r = subprocess.run([sys.executable, "-m", "engine", "-m", str(model), "-n", "24", "--moe-stream",
                            "--cache-mb", str(budget), "--force-cache", "-p", "The quick brown fox jumps over",
                            "--csv", str(csv), "--route-trace", str(trace)], capture_output=True, timeout=300)
        assert r.returncode == 0, r.stderr.decode()[-1000:]
        measured = read_metrics_csv(csv).summary["cache_hit_pct"]
        (point,) = lru_curve(access_sequence(read_route_trace(trace)), [budget], shape.cycle_bytes(4))
        assert f"{point.hit_pct_cum:.1f}" == f"{measured:.1f}", budget
        seen.add(round(measured, 1))
    assert len(seen) == len(budgets)  # the budgets really are different operating points
