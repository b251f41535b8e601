"""`bmoe-fleet db ingest|rebuild|columns`: the results database (results/db/) and the run table's
declared columns (results/read/columns.py). Parse, call the library, print.
"""

from __future__ import annotations

import json

import click

_DB = click.option("--db", "db", metavar="URL|PATH",
                   help="The results database: an SQLite file's path, sqlite:///PATH or postgresql://USER@HOST/DB. "
                        "Default: ~/.bmoe-fleet/results.sqlite.")


def _progress(line: str) -> None:
    click.echo(line, err=True)


def _print(done: tuple[list, int], as_json: bool) -> None:
    campaigns, pages = done
    if as_json:
        click.echo(json.dumps({"campaigns": [d.to_dict() for d in campaigns], "run_pages_made": pages}, indent=2))
    else:
        for d in campaigns:
            click.echo(d.text())


@click.group("db")
def db_group() -> None:
    """The results database: the run table of many campaigns, for table, report, recommend and compare --db."""


@db_group.command("ingest")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@_DB
@click.option("--json", "as_json", is_flag=True,
              help="Print what each campaign's ingest did, and how many run pages were made, as JSON.")
def ingest_command(dirs: tuple[str, ...], db: str | None, as_json: bool) -> None:
    """Load campaign directories DIRS into the database: only the attempts it has not seen, or whose
    files changed; each campaign in one transaction; then the run pages of the campaigns it
    changed, kept for report --db. Progress goes to stderr."""
    from results.site.run_pages import ingest_with_pages

    _print(ingest_with_pages(list(dirs), db, _progress), as_json)


@db_group.command("rebuild")
@click.argument("dirs", nargs=-1, type=click.Path(exists=True, file_okay=False))
@_DB
@click.option("--json", "as_json", is_flag=True,
              help="Print what each campaign's ingest did, and how many run pages were made, as JSON.")
def rebuild_command(dirs: tuple[str, ...], db: str | None, as_json: bool) -> None:
    """Make the database again from the files: its tables (for this bmoe-fleet's columns), then DIRS
    (default: the campaign directories it holds)."""
    from results.site.run_pages import ingest_with_pages

    _print(ingest_with_pages(list(dirs), db, _progress, rebuild=True), as_json)


@db_group.command("columns")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "md"]), default="text", show_default=True,
              help="md: the list docs/results.md carries.")
@click.option("--update", "update", type=click.Path(dir_okay=False, exists=True), metavar="FILE",
              help="Rewrite the column list between FILE's two markers (docs/results.md) instead of printing.")
def columns_command(fmt: str, update: str | None) -> None:
    """The run table's declared columns: name, type, unit, group, meaning, release."""
    from engine.fsutil import atomic_write
    from results.read import columns

    if update:
        with open(update, encoding="utf-8") as f:
            text = f.read()
        try:
            new = columns.updated_doc(text)
        except ValueError as e:
            raise click.ClickException(f"{update}: {e}") from None
        atomic_write(update, new)
        click.echo(f"{update}: {'updated' if new != text else 'already up to date'}")
    elif fmt == "json":
        click.echo(json.dumps({"columns": [c.to_dict() for c in columns.COLUMNS]}, indent=2))
    elif fmt == "md":
        click.echo("\n".join(columns.iter_markdown()))
    else:
        for c in columns.COLUMNS:
            click.echo(f"{c.name:28} {c.type:6} {c.unit:12} {c.group}")


COMMANDS = (db_group,)
