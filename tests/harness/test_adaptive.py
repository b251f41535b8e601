"""The adaptive sweep (docs/decisions/adaptive-sweep.md): `[plan] adaptive = true` / `sweep --adaptive` measures
cache 0 with a route trace, the predicted knee and largest safe budget, then bisects the kill
boundary on a real virtual phone; it resumes after the phone dies mid-bisection, never rests a
recommendation on a budget that was not measured and held, and `status` shows the bracket and what
was spent."""

from __future__ import annotations

import io
import json
import math
import shutil
import time
import tomllib
from pathlib import Path

import pytest

from harness.campaign.file import parse_campaign
from harness.campaign.model import CampaignError
from harness.plan.adaptive import BISECTING, BRACKETED, GRID, brackets_of
from harness.plan.grid import make_plan
from harness.run.errors import RunnerError
from harness.run.runner import run_campaign
from harness.run.status import campaign_status
from results.analysis.analyze import analyze
from results.analysis.recommend import recommend
from results.read.table import build_table
from store.campaign_dir import CampaignDir
from store.ledger import was_attempted
from tests.harness.faults import _CLI, stop_phone_when

# On this host one decode thread: this module's tests run in run.sh's serial part, beside tests at nice
# 19 on both cores (two hyperthreads here, it seems: SCHED_IDLE neighbours slow it as much), where a
# second thread waits on its sibling (the grid test took 6.4 s alone, 11.7 s beside two busy loops,
# 7.4 s so with one thread). A phone's runs keep its own count (one thread made the bisection's twice as long).
LOCAL_RUN = {"threads": 1}


def adaptive_campaign(model: Path, devices, cache_mb, plan=None, run=None, fleet=None, name="adapt", axes=None):
    local = LOCAL_RUN if list(devices) == ["local"] else {}
    return parse_campaign({"version": 1, "name": name, "fleet": {"devices": list(devices), **(fleet or {})},
                           "models": {"mid": str(model)}, "axes": {"cache_mb": cache_mb, **(axes or {})},
                           "run": {"n_predict": 8, **local, **(run or {})}, "gate": {"max_wait_s": 2},
                           "plan": {"adaptive": True, **(plan or {})}}, source=f"{name}.toml")


def ledger(out: Path) -> list[dict]:
    path = out / "ledger.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def held_budgets(out: Path) -> set[float]:
    """Every budget the analysis counts as safe: measured, every run finished, cache filled, not fought."""
    analysis = analyze(build_table([out]))
    safe = set()
    for g in analysis.groups:
        b = g.boundary
        for p in g.points:
            if p.ok == p.runs and p.filled and not p.fought and not p.auto and \
                    (b.smallest_killed_mib is None or p.budget_mib < b.smallest_killed_mib):
                safe.add(p.budget_mib)
    return safe


def assert_recommends_only_what_held(out: Path) -> None:
    """Every budget a recommendation rests on was measured and held; every argv is measured."""
    recs = recommend([out])
    held = held_budgets(out)
    for r in recs.all():
        if r.auto is not None:
            assert r.auto.largest_safe_mib in held and r.auto.cache_ceil_mb <= r.auto.largest_safe_mib, (r.auto, held)
        if r.fixed is not None and r.fixed.cache_mb > 0:
            assert r.fixed.cache_mb in held and r.fixed.measured, (r.fixed, held)
    doc = json.loads(recs.to_json())
    for d in doc["devices"]:
        assert d["default"]["basis"] in ("measured", "unmeasured")
        for r in d["recommendations"]:
            for choice in (r["fixed"], r["auto"]):
                assert choice is None or choice["basis"] in ("measured", "unmeasured")
            assert r["predicted"] is None or r["predicted"]["basis"] == "predicted"


