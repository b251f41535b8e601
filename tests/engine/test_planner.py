"""bmoe-py's hardware planner (engine.plan.planner, engine.plan.probe): upstream's rules on made-up
machines, its printed plan read back by the capture reader, and the real engine planning and
running inside a real memory cgroup (root; CI is root)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from engine.contract.config import RunConfig
from engine.gguf.synth import synth_options, write_model
from engine.interface.flags import AUTO, PLAN
from engine.plan.planner import (
    COMPRESS,
    DERIVED,
    EXPERTS_STREAM,
    FITS,
    KILL,
    MEASURED,
    OPERATOR,
    Group,
    Machine,
    ModelProfile,
    RateSample,
    Storage,
    check_line,
    explain_lines,
    plan_run,
)
from engine.units import MIB
from results.read.parse import read_metrics_csv
from results.read.parse_console import parse_console
from tests.conftest import UPSTREAM_HOST, in_cgroup, memory_cgroup

TINY = str(UPSTREAM_HOST / "tiny-qwen3moe.gguf")
NEXT_ENV = {"BMOE_PY_RELEASE": "0.25"}


def _model(file_mib=2000, dense_mib=100, cycle_mib=50, slice_kib=512) -> ModelProfile:
    experts = (file_mib - dense_mib) * MIB
    return ModelProfile(
        ok=True, arch="qwen3moe", n_expert=64, n_expert_used=4, n_moe_layer=24, n_layer=24, file_bytes=file_mib * MIB,
        dense_bytes=dense_mib * MIB, expert_bytes=experts, token_cycle_bytes=cycle_mib * MIB,
        expert_slice_bytes=slice_kib << 10, largest_dense_tensor_bytes=20 * MIB,
        groups=(Group("attention", dense_mib * MIB, dense_mib * MIB), Group("experts", experts, cycle_mib * MIB,
                                                                            streamable=True)))


def _storage(*rates: tuple[int, float]) -> Storage:
    return Storage(tuple(RateSample(512 << 10, lanes, r) for lanes, r in rates), direct_ok=True)


def _decision(plan, knob):
    return next(d for d in plan.decisions if d.knob == knob)


def test_the_budget_is_what_the_machine_holds_less_its_margin_and_the_dense_set():
    hw = Machine(1000 * MIB, KILL, 8, storage=_storage((1, 100.0), (2, 196.0), (4, 200.0)), host_gibs=10.0)
    plan = plan_run(RunConfig(), hw, _model())
    # a kill is fatal: 20 % of 1000 is under the 256 MiB floor, so 256; 744 usable less 100 dense
    assert plan.regime == EXPERTS_STREAM
    assert (plan.config.moe_stream, plan.config.cache_mb, plan.config.force_cache) == (True, 644, True)
    assert _decision(plan, "cache-mb").source == DERIVED
    # the largest lane count within 5 % of the best rate (plan.cpp), measured
    assert plan.config.io_threads == 4 and _decision(plan, "io-threads").source == MEASURED
    assert plan.to_flags() == "--moe-stream --cache-mb 644 --force-cache"
    # priced: compute of every byte a token reads, plus the cycle's uncredited share at the probe's rate
    credited = 644 / 1900
    expected = (150 / 1024) / 10.0 + 50 / 200.0 * (1 - credited)
    assert plan.predicted_s_per_tok == pytest.approx(expected)
    assert plan.credited_hit_pct == pytest.approx(100 * credited)


def test_lanes_past_the_best_rate_are_not_taken():
    hw = Machine(1000 * MIB, KILL, 8, storage=_storage((1, 100.0), (2, 200.0), (4, 150.0)))
    assert plan_run(RunConfig(), hw, _model()).config.io_threads == 2


def test_a_budget_under_the_token_cycle_declines_streaming_unless_the_caller_pinned_one():
    hw = Machine(400 * MIB, KILL, 8)         # 144 usable, 44 after the dense set: under the 50 MiB cycle
    plan = plan_run(RunConfig(moe_stream=True), hw, _model())
    assert not plan.config.moe_stream and "below this model's worst-case token cycle of 50 MiB" in plan.declined
    assert plan.to_flags().startswith("# streaming declined")
    pinned = plan_run(RunConfig(moe_stream=True, cache_mb=300, force_cache=True), hw, _model(), pinned={"cache-mb"})
    assert pinned.config.moe_stream and pinned.config.cache_mb == 300
    assert _decision(pinned, "cache-mb").source == OPERATOR
    assert _decision(pinned, "cache-floor").value == "50 MiB"


def test_a_model_that_fits_streams_anyway_where_a_reclaim_is_cheap_and_it_has_no_air():
    model = _model(file_mib=2000)
    assert plan_run(RunConfig(), Machine(8000 * MIB, KILL, 8), model).regime == FITS
    # 3500 less a 350 MiB margin: it fits with 1150 MiB spare, under the 2000 it would hold
    squeezed = plan_run(RunConfig(), Machine(3500 * MIB, COMPRESS, 8), model)
    assert squeezed.regime == EXPERTS_STREAM and squeezed.config.moe_stream
    assert _decision(squeezed, "residency").value == "not verified"
    # capped at the experts' own size
    assert squeezed.config.cache_mb == 1900


def test_a_pinned_knob_is_never_overwritten():
    hw = Machine(1000 * MIB, KILL, 8, storage=_storage((1, 100.0), (4, 400.0)))
    plan = plan_run(RunConfig(io_threads=1, dense_weights="mmap", n_threads=2), hw, _model(),
                    pinned={"io-threads", "dense-weights", "threads"})
    assert (plan.config.io_threads, plan.config.dense_weights, plan.config.n_threads) == (1, "mmap", 2)
    assert {d.knob for d in plan.decisions if d.source == OPERATOR} == {"io-threads", "dense-weights", "threads"}
    # nothing converted, so the dense set is not subtracted: 744 usable, all of it cache
    assert plan.config.cache_mb == 744


def test_the_printed_plan_reads_back_field_by_field():
    hw = Machine(1000 * MIB, KILL, 8, storage=_storage((1, 100.0), (4, 200.0)), host_gibs=10.0)
    model = _model()
    plan = plan_run(RunConfig(), hw, model)
    lines = explain_lines(hw, model, plan, "/m/model.gguf", "bmoe-py")
    assert lines[-2:] == ["plan: reproduce with", f"  bmoe-py -m /m/model.gguf {plan.to_flags()}"]
    check = check_line(plan, 0.2, 35.0)
    assert re.fullmatch(r"plan: predicted \d\.\d{3} s/token, measured 0\.200 \([+-]\d+%\); cache hits credited "
                        r"\d+%, measured 35\.0%", check)
    run = parse_console(["generation: 8 tokens, 0.200 s/token (5.000 tok/s)", check, *lines])
    assert run.value("plan-regime", "plan_regime") == EXPERTS_STREAM
    assert run.value("plan-reproduce", "plan_cache_mb") == 644
    assert run.value("plan-cost", "plan_cost_ms_per_tok") == pytest.approx(plan.predicted_s_per_tok * 1000, abs=0.05)
    assert run.value("plan-check", "plan_measured_s_per_tok") == 0.2
    declined = plan_run(RunConfig(), Machine(400 * MIB, KILL, 8), model)
    back = parse_console(explain_lines(Machine(400 * MIB, KILL, 8), model, declined, "/m/model.gguf", "bmoe-py"))
    assert back.value("plan-declined", "plan_declined") == declined.declined
    assert back.value("plan-reproduce", "plan_flags") == declined.to_flags()


def _bmoe_py(args, env=None, cgroup=None):
    argv = [sys.executable, "-m", "engine", *map(str, args)]
    return subprocess.run(in_cgroup(cgroup, argv) if cgroup else argv, capture_output=True, timeout=600,
                          env={**os.environ, **(env or {})})


def test_the_planner_flags_are_unknown_at_the_release_bmoe_py_claims_by_default():
    for flag in (AUTO.name, PLAN.name):
        r = _bmoe_py(["-m", TINY, flag], env={"BMOE_PY_RELEASE": ""})
        assert r.returncode == 1 and r.stderr.decode().splitlines()[0] == f"unknown arg: {flag}"
        cli = os.environ.get("BMOE_CLI")
        if cli:   # what the real 0.19.0 build says to it
            real = subprocess.run([cli, "-m", TINY, flag], capture_output=True, timeout=120)
            assert real.returncode == r.returncode
            assert real.stderr.decode().splitlines()[0] == r.stderr.decode().splitlines()[0]


def test_plan_prints_the_plan_and_runs_nothing():
    r = _bmoe_py(["-m", TINY, PLAN.name], env=NEXT_ENV)
    assert r.returncode == 0 and r.stdout == b""
    lines = r.stderr.decode().splitlines()
    assert lines[0].startswith("plan: machine ") and lines[-2] == "plan: reproduce with"
    # this host holds the whole 7 MiB model many times over: it fits, and the plan says so
    assert "plan: regime fits" in lines


@pytest.fixture(scope="module")
def planned_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("planner") / "planned.gguf"
    write_model(path, synth_options("qwen3moe", size_bytes=64 << 20, experts=16, top_k=2, seed=3))
    return path


@pytest.mark.root("makes a memory cgroup")
def test_auto_plans_inside_a_memory_cgroup_and_runs_what_it_planned(planned_model, tmp_path):
    """The engine's own footprint at plan time, measured first, sets a limit halfway through the
    window where the experts stream: the plan's budget is then what the run's CSV header says,
    the run prints its prediction against its measurement, and the flags it says reproduce it
    run as written."""
    with memory_cgroup(4 << 30) as cg:
        assert _bmoe_py(["-m", planned_model, PLAN.name, "-t", 1], env=NEXT_ENV, cgroup=cg).returncode == 0
        with open(os.path.join(cg, "memory.max_usage_in_bytes")) as f:
            footprint = int(f.read())
    from engine.gguf.model import load_model_shape

    shape = load_model_shape(planned_model)
    cycle, dense = shape.cycle_bytes(2), shape.dense_bytes
    window_mid = (dense + cycle + shape.file_bytes) // 2        # usable between dense + cycle and the file
    limit = footprint + 256 * MIB + window_mid
    csv = tmp_path / "auto.csv"
    with memory_cgroup(limit) as cg:
        r = _bmoe_py(["-m", planned_model, AUTO.name, "--plan-explain", "-t", 1, "-n", 8, "--csv", csv],
                     env=NEXT_ENV, cgroup=cg)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    run = parse_console((r.stdout + r.stderr).decode("utf-8", "replace").splitlines())
    assert run.value("plan-regime", "plan_regime") == EXPERTS_STREAM
    budget = run.value("plan-reproduce", "plan_cache_mb")
    assert budget is not None and cycle / MIB <= budget < shape.expert_bytes / MIB
    assert int(read_metrics_csv(csv).preamble["cache_mb"]) == budget        # the plan is the run's configuration
    assert run.value("plan-check", "plan_measured_s_per_tok") > 0
    assert run.value("mode", "mode") == "expert streaming"
    flags = shlex.split(str(run.value("plan-reproduce", "plan_flags")))
    again = _bmoe_py(["-m", planned_model, "-n", 2, *flags], env=NEXT_ENV)   # accepted as written
    assert again.returncode == 0, again.stderr.decode()[-500:]
