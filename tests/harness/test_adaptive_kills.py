"""An adaptive sweep survives any kill (docs/decisions/adaptive-sweep.md, "Resume"): `bmoe-fleet
run` is SIGKILLed at random points of a real adaptive campaign on two virtual phones (groups by
device and by other apps), between rounds, mid-round and while starting, and run again after each
kill. The last run completes it, and the folder then holds exactly what one uninterrupted run
would have needed from the same runs: plan.json decided again round by round from its first round
gives the same cells, it never lost one, each cell has one result, nothing is torn
(tests/harness/adaptive_kills.py). The long version: `benchmarks/fault_inject.py --adaptive-kills`.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tests.harness import adaptive_kills

pytestmark = pytest.mark.phone

KILLS = 10


def test_an_adaptive_sweep_killed_at_random_points_resumes_to_what_one_run_would_need(
        tmp_path, adb_port, phone_home, tiny_model):
    adaptive_kills.phones_up(phone_home, adb_port)
    kills: list = []
    try:
        for path, out, chain in adaptive_kills.chains(tmp_path, phone_home, adb_port, tiny_model,
                                                      random.Random(47), KILLS, max_campaigns=4):
            why = adaptive_kills.describe(chain)
            assert chain.last_status == 0, why
            found = adaptive_kills.problems(path, out, chain, tmp_path / "scratch")
            assert found == Counter(), f"{found}\n{why}"
            kills += chain.kills
        assert len(kills) >= KILLS
        assert set(Counter(k.point for k in kills)) == set(adaptive_kills.KILL_POINTS)
        # kills landed in several rounds (plan.json had grown between them)
        assert len({len(k.planned) for k in kills}) >= 4
        print(f"{len(kills)} kills: {dict(Counter(k.point for k in kills))}")
    finally:
        adaptive_kills.phones_down(phone_home, adb_port)
