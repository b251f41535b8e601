"""Campaign files: reading, defaults, the resolved TOML written back, and one-line errors that
write nothing. Driven through the library and the CLI (CliRunner)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from engine.contract.flags import needs_force
from harness.campaign.budgets import budget_from_cycle, parse_cache_value
from harness.campaign.file import load_campaign, parse_campaign
from harness.campaign.model import Campaign, CampaignError
from harness.campaign.options import campaign_from_options
from harness.cli.campaign import COMMANDS
from tests.harness.conftest import write_campaign

GOOD = """
version = 1
name = "budgets"

[fleet]
devices = ["local"]

[models]
tiny = "{model}"

[axes]
cache_mb = [0, "auto", "cycle*1.2", 1500]
cache_ceil_mb = [0, 3000]
dense_weights = ["anon", "warm"]

[run]
n_predict = 4
repeats = 2
reverse_pass = true

[gate]
cpu_temp_max_c = 42.5
mem_available_min_mb = 256
max_wait_s = 30
"""


def test_a_campaign_file_reads_with_every_default_filled_in(tmp_path, tiny_model):
    path = write_campaign(tmp_path, GOOD.format(model=tiny_model))
    c = load_campaign(path)
    assert c.name == "budgets" and c.devices == ("local",)
    assert c.models[0].name == "tiny" and c.models[0].path == str(tiny_model)
    assert c.axes.cache_mb == (0, "auto", "cycle*1.2", 1500)
    assert c.axes.cache_ceil_mb == (0, 3000) and c.axes.dense_weights == ("anon", "warm")
    assert (c.run.n_predict, c.run.repeats, c.run.reverse_pass) == (4, 2, True)
    assert c.gate.cpu_temp_max_mc == 42500 and c.gate.mem_available_min_kb == 256 * 1024
    assert c.gate.max_wait_s == 30.0
    # defaults the file left out
    assert c.engine.kind == "python" and c.axes.n_expert_used == (0,) and c.axes.io_threads == (4,)
    assert c.run.timeout_s == 1800.0 and c.run.o_direct is True and c.adb == ()
    assert list(tmp_path.iterdir()) == [path]  # reading wrote nothing


def test_the_resolved_toml_reads_back_as_the_same_campaign(tmp_path, tiny_model):
    c = load_campaign(write_campaign(tmp_path, GOOD.format(model=tiny_model)))
    text = c.to_toml()
    data = tomllib.loads(text)
    assert data["version"] == 1 and data["run"]["timeout_s"] == 1800.0 and data["engine"]["kind"] == "python"
    again = parse_campaign(data, source="resolved")
    assert again == c
    # a relative model path is resolved against the file's folder, and written absolute
    (tmp_path / "sub").mkdir()
    rel = write_campaign(tmp_path / "sub", GOOD.format(model="../" + tiny_model.name).replace(
        str(tiny_model.parent) + "/", ""))
    (tmp_path / tiny_model.name).write_bytes(tiny_model.read_bytes())
    assert load_campaign(rel).models[0].path == str(tmp_path / tiny_model.name)


def test_what_needs_quoting_is_written_and_read_back(tmp_path, tiny_model):
    odd = tmp_path / 'a "quoted" dir ü' / "m.gguf"
    odd.parent.mkdir()
    odd.write_bytes(tiny_model.read_bytes())
    c = parse_campaign({"version": 1, "name": 'a "quoted" name\twith tab, \\ and \x7f',
                        "fleet": {"devices": ["local", "R58M1", "10.0.0.7:5555"],
                                  "adb": [{"host": "h", "port": 1}, {"host": "g", "port": 2}]},
                        "models": {"odd": str(odd)},
                        "axes": {"cache_mb": [0, "auto", "cycle*1.5"], "flags": {"--prefetch": [0, 2],
                                                                                  "--no-think": [True]}},
                        "run": {"prompt": "line one\nline \"two\"\x1b[31m", "engine_args": ["--chatml"]}},
                       source="odd")
    back = tomllib.loads(c.to_toml())
    assert back == c.to_dict()
    assert parse_campaign(back, source="again") == c


GOLDEN = Path(__file__).parents[1] / "fixtures" / "campaign" / "written-by-the-hand-writer.toml"


def test_a_campaign_toml_written_before_tomli_w_reads_as_the_same_campaign(tmp_path):
    # GOLDEN is what the hand-written TOML writer (before tomli-w) wrote for a campaign using every
    # key; {root} stands for the folder its files were in. It reads back as the campaign it was,
    # and tomli-w writes that campaign as data equal to the old file's.
    for rel in ("models/tiny.gguf", "models/mid model.gguf", "build/bmoe-cli", "build/libggml.so.0",
                "build/libllama.so.0"):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    path = tmp_path / "campaign.toml"
    path.write_text(GOLDEN.read_text(encoding="utf-8").replace("{root}", str(tmp_path)), encoding="utf-8")
    c = load_campaign(path)
    assert c.name == 'golden "v1" — ü\ttab' and c.devices == ("local", "virtual:pixel-6a", "R58M123", "10.0.0.7:5555")
    assert [(s.host, s.port) for s in c.adb] == [("127.0.0.1", 5037), ("lab.example", 6037)]
    assert [m.spec for m in c.models] == [str(tmp_path / "models/tiny.gguf"), str(tmp_path / "models/mid model.gguf"),
                                          "device:/sdcard/Download/big.gguf"]
    assert [(b.abi, len(b.libs)) for b in c.engine.native] == [("host", 2), ("arm64-v8a", 1)]
    assert c.axes.cache_mb == (0, "auto", "cycle*1.2", "knee*0.5", 1500, "mmap", "resident")
    assert c.axes.threads == (1, "auto") and c.axes.flags == (("--prefetch", (0, 2)), ("--no-think", (True, False)),
                                                              ("--temp", (0.5,)))
    assert c.run.prompt == 'Line one\nline "two" \\ back\x7f' and c.run.o_direct is False
    assert c.run.timeout_s == 90.5 and c.gate.poll_s == 0.5
    assert tomllib.loads(c.to_toml()) == tomllib.loads(path.read_text(encoding="utf-8"))
    again = tmp_path / "again" / "campaign.toml"
    again.parent.mkdir()
    again.write_text(c.to_toml(), encoding="utf-8")
    assert load_campaign(again) == c


@pytest.mark.parametrize("value, expected", [
    (0, 0), (4000, 4000), ("4000", 4000), ("auto", "auto"), ("AUTO", "auto"), ("cycle*1.2", "cycle*1.2"),
    ("cycle * 0.90", "cycle*0.9"), ("cycle", "cycle*1"), ("mmap", "mmap"), ("resident", "resident"),
    ("planner", "planner"), ("Planner", "planner"),
])
def test_cache_values(value, expected):
    assert parse_cache_value(value) == expected


@pytest.mark.parametrize("value, message", [
    ("auto 4000", "mixes auto with a number"), ("4000auto", "mixes auto with a number"),
    ("auto=3000", "mixes auto with a number"), (-1, "cannot be negative"), (1.5, "whole MiB"),
    ("lots", "is not a budget"), (True, "got a boolean"),
])
def test_bad_cache_values(value, message):
    with pytest.raises(ValueError, match=message):
        parse_cache_value(value)


def test_cycle_budgets_stay_on_the_side_of_the_cycle_they_name():
    assert budget_from_cycle(1815.4, 0.9) == 1633      # 1633.86: under the cycle stays under
    assert budget_from_cycle(907.7, 1.2) == 1090       # 1089.24: over stays over
    assert budget_from_cycle(10.0, 1.0) == 10 and budget_from_cycle(10.2, 1.0) == 11
    assert budget_from_cycle(0.11, 0.5) == 1           # never 0 (that would switch the cache off)
    assert budget_from_cycle(500.0, 0) == 0
    assert [needs_force(v) for v in (0, 1, 1499, 1500, 4000)] == [False, True, True, False, False]


BAD_CASES = {
    "unknown key": ("[run]\nrepeat = 3\n", "run.repeat: unknown key"),
    "unknown top-level key": ("[fleets]\n", "fleets: unknown key"),
    "unknown device": ('[fleet]\ndevices = ["local", "virtual:nosuchphone"]\n',
                       'fleet.devices[1]: unknown device "virtual:nosuchphone"'),
    "missing model": ('[models]\nother = "does-not-exist.gguf"\n', "models.other: no such file"),
    "auto with a number": ('[axes]\ncache_mb = [0, "auto 4000"]\n', "axes.cache_mb[1]:"),
    "bad type": ('[run]\nrepeats = "3"\n', 'run.repeats: expected an integer, got a string ("3")'),
    "bad dense mode": ('[axes]\ndense_weights = ["anon", "fast"]\n', "axes.dense_weights[1]: must be one of"),
    "io threads out of range": ("[axes]\nio_threads = [9]\n", "axes.io_threads[0]: must be in 1..8, got 9"),
    "newer version": ("version = 2\n", "version: 2 is newer than this bmoe-fleet reads (1)"),
    "top-k above the model's": ("[axes]\nn_expert_used = [9]\n", "axes.n_expert_used: 9 is above model tiny's "
                                                                "n_expert of 8"),
    "not TOML": ("[run\n", "not valid TOML"),
    "bad app state": ('[axes]\napps = ["none", "asleep:1GiB"]\n', "axes.apps[1]: bad app 'asleep:1GiB'"),
    "bad app size": ('[axes]\napps = ["cached:lots"]\n', "axes.apps[0]: bad app size 'lots'"),
    "apps on local": ('[axes]\napps = ["cached:1GiB"]\n', "axes.apps: other apps run on phones"),
    "planner without a claim": ('[axes]\ncache_mb = [0, "planner"]\n',
                                'axes.cache_mb: "planner" runs the engine\'s own planner, which bmoe-py has only when '
                                'it speaks bmoe-cli 0.25.0 or later: set engine.claim = "0.25.0"'),
    "claim not a release": ('[engine]\nclaim = "latest"\n', "engine.claim: BMOE_PY_RELEASE='latest' is not a "
                                                           "bmoe-cli release"),
    "claim before 0.19": ('[engine]\nclaim = "0.18"\n', "engine.claim: BMOE_PY_RELEASE='0.18': bmoe-py speaks "
                                                        "bmoe-cli 0.19.0 to 0.25.0"),
}


def _bad_file(tmp_path: Path, tiny_model: Path, extra: str) -> Path:
    base = f'version = 1\n[fleet]\ndevices = ["local"]\n[models]\ntiny = "{tiny_model}"\n'
    if extra.startswith("version"):
        base = base.replace("version = 1\n", "")
    if extra.startswith("[fleet]"):
        base = base.replace('[fleet]\ndevices = ["local"]\n', "")
    if extra.startswith("[models]"):
        base = base.replace(f'[models]\ntiny = "{tiny_model}"\n', "")
    return write_campaign(tmp_path, extra + base if extra.startswith("version") else base + extra)


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_a_bad_campaign_file_is_one_line_naming_the_key_and_writes_nothing(case, tmp_path, tiny_model, cli,
                                                                           fleet_home):
    extra, message = BAD_CASES[case]
    path = _bad_file(tmp_path, tiny_model, extra)
    out = tmp_path / "out"
    locks_before = sorted((fleet_home / "locks").glob("*")) if (fleet_home / "locks").exists() else []
    for args in (["run", str(path), "-o", str(out)], ["run", str(path), "--dry-run"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1, result.output
        assert result.output.startswith("Error: ") and result.output.count("\n") == 1, result.output
        assert message in result.output, result.output
        assert str(path) in result.output
    assert not out.exists()
    assert sorted(tmp_path.iterdir()) == [path]
    assert (sorted((fleet_home / "locks").glob("*")) if (fleet_home / "locks").exists() else []) == locks_before


def test_device_strings_are_checked_before_any_device_is_asked(tiny_model):
    for devices, message in ((["local", "bad serial"], 'fleet.devices[1]: "bad serial" is not a device'),
                             (["virtual:no/slash"], "a virtual phone name uses letters"),
                             ([], "fleet.devices: is empty")):
        with pytest.raises(CampaignError, match=message.replace("[", r"\[").replace("]", r"\]")):
            parse_campaign({"version": 1, "fleet": {"devices": devices}, "models": {"t": str(tiny_model)}},
                           source="x.toml")


def test_an_import_record_is_not_a_campaign_to_run(tmp_path):
    path = write_campaign(tmp_path, 'version = 1\n[import]\nsources = ["/x"]\n', "campaign.toml")
    with pytest.raises(CampaignError, match="import: this file records runs brought in by `bmoe-fleet import`"):
        load_campaign(path)


def test_sweep_options_make_the_campaign_a_file_would(tmp_path, tiny_model, mid_model):
    c = campaign_from_options(["local"], [str(tiny_model), str(mid_model)], ["0", "auto", "cycle*1.2", "4000"],
                              dense_weights=["anon", "warm"], n_expert_used=[0, 2], io_threads=[4],
                              cache_ceil_mb=[0, 3000], repeats=3, n_predict=8, reverse_pass=True, name="sw")
    assert isinstance(c, Campaign)
    assert [m.name for m in c.models] == ["tiny", "mid"]
    assert c.axes.cache_mb == (0, "auto", "cycle*1.2", 4000) and c.axes.n_expert_used == (0, 2)
    assert (c.run.repeats, c.run.n_predict, c.run.reverse_pass) == (3, 8, True)
    path = write_campaign(tmp_path, c.to_toml(), "campaign.toml")
    assert load_campaign(path) == c
    with pytest.raises(CampaignError, match=r'axes\.cache_mb\[1\]: "auto4000" mixes auto with a number'):
        campaign_from_options(["local"], [str(tiny_model)], ["0", "auto4000"])
    with pytest.raises(CampaignError, match="--adb: --adb expects HOST:PORT"):
        campaign_from_options(["local"], [str(tiny_model)], ["0"], adb=["nohostport"])


def test_sweep_plan_adds_the_planners_budget_and_bmoe_py_claims_the_release_that_has_it(tmp_path, tiny_model):
    from harness.plan.grid import make_plan

    c = campaign_from_options(["local"], [str(tiny_model)], ["0", "cycle*2"], planner=True)
    assert c.axes.cache_mb == (0, "cycle*2", "planner") and c.engine.claim == "0.25.0"
    assert load_campaign(write_campaign(tmp_path, c.to_toml(), "campaign.toml")) == c
    (cell,) = [cell for cell in make_plan(c).cells if cell.config.planner]
    # the planner's own pick: none of the harness's budget or lane flags, and what it does write it pins
    argv = list(cell.argv)
    assert "--auto" in argv and "--plan-explain" in argv
    assert not {"--moe-stream", "--cache-mb", "--cache-ceil-mb", "--force-cache", "--io-threads"} & set(argv)
    assert {"-t", "--n-expert-used", "--dense-weights"} <= set(argv)


def test_every_campaign_command_and_option_has_help(cli):
    assert {"import", "run", "status", "sweep"} <= set(cli.commands)
    for name, command in ((c.name, c) for c in COMMANDS):
        assert command.help and command.help.strip(), name
        for param in command.params:
            if param.param_type_name == "option":
                assert param.help, f"{name} {param.opts[0]} has no help"
    assert [c.name for c in COMMANDS] == ["run", "sweep", "status", "import"]

