"""The run table read back from the results database: the DataFrame `build_table` gives for the
same campaign directories (same columns in the same order, same dtypes, same rows in the same
order), so every output made from it is byte for byte the one made from the files.

Labels (`campaign`, and so `run_id`) are worked out for the campaigns asked, as
`read_campaigns` works them out (two of one name get their folder); the configuration columns
come from each row's `config` object, as `run_row` makes them (results/read/columns.py).
`stored_table` reads every campaign the database holds (of one device and model, when asked),
without any campaign folder: `history` and `compare --db`'s baseline (results.analysis.history);
`stored_engines` only which engines it holds of each device and model.
`stored_folders` gives what the run pages read of each run folder (its series, run.json and file
names) and `stored_campaigns` the campaigns with the table's runs, so `report --db` lists and reads
no run folder (results.site.report.build_site_from_db).
`run_groups` and `runs_of` read the database in two steps for the fleet rule
(results.analysis.fleet_db): a few columns of every run, grouped, then whole rows only of the
groups chosen from them.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import pandas as pd
from sqlalchemy import and_, func, or_, select
from sqlalchemy.exc import SQLAlchemyError

from results.db import schema
from results.errors import ResultsError
from results.read import columns as cols
from results.read import series as run_series
from results.read.columns import C
from results.read.quality import RunOutput, quality_columns
from results.read.rundir import CampaignData, RunFolder, StoredFolder, campaign_heads, campaign_labels
from results.read.series import RunSeries
from results.read.table import KEY_COLUMNS


def _floats(values: Sequence[Any]) -> list[float]:
    return np.array(values, dtype=float).tolist()          # None as NaN (numpy's conversion)


def _bools(values: Sequence[Any]) -> list[bool]:
    return [bool(v) for v in values]


def _maybe_bools(values: Sequence[Any]) -> list[bool | None]:
    return [None if v is None else bool(v) for v in values]


def _ints(values: Sequence[Any]) -> list[int]:
    return [int(v) for v in values]


def _text(v: Any) -> str:
    return "" if v is None else str(v)


def _texts(values: Sequence[Any]) -> list[str]:
    return [_text(v) for v in values]


def _decoder(c: cols.Column) -> Callable[[Sequence[Any]], list[Any]]:
    """A column's stored values (one per run) as run_row made them."""
    if c.type in cols.OBJECT_TYPES:
        return functools.partial(_objects, c)          # the config and argv objects the table holds
    if c.type == "float":
        return _floats
    if c.type == "bool":
        return _maybe_bools if c.nullable else _bools
    if c.type == "int":
        return _ints
    return _texts


def _objects(c: cols.Column, texts: Sequence[Any]) -> list[Any]:
    made: dict[Any, Any] = {}                          # runs of one configuration hold one (immutable) object
    out = []
    for text in texts:
        value = made.get(text, made)
        if value is made:
            value = made[text] = cols.from_text(c, text)
        out.append(value)
    return out


_FIXED = [(c.name, _decoder(c)) for c in cols.FIXED]
_AFTER = [(c.name, _decoder(c)) for c in cols.AFTER_CONFIG]
_AFTER_NAMES = [name for name, _ in _AFTER]
_BEFORE_CONFIG = [*(c.name for c in cols.FIXED), C.campaign, C.run_id]    # a row's keys before its config's
_IDS_AT_ONCE = 900               # campaign ids per query (SQLite's oldest limit on parameters is 999)


@functools.cache
def _config_columns(keys: tuple[str, ...]) -> tuple[str, ...]:
    """The columns of a config's keys (sorted), as run_row names them after the fixed ones."""
    taken = set(_BEFORE_CONFIG)
    out = []
    for key in keys:
        column = cols.config_column(key, taken)
        taken.add(column)
        out.append(column)
    return tuple(out)


def _config_items(config: Any) -> tuple[tuple[str, Any], ...]:
    """A config's columns and values, as run_row puts them in its row."""
    items = sorted(config.to_dict().items())
    names = _config_columns(tuple(k for k, _ in items))
    return tuple((name, json.dumps(value) if isinstance(value, (list, dict)) else value)
                 for name, (_, value) in zip(names, items))