@pytest.mark.parametrize("table, problem", [
    ({"adaptive": "yes"}, "plan.adaptive: expected true or false"),
    ({"adaptive": True, "resolution_mb": -1}, "plan.resolution_mb: must be at least 0"),
    ({"adaptive": True, "max_error_pct": 0}, "plan.max_error_pct: must be above 0"),
    ({"adaptive": True, "bisect": 3}, "plan.bisect: unknown key"),
    ({"resolution_mb": 8}, "plan.resolution_mb: applies to an adaptive plan only"),
])
def test_bad_plan_keys_name_the_key(tiny_model, table, problem):
    with pytest.raises(CampaignError) as e:
        parse_campaign({"version": 1, "fleet": {"devices": ["local"]}, "models": {"t": str(tiny_model)},
                        "plan": table}, source="p.toml")
    assert problem in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(CampaignError, match=r"run\.reverse_pass: an adaptive plan"):
        adaptive_campaign(tiny_model, ["local"], [0, 4], run={"reverse_pass": True})


def test_a_cell_far_from_its_prediction_sends_its_group_to_the_grid(tmp_path, mid_model):
    """With an error bound nothing meets (two cache-0 runs: neither is exactly the mean the
    prediction was made from), cache 0 is measured again (repeats 2 and 3), misses in all four
    runs, and the group falls back to the grid: every grid budget is measured, cache 0 only as the
    route-traced cells, the bracket says why, and the file round-trips."""
    c = adaptive_campaign(mid_model, ["local"], [0, "cycle*1.2", 40], plan={"max_error_pct": 1e-9},
                          run={"repeats": 2})
    out = tmp_path / "grid"
    status = run_campaign(c, out, progress_stream=io.StringIO())
    assert status.complete
    (b,) = status.brackets
    assert b.state == GRID and "predicted" in b.reason and "in all 4 run(s)" in b.reason, b
    runs = [json.loads(p.read_text()) for p in out.glob("runs/*/1/run.json")]
    budgets = sorted(r["config"]["cache_mb"] for r in runs)
    grid = {cell.config.cache_mb for cell in make_plan(c).cells}
    # cache 0 twice over (the second round measures the miss again), every other grid budget once
    assert grid <= set(budgets) and budgets.count(0) == 4 and len(budgets) == 2 * len(grid) + 2
    assert sorted(r["repeat"] for r in runs if r["config"]["cache_mb"] == 0) == [0, 1, 2, 3]
    assert status.spent.cells == len(budgets) == status.planned and status.spent.device_s > 0
    assert parse_campaign(tomllib.loads((out / "campaign.toml").read_text()), "x").plan == c.plan


def test_one_run_slowed_by_something_else_is_measured_again_and_costs_no_grid(tmp_path, mid_model):
    """One run of the predicted safe budget is slowed five-fold (as another app on the phone
    would). Every run of that budget missed, so the sweep measures it again (repeat 1) before it
    spends the grid; the second run meets the prediction, and the search goes on from there. Both
    runs stay on the record and in the accounting."""
    from tests.results.conftest import write_engine

    engine = write_engine(tmp_path / "engine", "slow-once", slow_when="call:3", slow_ms=20)
    data = {"version": 1, "name": "adapt", "fleet": {"devices": ["local"]}, "models": {"mid": str(mid_model)},
            "axes": {"cache_mb": [0, "cycle*1.2", 40]}, "run": {"n_predict": 8, "threads": 1},
            "gate": {"max_wait_s": 2}, "plan": {"adaptive": True, "max_error_pct": 50}, "engine": engine}
    c = parse_campaign(data, source="adapt.toml")
    out = tmp_path / "slow-once"
    status = run_campaign(c, out, progress_stream=io.StringIO())
    assert status.complete
    (b,) = status.brackets
    assert b.state != GRID, b
    table = build_table([out])
    third = table[table["started_at"] == sorted(table["started_at"])[2]].iloc[0]
    again = table[(table["cache_mb"] == third["cache_mb"]) & (table["run_id"] != third["run_id"])]
    assert len(again) == 1 and third["s_per_tok"] > 3 * float(again["s_per_tok"].iloc[0]), (third, again)
    repeats = sorted(json.loads((Path(d) / "run.json").read_text())["repeat"]
                     for d in table.loc[table["cache_mb"] == third["cache_mb"], "run_dir"])
    assert repeats == [0, 1]
    assert status.spent.cells == len(table) == status.planned


