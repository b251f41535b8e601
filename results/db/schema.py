"""The results database's tables, made from the declared run table (results/read/columns.py).

Four tables, through SQLAlchemy Core (docs/decisions/results-db.md):

- `campaigns`: one row per campaign directory ingested (its resolved path is its identity), its
  name, whether it was imported, and a fingerprint of the records its rows read (name, device and
  model records): when that changes, every run of the campaign is built again.
- `runs`: one row per attempt, keyed by campaign, cell id and attempt; a column per declared
  run-table column, of the declared type (`value` columns hold their JSON text), plus `files`,
  the attempt folder's file names, sizes and mtimes (a changed attempt is built again), and
  `output`, what an ok run generated (results.read.quality.RunOutput.to_json), from which the quality
  columns, which set a run against another of the table, are worked out when the table is read.
- `folders`: one row per `runs` row, what the report reads of the attempt's folder: its per-token
  metrics CSV and pressure samples (`series`: results.read.series.encode, every column, exact) and
  its run.json's bytes (`record`, zlib-compressed), so `report --db` reads no run folder
  (docs/decisions/report-speed.md); the names of its files are in `runs.files`. Beside them, the
  run's page as `db ingest` made it (`page`, zlib-compressed), the digest of the inputs it was made
  from (`page_digest`) and the code that made it (`page_code`): a report takes it when the page it
  would make has the same digest (results.site.run_pages, docs/decisions/stored-run-pages.md).
- `meta`: the schema's fingerprint; a database made for another run-table schema is refused until
  `bmoe-fleet db rebuild`.

NaN is stored as NULL (SQLite has no NaN); a float column's NULL reads back as NaN.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from pathlib import Path

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    create_engine,
    inspect,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.engine.url import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from engine.fsutil import fleet_home
from results.errors import ResultsError
from results.read import columns as cols
from results.read.columns import C
from results.read.series import FORMAT as SERIES_FORMAT

DB_FILE = "results.sqlite"
FORMAT = 4                       # the layout of the four tables (not the run table's columns)
_TYPES = {"int": BigInteger, "float": Float, "bool": Boolean, "text": Text, "json": Text, "value": Text, "config": Text,
          "args": Text}

metadata = MetaData()
campaigns = Table(
    "campaigns", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dir", Text, nullable=False, unique=True),
    Column("name", Text, nullable=False),
    Column("imported", Boolean, nullable=False),
    Column("fingerprint", Text, nullable=False),
)


def _attempt_key() -> tuple[Column, ...]:
    """An attempt's primary key: its campaign, cell id and attempt number."""
    return (Column("campaign_id", Integer, ForeignKey("campaigns.id", ondelete="CASCADE"), primary_key=True),
            Column(C.cell_id, Text, primary_key=True),
            Column(C.attempt, BigInteger, primary_key=True, autoincrement=False))


runs = Table(
    "runs", metadata, *_attempt_key(),
    Column("files", Text, nullable=False),
    Column("output", Text),
    *(Column(c.name, _TYPES[c.type]()) for c in cols.STORED if c.name not in (C.cell_id, C.attempt)),
)
Index("runs_device_model", runs.c.device, runs.c.model)
folders = Table(
    "folders", metadata, *_attempt_key(),
    Column("series", LargeBinary, nullable=False),
    Column("record", LargeBinary, nullable=False),
    Column("page_digest", Text),       # the digest of the run page's inputs (results.site.run_pages); NULL: none kept
    Column("page_code", Text),         # the code that made it (results.site.environment.code_fingerprint)
    Column("page", LargeBinary),       # its HTML, packed (packed)
)
meta = Table(
    "meta", metadata,
    Column("key", Text, primary_key=True),
    Column("value", Text, nullable=False),
)


def packed(raw: bytes) -> bytes:
    """Bytes as `folders` holds them (`record`: run.json's; `page`: a run page's, UTF-8)."""
    return zlib.compress(raw, 1)


def unpacked(data: bytes) -> bytes:
    """A `folders` column's bytes as they were packed (packed)."""
    return zlib.decompress(data)


def schema_fingerprint() -> str:
    """What the tables were made for: the layout and every declared column's name and type."""
    doc = [FORMAT, SERIES_FORMAT, [(c.name, c.type) for c in cols.COLUMNS]]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:16]


def default_url() -> str:
    """The embedded default: an SQLite file in this fleet's home, nothing to set up."""
    return f"sqlite:///{fleet_home() / DB_FILE}"


def resolve_url(db: str | None) -> str:
    """--db as a SQLAlchemy URL: none → the default file; a path → an SQLite file there;
    postgresql://… → PostgreSQL through psycopg (version 3); any other URL as given."""
    if not db:
        return default_url()
    if "://" not in db:
        return f"sqlite:///{Path(db).expanduser().resolve()}"
    if db.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + db.split("://", 1)[1]
    return db


def shown(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def connect(db: str | None, create: bool = True, check: bool = True) -> Engine:
    """An engine on the database (its tables made when `create` and missing); a database of another
    schema (unless not `check`: `db rebuild` remakes it), or one that cannot be reached, is one
    clear error."""
    url = resolve_url(db)
    try:
        parsed = make_url(url)
    except ArgumentError as e:
        raise ResultsError(f"--db {db}: not a database URL or path ({e})") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        folder = Path(parsed.database).parent
        if create:
            os.makedirs(folder, exist_ok=True)
        elif not Path(parsed.database).is_file():
            raise ResultsError(f"{parsed.database}: no results database there (bmoe-fleet db ingest DIR… --db "
                               f"{parsed.database} makes it)")
    try:
        engine = create_engine(url)
        with engine.begin() as conn:
            have = set(inspect(conn).get_table_names())
            if "meta" in have:
                found = conn.execute(select(meta.c.value).where(meta.c.key == "schema")).scalar()
                if check and found != schema_fingerprint():
                    raise ResultsError(f"{shown(url)}: made for another run-table schema ({found}, this bmoe-fleet's "
                                       f"is {schema_fingerprint()}): run `bmoe-fleet db rebuild --db {db or 'PATH'}`")
            elif create:
                metadata.create_all(conn)
                conn.execute(meta.insert(), [{"key": "schema", "value": schema_fingerprint()}])
            else:
                raise ResultsError(f"{shown(url)}: no results database there (bmoe-fleet db ingest makes it)")
    except ModuleNotFoundError as e:
        raise ResultsError(f"{shown(url)}: its driver is not installed ({e.name}): pip install 'psycopg[binary]'") \
            from None
    except SQLAlchemyError as e:
        raise ResultsError(f"{shown(url)}: {_first_line(e)}") from None
    return engine


def recreate(engine: Engine) -> None:
    """Drop the tables and make them again, empty, for this schema (`db rebuild`)."""
    with engine.begin() as conn:
        metadata.drop_all(conn)
        metadata.create_all(conn)
        conn.execute(meta.insert(), [{"key": "schema", "value": schema_fingerprint()}])


def _first_line(e: BaseException) -> str:
    text = str(getattr(e, "orig", None) or e).strip()
    return text.splitlines()[0] if text else type(e).__name__
