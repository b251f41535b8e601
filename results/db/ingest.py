"""`bmoe-fleet db ingest` / `db rebuild`: campaign directories into the results database.

A campaign is keyed by its resolved directory, an attempt by campaign, cell id and attempt
number. Ingest lists the committed attempt folders (`runs/<cell>/<attempt>/` with its run.json:
the attempts the ledger recorded and the run table reads; a folder the runner never committed
is not one) and builds rows (results.read.table.run_row) only for attempts it has not seen, or
whose files changed since (their names, sizes and mtimes: a re-reconciled attempt is built again
and replaces its row), or all of a campaign's when its name or device and model records changed.
Its cost is its own campaign's attempts, never the database's size. Beside each row it keeps what
the report reads of the attempt's folder: its metrics CSV and samples (results.read.series) and its
run.json's bytes, so `report --db` reads no run folder. Attempts whose folder is gone
are deleted, and `latest` is set again for the campaign's cells.

Each campaign is written in one transaction, after its rows are built: a crash or Ctrl-C leaves
the database as it was before that campaign.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy import and_, bindparam, delete, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from results.db import schema
from results.errors import ResultsError
from results.read import columns as cols
from results.read import series as run_series
from results.read.columns import C
from results.read.parse_csv import parsed_once
from results.read.quality import read_output
from results.read.rundir import CampaignData, RunFolder, campaign_head
from results.read.table import ShapeCache, run_row
from store import outcomes
from store.campaign_dir import CampaignDir
from store.errors import StoreError

Progress = Callable[[str], None]
_KEY = (C.cell_id, C.attempt)


@dataclass(frozen=True)
class Ingested:
    """What one campaign's ingest did."""

    dir: str
    name: str
    added: int
    updated: int
    removed: int
    unchanged: int

    def to_dict(self) -> dict[str, Any]:
        return {"dir": self.dir, "name": self.name, "added": self.added, "updated": self.updated,
                "removed": self.removed, "unchanged": self.unchanged}

    @property
    def changed(self) -> bool:
        """Whether it added, updated or removed a run and the campaign still has runs (whose pages
        may have changed with them: results.site.run_pages.store_run_pages)."""
        return bool(self.added or self.updated or self.removed) and self.added + self.updated + self.unchanged > 0

    def text(self) -> str:
        return (f"{self.name} ({self.dir}): {self.added} added, {self.updated} updated, {self.removed} removed, "
                f"{self.unchanged} unchanged")


def _fingerprint(camp: CampaignData) -> str:
    doc = [camp.name, camp.imported, {k: dict(v) for k, v in camp.devices.items()},
           {k: dict(v) for k, v in camp.models.items()}]
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _attempts(root: Path) -> dict[tuple[str, int], tuple[Path, str]]:
    """{(cell, attempt): (folder, its files' fingerprint)} of the committed attempt folders
    (store.campaign_dir.CampaignDir.attempt_paths), none of their files read."""
    out: dict[tuple[str, int], tuple[Path, str]] = {}
    for cell, attempt, folder in CampaignDir(root).attempt_paths():
        files = sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(folder) if e.is_file())
        out[(cell, attempt)] = (folder, json.dumps(files))
    return out


