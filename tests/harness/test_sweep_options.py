"""`bmoe-fleet sweep` is built from its declared options alone (harness/campaign/sweep_options.py):
each is in `sweep --help`, none is added beside the list, and each campaign key it declares is one
a campaign file has and where its value goes."""

from __future__ import annotations

import re
from typing import Any

import pytest
from click.testing import CliRunner

import harness.campaign.options as options_mod
from harness.campaign.file import parse_campaign
from harness.campaign.model import CampaignError
from harness.campaign.options import campaign_from_options
from harness.campaign.sweep_options import SWEEP_OPTIONS, SweepOption
from harness.cli.campaign import run_command, sweep_command
from harness.cli.main import main

KEYED = [o for o in SWEEP_OPTIONS if o.key]


def _squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_every_declared_option_is_in_sweep_help():
    """Each declaration's names and its whole help text are what `sweep --help` shows."""
    result = CliRunner().invoke(main, ["sweep", "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    shown = _squeezed(result.output)
    for option in SWEEP_OPTIONS:
        for name in option.names:
            assert re.search(rf"(^|[\s,/]){re.escape(name)}([\s,=]|$)", result.output, re.M), f"{name} not in help"
        assert _squeezed(option.help) in shown, f"{option.flag}: its help is not what --help shows"


def test_sweep_has_the_declared_options_and_no_other():
    """A click option added to the command beside the list (a second place for an option) fails here."""
    built = [(p.name, tuple(p.opts)) for p in sweep_command.params]
    assert built == [(o.dest, o.names) for o in SWEEP_OPTIONS]
    names = [n for o in SWEEP_OPTIONS for n in o.names]
    assert len(names) == len(set(names)) and len({o.dest for o in SWEEP_OPTIONS}) == len(SWEEP_OPTIONS)


def test_run_shares_the_sweeps_run_controls():
    """`run`'s --dry-run, --rerun-failed and --json are the sweep's declarations, help and all."""
    by_name = {p.name: p for p in run_command.params}
    for option in SWEEP_OPTIONS:
        if option.dest in ("dry_run", "rerun_failed", "as_json"):
            assert by_name[option.dest].help == option.help and tuple(by_name[option.dest].opts) == option.names


def _minimal(tiny_model) -> dict[str, Any]:
    return {"version": 1, "fleet": {"devices": ["local"]}, "models": {"tiny": str(tiny_model)}}


def _problem(data: dict[str, Any]) -> str:
    with pytest.raises(CampaignError) as err:
        parse_campaign(data, source="sweep")
    return str(err.value)


def _set(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    table, _, name = key.rpartition(".")
    (data.setdefault(table, {}) if table else data)[name] = value
    return data


@pytest.mark.parametrize("option", KEYED, ids=lambda o: o.flag)
def test_each_declared_key_is_read_by_parse_campaign(tiny_model, option: SweepOption):
    """A value of no TOML type under the declared key is refused naming that key (so the reader
    reads it), never as an unknown key, as a key the file does not have is."""
    assert parse_campaign(_minimal(tiny_model), source="sweep").models   # the document is valid without it
    problem = _problem(_set(_minimal(tiny_model), option.key, 1j))
    assert re.search(rf"(^|: ){re.escape(option.key)}(\[\d+\]|\.\w+)?: ", problem), problem
    assert "unknown key" not in problem
    assert "unknown key" in _problem(_set(_minimal(tiny_model), f"{option.key}_typo", 1))


def _example(option: SweepOption, tmp_path, tiny_model) -> Any:
    """A value for the option that reaches parse_campaign, unlike its default."""
    if option.dest == "models":
        return [str(tiny_model), "device:/sdcard/other.gguf"]
    if option.dest == "engine":
        cli = tmp_path / "bmoe-cli"
        cli.write_text("#!/bin/sh\nexit 0\n")
        cli.chmod(0o755)
        return str(cli)
    special = {"adb": ["127.0.0.1:6037"], "flags": ("--prefetch=0,2",), "engine_args": ("--no-think",),
               "threads": "2", "devices": ["virtual:x"]}
    if option.dest in special:
        return special[option.dest]
    if option.kind is bool:
        return True
    if option.kind is int:
        return [3] if option.listed else 3
    if option.kind is float:
        return 2.5
    return ["x"] if option.listed else "x"


def _flat(data: dict[str, Any]) -> dict[str, Any]:
    """A campaign document as {"run.n_predict": 32, "name": …} (tables two deep)."""
    return {f"{t}.{k}" if isinstance(v, dict) else t: w for t, v in data.items()
            for k, w in (v.items() if isinstance(v, dict) else [(None, v)])}


@pytest.mark.parametrize("option", KEYED, ids=lambda o: o.flag)
def test_each_option_goes_to_its_declared_key(tiny_model, tmp_path, monkeypatch, option: SweepOption):
    """Given, the option changes the campaign under its declared key and nowhere else (but for
    the engine.claim the planner brings bmoe-py)."""
    handed: list[dict[str, Any]] = []
    monkeypatch.setattr(options_mod, "parse_campaign", lambda data, **kw: handed.append(data))
    given = {"devices": ["local"], "models": [str(tiny_model)], "cache_mb": ["0"]}
    campaign_from_options(**given)
    campaign_from_options(**{**given, option.dest: _example(option, tmp_path, tiny_model)})
    plain, changed = map(_flat, handed)
    moved = {k for k in plain.keys() | changed.keys() if plain.get(k) != changed.get(k)}
    derived = {"engine.claim"} if option.dest == "planner" else set()
    assert any(k == option.key or k.startswith(f"{option.key}.") for k in moved), (option.key, moved)
    assert all(k == option.key or k.startswith(f"{option.key}.") or k in derived for k in moved), (option.key, moved)


def test_an_undeclared_option_is_refused_by_the_library(tiny_model):
    with pytest.raises(TypeError, match="'prefetch'"):
        campaign_from_options(["local"], [str(tiny_model)], ["0"], prefetch=2)
