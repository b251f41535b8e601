"""`bmoe-fleet run|sweep|status|import`: parse options, call one library function, print.

Registered into the main group by harness/cli/main.py, whose group turns library errors (BmoeError)
into one-line `Error: …` messages with exit status 1.
"""

from __future__ import annotations

import json

import click

from harness.campaign.defaults import SWEEP


def _split(values: tuple[str, ...]) -> list[str]:
    """Comma-separated and/or repeated option values, in order."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def _ints(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[int]:
    try:
        return [int(v) for v in _split(values)]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {','.join(values)!r}") from None


def _listed(values: tuple) -> str:
    return ",".join(map(str, values))


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
@click.option("--dry-run", is_flag=True, help="Print the plan (every cell's exact engine command line) and stop.")
@click.option("--rerun-failed", is_flag=True, help="Also run again the cells whose latest outcome is not ok.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan or the final status as JSON.")
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
@click.option("--device", "devices", multiple=True,
              help="local, an adb serial, virtual:NAME or HOST:PORT (repeatable, or comma separated). Default: "
                   "$ANDROID_SERIAL; with --preset community, this host and $ANDROID_SERIAL, else this host and "
                   "every phone attached to the adb servers.")
@click.option("--preset", type=click.Choice(["quick", "publish", "community", "app"]),
              help="quick: 32 tokens, one run per config; publish: at least 256 tokens, 3 repeats and a reverse "
                   "pass (what a published number needs); community: upstream's community-benchmark protocol "
                   "(docs/results.md), then each device's storage probe; `report --format community` prints the "
                   "rows; app: what upstream's Android app runs, its cache rungs as budgets, its session flags and "
                   "a 2-turn session (docs/campaigns.md); `recommend` names the app rung.")
@click.option("--model", "models", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="A GGUF model on this host (pushed to phones), or device:PATH, one already on every device "
                   "(nothing pushed; on local, a path on this host). Repeatable.")
@click.option("--engine", "engines", multiple=True, default=(SWEEP.engine,), show_default=True,
              metavar="bmoe-py|PATH|ABI=PATH",
              help="bmoe-py, or the path of a bmoe-cli binary (the lib*.so* beside it go along) for this host "
                   "and virtual phones; ABI=PATH (repeatable, one per ABI) the bmoe-cli built for real phones of "
                   "that ABI: --engine arm64-v8a=build-android/bin/bmoe-cli.")
@click.option("--cache-mb", "cache_mb", multiple=True, default=tuple(map(str, SWEEP.cache_mb)), show_default=True,
              help="Budgets: 0, auto, cycle*F (F x the model's token cycle), a MiB number, planner (the engine's "
                   "own pick), mmap, resident.")
@click.option("--cache-ceil-mb", multiple=True, callback=_ints,
              help=f"Caps for the auto budgets (default {_listed(SWEEP.cache_ceil_mb)}: none).")
@click.option("--dense-weights", multiple=True, default=SWEEP.dense_weights, show_default=True,
              help="Dense-weight policies: mmap, warm, anon (ahwb on Android bmoe-cli).")
@click.option("--n-expert-used", multiple=True, callback=_ints, help="Top-k values (default: the model's own).")
@click.option("--io-threads", multiple=True, callback=_ints,
              help=f"Expert-read lanes (default {_listed(SWEEP.io_threads)}).")
@click.option("-t", "--threads", "threads", metavar="N|auto",
              help=f"Compute threads (-t) of every run; {SWEEP.threads} (the default): each device's online cores, "
                   "at most 4.")
@click.option("--engine-arg", "engine_args", multiple=True, metavar="ARGS",
              help="Engine arguments passed to every run, split like a shell line (repeatable): "
                   "--engine-arg '--ubatch 512' --engine-arg --no-think.")
@click.option("--flag", "flags", multiple=True, metavar="NAME=V1,V2",
              help="An engine flag as an axis (repeatable): --flag --prefetch=0,2; true passes the flag alone, "
                   "false leaves it out; -t, --n-expert-used, --io-threads, --dense-weights become that axis.")
@click.option("--apps", "apps", multiple=True, metavar="LOAD,LOAD",
              help="Other apps open beside the engine, one load per value: none, cached:1GiB, "
                   "cached:1GiB+perceptible:512MiB (STATE:SIZE[:compressible][:active]; phones only).")
@click.option("--run-as", "run_as", multiple=True, metavar="HOW,HOW",
              help="How the engine is started, an axis (axes.run_as): shell (default: over adb, as a phone's user "
                   "runs it; lmkd never considers it), app-service or app-top (virtual phones only: as the app, "
                   "registered with lmkd at adj 200 or 0, to check the app's replayed verdict against a real kill).")
@click.option("--turns", "turns", type=int, metavar="N",
              help="Turns of one engine session per run (run.turns; default 1, a one-shot run): the engine runs "
                   "with --session and gets N requests, an idle gap between them.")
@click.option("--idle-s", "idle_s", type=float, metavar="S", help="Seconds of idle between a session's turns (run.idle_s).")
@click.option("--gap-apps", "gap_apps", metavar="LOAD",
              help="One load of other apps started during each gap and stopped at its end (run.gap_apps), e.g. "
                   "cached:64MiB; phones only.")
@click.option("--plan", "planner", is_flag=True,
              help="Also run the engine's own planner on each device: a \"planner\" budget per dense mode, "
                   "recorded with its plan and shown beside the measured boundary (bmoe-cli after 0.24; bmoe-py "
                   "then claims that release).")
@click.option("--adaptive", is_flag=True,
              help="Spend cells only where the prediction is unsure ([plan] adaptive): cache 0 with a route trace, "
                   "then the predicted knee and largest safe budget, then bisection of the kill-or-fight boundary; "
                   "a group whose cells miss their prediction falls back to the --cache-mb grid.")
@click.option("--resolution-mb", "resolution_mb", type=click.IntRange(min=0), metavar="MIB",
              help="With --adaptive: bisect until the bracket is this narrow (default 0: a quarter of the token "
                   "cycle).")
@click.option("--max-error-pct", "max_error_pct", type=click.FloatRange(min=0, min_open=True), metavar="PCT",
              help="With --adaptive: a measured cell further than this from its predicted s/token sends its group "
                   "to the grid (default 25).")
@click.option("--repeats", type=click.IntRange(min=1), default=SWEEP.repeats, show_default=True,
              help="Runs of every config, interleaved across configs.")
@click.option("--reverse-pass", is_flag=True, help="Run the whole sequence a second time in reverse order.")
@click.option("-n", "--n-predict", "n_predict", type=click.IntRange(min=1), default=SWEEP.n_predict, show_default=True,
              help="Tokens to generate per run (256 or more for a published number).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True),
              help=f"Seconds before a run is killed and recorded as a timeout (default {SWEEP.timeout_s:g}).")
@click.option("--device-timeout-s", "device_timeout_s", type=click.FloatRange(min=0, min_open=True),
              help="Seconds a phone may leave the harness without an answer mid-run before the cell is "
                   f"device_lost (default {SWEEP.device_timeout_s:g}).")
@click.option("--adb", "adb", multiple=True,
              help="adb server HOST:PORT (repeatable). Default: $ADB_SERVER_SOCKET, else $ANDROID_ADB_SERVER_ADDRESS "
                   "and $ANDROID_ADB_SERVER_PORT, else 127.0.0.1:5037.")
@click.option("--name", default=SWEEP.name, show_default=True, help="Campaign name.")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Campaign directory; the equivalent campaign file is written into it as campaign.toml.")
@click.option("--dry-run", is_flag=True, help="Print the plan (every cell's exact engine command line) and stop.")
@click.option("--rerun-failed", is_flag=True, help="Also run again the cells whose latest outcome is not ok.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan or the final status as JSON.")
def sweep_command(devices: tuple[str, ...], models: tuple[str, ...], cache_mb: tuple[str, ...],
                  cache_ceil_mb: list[int], dense_weights: tuple[str, ...], n_expert_used: list[int],
                  io_threads: list[int], repeats: int, reverse_pass: bool, n_predict: int, timeout_s: float | None,
                  device_timeout_s: float | None, adb: tuple[str, ...], name: str, out_dir: str, dry_run: bool,
                  rerun_failed: bool, as_json: bool, engines: tuple[str, ...], threads: str | None,
                  engine_args: tuple[str, ...],
                  flags: tuple[str, ...], apps: tuple[str, ...], run_as: tuple[str, ...], preset: str | None,
                  turns: int | None,
                  idle_s: float | None, gap_apps: str | None, planner: bool, adaptive: bool,
                  resolution_mb: int | None, max_error_pct: float | None) -> None:
    """Sweep cache budgets and dense modes across devices without writing a campaign file.

    Exit status: 0 complete, 3 cells pending (rerun to resume), 130 interrupted, 1 error."""
    from harness.campaign.options import sweep_engines
    from harness.campaign.presets import sweep_campaign
    from harness.run.runner import prepare
    from harness.run.sweep import run_sweep

    ctx = click.get_current_context()
    explicit = {p for p in ctx.params if ctx.get_parameter_source(p) is click.core.ParameterSource.COMMANDLINE}
    explicit |= {"engine"} if "engines" in explicit else set()
    engine, engine_builds = sweep_engines(engines, preset)
    sweep = sweep_campaign(preset, explicit, dict(
        devices=_split(devices), models=list(models), cache_mb=_split(cache_mb),
        dense_weights=_split(dense_weights), n_expert_used=n_expert_used or list(SWEEP.n_expert_used),
        io_threads=io_threads or list(SWEEP.io_threads), cache_ceil_mb=cache_ceil_mb or list(SWEEP.cache_ceil_mb),
        repeats=repeats, n_predict=n_predict, adb=_split(adb),
        reverse_pass=reverse_pass, name=name, timeout_s=timeout_s, engine=engine, engine_builds=engine_builds,
        device_timeout_s=device_timeout_s, threads=threads,
        engine_args=engine_args, flags=flags, apps=_split(apps), run_as=_split(run_as), turns=turns, idle_s=idle_s,
        gap_apps=gap_apps,
        planner=planner, adaptive=adaptive, resolution_mb=resolution_mb, max_error_pct=max_error_pct))
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
@click.argument("sources", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Campaign directory to create or extend.")
@click.option("--device", default="imported", show_default=True,
              help="Device label for the imported runs (upstream files do not say which phone).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def import_command(sources: tuple[str, ...], out_dir: str, device: str, as_json: bool) -> None:
    """Turn upstream bench-data folders (CSVs, .metrics, .log/.out captures, route traces) into runs."""
    from harness.importer import import_runs

    report = import_runs(sources, out_dir, device)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.text())


COMMANDS = (run_command, sweep_command, status_command, import_command)