def run_table(dirs: Sequence[str | Path], db: str | None) -> pd.DataFrame:
    """The run table of campaign directories DIRS, as ingested into the database."""
    if not dirs:
        raise ResultsError("give at least one campaign directory")
    engine = schema.connect(db, create=False)
    c = schema.campaigns
    try:
        with engine.connect() as conn:
            found = {row.dir: row for row in conn.execute(select(c))}
            wanted = []
            for d in dirs:
                key = str(Path(d).resolve())
                if key not in found:
                    raise ResultsError(f"{d}: not in the database {schema.shown(str(engine.url))} (bmoe-fleet db "
                                       f"ingest {d} --db URL)")
                wanted.append(found[key])
            rows = _rows_of(conn, wanted)
    except SQLAlchemyError as e:
        raise ResultsError(f"{schema.shown(str(engine.url))}: {schema._first_line(e)}") from None
    finally:
        engine.dispose()
    if not rows:
        raise ResultsError("no runs in " + ", ".join(str(w.dir) for w in wanted))
    return _framed(rows)


def stored_table(db: str | None, device: str | None = None, model: str | None = None) -> pd.DataFrame:
    """The run table of every campaign the database holds (labelled as `run_table` labels them
    all at once), only the runs of `device` and `model` when given: no campaign folder is read. An
    empty database, or a device or model it has no run of, is one clear error naming what it has."""
    engine = schema.connect(db, create=False)
    c, r = schema.campaigns, schema.runs
    where = schema.shown(str(engine.url))
    try:
        with engine.connect() as conn:
            pairs = sorted({(x.device, x.model) for x in conn.execute(select(r.c.device, r.c.model).distinct())})
            if not pairs:
                raise ResultsError(f"{where}: no runs in the database (bmoe-fleet db ingest DIR… --db URL fills it)")
            for name, asked, have in (("device", device, {d for d, _ in pairs}),
                                      ("model", model, {m for d, m in pairs if device is None or d == device})):
                if asked is not None and asked not in have:
                    raise ResultsError(f"{name} {asked!r}: no runs of it in {where}"
                                       + (f" on {device!r}" if name == "model" and device is not None else "")
                                       + f" ({name}s there: {', '.join(sorted(have))})")
            camps = list(conn.execute(select(c).order_by(c.c.id)))
            rows = _rows_of(conn, camps, device, model)
    except SQLAlchemyError as e:
        raise ResultsError(f"{where}: {schema._first_line(e)}") from None
    finally:
        engine.dispose()
    return _framed(rows)


def stored_engines(db: str | None) -> dict[tuple[str, str], set[str]]:
    """The engines the database holds runs of, per (device, model): one query, no run row built."""
    engine = schema.connect(db, create=False)
    r = schema.runs
    out: dict[tuple[str, str], set[str]] = {}
    try:
        with engine.connect() as conn:
            for x in conn.execute(select(r.c.device, r.c.model, r.c.engine).distinct()):
                out.setdefault((_text(x.device), _text(x.model)), set()).add(_text(x.engine))
    except SQLAlchemyError as e:
        raise ResultsError(f"{schema.shown(str(engine.url))}: {schema._first_line(e)}") from None
    finally:
        engine.dispose()
    return out


def _rows_of(conn: Any, camps: Sequence[Any], device: str | None = None, model: str | None = None) \
        -> list[tuple[Any, str]]:
    """The `runs` rows of these `campaigns` rows, each with its campaign's label among them all."""
    labels = campaign_labels([w.name for w in camps], [w.dir for w in camps])
    r = schema.runs
    found: dict[int, list[Any]] = {int(c.id): [] for c in camps}
    ids = list(found)
    for at in range(0, len(ids), _IDS_AT_ONCE):       # one query for many campaigns, not one each
        q = _where(select(r).where(r.c.campaign_id.in_(ids[at:at + _IDS_AT_ONCE])), device=device, model=model)
        for x in conn.execute(q):
            found[int(x.campaign_id)].append(x)
    rows: list[tuple[Any, str]] = []
    for camp, label in zip(camps, labels):
        rows += [(x, label) for x in sorted(found[int(camp.id)], key=lambda x: (x.cell_id, x.attempt))]
    return rows


def _selected(conn: Any, campaign_id: int, label: str, **where: str | None) -> list[tuple[Any, str]]:
    """The `runs` rows of one campaign whose columns equal `where` (a None value: any), with its label."""
    r = schema.runs
    q = _where(select(r).where(r.c.campaign_id == campaign_id), **where)
    return [(x, label) for x in sorted(conn.execute(q), key=lambda x: (x.cell_id, x.attempt))]


