"""`bmoe-fleet run|sweep|status|import`: parse options, call one library function, print.

Registered into the main group by harness/cli/main.py, whose group turns library errors (BmoeError)
into one-line `Error: …` messages with exit status 1.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from engine.units import ascii_int
from harness.campaign.sweep_options import AS_JSON, DRY_RUN, RERUN_FAILED, SWEEP_OPTIONS, SweepOption
from harness.cli.numbers import FLOAT, INT, AsciiFloatRange, AsciiIntRange

F = TypeVar("F", bound=Callable[..., Any])


def _split(values: tuple[str, ...]) -> list[str]:
    """Comma-separated and/or repeated option values, in order."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def _words(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[str]:
    return _split(values)


def _ints(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[int]:
    try:
        return [ascii_int(v) for v in _split(values)]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {','.join(values)!r}") from None


def _click_option(option: SweepOption) -> Callable[[F], F]:
    """The click option a declaration describes (its names, type, default and help)."""
    kwargs: dict[str, Any] = {"help": option.help}
    if option.kind is bool:
        kwargs["is_flag"] = True
    elif option.listed or option.multiple:
        kwargs["multiple"] = True
        if option.listed:
            kwargs["callback"] = _ints if option.kind is int else _words
        if option.default not in (None, ()):
            kwargs["default"] = tuple(map(str, option.default if isinstance(option.default, tuple) else
                                          (option.default,)))
    else:
        kwargs["type"] = _scalar_type(option)
        if option.default is not None:
            kwargs["default"] = option.default
    if option.path:
        kwargs["type"] = click.Path(dir_okay=False) if option.path == "file" else click.Path(file_okay=False)
    for name in ("show_default", "required", "metavar"):
        if getattr(option, name):
            kwargs[name] = getattr(option, name)
    return click.option(*option.names, option.dest, **kwargs)


def _scalar_type(option: SweepOption) -> Any:
    if option.choices:
        return click.Choice(list(option.choices))
    if option.kind is int:
        return INT if option.minimum is None else AsciiIntRange(min=int(option.minimum))
    if option.kind is float:
        return FLOAT if option.minimum is None else AsciiFloatRange(min=option.minimum, min_open=option.above)
    return None


def _options(*declared: SweepOption) -> Callable[[F], F]:
    """Decorate a command with these declared options, listed in this order."""
    def decorate(f: F) -> F:
        for option in reversed(declared):
            f = _click_option(option)(f)
        return f
    return decorate


def _echo_plan(plan, as_json: bool) -> None:
    click.echo(json.dumps(plan.to_dict(), indent=2) if as_json else plan.text())


def _finish(end, as_json: bool) -> None:
    """Print how a run ended and exit with its status (0 complete, 3 incomplete, 130 interrupted)."""
    click.echo(end.to_json() if as_json else end.text())
    click.get_current_context().exit(end.exit_status)


@click.command("run")
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False),
              help="Campaign directory (default: a folder named after the campaign next to the file; a "
                   "campaign directory's own campaign.toml runs in that directory).")
@_options(DRY_RUN, RERUN_FAILED, AS_JSON)
def run_command(campaign_file: str, out_dir: str | None, dry_run: bool, rerun_failed: bool, as_json: bool) -> None:
    """Run (or resume) the campaign in CAMPAIGN_FILE: every cell not yet done, devices in parallel.

    Exit status: 0 complete, 3 cells pending (rerun to resume), 130 interrupted, 1 error."""
    from harness.campaign.file import load_campaign
    from harness.run.runner import default_out_dir, prepare, run_to_end

    campaign = load_campaign(campaign_file)
    prepared = prepare(campaign)
    if dry_run:
        _echo_plan(prepared.first(), as_json)
        return
    _finish(run_to_end(campaign, out_dir or default_out_dir(campaign_file, campaign), rerun_failed, prepared),
            as_json)


@click.command("sweep")
@_options(*SWEEP_OPTIONS)
def sweep_command(preset: str | None, engine: tuple[str, ...], out_dir: str, dry_run: bool, rerun_failed: bool,
                  as_json: bool, **options: Any) -> None:
    """Sweep cache budgets and dense modes across devices without writing a campaign file.

    Exit status: 0 complete, 3 cells pending (rerun to resume), 130 interrupted, 1 error."""
    from harness.campaign.options import sweep_engines
    from harness.campaign.presets import sweep_campaign
    from harness.run.runner import prepare
    from harness.run.sweep import run_sweep

    ctx = click.get_current_context()
    explicit = {p for p in ctx.params if ctx.get_parameter_source(p) is click.core.ParameterSource.COMMANDLINE}
    host_engine, engine_builds = sweep_engines(engine, preset)
    sweep = sweep_campaign(preset, explicit, dict(options, engine=host_engine, engine_builds=engine_builds))
    for note in sweep.notes:              # a preset's flag the engine lacks is left out, never silently
        click.echo(f"--preset {preset}: {note}", err=True)
    prepared = prepare(sweep.campaign)
    if dry_run:
        _echo_plan(prepared.first(), as_json)
        return
    _finish(run_sweep(sweep, out_dir, rerun_failed, prepared), as_json)


@click.command("status")
@click.argument("campaign_dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def status_command(campaign_dir: str, as_json: bool) -> None:
    """Show a campaign directory's progress and the outcomes of its runs."""
    from harness.run.status import campaign_status

    status = campaign_status(campaign_dir)
    click.echo(status.to_json() if as_json else status.text())


@click.command("import")
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Campaign directory to create or extend.")
@click.option("--device", default="imported", show_default=True,
              help="Device label for the imported runs (upstream files do not say which phone).")
@click.option("--url", default=None, help="Where a community report file came from (its issue's address).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.pass_context
def import_command(ctx: click.Context, sources: tuple[str, ...], out_dir: str, device: str, url: str | None,
                   as_json: bool) -> None:
    """Turn upstream bench-data folders (CSVs, .metrics, .log/.out captures, route traces) into runs, and
    community benchmark reports (files: an issue's text or its JSON export) into runs once they pass
    their checks; exit 1 when reports were given and none was accepted."""
    from pathlib import Path

    from harness.community_import import import_reports, render
    from harness.importer import import_runs

    folders = [s for s in sources if Path(s).is_dir()]
    reports = [s for s in sources if not Path(s).is_dir()]
    if folders:
        report = import_runs(folders, out_dir, device)
        click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.text())
    if reports:
        checked = import_reports(reports, out_dir, url)
        click.echo(render(checked, as_json))
        if not checked.accepted:
            ctx.exit(1)


COMMANDS = (run_command, sweep_command, status_command, import_command)
