"""`bmoe-fleet table|recommend|report|compare`: parse options, call one results function, print.

Registered into the main group by harness/cli.py, whose group turns library errors (BmoeError,
here results.errors.ResultsError) into one-line `Error: …` messages with exit status 1.
Everything is recomputed from campaign directories; no command talks to a device.
"""

from __future__ import annotations

import json

import click

_DIRS = click.argument("dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
_MODEL_FILE = click.option(
    "--model-file", "model_files", multiple=True, metavar="NAME=PATH",
    help="The GGUF of a model the runs name (repeatable): its token cycle is priced from the header when a "
         "CSV predates the cache_cycle_mb key (imported upstream runs, for instance).")


@click.command("table")
@_DIRS
@click.option("-o", "--out", "out", required=True, type=click.Path(dir_okay=False),
              help="runs.csv, or runs.parquet (parquet needs pyarrow).")
@_MODEL_FILE
def table_command(dirs: tuple[str, ...], out: str, model_files: tuple[str, ...]) -> None:
    """Write the tidy run table (one row per run) of campaign directories DIRS."""
    from results.table import parse_model_files, write_table

    click.echo(write_table(list(dirs), out, parse_model_files(model_files)))


@click.command("recommend")
@_DIRS
@click.option("--json", "as_json", is_flag=True, help="Print recommendations.json (versioned) instead of text.")
@_MODEL_FILE
def recommend_command(dirs: tuple[str, ...], as_json: bool, model_files: tuple[str, ...]) -> None:
    """Recommend --cache-mb, --cache-mb auto --cache-ceil-mb N and --dense-weights per device and model."""
    from results.recommend import recommend
    from results.table import parse_model_files

    recs = recommend(list(dirs), parse_model_files(model_files))
    click.echo(recs.to_json().rstrip("\n") if as_json else recs.text())


@click.command("report")
@_DIRS
@click.option("-o", "--out", "out", required=True, type=click.Path(file_okay=False),
              help="Site folder (created, or replaced when it holds a previous report).")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
@_MODEL_FILE
def report_command(dirs: tuple[str, ...], out: str, as_json: bool, model_files: tuple[str, ...]) -> None:
    """Render the static benchmark site (works offline from file://) for campaign directories DIRS."""
    from results.report import build_site
    from results.table import parse_model_files

    site = build_site(list(dirs), out, parse_model_files(model_files))
    click.echo(json.dumps(site.to_dict(), indent=2) if as_json else site.text())


@click.command("compare")
@click.argument("a", type=click.Path(exists=True, file_okay=False))
@click.argument("b", type=click.Path(exists=True, file_okay=False))
@click.option("--engine-a", help="Only A's runs of this engine version (compare two engines of one directory).")
@click.option("--engine-b", help="Only B's runs of this engine version.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@_MODEL_FILE
def compare_command(a: str, b: str, engine_a: str | None, engine_b: str | None, as_json: bool,
                    model_files: tuple[str, ...]) -> None:
    """Compare the matching cells of campaign directories A and B: regressions, improvements, new failures."""
    from results.compare import compare
    from results.table import parse_model_files

    result = compare(a, b, engine_a, engine_b, parse_model_files(model_files))
    click.echo(result.to_json() if as_json else result.text())


COMMANDS = (table_command, recommend_command, report_command, compare_command)
