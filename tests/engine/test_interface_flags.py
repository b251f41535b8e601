"""engine.interface.flags, the one declared table of bmoe-cli's flags, against the real build and
against everything derived from it (harness.campaign.flags, store.engine_argv, results.analysis.recommend_argv)."""

from __future__ import annotations

import importlib
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from engine.interface import flags as table
from engine.interface.flags import (
    AXIS,
    BMOE_CLI,
    BMOE_PY,
    BUDGET,
    FLAGS,
    HARNESS,
    INT,
    NO_RUN,
    PLANNER,
    RUN,
    SESSION,
    TUNING,
    Flag,
)
from engine.interface.releases import NEXT, V0_19, V0_20, V0_24

ROOT = Path(__file__).resolve().parents[2]
_DASHED = re.compile(r"(?<![\w-])(--?[a-z][a-z0-9-]*)")


def help_flags(cli: Path) -> set[str]:
    """Every flag the real build's --help names (its usage text lists all it parses)."""
    out = subprocess.run([str(cli), "--help"], capture_output=True, text=True, timeout=30, check=True).stdout
    body = out.split("\n", 1)[1]          # the usage line names the binary's own path
    return set(_DASHED.findall(body))


def test_the_real_builds_help_lists_exactly_the_tables_flags_at_0_19_and_0_20(bmoe_cli):
    """This build is the 0.20.0 source reporting 0.19.0 (releases.REPORTED_AS): its --help is the
    flag list of both, and the table must agree with it flag for flag."""
    helped = help_flags(bmoe_cli)
    for release in (V0_19, V0_20):
        declared = set(table.spellings(table.taken_by(BMOE_CLI, release)))
        assert declared == helped, (f"table at {release}: missing {sorted(helped - declared)}, "
                                    f"not in the build's --help {sorted(declared - helped)}")


@pytest.mark.parametrize("spelling", ["--no-mmap", "--prompt-tokens", "--release-mmap", "--plan", "--auto"])
def test_a_flag_the_table_says_0_19_lacks_is_unknown_to_the_real_build(bmoe_cli, spelling):
    assert not table.flag(spelling).taken_by(BMOE_CLI, V0_19)
    r = subprocess.run([str(bmoe_cli), spelling], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and r.stderr.startswith(f"unknown arg: {spelling}")


def test_releases_grow_the_vocabulary_and_keep_every_older_flag():
    at = {r: set(table.spellings(table.taken_by(BMOE_CLI, r))) for r in (V0_19, V0_24, NEXT)}
    assert at[V0_19] < at[V0_24] < at[NEXT]
    assert {"--release-mmap", "--row-stream", "--expert-substitute", "--ppl"} <= at[V0_24] - at[V0_19]
    assert {"--auto", "--plan", "--plan-only", "--show-config", "--describe-params"} <= at[NEXT] - at[V0_24]


def test_every_spelling_is_declared_once_and_every_row_is_well_formed():
    seen: set[str] = set()
    for f in FLAGS:
        for s in f.spellings:
            assert s not in seen, s
            seen.add(s)
        assert f.role in table.ROLES and f.value in (table.NONE, INT, table.U32, table.FLOAT, table.TEXT, table.PATH,
                                                    table.CHOICE, table.MIB_OR_AUTO, table.LIST, table.TOKENS)
        assert (f.role == AXIS) == bool(f.axis), f.name
        assert bool(f.harness) == (f.role in (RUN, BUDGET, HARNESS, PLANNER)), f.name
        assert f.bmoe_py == (BMOE_PY in f.engines), f.name
        assert not f.bmoe_py or f.field or f.role == NO_RUN, f"{f.name}: bmoe-py implements it but sets no field"
        assert (f.value == table.CHOICE) == bool(f.choices), f.name


def test_bmoe_py_refuses_exactly_the_0_19_flags_the_table_says_it_lacks():
    from engine.contract.config import NOT_IMPLEMENTED, implemented_flags

    assert set(NOT_IMPLEMENTED) == set(table.refused_by_bmoe_py(V0_19))
    assert implemented_flags() == {s for f in FLAGS if f.bmoe_py for s in f.spellings}


def test_harness_rules_are_the_tables_roles():
    from harness.campaign import flags as rules

    for f in FLAGS:
        for s in f.spellings:
            problem = rules.arg_problem(s)
            if f.role == TUNING:
                assert problem is None and rules.name_problem(s) is None, s
            elif f.role in (RUN, BUDGET, HARNESS, PLANNER):
                assert problem == f"{s} is set by the harness: {f.harness}", s
            elif f.role == AXIS:
                assert rules.MAPPED[s] == f.axis and rules.name_problem(s) is None, s
            else:
                assert f.role in (NO_RUN, SESSION) and problem == f"{s} makes no measurement run", s


@pytest.fixture
def made_up(monkeypatch):
    """The table with one more flag, and the modules that derive from it at import re-derived."""
    import harness.campaign.flags
    import results.read.parse_config

    derived = (harness.campaign.flags, results.read.parse_config)

    def add(extra: Flag) -> None:
        flags = FLAGS + (extra,)
        monkeypatch.setattr(table, "FLAGS", flags)
        monkeypatch.setattr(table, "_BY_SPELLING", {s: f for f in flags for s in f.spellings})
        for module in derived:
            importlib.reload(module)

    yield add
    monkeypatch.undo()
    for module in derived:
        importlib.reload(module)


def test_a_made_up_flag_parses_is_sweepable_refused_by_bmoe_py_and_shown_with_no_other_edit(made_up):
    import harness.campaign.flags as rules
    from engine.contract.config import UsageExit, parse_args
    from engine.contract.flags import flags_text
    from results.read.parse_config import config_from_command
    from store.cells import CellConfig
    from store.engine_argv import settings_argv

    made_up(Flag("--made-up-knob", INT, TUNING, "a knob no release has", since=V0_19, key="made_up_knob"))
    # sweepable: a campaign's [axes.flags] key and a sweep's --flag
    assert rules.name_problem("--made-up-knob") is None and rules.arg_problem("--made-up-knob") is None
    assert rules.parse_option("--made-up-knob=1,2") == ("--made-up-knob", [1, 2])
    # parsed: a captured command line's reader records it (an imported run's config)
    assert config_from_command("bmoe-cli -m x.gguf --made-up-knob 3 -t 2") == {
        "model_path": "x.gguf", "made_up_knob": 3, "threads": 2}
    # refused by bmoe-py, as every bmoe-cli flag it lacks
    assert "--made-up-knob" in table.refused_by_bmoe_py(V0_19)
    with pytest.raises(UsageExit, match="unknown arg: --made-up-knob"):
        parse_args(["-m", "x.gguf", "--made-up-knob", "3"], {})
    # shown: a cell that sweeps it runs it, and the run table's flags column names it
    config = CellConfig.from_dict({"moe_stream": False, "threads": 1, "n_expert_used": 0, "dense_weights": "anon",
                                   "engine_flags": {"--made-up-knob": 3}})
    assert settings_argv(config)[-2:] == ["--made-up-knob", "3"]
    assert flags_text(config.engine_flags) == "--made-up-knob 3"
    # a made-up budget flag is the harness's, with the reason the table gives
    made_up(Flag("--made-up-budget", INT, BUDGET, "a budget no release has", since=NEXT,
                 harness="use axes.cache_mb"))
    assert rules.name_problem("--made-up-budget") == "--made-up-budget is set by the harness: use axes.cache_mb"


def test_a_replaced_flag_keeps_its_spellings():
    f = table.flag("-t")
    assert f.typed == "-t" and f.name == "--threads" and replace(f, short="").typed == "--threads"