def _where(q: Any, **where: str | None) -> Any:
    """`q` narrowed to the runs whose columns equal `where` (a None value: any)."""
    r = schema.runs
    for name, value in where.items():
        if value == "":                  # a text column reads back NULL as "" (_text)
            q = q.where(or_(r.c[name] == value, r.c[name].is_(None)))
        elif value is not None:
            q = q.where(r.c[name] == value)
    return q


# what run_groups reads of every run: the keys of a group and what tells its device and provenance
GROUP_COLUMNS = (C.device, C.model, C.engine, C.engine_release, C.device_kind, C.device_manufacturer, C.device_model,
                 C.device_soc, C.android_release, C.ram_total_kb, "source")


def run_groups(db: str | None) -> pd.DataFrame:
    """One row per campaign and distinct GROUP_COLUMNS in the database: those columns, `campaign_id`,
    `campaign` (labelled as `stored_table` labels it), `imported`, `runs` and `started_at` (the
    first run's). Only these columns are read; no run row is built."""
    engine = schema.connect(db, create=False)
    c, r = schema.campaigns, schema.runs
    keys = [r.c[name] for name in GROUP_COLUMNS]
    try:
        with engine.connect() as conn:
            camps = list(conn.execute(select(c).order_by(c.c.id)))
            labels = dict(zip([w.id for w in camps], campaign_labels([w.name for w in camps], [w.dir for w in camps])))
            imported = {w.id: bool(w.imported) for w in camps}
            got = list(conn.execute(select(r.c.campaign_id, *keys, func.count().label("runs"),
                                           func.min(r.c.started_at).label(C.started_at))
                                    .group_by(r.c.campaign_id, *keys)))
    except SQLAlchemyError as e:
        raise ResultsError(f"{schema.shown(str(engine.url))}: {schema._first_line(e)}") from None
    finally:
        engine.dispose()
    out = pd.DataFrame([dict(x._mapping) for x in got],
                       columns=["campaign_id", *GROUP_COLUMNS, "runs", C.started_at])
    out[C.campaign] = [labels[i] for i in out["campaign_id"]]
    out[C.imported] = [imported[i] for i in out["campaign_id"]]
    out[C.ram_total_kb] = _floats(out[C.ram_total_kb])
    out[C.started_at] = _floats(out[C.started_at])
    for name in GROUP_COLUMNS:
        if name != C.ram_total_kb:
            out[name] = _texts(out[name])
    return out.sort_values(["campaign_id", *GROUP_COLUMNS], kind="stable").reset_index(drop=True)


def runs_of(db: str | None, groups: pd.DataFrame) -> pd.DataFrame:
    """The run table of these `run_groups` rows (their campaign, device, model and engine), framed as
    `build_table` frames it; an empty frame when no group is given."""
    if not len(groups):
        return pd.DataFrame()
    engine = schema.connect(db, create=False)
    try:
        with engine.connect() as conn:
            rows: list[tuple[Any, str]] = []
            wanted = groups[["campaign_id", C.campaign, C.device, C.model, C.engine]].drop_duplicates()
            for g in wanted.itertuples(index=False):
                rows += _selected(conn, int(g.campaign_id), str(g.campaign), device=g.device, model=g.model,
                                  engine=g.engine)
    except SQLAlchemyError as e:
        raise ResultsError(f"{schema.shown(str(engine.url))}: {schema._first_line(e)}") from None
    finally:
        engine.dispose()
    return _framed(rows)


