"""`sweep --preset app` (docs/decisions/presets.md): what upstream's Android app runs — its cache rungs as the
budgets, its session-open flags where the engine takes them, its session as a session cell — and the
options its settings fix refused in one line. One small campaign of it runs through the real adb
server on a virtual phone, and `recommend` names the app rung."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from results.analysis import android_app as app
from results.read.run_keys import budget_label


def _dry(cli, *args: str) -> tuple[list[dict], list[str]]:
    result = CliRunner().invoke(cli, ["sweep", "--preset", "app", "--device", "local", "--dry-run", "--json", *args],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if line.startswith("--preset app: ")]
    return json.loads(result.stdout)["cells"], notes


def _budgets(cells: list[dict]) -> set[tuple[str, int]]:
    return {("auto", c["config"]["cache_ceil_mb"]) if c["config"]["cache_auto"] else ("fixed", c["config"]["cache_mb"])
            for c in cells}


def test_the_budgets_are_the_apps_rungs_in_a_session_with_its_context_and_top_k(cli, tiny_model, tmp_path):
    cells, notes = _dry(cli, "--model", str(tiny_model), "-t", "1", "-o", str(tmp_path / "a"))
    assert _budgets(cells) == {("fixed", mb) for mb in app.APP_RUNGS_MB} | {("auto", app.APP_AUTO_CEIL_MB)}
    # each cache-on rung (and auto) with the app's dropping and without it; the 0 rung once, without
    drops = [c for c in cells if "--drop-cold-experts" in c["argv"]]
    assert len(cells) == 2 * len(app.APP_RUNGS_MB) + 1 and len(drops) == len(app.APP_RUNGS_MB)
    assert all(c["argv"][c["argv"].index("--drop-cold-experts") + 1] == "0.75" for c in drops)
    assert _budgets(drops) == _budgets(cells) - {("fixed", 0)}
    for cell in cells:
        c, argv = cell["config"], cell["argv"]
        assert (c["turns"], c["idle_s"], c["n_predict"], c["prompt"]) == (2, 240.0, 128, app.APP_PROMPT)
        assert (c["dense_weights"], c["io_threads"], c["n_expert_used"]) == ("anon", 4, 2)   # the model's own top-k
        assert "--session" in argv and argv[argv.index("-c") + 1] == "4096"
        assert ("--force-cache" in argv) == (0 < c["cache_mb"] < 1500 if not c["cache_auto"] else False)
        # bmoe-py lacks the app's other flags: none of them is sent, each is named
        assert not {"--ubatch", "--chatml", "--no-think", "--overlap"} & set(argv)
        # the answer is kept to price the dropping against its lossless twin (quality on)
        assert c["progress"] is True and argv[-1] == "--progress"
    for flag in ("--ubatch", "--chatml", "--no-think", "--overlap"):
        assert f"--preset app: {flag} left out: the engine does not take it (unknown arg: {flag})" in notes
    assert not any("--drop-cold-experts" in n for n in notes)
    assert not (tmp_path / "a").exists()


def test_with_bmoe_cli_the_argv_carries_the_flags_the_release_takes(cli, bmoe_cli, tmp_path):
    from tests.conftest import UPSTREAM_HOST

    cells, notes = _dry(cli, "--model", str(UPSTREAM_HOST / "tiny-qwen3moe.gguf"), "--engine", str(bmoe_cli),
                        "-t", "1", "-o", str(tmp_path / "a"))
    for cell in cells:
        line = shlex.join(cell["argv"])
        assert " -c 4096 --ubatch 512 --chatml --no-think " in line and " --session " in line, line
        assert "--overlap" not in cell["argv"]
        # 0.19.0 takes the app's dropping: every cache-on rung runs with it and without it
        assert ("--drop-cold-experts" in cell["argv"]) <= (cell["config"]["cache_auto"] or cell["config"]["cache_mb"] > 0)
    assert sum("--drop-cold-experts" in c["argv"] for c in cells) == len(app.APP_RUNGS_MB)
    (overlap,) = [n for n in notes if "--overlap" in n]     # 0.19.0 lists it; this build refuses it at load
    assert overlap.startswith("--preset app: --overlap left out: the engine refuses it at load") and "fork" in overlap


@pytest.mark.parametrize("option, shown", [
    (["--cache-mb", "2000"], "--cache-mb"), (["--cache-ceil-mb", "4000"], "--cache-ceil-mb"),
    (["--dense-weights", "mmap"], "--dense-weights"), (["--n-expert-used", "2"], "--n-expert-used"),
    (["--io-threads", "2"], "--io-threads"), (["--engine-arg", "--ubatch 256"], "--engine-arg"),
    (["--flag", "--prefetch=0,2"], "--flag"),
    (["--cache-mb", "0", "--io-threads", "8"], "--cache-mb, --io-threads"),
])
def test_options_the_apps_settings_fix_are_refused_in_one_line(cli, tiny_model, tmp_path, option, shown):
    result = CliRunner().invoke(cli, ["sweep", "--preset", "app", "--device", "local", "--model", str(tiny_model),
                                      *option, "-o", str(tmp_path / "a")])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"Error: --preset app fixes {shown} (upstream's Android app); leave ")
    assert not (tmp_path / "a").exists()


def test_the_session_is_the_users_to_shape_but_stays_a_session(cli, tiny_model, tmp_path):
    cells, _ = _dry(cli, "--model", str(tiny_model), "-t", "1", "--turns", "3", "--idle-s", "5", "-n", "16",
                    "--repeats", "2", "-o", str(tmp_path / "a"))
    assert {(c["config"]["turns"], c["config"]["idle_s"], c["config"]["n_predict"]) for c in cells} == {(3, 5.0, 16)}
    assert len(cells) == 2 * (2 * len(app.APP_RUNGS_MB) + 1)     # two repeats; each cache-on rung twice
    one = CliRunner().invoke(cli, ["sweep", "--preset", "app", "--device", "local", "--model", str(tiny_model),
                                   "--turns", "1", "-o", str(tmp_path / "b")])
    assert one.exit_code == 1 and "--preset app runs a session, as the app does (--session): --turns 1" in one.output


@pytest.fixture(scope="module")
def app_sweep(tmp_path_factory):
    """The preset on one 384 MiB virtual phone (no zram) through the real adb server: bmoe-py, 16 tokens a
    turn, two turns 0.2 s apart, then `recommend` of the directory as JSON. The model's 3.2 MiB cycle
    keeps any ceiling in whole MiB (a sub-MiB one would round to 0)."""
    from devices.virtual import manager
    from engine.gguf.synth import synth_options, write_model
    from harness.cli.main import main as cli
    from tests.conftest import running_adb_server

    out = tmp_path_factory.mktemp("app") / "camp"
    model = out.parent / "bank48.gguf"
    write_model(model, synth_options("qwen3moe", layers=4, experts=8, top_k=2, hidden=256, expert_ffn=512, vocab=300,
                                     seed=3))
    with running_adb_server(tmp_path_factory.mktemp("app-adb")) as (port, _env):
        try:
            manager.up("appphone", 384 << 20, model="Pixel 8", adb_host="127.0.0.1", adb_port=port)
            swept = CliRunner().invoke(cli, ["sweep", "--preset", "app", "--device", "virtual:appphone",
                                             "--model", str(model), "-t", "1", "-n", "16", "--idle-s", "0.2",
                                             "--adb", f"127.0.0.1:{port}", "-o", str(out), "--json"],
                                       catch_exceptions=False)
        finally:
            manager.down("appphone", adb_host="127.0.0.1", adb_port=port)
    recommended = CliRunner().invoke(cli, ["recommend", str(out), "--format", "json"], catch_exceptions=False)
    return out, swept, recommended


@pytest.mark.phone
def test_the_preset_runs_on_a_virtual_phone_and_recommend_names_a_measured_safe_rung(app_sweep):
    from tests.results.test_recommend_v2 import validate

    out, swept, recommended = app_sweep
    assert swept.exit_code == 0, swept.output
    runs = [json.loads(p.read_text()) for p in (out / "runs").glob("*/*/run.json")]
    # every rung, and every cache-on one (auto too) again with the app's dropping
    assert len(runs) == 2 * len(app.APP_RUNGS_MB) + 1
    assert sum("--drop-cold-experts" in r["argv"] for r in runs) == len(app.APP_RUNGS_MB)
    assert all(len(r["turns"]) == 2 for r in runs if r["outcome"] == "ok")
    meta = json.loads((out / "app.json").read_text())
    assert meta["rungs_mb"] == list(app.APP_RUNGS_MB) and meta["upstream"]["settings_commit"].startswith("07045c19")
    assert meta["engine_args"] == ["-c", "4096"] and len(meta["notes"]) == 4       # the four flags bmoe-py lacks
    assert recommended.exit_code == 0, recommended.output
    doc = json.loads(recommended.stdout)
    validate(doc)
    (rec,) = doc["devices"][0]["recommendations"]
    ok = {r["config"]["cache_mb"] for r in runs if r["outcome"] == "ok" and not r["config"]["cache_auto"]}
    ceiling = rec["auto"]["cache_ceil_mb"] if rec["auto"] else 0
    assert rec["app_rung_mb"] in ok and rec["app_rung_mb"] <= ceiling, rec["app_rung_reason"]
    assert rec["app_rung_mb"] == 0 or not rec["cache_off"]
    assert rec["app_rung_reason"].startswith(f"app rung {budget_label(rec['app_rung_mb'])}: "), rec["app_rung_reason"]
    # and what the app's dropping costs on this phone, at each rung both of its runs finished
    priced = {(r["config"]["cache_mb"], r["config"]["cache_auto"]) for r in runs if r["outcome"] == "ok"
              and "--drop-cold-experts" in r["argv"]}
    assert rec["app_drop"] and all(t.startswith("the app's default dropping (0.75) at ") for t in rec["app_drop"])
    assert len(rec["app_drop"]) <= len(priced)
