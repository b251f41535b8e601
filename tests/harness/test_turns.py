"""Session cells (docs/decisions/session-cells.md): run.turns / run.idle_s / run.gap_apps read and written back,
the cells they plan, the sweep options, the SessionFeeder driving the real bmoe-py `--session`
on this host through LocalDevice.run's stdin (the same feeder a phone's run() takes), and the
rule that reads a session's turns (results/read/turns.py) as far as the fought rule."""

from __future__ import annotations

import io
import itertools
import json
import math
import threading

import pytest
from click.testing import CliRunner

from devices.local import LocalDevice
from harness.campaign.file import load_campaign, parse_campaign
from harness.campaign.model import CampaignError
from harness.plan.grid import make_plan
from harness.run.turns import SessionFeeder, request_line, turns_record
from results.analysis.analyze import BudgetPoint, fought_reason
from results.read.turns import demand_hit_pct, gap_rereads, gap_taken, turn_columns, warm_need_mib
from tests.engine.test_engine_cli import BMOE_PY
from tests.harness.conftest import write_campaign


def campaign(model, devices=("R58N12345",), **run):
    data = {"version": 1, "name": "s", "fleet": {"devices": list(devices)}, "models": {"m": str(model)},
            "axes": {"cache_mb": [0, 1500]}, "run": run}
    return parse_campaign(data, source="s.toml")


def test_turns_are_run_keys_that_change_cells_only_when_set(tmp_path, tiny_model):
    one_shot, session = campaign(tiny_model), campaign(tiny_model, turns=3, idle_s=20, gap_apps="cached:64MiB")
    assert (session.run.turns, session.run.idle_s, session.run.gap_apps) == (3, 20.0, "cached:64MiB")
    # not written when default: a campaign.toml from before them is the same file
    assert "turns" not in one_shot.to_toml() and "idle_s" not in one_shot.to_toml()
    path = write_campaign(tmp_path, session.to_toml(), "campaign.toml")
    assert load_campaign(path) == session
    # turns = 1 keeps every cell id; turns > 1 records them in the config and runs --session
    assert [c.cell_id for c in make_plan(campaign(tiny_model, turns=1)).cells] == \
        [c.cell_id for c in make_plan(one_shot).cells]
    cells = make_plan(session).cells
    assert not {c.cell_id for c in cells} & {c.cell_id for c in make_plan(one_shot).cells}
    for c in cells:
        assert (c.config.turns, c.config.idle_s, c.config.gap_apps) == (3, 20.0, "cached:64MiB")
        assert c.argv.count("--session") == 1 and c.argv.index("--session") < c.argv.index("--csv")
        assert c.label().endswith("turns=3 idle=20s gap-apps=cached:64MiB r0 p0"), c.label()
    # a recommended command line is the run's settings, without how the harness drove it
    from results.analysis.recommend_argv import settings_of

    assert "--session" not in settings_of(cells[0].argv) and "--csv" not in settings_of(cells[0].argv)
    assert settings_of(cells[0].argv) == settings_of(make_plan(one_shot).cells[0].argv)
    no_apps = make_plan(campaign(tiny_model, turns=2, idle_s=1.5)).cells[0].config.to_dict()
    assert no_apps["turns"] == 2 and no_apps["idle_s"] == 1.5 and "gap_apps" not in no_apps


@pytest.mark.parametrize(("run", "message"), [
    ({"turns": 0}, "run.turns: must be at least 1, got 0"),
    ({"turns": "3"}, 'run.turns: expected an integer, got a string ("3")'),
    ({"turns": True}, "run.turns: expected an integer, got a boolean"),
    ({"turns": 2, "idle_s": -1}, "run.idle_s: must be at least 0, got -1"),
    ({"turns": 2, "idle_s": float("nan")}, "run.idle_s: must be a finite number"),
    ({"turns": 2, "gap_apps": "cached"}, "run.gap_apps: bad app 'cached'"),
    ({"idle_s": 5}, "run.idle_s: has no gap to apply to: set run.turns to 2 or more"),
    ({"gap_apps": "cached:64MiB"}, "run.gap_apps: has no gap to apply to"),
    ({"turns": 3, "idle_s": 1000, "timeout_s": 2000}, "run.timeout_s: 2000 s is not longer than the session's gaps"),
])
def test_bad_session_keys_are_one_line_naming_the_key(tiny_model, run, message):
    with pytest.raises(CampaignError) as e:
        campaign(tiny_model, **run)
    assert message in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("s.toml: ")


