"""Readers' limits (docs/results.md): each smaller finding fixed, each with a property over generated inputs.

- replay --budgets: a budget past the engine's int (1e308, inf, nan, negative) is one `Error:` line, exit 1;
- cycle*F / knee*F: ASCII digits only, and a relative budget is never 0;
- engine_args: `--flag=value` of a harness-owned flag is refused like the flag (bmoe-cli takes no such form);
- a campaign file with a UTF-8 BOM loads as without it; a model that is /dev/zero is "not a regular file";
- a FIFO or /dev/zero as a model: refused at once, without blocking on the FIFO;
- a repeated `# summary` key keeps the first value, with a note;
- a newline in the model's file name (the engine prints it raw in `# model=`) leaves the run readable;
- engine integers (top-k, io_threads, ...) outside what bmoe-cli accepts are stored as missing, with a note.
"""

from __future__ import annotations

import os
import time

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import ModelError
from engine.gguf.header import read_header
from harness.campaign.budgets import parse_cache_value
from harness.campaign.file import load_campaign
from harness.campaign.flags import MAPPED, RESERVED, arg_problem
from harness.campaign.model import CampaignError
from harness.cli.main import main
from results.read.parse import read_metrics_csv
from results.read.parse_values import ENGINE_INTS, problem
from tests.harness.campaign_mutants import seed_texts
from tests.results.mutants import UPSTREAM

PROPS = settings(max_examples=60, deadline=None, derandomize=True, database=None)
TRACE = next(UPSTREAM.glob("*/*.route.csv"))
CSV = UPSTREAM / "host-v2-0.19.0" / "tiny_auto.csv"
MODEL = UPSTREAM / "host-v2-0.19.0" / "tiny-qwen3moe.gguf"


@pytest.mark.parametrize("budget", ["1e308", "inf", "nan", "-1", "3e9"])
def test_replay_budget_past_the_engines_int_is_one_line_exit_1(budget):
    r = CliRunner().invoke(main, ["replay", str(TRACE), "--budgets", f"100,{budget}"])
    assert r.exit_code == 1, r.output
    assert r.output.startswith("Error: ") and r.output.count("\n") == 1, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


@PROPS
@given(kind=st.sampled_from(["cycle", "knee"]), factor=st.text(st.characters(categories=["Nd"]), min_size=1,
                                                                max_size=4))
def test_relative_budgets_take_ascii_digits_only_and_are_never_zero(kind, factor):
    text = f"{kind}*{factor}"
    try:
        spec = parse_cache_value(text)
    except ValueError:
        assert not factor.isascii() or float(factor) == 0 or float(factor) > 1000
    else:
        assert factor.isascii() and isinstance(spec, str) and float(spec.split("*")[1]) > 0


@PROPS
@given(flag=st.sampled_from(sorted({*RESERVED, *MAPPED} - {"-t"})), value=st.text(max_size=8))
def test_a_harness_owned_flag_is_refused_in_its_equals_form(flag, value):
    if flag.startswith("--"):
        assert arg_problem(f"{flag}={value}") is not None


def test_campaign_file_with_a_bom_loads_as_without(tmp_path):
    text = seed_texts(MODEL)[0]
    plain, bom = tmp_path / "plain.toml", tmp_path / "bom.toml"
    plain.write_bytes(text)
    bom.write_bytes(b"\xef\xbb\xbf" + text)
    assert load_campaign(bom).to_toml().replace("bom", "plain") == load_campaign(plain).to_toml()


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "folder"])
def test_a_model_that_is_no_regular_file_is_refused_at_once(tmp_path, special):
    path = {"/dev/zero": "/dev/zero", "fifo": str(tmp_path / "m.gguf"), "folder": str(tmp_path)}[special]
    if special == "fifo":
        os.mkfifo(path)   # no writer: opening it for a blocking read would wait forever
    start = time.monotonic()
    with pytest.raises(ModelError, match="not a regular file"):
        read_header(path)
    assert time.monotonic() - start < 5
    text = seed_texts(MODEL)[0].replace(str(MODEL).encode(), path.encode())
    (tmp_path / "c.toml").write_bytes(text)
    with pytest.raises(CampaignError, match="not a regular file"):
        load_campaign(tmp_path / "c.toml")