def test_the_bisection_closes_the_kill_bracket_and_resumes_after_the_phone_dies(tmp_path, adb_port, phone_home,
                                                                                mid_model):
    """On a 72 MiB virtual phone the mid model's cache is killed somewhere between the cycle and
    the working set. The phone is stopped mid-bisection: the run ends with cells pending, every
    recommendation rests on a budget measured and held; back up, the same command finishes the
    bracket to its resolution, re-running nothing that had finished."""
    from devices.virtual import manager

    manager.up("adapt", 72 << 20, home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)
    c = adaptive_campaign(mid_model, ["virtual:adapt"], [0, "cycle*1.2", 60],
                          plan={"resolution_mb": 1, "max_error_pct": 1000.0},
                          run={"retries": 0, "retry_backoff_s": 0.1},
                          fleet={"virtual_home": str(phone_home), "adb": [{"host": "127.0.0.1", "port": adb_port}]})
    out = tmp_path / "adapt"

    def bisecting() -> bool:
        """The predicted budgets are measured and a bisection cell runs: the moment to lose the phone."""
        doc = CampaignDir(out).read_plan_doc() if (out / "plan.json").exists() else None
        return any(b.state == BISECTING for b in brackets_of(doc))

    try:
        killer = stop_phone_when(bisecting, "adapt", phone_home, adb_port)
        first = run_campaign(c, out, progress_stream=io.StringIO())
        killer.join(120)
        assert not first.complete and first.pending >= 1 and "device_lost" in first.outcomes
        (b,) = first.brackets
        assert b.state == BISECTING and b.next_mib, b
        assert_recommends_only_what_held(out)
        before = ledger(out)
        finished = {r["cell_id"] for r in before if r["outcome"] != "device_lost"}

        manager.up("adapt", 72 << 20, home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)
        second = run_campaign(c, out, progress_stream=io.StringIO())
        assert second.complete, second.text()
        new = ledger(out)[len(before):]
        assert not {r["cell_id"] for r in new} & finished           # nothing that finished ran again
        (b,) = second.brackets
        assert b.state == BRACKETED and b.held_mib is not None, b
        assert b.failed_mib is None or 0 < b.failed_mib - b.held_mib <= 1, b
        assert b.held_mib in held_budgets(out)
        assert_recommends_only_what_held(out)
        # the budget over the bracket was measured and did not hold (killed, fought or unfilled)
        assert b.failed_mib is None or b.failed_mib not in held_budgets(out)
        text = second.text()
        assert "adaptive: virtual:adapt mid k=4: bracketed" in text and "spent:" in text
        assert second.spent.cells == len({r["cell_id"] for r in ledger(out) if was_attempted(r)})
        assert json.loads(second.to_json())["adaptive"][0]["state"] == BRACKETED
        assert brackets_of(CampaignDir(out).read_plan_doc()) == second.brackets
        # and a rerun has nothing left to decide or run
        third = run_campaign(c, out, progress_stream=io.StringIO())
        assert third.complete and len(ledger(out)) == len(before) + len(new) and third.brackets == second.brackets
        assert campaign_status(out).brackets == second.brackets
    finally:
        if manager.info("adapt", phone_home).running:
            manager.down("adapt", home=phone_home, adb_host="127.0.0.1", adb_port=adb_port)
    assert not math.isnan(second.spent.device_s)