def test_gap_apps_run_on_phones_only(tiny_model):
    with pytest.raises(CampaignError, match=r"run\.gap_apps: other apps run on phones"):
        campaign(tiny_model, devices=("local",), turns=2, gap_apps="cached:8MiB")
    assert campaign(tiny_model, devices=("local",), turns=2, idle_s=1).run.gap_apps == ""


def test_sweep_takes_the_session_options(tmp_path, tiny_model, cli, fleet_home):
    args = ["sweep", "--device", "local", "--model", str(tiny_model), "--cache-mb", "0", "-n", "4", "--dry-run",
            "--json", "-o", str(tmp_path / "o")]
    ok = CliRunner().invoke(cli, [*args, "--turns", "3", "--idle-s", "2.5"])
    assert ok.exit_code == 0, ok.output
    (cell,) = json.loads(ok.output)["cells"]
    assert cell["config"]["turns"] == 3 and cell["config"]["idle_s"] == 2.5 and "--session" in cell["argv"]
    bad = CliRunner().invoke(cli, [*args, "--turns", "0"])
    assert bad.exit_code == 1 and bad.output.count("\n") == 1 and "run.turns: must be at least 1" in bad.output
    assert not (tmp_path / "o").exists()


def test_the_feeder_reads_lines_split_anywhere():
    f = SessionFeeder(2, 0.0, "p", 4)
    for chunk in (b"BMOE_REA", b'DY {"load_s":0.1}\nBMOE_PROGRESS {"step":1}\nBMOE_DONE {"id":1,"tok', b'ens":4}\n'):
        f.on_stdout(chunk)
    assert f.ready == {"load_s": 0.1} and f._answers[1][2] == {"id": 1, "tokens": 4}
    assert request_line(2, 'say "hi"\n', 8) == b'{"cmd": "generate", "id": 2, "prompt": "say \\"hi\\"\\n", "n_predict": 8}\n'
    with pytest.raises(ValueError):
        SessionFeeder(0, 1.0, "p", 4)


def session_argv(model, *extra: str) -> list[str]:
    return [*BMOE_PY, "-t", "1", "-m", str(model), "-n", "6", "--moe-stream", "--cache-mb", "4", "--force-cache",
            "--session", *extra]


def test_the_feeder_drives_a_real_session_through_stdin(tiny_model):
    """bmoe-py --session on this host: three turns a second apart, each request sent after the
    previous BMOE_DONE and the gap; the gap hooks run at each gap's start and end; stdin closed
    after the last answer ends the session with exit 0; the sampler samples the engine through
    the gaps."""
    calls: list[tuple[str, object]] = []

    def start(k):
        calls.append(("start", k))
        return f"handle{k}"

    def stop(handle):
        calls.append(("stop", handle))
        return [{"name": "co.gx", "pid": 1}]

    f = SessionFeeder(3, 1.0, "The capital of Japan is", 6, start, stop)
    out = LocalDevice().run(session_argv(tiny_model), timeout_s=120, feeder=f, sample_period_s=0.2)
    assert out.exit_status == 0 and not out.timed_out, out.stderr
    assert f.closed and calls == [("start", 1), ("stop", "handle1"), ("start", 2), ("stop", "handle2")]
    stdout = out.stdout.decode("latin-1")
    assert stdout.count("BMOE_BEGIN") == 3 and stdout.count("BMOE_DONE") == 3
    turns = turns_record(f, out.samples)
    assert [t["id"] for t in turns] == [1, 2, 3] and all(t["outcome"] == "done" and t["tokens"] == 6 for t in turns)
    for before, t in itertools.pairwise(turns):
        gap = t["gap"]
        assert gap["start_t_s"] >= before["answered_t_s"] - 1e-3 and t["sent_t_s"] >= gap["end_t_s"] - 1e-3
        assert gap["end_t_s"] - gap["start_t_s"] >= 1.0 - 1e-3 and gap["samples"] >= 2 and gap["vm_rss_min_kb"] > 0
        assert gap["apps"] == [{"name": "co.gx", "pid": 1}]
    assert turns[2]["cache_hit_pct"] > turns[0]["cache_hit_pct"]      # the cache stayed warm across turns


