"""A session cell on a virtual phone (docs/decisions/session-cells.md), with bmoe-py and with the
real bmoe-cli, through the real adb server and the campaign runner: 3 turns of one `--session`
engine with a 6 s idle gap between them, another app started by the harness in each gap and
stopped at its end. The engine's requests go in through adb's shell-protocol stdin packets; the
run records per turn the hit % and MiB read (so the re-reads after each gap), and per gap the
engine's VmSwap / VmRSS / RssFile, in run.json and in the run table. No zram (another agent runs
zram phones on this host at the same time): the gap's app cannot swap the engine out here, so
what is asserted is what was recorded and that it agrees with itself, not a fight."""

from __future__ import annotations

import io
import json
import math
import os
import threading
from pathlib import Path

import pytest

from engine.gguf.synth import synth_options, write_model
from engine.units import MIB
from harness.campaign.file import parse_campaign
from harness.run.runner import run_campaign
from results.read.rundir import read_campaigns
from results.read.table import build_table
from results.read.turns import gap_rereads

TURNS, IDLE_S, TOKENS = 3, 6.0, 16
GAP_APPS = "cached:48MiB"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("turn-models") / "turns48.gguf"
    write_model(path, synth_options("qwen3moe", size_bytes=48 * MIB, seed=3))
    return path


def _campaign(name: str, phone, adb_server, phone_home, model, engine: dict) -> dict:
    return {"version": 1, "name": name,
            "fleet": {"devices": [f"virtual:{phone.name}"], "virtual_home": str(phone_home),
                      "adb": [{"host": "127.0.0.1", "port": adb_server.port}]},
            "models": {"m": str(model)}, "engine": engine,
            "axes": {"cache_mb": [16], "dense_weights": ["anon"], "n_expert_used": [2]},
            # a top-k under the model's own for the memory it leaves, not for its answers: no quality runs
            "run": {"n_predict": TOKENS, "threads": 1, "retries": 0, "turns": TURNS, "idle_s": IDLE_S,
                    "gap_apps": GAP_APPS, "timeout_s": 600, "quality": "off"},
            "gate": {"max_wait_s": 2}}


def test_session_cells_record_their_turns_and_gaps(request, tmp_path, adb_server, make_phone, phone_home, model):
    """bmoe-py and bmoe-cli each on a phone of its own, at the same time (each decodes 16 tokens
    with -t 1 and idles 6 s twice: two engines fit this host's two cores; one after the other took
    84 s of the suite's 20 minutes)."""
    engines = {"bmoe-py": {"kind": "python"}}
    if os.environ.get("BMOE_CLI"):
        engines["bmoe-cli"] = {"kind": "native", "native": {"host": {"cli": str(request.getfixturevalue("bmoe_cli"))}}}
    else:
        print("BMOE_CLI is unset: the bmoe-cli half of this test did not run")
    phones = {name: make_phone(f"turns{i}", 256 * MIB) for i, name in enumerate(engines)}
    outs = {name: tmp_path / name for name in engines}
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            data = _campaign(name, phones[name], adb_server, phone_home, model, engines[name])
            run_campaign(parse_campaign(data, source=f"{name}.toml"), outs[name], progress_stream=io.StringIO())
        except BaseException as e:      # re-raised below, in the test's own thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(name,)) for name in engines]
    for th in threads:
        th.start()
    for th in threads:
        th.join(900)
    if errors:
        raise errors[0]
    for name, out in outs.items():
        _check(name, out)


def _check(name: str, out: Path) -> None:
    (camp,) = read_campaigns([out])
    (run,) = camp.runs
    rec = run.record.to_dict()
    assert rec["outcome"] == "ok", (name, rec["evidence"])
    assert "--session" in rec["argv"] and rec["config"]["turns"] == TURNS and rec["config"]["idle_s"] == IDLE_S
    turns = rec["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3] and all(t["outcome"] == "done" for t in turns), turns
    assert all(t["tokens"] == TOKENS and 0 <= t["cache_hit_pct"] <= 100 for t in turns), turns
    assert turns[0]["read_mib"] > 0                         # the first turn fills the cache from flash
    # the cache stays warm across turns: the session's cumulative hit % never falls back to turn 1's
    assert turns[2]["cache_hit_pct"] >= turns[0]["cache_hit_pct"], turns
    for t in turns[1:]:
        gap = t["gap"]
        assert gap["end_t_s"] - gap["start_t_s"] >= IDLE_S - 0.5, gap
        assert t["sent_t_s"] >= gap["end_t_s"] - 1e-3            # the next turn went out after the gap
        # the sampler went on sampling the engine through the gap (~1 Hz over adb)
        assert gap["samples"] >= 4 and gap["vm_rss_min_kb"] > 0 and gap["rss_file_min_kb"] > 0, gap
        assert gap["vm_swap_max_kb"] == 0                       # no zram on this phone: nothing in swap
        assert len(gap["apps"]) == 1, (name, gap)
        (app,) = gap["apps"]
        assert app["name"] == "co.gcached1" and app["ready"] and app["size_mib"] == 48, app
        assert app["gone_by_end"] is False and app["lmk_killed"] is False
    # each gap's app was stopped at the gap's end: none is left on the phone
    for t in turns[1:]:
        status = Path(f"/proc/{t['gap']['apps'][0]['pid']}/status")
        assert not status.exists() or "co.gcached1" not in status.read_text()
    row = build_table([out]).iloc[0]
    print({k: row[k] for k in ("turn_hit_pct", "turn_demand_hit_pct", "turn_read_mib", "gap_reread_mib",
                               "gap_vm_swap_max_mib", "gap_rss_file_min_mib", "gap_taken")})
    assert row["turns"] == TURNS
    assert json.loads(row["turn_hit_pct"]) == [t["cache_hit_pct"] for t in turns]
    assert json.loads(row["turn_read_mib"]) == [t["read_mib"] for t in turns]
    assert row["gap_reread_mib"] == max(gap_rereads(turns)) and not math.isnan(row["gap_reread_mib"])
    assert row["gap_vm_swap_max_mib"] == 0
    assert row["gap_rss_file_min_mib"] == min(t["gap"]["rss_file_min_kb"] for t in turns[1:]) / 1024
