"""Numbers inside a campaign's strings and the command line's flags (docs/decisions/ascii-numbers.md):
an app size, a release claim, a flag's value are ASCII decimal and bounded, and anything else is
one `Error:` line naming the key (or the option), never a traceback, under `run --dry-run` too."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from engine.contract.claim import CLAIM_ENV, claimed
from engine.contract.config import UsageExit, parse_args
from engine.interface.releases import Release
from tests.results.mutants import UPSTREAM

NINES = "9" * 400


def _campaign(tmp_path: Path, model: Path, axes: str = "", run: str = "", engine: str = "") -> Path:
    path = tmp_path / "c.toml"
    path.write_text(f'version = 1\nname = "n"\n[fleet]\ndevices = ["R58XYZ"]\n[models]\nm = "{model}"\n'
                    f'[engine]\n{engine}\n[axes]\ncache_mb = [0]\n{axes}\n[run]\nn_predict = 4\n{run}\n')
    return path


def _refused(cli, path: Path, tmp_path: Path, key: str, why: str) -> None:
    for args in (["run", str(path), "--dry-run"], ["run", str(path), "-o", str(tmp_path / "out")]):
        result = CliRunner().invoke(cli, args, catch_exceptions=False)
        assert result.exit_code == 1, result.output
        assert result.output.startswith("Error: ") and result.output.count("\n") == 1, result.output
        assert f"{key}: " in result.output and why in result.output, result.output
        assert len(result.output) < 600
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("axes", "run", "key", "why"), [
    (f'apps = ["cached:{NINES}MiB"]', "", "axes.apps[0]", "no phone holds it"),
    (f'apps = ["none", "cached:1MiB+visible:{NINES}"]', "", "axes.apps[1]", "no phone holds it"),
    ("", f'turns = 2\nidle_s = 1.0\ngap_apps = "cached:{NINES}MiB"', "run.gap_apps", "no phone holds it"),
    ("", f'turns = 2\nidle_s = 1.0\ngap_apps = "cached:{"1" * 5000}G"', "run.gap_apps", "no phone holds it"),
    ('apps = ["cached:32MiB+"]', "", "axes.apps[0]", "an empty item"),
    ('apps = ["a++b"]', "", "axes.apps[0]", "an empty item"),
    ("", 'turns = 2\nidle_s = 1.0\ngap_apps = "+cached:1MiB"', "run.gap_apps", "an empty item"),
    ('apps = ["cached:１２MiB"]', "", "axes.apps[0]", "bad app size"),
    ('apps = ["cached:1_000MiB"]', "", "axes.apps[0]", "bad app size"),
])
def test_an_app_size_no_phone_holds_or_an_empty_app_is_one_line_naming_the_key(tmp_path, tiny_model, cli,
                                                                                 axes, run, key, why):
    _refused(cli, _campaign(tmp_path, tiny_model, axes=axes, run=run), tmp_path, key, why)


@pytest.mark.parametrize("claim", ["0.٢٥", "０.25", "0.2_5"])
def test_a_release_claim_is_ascii_digits_in_the_campaign_and_the_environment(tmp_path, tiny_model, cli, claim):
    with pytest.raises(ValueError):
        Release.parse(claim)
    with pytest.raises(ValueError, match="is not a bmoe-cli release"):
        claimed({CLAIM_ENV: claim})
    _refused(cli, _campaign(tmp_path, tiny_model, engine=f'claim = "{claim}"'), tmp_path, "engine.claim",
             "is not a bmoe-cli release")


@pytest.mark.parametrize("tokens", ["١,٢", "1_0,2", "１"])
def test_bmoe_pys_prompt_tokens_are_ascii_digits_and_other_digits_are_junk_exit_2(tokens):
    with pytest.raises(UsageExit) as e:
        parse_args(["-m", "m.gguf", "--prompt-tokens", tokens], {})
    assert e.value.code == 2 and "expects comma-separated token ids" in str(e.value)
    assert parse_args(["-m", "m.gguf", "--prompt-tokens", " 1, 2"], {}).prompt_tokens == (1, 2)


@pytest.mark.parametrize("args", [
    ["--repeats", "٣"], ["-n", "1_0"], ["--n-expert-used", "٢"], ["--timeout", "１０"], ["--idle-s", "1_0"],
])
def test_a_sweep_option_that_is_no_ascii_decimal_is_a_usage_error(tmp_path, tiny_model, cli, args):
    result = CliRunner().invoke(cli, ["sweep", "--model", str(tiny_model), "--device", "local", *args, "--dry-run",
                                      "-o", str(tmp_path / "out")], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert args[0] in result.output and ("ASCII decimal" in result.output or "integers" in result.output), result.output


def test_model_inspect_and_replay_take_ascii_numbers_only(tiny_model, cli):
    result = CliRunner().invoke(cli, ["model", "inspect", str(tiny_model), "--top-k", "٢"])
    assert result.exit_code == 2 and "'٢' is not an ASCII decimal number" in result.output, result.output
    assert CliRunner().invoke(cli, ["model", "inspect", str(tiny_model), "--top-k", "2"]).exit_code == 0
    trace = next(UPSTREAM.glob("*/*.route.csv"))
    for budgets in ("1_000", "١٠٠", "100,２00"):
        result = CliRunner().invoke(cli, ["replay", str(trace), "--budgets", budgets])
        assert result.exit_code == 2 and "--budgets" in result.output, result.output


@pytest.mark.parametrize(("args", "env"), [
    (["--adb", "127.0.0.1:" + "9" * 5000], {}), (["--adb", "127.0.0.1:٥٠٣٧"], {}),
    ([], {"ADB_SERVER_SOCKET": "tcp:" + "9" * 5000}), ([], {"ANDROID_ADB_SERVER_PORT": "٥٠٣٧"}),
])
def test_an_adb_port_of_5000_digits_or_other_digits_is_one_line(tmp_path, tiny_model, cli, args, env):
    result = CliRunner().invoke(cli, ["sweep", "--model", str(tiny_model), "--device", "R58XYZ", *args, "--dry-run",
                                      "-o", str(tmp_path / "out")], env=env, catch_exceptions=False)
    assert result.exit_code == 1 and result.output.startswith("Error: ") and result.output.count("\n") == 1, \
        result.output
    assert len(result.output) < 400 and ("--adb" in result.output or next(iter(env)) in result.output)