def test_a_session_that_dies_at_load_ends_the_feeder(tmp_path):
    """No BMOE_READY (the model is no GGUF): the engine exits 1, run() returns, and the feeder sent
    nothing and did not hang waiting."""
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    f = SessionFeeder(2, 60.0, "p", 4)
    out = LocalDevice().run(session_argv(bad), timeout_s=60, feeder=f)
    assert out.exit_status == 1 and f.turns == [] and not f.closed and f.ready is None
    assert turns_record(f, out.samples) == []


def test_a_stop_ends_the_gap_at_once(tiny_model):
    stop = threading.Event()
    stop.set()
    f = SessionFeeder(3, 600.0, "The capital of Japan is", 4, stop=stop)
    out = LocalDevice().run(session_argv(tiny_model), timeout_s=120, feeder=f)
    assert out.exit_status == 0 and len(f.turns) == 1 and not f.closed     # stdin closed after turn 1


def turn(k, read, *, tokens=8, evictions=None, majflt=0.0, swap_in=0.0, hit=50.0):
    t = {"turn": k, "tokens": tokens, "read_mib": read, "token_demand_mib": 4.0, "majflt_per_tok": majflt,
         "swap_in_mib": swap_in, "cache_hit_pct": hit, "s_per_token": 0.1}
    if evictions is not None:
        t["evictions"] = evictions
    if k > 1:
        t["gap"] = {"vm_swap_max_kb": 2048 * k, "rss_file_min_kb": 10240 // k, "vm_rss_min_kb": 40960}
    return t


def test_the_gap_rule_reads_rereads_faults_and_swap_in():
    # the first turn evicted nothing: a warm repeat needs no reads, so turn 2's 6 MiB were taken in the gap
    held = [turn(1, 20.0, evictions=0), turn(2, 6.0), turn(3, 0.0)]
    assert warm_need_mib(held) == 0 and gap_rereads(held) == [6.0, 0.0]
    assert gap_taken(held) == "taken in the gap: turn 2 re-read 6 MiB"
    # an LRU smaller than the working set re-reads its share every turn: the least later turn is the need
    lru = [turn(1, 20.0, evictions=30), turn(2, 9.0), turn(3, 9.5)]
    assert warm_need_mib(lru) == 9.0 and gap_rereads(lru) == [0.0, 0.5] and gap_taken(lru) == ""
    assert gap_taken([turn(1, 20.0), turn(2, 9.0), turn(3, 9.0, majflt=3.0)]) == \
        "taken in the gap: turn 3 had 3 major faults/token"
    assert gap_taken([turn(1, 20.0), turn(2, 9.0, swap_in=16.0)]) == "taken in the gap: turn 2 swapped in 2 MiB/token"
    assert gap_taken([turn(1, 20.0, evictions=0), turn(2, 1.5)]) == ""        # under 10 % of turn 1's reads
    assert gap_taken([turn(1, 20.0)]) == ""
    # budget 0 holds no cache and evicts nothing: each turn reads what the first did, none is taken
    no_cache = [{**turn(k, 20.0, evictions=0, hit=-1.0), "cache_resident_mib": 0.0} for k in (1, 2, 3)]
    assert warm_need_mib(no_cache) == 20.0 and gap_rereads(no_cache) == [0.0, 0.0] and gap_taken(no_cache) == ""
    assert gap_taken([no_cache[0], {**no_cache[1], "majflt_per_tok": 4.0}]) == "taken in the gap: turn 2 had 4 major faults/token"
    assert demand_hit_pct(turn(2, 8.0)) == 75.0 and math.isnan(demand_hit_pct({"tokens": 8}))
    cols = turn_columns(held)
    assert cols["turns"] == 3 and json.loads(cols["turn_read_mib"]) == [20.0, 6.0, 0.0]
    assert json.loads(cols["turn_hit_pct"]) == [50.0, 50.0, 50.0] and cols["gap_reread_mib"] == 6.0
    assert cols["gap_vm_swap_max_mib"] == 6.0 and cols["gap_rss_file_min_mib"] == 10240 // 3 / 1024
    assert math.isnan(turn_columns(None)["turns"]) and turn_columns([])["gap_taken"] == ""


def test_a_cache_taken_in_the_gap_makes_the_budget_fought():
    def point(budget, taken=""):
        return BudgetPoint(series="s", budget_mib=budget, label="", auto=False, runs=1, ok=1, killed=0, run_ids=("r",),
                           killed_run_ids=(), hit_pct=50.0, tok_s=2.0, tok_s_min=2.0, tok_s_max=2.0, tok_s_values=(2.0,),
                           spread_pct=0.0, under_cycle=False, advice="", mem_avail_floor_kb=1e5, majflt_per_tok=0.0,
                           compute_s_per_tok=0.01, swap_in_mib_per_tok=0.0, vm_swap_max_mib=0.0, gap_taken=taken)

    zero = point(0)
    assert fought_reason(point(300), zero) == ""
    assert fought_reason(point(300, "taken in the gap: turn 2 re-read 42 MiB"), zero) == \
        "fought: taken in the gap: turn 2 re-read 42 MiB"
    assert fought_reason(point(0, "taken in the gap: turn 2 re-read 42 MiB"), zero) == ""   # cache 0 has no cache


def test_a_local_session_cell_through_the_runner_and_the_analysis(tmp_path, tiny_model):
    """A session sweep on this host through the campaign runner (the worker's feeder path on
    LocalDevice): every cell `ok` with three turns in run.json and the run table; then one run's
    turn 2 is made to have re-read what its first turn held (its recorded read raised past the
    rule's thresholds, turn 1 evicting nothing), and the analysis calls that budget fought with the
    gap's reason, while the untouched budget stays safe."""
    from harness.run.runner import run_campaign
    from results.analysis.analyze import analyze
    from results.read.table import build_table

    # a gap longer than the 1 Hz sampling period always holds a sample, whatever the run's phase
    # (at 0.5 s it held one or none by where the load time put the gap between two samples)
    data = {"version": 1, "name": "s", "fleet": {"devices": ["local"]}, "models": {"m": str(tiny_model)},
            "axes": {"cache_mb": [0, 1, 2], "dense_weights": ["anon"]},
            "run": {"n_predict": 6, "threads": 1, "turns": 3, "idle_s": 1.2, "retries": 0}, "gate": {"max_wait_s": 1}}
    out = tmp_path / "out"
    run_campaign(parse_campaign(data, source="s.toml"), out, progress_stream=io.StringIO())
    records = {p: json.loads(p.read_text()) for p in sorted(out.glob("runs/*/*/run.json"))}
    assert len(records) == 3
    for rec in records.values():
        assert rec["outcome"] == "ok", rec["evidence"]
        assert [t["outcome"] for t in rec["turns"]] == ["done"] * 3 and rec["turns"][2]["gap"]["samples"] >= 1
    table = build_table([out])
    assert set(table["turns"]) == {3.0} and all(len(json.loads(v)) == 3 for v in table["turn_read_mib"])
    assert not analyze(table).groups[0].points[-1].fought
    # one budget's turn 2 re-read 5 MiB more than its first turn, which evicted nothing
    path, rec = next((p, r) for p, r in records.items() if r["config"]["cache_mb"] == 2)
    rec["turns"][0]["evictions"] = 0
    rec["turns"][1]["read_mib"] = rec["turns"][0]["read_mib"] + 5.0
    rec["turns"][2]["read_mib"] = 0.0
    path.write_text(json.dumps(rec))
    table = build_table([out])
    reread = table.loc[table["cache_mb"] == 2, "gap_reread_mib"].iloc[0]
    assert reread == rec["turns"][0]["read_mib"] + 5.0
    (group,) = analyze(table).groups
    by_budget = {p.budget_mib: p for p in group.points}
    assert by_budget[2].fought == f"fought: taken in the gap: turn 2 re-read {reread:.3g} MiB", by_budget[2]
    assert not by_budget[1].fought and by_budget[2].gap_taken, by_budget