def _db_value(column: cols.Column, value: Any, pg: bool, run_id: str) -> Any:
    """A row's value as its database column holds it."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    t = column.type
    if t == "value":
        return json.dumps(value)
    if t in cols.OBJECT_TYPES:
        return cols.as_text(column, value)          # the config and argv as JSON text
    if column.config_key:
        # a configuration column: the value as run.json has it, when it fits the declared type
        # (the `config` column keeps every key whatever its type)
        if cols.type_problem(column, value) is not None:
            return None
        if t == "json" and not isinstance(value, str):
            return json.dumps(value)
    if pg and isinstance(value, str) and "\x00" in value:
        raise ResultsError(f"{run_id}: {column.name} holds a NUL character, which PostgreSQL's text cannot store")
    if t == "float":
        return float(value)
    return value


def db_row(row: Mapping[str, Any], campaign_id: int, files: str, pg: bool, output: str | None = None) -> dict[str, Any]:
    """A run-table row as a `runs` row; `output`: what the run generated (an ok run's; JSON text)."""
    out: dict[str, Any] = {"campaign_id": campaign_id, "files": files, "output": output}
    run_id = str(row.get(C.run_id))
    for c in cols.STORED:
        out[c.name] = _db_value(c, row.get(c.name), pg, run_id)
    return out


def ingest_one(engine: Engine, root: str | Path, progress: Progress | None = None) -> Ingested:
    """One campaign directory into the database (module doc)."""
    head = campaign_head(root)
    on_disk = _attempts(head.root)
    fingerprint = _fingerprint(head)
    pg = engine.dialect.name == "postgresql"
    with engine.connect() as conn:
        camp_row = conn.execute(select(schema.campaigns).where(schema.campaigns.c.dir == str(head.root))).first()
        seen: dict[tuple[str, int], tuple[str, bool]] = {}
        if camp_row is not None:
            q = select(schema.runs.c.cell_id, schema.runs.c.attempt, schema.runs.c.files, schema.runs.c.latest) \
                .where(schema.runs.c.campaign_id == camp_row.id)
            seen = {(r.cell_id, int(r.attempt)): (r.files, bool(r.latest)) for r in conn.execute(q)}
    everything = camp_row is None or camp_row.fingerprint != fingerprint
    latest: dict[str, int] = {}
    for cell, attempt in on_disk:
        latest[cell] = max(attempt, latest.get(cell, 0))
    todo = [k for k, (_, files) in on_disk.items() if everything or k not in seen or seen[k][0] != files]
    gone = [k for k in seen if k not in on_disk]
    flips = [k for k in on_disk if k in seen and k not in todo and seen[k][1] != (k[1] == latest[k[0]])]
    shapes = ShapeCache()
    built: list[tuple[tuple[str, int], dict[str, Any], str | None, dict[str, bytes]]] = []
    for i, key in enumerate(todo, 1):
        path = on_disk[key][0]
        run = RunFolder(head.label, head.root, path, key[0], key[1], key[1] == latest[key[0]])
        try:
            _ = run.record                # read once, and checked against its folder (RunFolder.record)
        except StoreError:
            raise ResultsError(f"{path}: its run.json does not read as attempt {key[1]} of {key[0]}") from None
        camp = replace(head, runs=(run,))
        with parsed_once():              # its metrics CSV parsed once for the row and the kept series
            row = run_row(camp, run, shapes)
            series = run_series.read_series(path)
        built.append((key, row, read_output(run).to_json() if row.get(C.outcome) == outcomes.OK else None,
                      {"series": run_series.encode(series), "record": schema.packed(run.record_bytes())}))
        if progress is not None and (i % 200 == 0 or i == len(todo)):
            progress(f"db: {head.name}: built {i}/{len(todo)} runs")
    try:
        with engine.begin() as conn:
            campaign_id = _campaign_id(conn, head, fingerprint, camp_row)
            stale = [k for k in todo if k in seen] + gone
            for table in (schema.runs, schema.folders) if stale else ():
                conn.execute(delete(table).where(and_(
                    table.c.campaign_id == campaign_id, table.c.cell_id == bindparam("k_cell"),
                    table.c.attempt == bindparam("k_attempt"))),
                    [{"k_cell": c, "k_attempt": a} for c, a in stale])
            if built:
                conn.execute(schema.runs.insert(),
                             [db_row(row, campaign_id, on_disk[key][1], pg, output) for key, row, output, _ in built])
                conn.execute(schema.folders.insert(),
                             [{"campaign_id": campaign_id, C.cell_id: key[0], C.attempt: key[1], **folder}
                              for key, _, _, folder in built])
            if flips:
                conn.execute(update(schema.runs).where(and_(
                    schema.runs.c.campaign_id == campaign_id, schema.runs.c.cell_id == bindparam("k_cell"),
                    schema.runs.c.attempt == bindparam("k_attempt"))).values(latest=bindparam("k_latest")),
                    [{"k_cell": c, "k_attempt": a, "k_latest": a == latest[c]} for c, a in flips])
    except SQLAlchemyError as e:
        raise ResultsError(f"{schema.shown(str(engine.url))}: {head.root}: {schema._first_line(e)}") from None
    updated = sum(1 for k in todo if k in seen)
    return Ingested(str(head.root), head.name, len(todo) - updated, updated, len(gone),
                    len(on_disk) - len(todo))


def _campaign_id(conn: Connection, head: CampaignData, fingerprint: str, existing: Any) -> int:
    c = schema.campaigns
    values = {"name": head.name, "imported": head.imported, "fingerprint": fingerprint}
    if existing is not None:
        conn.execute(update(c).where(c.c.id == existing.id).values(**values))
        return int(existing.id)
    key = conn.execute(c.insert().values(dir=str(head.root), **values)).inserted_primary_key
    assert key is not None            # an insert into a table with a primary key
    return int(key[0])


def ingest(dirs: Sequence[str | Path], db: str | None, progress: Progress | None = None) -> list[Ingested]:
    """`bmoe-fleet db ingest`: each campaign directory, one transaction each."""
    if not dirs:
        raise ResultsError("give at least one campaign directory")
    engine = schema.connect(db)
    try:
        out = []
        for i, d in enumerate(dirs, 1):
            done = ingest_one(engine, d, progress)
            if progress is not None:
                progress(f"db: [{i}/{len(dirs)}] {done.text()}")
            out.append(done)
        return out
    finally:
        engine.dispose()


def store_pages(db: str | None, pages: Sequence[tuple[str, str, int, str, bytes]], code: str) -> None:
    """Run pages into the database, beside their runs' folders, in one transaction: each (campaign
    directory as ingested, cell id, attempt, the digest of its inputs, its HTML packed by
    schema.packed), made by `code` (results.site.run_pages). A run the database no longer
    holds is left out."""
    if not pages:
        return
    engine = schema.connect(db, create=False)
    f, c = schema.folders, schema.campaigns
    try:
        with engine.begin() as conn:
            ids = {str(row.dir): int(row.id) for row in conn.execute(select(c.c.id, c.c.dir))}
            conn.execute(update(f).where(and_(
                f.c.campaign_id == bindparam("k_campaign"), f.c.cell_id == bindparam("k_cell"),
                f.c.attempt == bindparam("k_attempt"))).values(
                    page_digest=bindparam("k_digest"), page_code=bindparam("k_code"), page=bindparam("k_page")),
                [{"k_campaign": ids[d], "k_cell": cell, "k_attempt": attempt, "k_digest": digest, "k_code": code,
                  "k_page": page} for d, cell, attempt, digest, page in pages if d in ids])
    except SQLAlchemyError as e:
        raise ResultsError(f"{schema.shown(str(engine.url))}: {schema._first_line(e)}") from None
    finally:
        engine.dispose()


def recorded_dirs(db: str | None) -> list[str]:
    """The campaign directories a database holds, in the order they were first ingested."""
    engine = schema.connect(db, create=False, check=False)
    try:
        with engine.connect() as conn:
            return [r.dir for r in conn.execute(select(schema.campaigns.c.dir).order_by(schema.campaigns.c.id))]
    except SQLAlchemyError:
        return []
    finally:
        engine.dispose()


def rebuild(dirs: Sequence[str | Path], db: str | None, progress: Progress | None = None) -> list[Ingested]:
    """`bmoe-fleet db rebuild`: the tables made again (for this schema) and DIRS ingested, or the
    directories the database held when none are given."""
    dirs = list(dirs) or recorded_dirs(db)
    if not dirs:
        raise ResultsError("give the campaign directories to rebuild from (the database records none)")
    for d in dirs:
        campaign_head(d)                      # refused before anything is dropped
    engine = schema.connect(db, check=False)
    try:
        schema.recreate(engine)
    finally:
        engine.dispose()
    return ingest(dirs, db, progress)