@PROPS
@given(key_index=st.integers(0, 20), first=st.integers(0, 10**6), second=st.integers(0, 10**6))
def test_a_repeated_summary_key_keeps_the_first_value_and_says_so(tmp_path_factory, key_index, first, second):
    lines = CSV.read_text(errors="replace").splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("# summary"))
    keys = [token.split("=")[0] for token in lines[at].split()[2:]]
    key = keys[key_index % len(keys)]
    lines[at] = lines[at].replace(f" {key}=", f" {key}={first} {key}=", 1) + f" {key}={second}"
    path = tmp_path_factory.mktemp("sum") / "r.csv"
    path.write_text("\n".join(lines) + "\n")
    m = read_metrics_csv(path)
    assert m.summary is not None and m.summary[key] in (first, None)
    assert any("repeated, the first value kept" in n for n in m.notes)


@PROPS
@given(parts=st.lists(st.text(st.characters(exclude_categories=["Cs", "Zs", "Cc"]), min_size=1, max_size=6),
                      min_size=2, max_size=4))
def test_a_newline_in_the_models_file_name_leaves_the_run_readable(tmp_path_factory, parts):
    name = "\n".join(parts) + ".gguf"
    if any(p.startswith(("#", "step,")) for p in parts[1:]):
        return   # a name line that looks like a comment or the header is the engine's own ambiguity
    text = CSV.read_bytes().replace(b"# model=tiny.gguf", b"# model=" + name.encode())
    path = tmp_path_factory.mktemp("nl") / "r.csv"
    path.write_bytes(text)
    m = read_metrics_csv(path)
    assert m.complete and len(m.rows) == 32
    assert m.preamble["model"] == name and m.preamble["arch"] == "qwen3moe"


@PROPS
@given(key=st.sampled_from(sorted(ENGINE_INTS)), value=st.integers(-(2**63), 2**64 - 1))
def test_engine_integers_outside_bmoe_clis_range_are_impossible(key, value):
    low, high = ENGINE_INTS[key]
    assert (problem(key, value) is None) == (low <= value <= high)


@PROPS
@given(model=st.text(min_size=1, max_size=12))
def test_virtual_list_shows_a_phones_strings_escaped(tmp_path_factory, model):
    import json

    from devices.virtual.phone import INTERNAL, PhoneSpec

    home = tmp_path_factory.mktemp("phones")
    (home / "p1" / INTERNAL).mkdir(parents=True)
    spec = PhoneSpec(name="p1", ram_bytes=1 << 30, model=model, soc="sm\x1b[2J8550")
    (home / "p1" / INTERNAL / "spec.json").write_text(json.dumps(spec.to_json()))
    r = CliRunner().invoke(main, ["virtual", "list", "--home", str(home)])
    assert r.exit_code == 0, r.output
    assert not any(c in r.output for c in "\x1b\r\x00\x07\x7f\u202e"), repr(r.output)
    assert r.output.count("\n") == 1


@settings(PROPS, max_examples=15)
@given(k=st.integers(0, 2**64 - 1), io=st.integers(0, 2**64 - 1))
def test_an_imported_driver_tags_engine_ints_are_kept_only_when_the_engine_takes_them(tmp_path_factory, k, io):
    import json

    from harness.importer import import_runs

    lines = (UPSTREAM / "2026-07-17" / "driver-lanes.log").read_text().splitlines()[1:19]
    source = tmp_path_factory.mktemp("drv")
    body = "\n".join(line for line in lines if "n_expert_used" not in line and "io_threads" not in line)
    (source / "driver-w.log").write_text(f"=============== gptoss_k4 (k={k} io={io} n=24) ===============\n{body}\n")
    out = tmp_path_factory.mktemp("out") / "c"
    import_runs([source], out)
    (run,) = [json.loads(p.read_text()) for p in out.glob("runs/*/*/run.json")]
    assert run["config"].get("n_expert_used") == (k if k <= ENGINE_INTS["n_expert_used"][1] else None)
    assert run["config"].get("io_threads") == (io if io <= ENGINE_INTS["io_threads"][1] else None)
    assert all(type(v) is not float or k != v for v in run["config"].values())   # never a float round trip