def _framed(got: Sequence[tuple[Any, str]]) -> pd.DataFrame:
    """`runs` rows (with their campaigns' labels) as `build_table` frames them, with their quality
    columns. Decoded a column at a time, then framed as build_table frames its `run_row` dicts:
    the same values in the same columns (a config's columns after the fixed ones, a column first
    met in a later run at the end, a run without it NaN), so pandas makes the same dtypes."""
    if not got:
        return _with_quality(pd.DataFrame([]), {})
    fields = list(got[0][0]._fields)
    stored = dict(zip(fields, zip(*(x for x, _ in got))))
    labels = [label for _, label in got]
    data: dict[str, list[Any]] = {name: decode(stored[name]) for name, decode in (*_FIXED, *_AFTER)}
    data[C.campaign] = labels
    data[C.run_id] = [f"{label}/{cell}/{attempt}" for label, cell, attempt in zip(labels, data[C.cell_id],
                                                                                  data[C.attempt])]
    made: dict[int, tuple[tuple[str, Any], ...]] = {}               # one config object: one set of items
    items = [made.get(id(config)) or made.setdefault(id(config), _config_items(config)) for config in data[C.config]]
    order = dict.fromkeys(_BEFORE_CONFIG)
    for config_names in dict.fromkeys(tuple(name for name, _ in i) for i in items):
        order.update(dict.fromkeys([*config_names, *_AFTER_NAMES]))     # pandas' order: first met, run by run
    config = [name for name in order if name not in data]          # (an after-config column's value wins)
    at = {name: i for i, name in enumerate(config)}
    values = [[math.nan] * len(got) for _ in config]
    for i, row_items in enumerate(items):
        for name, value in row_items:
            if name in at:
                values[at[name]][i] = value
    data.update(zip(config, values))
    names = list(order)
    frame = pd.DataFrame(list(zip(*(data[name] for name in names))), columns=names)
    # each run against a lossless run of the same question, from the outputs the database kept (as
    # results.read.table.build_table does from the run folders)
    outputs = {run_id: RunOutput.from_json(text) for run_id, text in zip(data[C.run_id], stored["output"])}
    return _with_quality(frame, outputs)


def _with_quality(frame: pd.DataFrame, outputs: Mapping[str, RunOutput]) -> pd.DataFrame:
    frame = quality_columns(frame, {k: v for k, v in outputs.items() if v.known})
    rest = [col for col in frame.columns if col not in KEY_COLUMNS]
    frame = frame[list(KEY_COLUMNS) + rest]
    return frame.sort_values([C.campaign, C.device, C.model, C.order, C.attempt], kind="stable").reset_index(drop=True)


R = TypeVar("R")
V = TypeVar("V")


