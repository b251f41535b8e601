"""Over adb a phone's lmkd never kills the engine; the app's verdict, replayed from those runs' samples,
agrees with the engine run as the app on the same phone (docs/decisions/app-verdict.md). With
bmoe-py and the real bmoe-cli, through the real adb server and the campaign runner.

One sweep on a zram phone with a paced flash, beside an app the user opened (`open:PKG`: the phone's
ActivityManager registers it with lmkd), each budget run twice: from the shell, as a phone's user
runs bmoe-cli, and as the app (`am run-as-app`, registered at a foreground service's adj 200).

- From the shell no run is `lmk_killed`: lmkd takes the opened app instead, which the run records
  as its collateral (and past RAM + zram the kernel's OOM killer would take the engine: a bare SIGKILL).
- Every shell run carries the app's replayed verdict, and the smallest budget at which it says lmkd
  would kill the app is within one grid step of the smallest budget at which lmkd did kill the
  engine run as the app.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from engine.units import MIB
from harness.campaign.file import parse_campaign
from harness.run.runner import run_campaign
from results.analysis.analyze import analyze
from results.read.rundir import read_campaigns
from results.read.table import build_table
from tests.devices.conftest import needs_zram

RAM, ZRAM = 128 * MIB, 64 * MIB
# a flash of the phone's own: the cache fills at a phone's pace (an expert read is ~0.04 s), not at
# this host's page cache's, so the phone's lmkd (10 ms polls under pressure) sees the squeeze
STORAGE_MBPS = 100
OPENED = "open:com.bmoe.app.chat"            # 32 MiB (devices/virtual/am.py INSTALLED), in front: adj 0
BUDGETS = [16, 56, 96]                       # fits; past the RAM left; past RAM + zram
TOKENS, TOP_K = 24, 2                        # the uniform model's cycle is 14.2 MiB at top-k 2
# ro.lmk.thrashing_limit 1000 (AOSP 100), as tests/devices/test_vphone_fought.py says why: on a scale
# phone the mapped model's refaults read as thrashing at any budget (the app killed at 16 MiB)
LMK = {"kill_heaviest_task": True, "thrashing_limit": 1000}


def _sweep(out: Path, adb_server, phone_home, phone, model: Path, engine: dict) -> Path:
    data = {"version": 1, "name": out.name,
            "fleet": {"devices": [f"virtual:{phone.name}"], "virtual_home": str(phone_home),
                      "adb": [{"host": "127.0.0.1", "port": adb_server.port}]},
            "models": {"bank": str(model)}, "engine": engine,
            "axes": {"cache_mb": BUDGETS, "dense_weights": ["anon"], "n_expert_used": [TOP_K], "apps": [OPENED],
                     "run_as": ["shell", "app-service"]},
            # a top-k under the model's own for the memory it leaves, not for its answers: no quality runs
            "run": {"n_predict": TOKENS, "threads": 1, "retries": 0, "quality": "off"}, "gate": {"max_wait_s": 2}}
    run_campaign(parse_campaign(data, source=f"{out.name}.toml"), out, progress_stream=io.StringIO())
    return out


def _runs(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("runs/*/*/run.json"))]


def _seen(runs: list[dict]) -> list[tuple]:
    return [(r["config"]["cache_mb"], r["config"].get("run_as", "shell"), r["outcome"],
             [c["name"] for c in r.get("collateral") or ()],
             [(v["role"], v["killed"], v["samples"]) for v in r.get("app_verdicts") or ()]) for r in runs]


@needs_zram
def test_over_adb_lmkd_takes_the_apps_and_the_replayed_verdict_matches_the_app_run(
        tmp_path, adb_server, make_phone, phone_home, uniform_model, real_engine):
    phone = make_phone("verdict", RAM, zram_bytes=ZRAM, storage_mbps=STORAGE_MBPS, lmk=LMK)
    out = _sweep(tmp_path / "verdict", adb_server, phone_home, phone, uniform_model, real_engine)
    runs = _runs(out)
    seen = _seen(runs)
    print(seen)
    shell = {r["config"]["cache_mb"]: r for r in runs if "run_as" not in r["config"]}
    as_app = {r["config"]["cache_mb"]: r for r in runs if r["config"].get("run_as") == "app-service"}
    assert sorted(shell) == sorted(as_app) == BUDGETS, seen

    # over adb: never lmkd's (past RAM + zram the kernel's, a bare SIGKILL); lmkd takes the opened app
    assert all(r["outcome"] != "lmk_killed" for r in shell.values()), seen
    assert all(not [e for e in r["evidence"] if "lowmemorykiller" in e] for r in shell.values()), seen
    assert shell[BUDGETS[0]]["outcome"] == "ok" and shell[BUDGETS[0]]["collateral"] == [], seen
    assert any("com.bmoe.app.chat" in [c["name"] for c in r["collateral"]] for r in shell.values()), seen
    for r in shell.values():                 # the replay, both roles, on every shell run
        assert [v["role"] for v in r["app_verdicts"]] == ["top", "service"], seen

    # as the app: lmkd's kill, its line naming the app
    killed = [b for b in BUDGETS if as_app[b]["outcome"] == "lmk_killed"]
    assert killed and as_app[BUDGETS[0]]["outcome"] == "ok", seen
    assert any("lowmemorykiller: Kill 'io.bigmoeonedge.example'" in e for e in as_app[killed[0]]["evidence"]), seen

    # the replayed verdict within one grid step of the real kill
    replayed = [b for b in BUDGETS if any(v["killed"] for v in shell[b]["app_verdicts"] if v["role"] == "service")]
    assert replayed, seen
    assert abs(BUDGETS.index(replayed[0]) - BUDGETS.index(killed[0])) <= 1, (replayed, killed, seen)

    # and the analysis says both: the shell's boundary, the app's replayed and observed kills
    (g,) = analyze(build_table(read_campaigns([out]))).groups
    b = g.boundary
    assert b.app_killed_mib == replayed[0] and b.app_observed_killed_mib == killed[0], b
    assert b.killed_by in ("", "the kernel (SIGKILL with no lmkd line)"), b
    assert f"in the app: lmkd would kill the app at {replayed[0]:g} MiB" in b.app_text(), b.app_text()
    assert f"run as the app: killed at {killed[0]:g} MiB" in b.app_text(), b.app_text()
    assert all(not p.as_app for p in g.points)

    # recommend and the device page show the two answers side by side
    from results.analysis.recommend import recommend
    from results.site.report import build_site

    text = recommend([out]).text()
    assert f"    {b.adb_text()}  |  in the app: lmkd would kill the app at {replayed[0]:g} MiB" in text, text
    build_site([out], tmp_path / "site")
    pages = [p.read_text() for p in (tmp_path / "site").rglob("*.html") if 'class="verdicts"' in p.read_text()]
    assert len(pages) == 1, "one device page with the verdicts table"
    assert 'class="adb-verdict">over adb: ' in pages[0] and 'class="app-verdict">in the app: lmkd would kill' in pages[0]
