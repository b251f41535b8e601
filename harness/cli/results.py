"""`bmoe-fleet table|recommend|report|compare`: parse options, call a results function and its
renderer, write what it rendered (atomically, to -o) or print it.

Registered into the main group by harness/cli/main.py, whose group turns library errors (BmoeError,
here results.errors.ResultsError) into one-line `Error: …` messages with exit status 1.
Everything is recomputed from campaign directories; no command talks to a device, except
`recommend --verify`, which runs each recommended command line once on its device.
"""

from __future__ import annotations

import json

import click

from harness.cli.numbers import FLOAT

_DIRS = click.argument("dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
_MODEL_FILE = click.option(
    "--model-file", "model_files", multiple=True, metavar="NAME=PATH",
    help="The GGUF of a model the runs name (repeatable): its token cycle is priced from the header when a "
         "CSV predates the cache_cycle_mb key (imported upstream runs, for instance).")
_FORMATS = ("text", "csv", "json", "jsonl", "md")
_DB = click.option(
    "--db", "db", metavar="URL|PATH",
    help="Read the run table from this results database (bmoe-fleet db ingest DIR… filled it: an SQLite file's "
         "path, sqlite:///PATH or postgresql://…) instead of rebuilding it from the files.")


def _no_model_files(model_files: tuple[str, ...]) -> None:
    if model_files:
        raise click.UsageError("--model-file prices rows as they are built; with --db they were built at ingest")


def _db_table(db: str | None, dirs: list[str], model_files: tuple[str, ...]):
    """The run table of DIRS from the results database, or None without --db."""
    if db is None:
        return None
    _no_model_files(model_files)
    from results.db.load import run_table

    return run_table(dirs, db)


def _format(extra: tuple[str, ...] = ()):
    return click.option("--format", "fmt", type=click.Choice(_FORMATS + extra),
                        help="Output format (md: a GitHub table). Default: from -o's suffix, else text.")


def _write(data: str | bytes, out: str | None, what: str) -> None:
    """Rendered output to `out` (atomically; `-` or none: stdout), and the line that says where."""
    from results import formats

    printed = formats.emit(data, out or None, what)
    click.echo(printed, nl=bool(out) and out != formats.STDOUT)


def _checked_out(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """-o refused before any work when no output can go there (a FIFO, a device: results/formats.py)."""
    from results import formats

    formats.check_out(value)
    return value


def _out(what: str):
    return click.option("-o", "--out", "out", default="-", show_default=True, type=click.Path(dir_okay=False),
                        callback=_checked_out,
                        help=f"Write {what} to this file (atomically; a symlink there is replaced); - for stdout.")


def _checked_bound(ctx: click.Context, param: click.Parameter, value: str | None):
    """--max-quality-loss parsed before any work (results.analysis.quality.parse_bound: one line on bad input)."""
    from results.analysis.quality import parse_bound

    return parse_bound(value) if value is not None else None


@click.command("table")
@_DIRS
@_out("the run table")
@_format(("parquet",))
@_MODEL_FILE
@_DB
def table_command(dirs: tuple[str, ...], out: str, fmt: str | None, model_files: tuple[str, ...],
                  db: str | None) -> None:
    """Write the tidy run table (one row per run) of campaign directories DIRS.

    text and md show the columns a person reads; csv, json, jsonl and parquet carry every column
    (parquet needs pyarrow: pip install 'bmoe-fleet[parquet]')."""
    from results import formats
    from results.read.table import TABLE_FORMATS, build_table, parse_model_files, render_table, table_what

    fmt = formats.choose_format(fmt, out, TABLE_FORMATS)
    frame = _db_table(db, list(dirs), model_files)
    if frame is None:
        frame = build_table(list(dirs), parse_model_files(model_files))
    _write(render_table(frame, fmt), out, table_what(frame))


@click.command("recommend")
@click.argument("dirs", nargs=-1, type=click.Path(exists=True, file_okay=False))
@_out("the recommendations")
@_format()
@click.option("--json", "as_json", is_flag=True, help="Print recommendations.json (version 2), as --format json.")
@click.option("--verify", is_flag=True,
              help="Run every recommended command line once (-n 1) on its device with the campaign's engine, and "
                   "record whether the engine accepted or refused it, with the engine's line.")
@click.option("--max-quality-loss", "max_quality_loss", metavar="BOUND", callback=_checked_bound,
              help="Also name a lossy setting (--drop-cold-experts, --expert-substitute, --route-ahead, a lower "
                   "top-k) measured faster beyond noise, within BOUND: ppl+P% (perplexity at most P% over the "
                   "lossless run's), agreement>=A (the share of tokens before the first that differs, 0..1), "
                   "or both joined by ','. The lossless setting stays the default.")
@_MODEL_FILE
@_DB
def recommend_command(dirs: tuple[str, ...], out: str, fmt: str | None, as_json: bool, verify: bool,
                      max_quality_loss, model_files: tuple[str, ...], db: str | None) -> None:
    """Recommend --cache-mb, --cache-mb auto --cache-ceil-mb N and --dense-weights per device and model,
    as the command lines that were measured; a per-phone default, and a rule for phones never measured.

    With --db, that rule is drawn from every device the database holds, each point with the campaigns
    and engine release it came from; with --db and no DIRS, the rule alone."""
    from harness.run.verify import verifier
    from results import formats
    from results.analysis.recommend import recommend
    from results.analysis.recommend_records import render
    from results.read.table import parse_model_files

    if not dirs and db is None:
        raise click.UsageError("give campaign directories DIRS, or --db URL for the fleet rule alone")
    fmt = formats.choose_format("json" if as_json else fmt, out)
    check = verifier(lambda line: click.echo(line, err=True)) if verify else None
    if db is not None:
        from results.analysis.fleet_db import recommend_with_db

        recs = recommend_with_db(list(dirs), db, check, max_quality_loss,
                                 _db_table(db, list(dirs), model_files) if dirs or model_files else None)
    else:
        recs = recommend(list(dirs), parse_model_files(model_files), check, max_quality_loss)
    _write(render(recs, fmt), out, "the recommendations")


@click.command("report")
@_DIRS
@click.option("-o", "--out", "out", type=click.Path(),
              help="Site folder (created, or replaced when it holds a previous report); with --format community, "
                   "a file (default: stdout).")
@click.option("--format", "fmt", type=click.Choice(["site", "community"]), default="site", show_default=True,
              help="site: the static benchmark site; community: one Markdown row per device in the column order "
                   "of upstream's docs/community-benchmarks.md, ready to paste.")
@click.option("--by", "by", default="bmoe-fleet", show_default=True, help="The community table's `By` column.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written (or the rows) as JSON.")
@_MODEL_FILE
@_DB
def report_command(dirs: tuple[str, ...], out: str | None, fmt: str, by: str, as_json: bool,
                   model_files: tuple[str, ...], db: str | None) -> None:
    """Render the static benchmark site (works offline from file://), or upstream's community rows."""
    from results.read.table import parse_model_files

    if fmt == "community":
        from results import formats
        from results.analysis.community import community_rows, render_community

        formats.check_out(out)

        rows = community_rows(list(dirs), by, parse_model_files(model_files), _db_table(db, list(dirs), model_files))
        _write(render_community(rows, as_json), out, "the community rows")
        return
    from results.site.report import build_site

    if not out:
        raise click.UsageError("report --format site needs -o SITE_FOLDER")
    if db is not None:
        from results.site.report import build_site_from_db

        _no_model_files(model_files)
        site = build_site_from_db(list(dirs), out, db, lambda line: click.echo(line, err=True))
    else:
        site = build_site(list(dirs), out, parse_model_files(model_files),
                          progress=lambda line: click.echo(line, err=True))
    click.echo(json.dumps(site.to_dict(), indent=2) if as_json else site.text())


@click.command("compare")
@click.argument("a", type=click.Path(exists=True, file_okay=False), required=False)
@click.argument("b", type=click.Path(exists=True, file_okay=False), required=False)
@click.option("--engine-a", help="Only A's runs of this engine version (compare two engines of one directory); "
                                 "with --db and one campaign, the release to compare with instead of the previous.")
@click.option("--engine-b", help="Only B's runs of this engine version.")
@click.option("--device", help="With --db and no campaign: this device's newest release against the one before.")
@click.option("--model", help="With --db: only this model's runs (with no campaign, the one to compare).")
@_out("the comparison")
@_format()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON, as --format json.")
@click.option("--threshold", "threshold_pct", type=FLOAT, default=0.0, show_default=True, metavar="PCT",
              help="Count a change beyond noise as a regression or improvement only past PCT %.")
@click.option("--fail-on-regression", is_flag=True,
              help="Exit with status 4 when a cell regressed past noise and threshold, or newly fails (for CI).")
@_MODEL_FILE
@_DB
def compare_command(a: str | None, b: str | None, engine_a: str | None, engine_b: str | None,
                    device: str | None, model: str | None, out: str, fmt: str | None,
                    as_json: bool, threshold_pct: float, fail_on_regression: bool,
                    model_files: tuple[str, ...], db: str | None) -> None:
    """Compare the matching cells of campaign directories A and B: regressions, improvements, new failures.

    With --db and one campaign (or --device and --model and none), its runs against the previous
    release's on the same device and model from the database, judged by the Mann-Whitney U test
    (two-sided p < 0.05) and the noise threshold.

    Exit status: 0, or 4 with --fail-on-regression when anything regressed; 1 error, 2 usage."""
    from results import formats
    from results.analysis.compare import FAIL_EXIT_STATUS, compare, render

    fmt = formats.choose_format("json" if as_json else fmt, out)
    if b is None or device is not None or model is not None:
        if db is None:
            raise click.UsageError("compare needs A and B, or --db URL with one campaign (or --device and --model)")
        if b is not None:
            raise click.UsageError("--device and --model go with one campaign or none, not two")
        _no_model_files(model_files)
        from results.analysis.history import compare_release

        result = compare_release(db, a, device, model, engine_b, engine_a, threshold_pct)
    else:
        from results.read.table import parse_model_files

        assert a is not None                   # click fills A before B
        ta, tb = _db_table(db, [a], model_files), _db_table(db, [b], model_files)
        result = compare(a, b, engine_a, engine_b, parse_model_files(model_files), threshold_pct,
                         None if ta is None or tb is None else (ta, tb))
    _write(render(result, fmt), out, "the comparison")
    if fail_on_regression and result.failed:
        click.get_current_context().exit(FAIL_EXIT_STATUS)


@click.command("history")
@click.option("--db", "db", metavar="URL|PATH", required=True,
              help="The results database (bmoe-fleet db ingest DIR… filled it): an SQLite file's path, sqlite:///PATH "
                   "or postgresql://…. No campaign folder is read.")
@click.option("--device", help="Only this device.")
@click.option("--model", help="Only this model.")
@_out("the history")
@_format()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON, as --format json.")
def history_command(db: str, device: str | None, model: str | None, out: str, fmt: str | None,
                    as_json: bool) -> None:
    """Each device and model across engine releases, in release order: per release the recommended
    ceiling, tok/s at the recommended fixed budget (median, of how many runs), hit % there and the
    app's verdict, as the recommendation of that release's runs alone gives them."""
    from results import formats
    from results.analysis.history import history, render

    fmt = formats.choose_format("json" if as_json else fmt, out)
    _write(render(history(db, device, model, lambda line: click.echo(line, err=True)), fmt), out, "the history")


COMMANDS = (table_command, recommend_command, report_command, compare_command, history_command)