class _Stored(Mapping[str, V], Generic[R, V]):
    """Run folder → what the database keeps of it, unpacked when asked for; kept unpacked when
    `keep` (the series: a prediction reads some again), else only the last one asked for (the
    records: a page asks for its record and its files' names twice each, one after the other, and
    keeping them all held every run's record in each process)."""

    def __init__(self, raw: dict[str, R], unpack: Callable[[R], V], keep: bool) -> None:
        self._raw, self._unpack, self._keep = raw, unpack, keep
        self._done: dict[str, V] = {}

    def __getitem__(self, key: str) -> V:
        if key in self._done:
            return self._done[key]
        value = self._unpack(self._raw[key])
        if not self._keep:
            self._done.clear()
        self._done[key] = value
        return value

    def raw(self, key: str) -> R | None:
        """What the database holds of a run folder as it holds it (the series' bytes:
        results.read.series.fingerprint), None when it holds nothing of it."""
        return self._raw.get(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


def _folder(stored: tuple[bytes, str]) -> StoredFolder:
    record, files = stored
    return StoredFolder(schema.unpacked(record), tuple(f[0] for f in json.loads(files)))


def _folder_rows(db: str | None, columns: Sequence[Any], pairs: Iterable[tuple[str, str]],
                 dirs: Sequence[str | Path] | None, *where: Any) -> Iterator[Any]:
    """`columns` of each run of these (device, model) pairs (only of the campaign directories
    `dirs`, when given) joined with its `folders` row, where `where` holds."""
    engine = schema.connect(db, create=False)
    r, f = schema.runs, schema.folders
    of_dirs = [] if dirs is None else [r.c.campaign_id.in_(select(schema.campaigns.c.id).where(
        schema.campaigns.c.dir.in_([str(Path(d).resolve()) for d in dirs])))]
    try:
        with engine.connect() as conn:
            for device, model in sorted(set(pairs)):
                yield from conn.execute(select(*columns).join(f, and_(
                    f.c.campaign_id == r.c.campaign_id, f.c.cell_id == r.c.cell_id, f.c.attempt == r.c.attempt))
                    .where(r.c.device == device, r.c.model == model, *of_dirs, *where))
    except SQLAlchemyError as e:
        raise ResultsError(f"{schema.shown(str(engine.url))}: {schema._first_line(e)}") from None
    finally:
        engine.dispose()


def stored_folders(db: str | None, pairs: Iterable[tuple[str, str]], records: bool = True,
                   dirs: Sequence[str | Path] | None = None) \
        -> tuple[Mapping[str, RunSeries], Mapping[str, StoredFolder]]:
    """What the database keeps of every run folder of these (device, model) pairs (only of the
    campaign directories `dirs`, when given), by run folder: its metrics CSV and samples
    (results.read.series.provided answers from them) and its run.json and file names
    (results.read.rundir.provided_folders answers from them); without `records`, the series alone
    (the second store empty: `recommend --db` reads no run.json)."""
    r, f = schema.runs, schema.folders
    series: dict[str, bytes] = {}
    folders: dict[str, tuple[bytes, str]] = {}
    for row in _folder_rows(db, [r.c.run_dir, f.c.series, *((r.c.files, f.c.record) if records else ())], pairs, dirs):
        series[str(row.run_dir)] = bytes(row.series)
        if records:
            folders[str(row.run_dir)] = (bytes(row.record), row.files)
    return _Stored(series, run_series.decode, keep=True), _Stored(folders, _folder, keep=False)


def stored_pages(db: str | None, pairs: Iterable[tuple[str, str]],
                 dirs: Sequence[str | Path] | None = None) -> dict[str, tuple[str, bytes]]:
    """The run pages the database keeps of every run of these (device, model) pairs (only of the
    campaign directories `dirs`, when given), by run folder: the digest of the inputs each was made
    from and its HTML, packed (schema.unpacked)."""
    f = schema.folders
    return {str(row.run_dir): (str(row.page_digest), bytes(row.page)) for row in _folder_rows(
        db, [schema.runs.c.run_dir, f.c.page_digest, f.c.page], pairs, dirs, f.c.page.is_not(None))}


def page_digests(db: str | None, pairs: Iterable[tuple[str, str]],
                 dirs: Sequence[str | Path] | None = None) -> dict[str, str]:
    """stored_pages' digests alone, by run folder (what an ingest compares, without the pages)."""
    f = schema.folders
    return {str(row.run_dir): str(row.page_digest) for row in _folder_rows(
        db, [schema.runs.c.run_dir, f.c.page_digest], pairs, dirs, f.c.page.is_not(None))}


def unpaged_dirs(db: str | None, code: str) -> list[str]:
    """The campaign directories the database holds a run of whose page it lacks, or keeps as
    other code made it (`code`: results.site.environment.code_fingerprint), in the order they were
    first ingested."""
    engine = schema.connect(db, create=False)
    c, f = schema.campaigns, schema.folders
    try:
        with engine.connect() as conn:
            q = select(c.c.id, c.c.dir).where(c.c.id.in_(select(f.c.campaign_id).where(
                or_(f.c.page.is_(None), f.c.page_code.is_(None), f.c.page_code != code)))).order_by(c.c.id)
            return [str(row.dir) for row in conn.execute(q)]
    except SQLAlchemyError as e:
        raise ResultsError(f"{schema.shown(str(engine.url))}: {schema._first_line(e)}") from None
    finally:
        engine.dispose()


def stored_campaigns(dirs: Sequence[str | Path], table: pd.DataFrame) -> list[CampaignData]:
    """The campaigns of `run_table(dirs, db)`: each directory's name and device and model records
    read from it (results.read.rundir.campaign_heads), its runs the table's (the database's: an
    attempt folder is runs/<cell>/<attempt> of its campaign's directory), so no run folder is
    listed. A directory whose label is not its runs' (renamed since it was ingested) is one clear
    error."""
    heads = campaign_heads(dirs)
    found: dict[Path, list[RunFolder]] = {h.root: [] for h in heads}
    for label, run_dir, cell, attempt, latest in zip(table[C.campaign], table[C.run_dir], table[C.cell_id],
                                                    table[C.attempt], table[C.latest]):
        path = Path(run_dir)
        root = path.parents[2]
        if root in found:
            found[root].append(RunFolder(str(label), root, path, str(cell), int(attempt), bool(latest)))
    out = []
    for head, d in zip(heads, dirs):
        stale = sorted({r.campaign for r in found[head.root]} - {head.label})
        if stale:
            raise ResultsError(f"{d}: labelled {head.label!r} now, not {stale[0]!r} as the "
                               f"results database has it (renamed since it was ingested: bmoe-fleet db ingest {d} "
                               f"--db URL)")
        out.append(replace(head, runs=tuple(sorted(found[head.root], key=lambda r: (r.cell_id, r.attempt)))))
    return out