def test_sweep_adaptive_interrupted_then_rerun_completes_the_same_plan(tmp_path, mid_model):
    """`sweep --adaptive` through the CLI: Ctrl-C mid-way exits 130 with the directory valid; the
    same command again decides the same cells from the runs on disk, runs only what is missing,
    and `status --json` gives the closed bracket and what was spent."""
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "sweep"
    args = [sys.executable, "-c", _CLI, "sweep", "--device", "local", "--model", str(mid_model),
            "--cache-mb", "0,cycle*1.2,40", "--adaptive", "--resolution-mb", "4", "--max-error-pct", "1000",
            "-n", "8", "-t", str(LOCAL_RUN["threads"]), "-o", str(out)]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while len(ledger(out)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        text = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "interrupted" in text and "Traceback" not in text, text[-800:]
    before = ledger(out)
    assert before and not campaign_status(out).complete
    done = subprocess.run(args, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stdout.decode()[-800:]
    after = ledger(out)
    assert after[:len(before)] == before
    assert not {r["cell_id"] for r in after[len(before):]} & {r["cell_id"] for r in before if r["outcome"] == "ok"}
    status = json.loads(campaign_status(out).to_json())
    (b,) = status["adaptive"]
    assert b["state"] == BRACKETED and status["complete"] and status["spent"]["cells"] == status["planned"]
    assert status["spent"]["device_s"] > 0
    assert_recommends_only_what_held(out)
    # recommendations.json counts what the campaign spent as status does, from its runs
    (camp,) = json.loads(recommend([out]).to_json())["campaigns"]
    assert camp["spent"]["cells"] == status["spent"]["cells"]
    assert math.isclose(camp["spent"]["device_s"], status["spent"]["device_s"], abs_tol=0.01)


def _next_after(measured: dict[float, bool | str], anchor: int | None, top: int = 668, resolution: int = 32,
                lowest: int = 58, knee: int | None = None,
                swap_in: dict[float, float] | None = None,
                floors: dict[float, float] | None = None) -> tuple[int | None, str]:
    """harness.plan.adaptive's next budget for a group whose fixed budgets held (True), were killed
    (False) or survived fought ("fought"), the analysis' largest safe budget being the largest (> 0)
    that held under every failure."""
    from types import SimpleNamespace

    from harness.plan.adaptive import _Group

    fails = [b for b, ok in measured.items() if ok is not True]
    held = [b for b, ok in measured.items() if ok is True and b > 0 and (not fails or b < min(fails))]
    g = SimpleNamespace(boundary=SimpleNamespace(largest_safe_mib=max(held) if held else None),
                        points=[SimpleNamespace(budget_mib=b, auto=False, ok=int(ok is not False),
                                                killed=int(ok is False), fought="fought" if ok == "fought" else "",
                                                swap_in_mib_per_tok=(swap_in or {}).get(b, math.nan),
                                                mem_avail_floor_kb=(floors or {}).get(b, math.nan) * 1024)
                                for b, ok in measured.items()])
    group = _Group.__new__(_Group)
    group.g, group.resolution, group.lowest, group.top, group.top_why = g, resolution, lowest, top, "the top held"
    return group._next(anchor, knee)


def test_the_search_steps_from_the_predicted_budget_doubling_then_bisects():
    """Up from the predicted safe budget while it holds, down while it does not, each step twice the
    last; a bracket narrower than the next step is bisected; the resolution or the top closes it."""
    assert _next_after({0: True, 139: True, 436: True}, 436) == (468, "")
    assert _next_after({0: True, 139: True, 436: True, 468: True}, 436) == (532, "")
    assert _next_after({0: True, 139: True, 436: True, 468: True, 532: False}, 436) == (500, "")
    assert _next_after({0: True, 139: True, 436: True, 468: False}, 436)[0] is None      # bracketed to 32
    # the prediction too high: down by 32, 64, 128, then the bisection of what is left
    seen = {0: True, 139: True, 626: False}
    for want in (594, 530, 402):
        assert _next_after(seen, 626) == (want, "")
        seen[want] = want < 500                 # the boundary sits between 402 and 530
    assert _next_after(seen, 626) == (466, "")
    # a fought prediction: the model placed the RAM's end, not the fight's start. Where the swap-in
    # rate crossed the rule's between the knee and it, the search steps from that crossing (the paced
    # 640 MiB phone: 0.09 MiB/token at 139, 1.86 at 437, so 293; fought there, and 261 held)
    rates = {0: 0.06, 139: 0.09, 437: 1.86, 293: 1.69, 261: 0.6}
    seen = {0: True, 139: True, 437: "fought"}
    for want, outcome in ((293, "fought"), (261, True)):
        assert _next_after(seen, 437, knee=139, swap_in=rates) == (want, "")
        seen[want] = outcome
    assert _next_after(seen, 437, knee=139, swap_in=rates) == (None, "bracketed to 32 MiB")
    # the rate rises steeply at the fight's start and flattens past it: a step down goes no further
    # than the crossing between the bracket's ends, where a doubled one would overshoot
    # (docs/lab-notes/2026-12-05-adaptive-demo-phones.md: 294 and 262 fought, the doubled step 198; the
    # crossing from 262 is 240, and 230 held)
    steep = {0: 0.066, 139: 0.091, 438: 1.849, 294: 1.739, 262: 1.209, 240: 0.3}
    seen = {0: True, 139: True, 438: "fought"}
    for want, outcome in ((294, "fought"), (262, "fought"), (240, True)):
        assert _next_after(seen, 438, knee=139, swap_in=steep) == (want, "")
        seen[want] = outcome
    assert _next_after(seen, 438, knee=139, swap_in=steep) == (None, "bracketed to 22 MiB")
    # and up: no further than the crossing between the largest budget that held and the fought one
    # (held at 293 and 325, 0.95 MiB/token at 325: the doubled step is 389, the crossing 332)
    rising = {0: 0.06, 139: 0.09, 437: 1.86, 293: 0.5, 325: 0.95}
    seen = {0: True, 139: True, 437: "fought", 293: True, 325: True}
    assert _next_after(seen, 437, knee=139, swap_in=rising) == (332, "")
    # a step up goes no further than the RAM the largest budget that held left, one resolution at
    # least (bmoe-py's 640 MiB phone, the same lab note: 106 MiB left at 445, 74 at 477, 17 at 541; the
    # doubled steps were 477, 541, 669, fought, and two bisections; the fight began by 573)
    floors = {0: 446, 137: 414, 445: 106, 477: 74, 541: 17}
    seen = {0: True, 137: True, 445: True}
    for want, outcome in ((477, True), (541, True), (573, "fought")):
        assert _next_after(seen, 445, top=669, floors=floors) == (want, "")
        seen[want] = outcome
    assert _next_after(seen, 445, top=669, floors=floors) == (None, "bracketed to 32 MiB")
    assert _next_after({0: True, 137: True, 445: True, 477: True}, 445, top=669, floors={477: 40}) == (517, "")
    # held at the crossing: up from it by the resolution
    assert _next_after({0: True, 139: True, 437: "fought", 293: True}, 437, knee=139, swap_in=rates) == (325, "")
    # without the rates (a fight for another reason), bisection at once
    seen = {0: True, 139: True, 436: "fought"}
    for want, outcome in ((287, True), (361, "fought"), (324, "fought"), (305, "fought")):
        assert _next_after(seen, 436) == (want, "")
        seen[want] = outcome
    nxt, why = _next_after(seen, 436)
    assert nxt is None and why == "bracketed to 18 MiB"
    # within one resolution of the top: closed without measuring the top
    nxt, why = _next_after({0: True, 139: True, 640: True}, 640)
    assert nxt is None and "under the top of the search (668 MiB)" in why
    assert _next_after({0: True, 139: True, 668: True}, 668) == (None, "the top held")
    # nothing held from the cycle up: the cycle next; no prediction: the top, then bisection
    assert _next_after({0: True}, None) == (58, "")
    assert _next_after({0: True, 139: True}, None) == (668, "")
    assert _next_after({0: True, 139: True, 668: False}, None) == (403, "")


def test_the_predicted_safe_budget_is_the_ram_left_at_cache0_or_the_top_when_everything_fits():
    """What MemAvailable left while cache 0 ran (zram left out), or, when the whole working set fits
    in it, the top of the search: the largest budget the cache still fills (the demo's phones)."""
    from types import SimpleNamespace

    from harness.plan.adaptive import _Group
    from results.replay.predict import _ram_budget

    def safe(floor_mib: float) -> int | None:
        group = _Group.__new__(_Group)
        group.g = SimpleNamespace(points=[SimpleNamespace(budget_mib=0, auto=False, mem_avail_floor_kb=floor_mib * 1024)])
        group.top, group.lowest = 668, 58
        pred = SimpleNamespace(working_set_mib=634.0, rates=SimpleNamespace(rss_anon_peak_mib=197.0),
                               ram_budget_for=lambda phone: _ram_budget(phone.engine_capacity_mib, 197.0, 634.0))
        return group._predicted_safe([pred])

    assert safe(435) == 435            # the 640 MiB phone: what cache 0 left
    assert safe(1411) == 668           # the 2 GiB phone: all 634 MiB fit, so the top (not 634)


def test_a_run_killed_between_two_rounds_resumes_and_another_campaigns_folder_is_refused(tmp_path, tiny_model):
    """The state a SIGKILL leaves between two rounds (every cell of the first round done, its
    next round's cells not yet in plan.json; the groups' second cache-0 runs among them, as every
    run misses a prediction held to 0 %): the same campaign resumes it, deciding the rounds again
    from the runs. A folder whose plan.json holds another campaign's first round is refused."""
    from harness.plan.adaptive import adaptive_plan

    c = adaptive_campaign(tiny_model, ["local"], [0, "cycle*1.2", 3], plan={"resolution_mb": 1, "max_error_pct": 0.001},
                          name="between", axes={"n_expert_used": [1, 2]})
    out = tmp_path / "between"
    full = run_campaign(c, out, progress_stream=io.StringIO())
    assert full.complete
    grid = make_plan(c)
    round_one = adaptive_plan(c, grid, None)
    first = {cell.cell_id for cell in round_one.plan.cells}
    cdir = CampaignDir(out)
    doc = cdir.read_plan_doc()
    later = [x for x in doc["cells"] if x["cell_id"] not in first]
    # the groups measured cache 0 again (route-traced) in a later round: the cells the old check took for the first
    assert any(x["config"].get("route_trace") and not x["config"].get("cache_mb") for x in later), later
    # back to the moment round one ended: its runs, its plan.json
    kept = [r for r in ledger(out) if r["cell_id"] in first]
    (out / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    for x in later:
        shutil.rmtree(out / "runs" / x["cell_id"], ignore_errors=True)
    cdir.write_plan_doc(round_one.to_doc())

    resumed = run_campaign(c, out, progress_stream=io.StringIO())
    assert resumed.complete, resumed.text()
    after = ledger(out)
    assert after[:len(kept)] == kept
    assert {r["cell_id"] for r in after} == {x["cell_id"] for x in cdir.read_plan_doc()["cells"]}
    assert not {r["cell_id"] for r in after[len(kept):]} & first          # round one not run again

    other = adaptive_campaign(tiny_model, ["local"], [0, "cycle*1.2", 3], name="other")
    with pytest.raises(RunnerError, match="holds a different campaign"):
        run_campaign(other, out, progress_stream=io.StringIO())


def test_a_run_killed_in_its_first_attempt_resumes(tmp_path, tiny_model):
    """A SIGKILL in the middle of an adaptive campaign's first attempt leaves plan.json, and a runs
    folder with no attempt in it but the half-written one: the rerun decides from no runs."""
    from harness.plan.adaptive import adaptive_plan

    c = adaptive_campaign(tiny_model, ["local"], [0, "cycle*1.2"], name="first")
    out = tmp_path / "first"
    round_one = adaptive_plan(c, make_plan(c), None)
    cdir = CampaignDir(out)
    cdir.write_campaign_toml(c.to_toml())
    cdir.write_plan_doc(round_one.to_doc())
    (out / "runs" / round_one.plan.cells[0].cell_id / ".tmp-1-4242").mkdir(parents=True)
    status = run_campaign(c, out, progress_stream=io.StringIO())
    assert status.complete, status.text()
    assert not list(out.glob("runs/*/.tmp-*"))
