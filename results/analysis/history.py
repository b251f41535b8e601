"""`bmoe-fleet history --db URL`: each device and model across engine releases, from the results
database alone; and the baseline `compare --db` takes from it (docs/decisions/history.md).

A release is one value of the run table's `engine` column (the version the engine reported, and
the bmoe-cli release bmoe-py claimed in it). Releases are ordered by the bmoe-cli release they
are (results.read.table.release_range; bmoe-py at its default claim is DEFAULT, 0.19.0), then by
their first run; an engine whose release is unknown comes after the known ones, by date.

Each release's row is what the recommendation of that release's runs alone says:
results.analysis.recommend.recommendations_from on analyze() of the table filtered to the device,
the model and the release. Nothing here judges a run itself: the ceiling is the auto line's, the
tok/s and hit % are the fixed budget's point, and the app verdict is the app rung and the app
text of that recommendation. One row per (device, model, top-k, other apps) and release.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from engine.contract.claim import DEFAULT
from engine.interface.releases import Release
from engine.safetext import printable
from results import formats
from results.analysis.analyze import analyze
from results.analysis.compare import U_TEST, Comparison, compare_tables
from results.analysis.recommend import recommendations_from
from results.db.load import stored_engines, stored_table
from results.errors import ResultsError
from results.read.columns import C
from results.read.run_keys import budget_label, load_text
from results.read.table import release_range
from store.versioned import json_safe

FORMAT = "bmoe-fleet.history"
FORMAT_VERSION = 1
Progress = Callable[[str], None]


def engine_release(engine: str) -> Release | None:
    """The bmoe-cli release an engine is, from the version it reported (the oldest it may be);
    bmoe-py without a claim speaks DEFAULT; None when unknown."""
    span = release_range(engine)
    if span is not None:
        return span[0]
    return DEFAULT if engine.startswith("bmoe-py") else None


def _first_run(rows: pd.DataFrame) -> float:
    starts = pd.to_numeric(rows[C.started_at], errors="coerce").dropna()
    return float(starts.min()) if len(starts) else math.inf


def release_order(table: pd.DataFrame) -> list[str]:
    """The engines of a run table in release order (module doc)."""
    keys = []
    for engine, rows in table.groupby(C.engine, sort=True):
        release = engine_release(str(engine))
        keys.append(((release is None, release or Release(0, 0), _first_run(rows), str(engine)), str(engine)))
    return [engine for _, engine in sorted(keys)]


def _date(epoch: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(epoch)) if math.isfinite(epoch) else ""


@dataclass(frozen=True)
class ReleaseRow:
    """One release of one (device, model, top-k, other apps): what its runs' recommendation says."""

    device: str
    model: str
    top_k: int | None
    apps: str
    engine: str                      # the run table's `engine`
    release: str                     # the bmoe-cli release it is ("" unknown)
    date: str                        # its first run's day (UTC)
    campaigns: tuple[str, ...]
    runs: int
    ceiling_mib: int | None          # the auto line's --cache-ceil-mb; None: cache off
    cache_off: bool
    fixed_mib: int | None            # the recommended fixed --cache-mb
    tok_s: float                     # the fixed budget's median tok/s
    tok_s_runs: int                  # how many runs that median is of
    hit_pct: float                   # the fixed budget's hit %
    app_rung_mb: int | None
    app_verdict: str                 # the app rung and the app's verdict in words, where it exists
    confidence: str
    summary: str

    def record(self) -> dict[str, Any]:
        """A row of csv, md and text."""
        return {"device": self.device, "model": self.model, "top_k": self.top_k, "apps": load_text(self.apps),
                "engine": self.engine, "release": self.release, "date": self.date, "runs": self.runs,
                "ceiling_mib": "cache off" if self.cache_off else self.ceiling_mib,
                "fixed_mib": budget_label(self.fixed_mib) if self.fixed_mib is not None else None,
                "tok_s": self.tok_s, "tok_s_runs": self.tok_s_runs, "hit_pct": self.hit_pct,
                "app": self.app_verdict, "confidence": self.confidence}


COLUMNS = ("device", "model", "top_k", "apps", "engine", "release", "date", "runs", "ceiling_mib", "fixed_mib",
           "tok_s", "tok_s_runs", "hit_pct", "app", "confidence")
_HEADERS = ("device", "model", "k", "other apps", "engine", "release", "first run", "runs", "ceiling MiB",
            "fixed", "tok/s", "of runs", "hit %", "app", "confidence")
_NUMERIC = ("top_k", "runs", "ceiling_mib", "tok_s", "tok_s_runs", "hit_pct")


@dataclass(frozen=True)
class History:
    rows: tuple[ReleaseRow, ...]

    def pairs(self) -> list[tuple[str, str]]:
        """The (device, model) pairs, in order."""
        return list(dict.fromkeys((r.device, r.model) for r in self.rows))

    def of(self, device: str, model: str) -> list[ReleaseRow]:
        return [r for r in self.rows if (r.device, r.model) == (device, model)]

    def releases(self, device: str, model: str) -> list[str]:
        """The engines measured on this device and model, in release order."""
        return list(dict.fromkeys(r.engine for r in self.of(device, model)))

    def to_dict(self) -> dict[str, Any]:
        return json_safe({"format": FORMAT, "version": FORMAT_VERSION,
                          "rows": [asdict(r) for r in self.rows]}, 4)


def render(h: History, fmt: str) -> str:
    """text, csv, json, jsonl or md."""
    if fmt == "json":
        return formats.to_json(h.to_dict())
    if fmt == "jsonl":
        return formats.to_jsonl(h.to_dict()["rows"])
    records = [r.record() for r in h.rows]
    if fmt == "csv":
        return formats.to_csv(records, COLUMNS)
    if fmt == "md":
        return formats.to_md(records, COLUMNS, _HEADERS, _NUMERIC)
    shown = [{k: printable(v) if isinstance(v, str) else v for k, v in r.items()} for r in records]
    return formats.to_text(shown, COLUMNS, _HEADERS, _NUMERIC)


def _app_verdict(rung: int | None, reason: str, app_text: str) -> str:
    parts = []
    if rung is not None:
        parts.append(f"app rung {budget_label(rung)}")
    if app_text and not app_text.endswith("not replayed"):
        parts.append(app_text)
    elif rung is None and reason and not reason.startswith("no app rung"):
        parts.append(reason)
    return "; ".join(parts)


def history_of(table: pd.DataFrame, progress: Progress | None = None) -> History:
    """Every device and model of a run table, one row per release and recommendation (module doc)."""
    rows: list[ReleaseRow] = []
    steps = [(d, m, e) for (d, m), sub in table.groupby([C.device, C.model], sort=True) for e in release_order(sub)]
    started = time.monotonic()
    for i, (device, model, engine) in enumerate(steps, 1):
        mine = table[(table[C.device] == device) & (table[C.model] == model) & (table[C.engine] == engine)]
        if progress is not None and time.monotonic() - started > 1.0:
            progress(f"history: [{i}/{len(steps)}] {device} {model} {engine}")
        release = engine_release(engine)
        for d in recommendations_from(analyze(mine)).devices:
            for rec in d.recommendations:
                fixed = rec.fixed
                rows.append(ReleaseRow(
                    device=rec.device, model=rec.model, top_k=rec.top_k, apps=rec.apps, engine=engine,
                    release=str(release) if release is not None else "", date=_date(_first_run(mine)),
                    campaigns=tuple(sorted(set(mine[C.campaign]))), runs=int(rec.evidence.get("runs", len(mine))),
                    ceiling_mib=rec.auto.cache_ceil_mb if rec.auto is not None else None, cache_off=rec.cache_off,
                    fixed_mib=fixed.cache_mb if fixed is not None else None,
                    tok_s=fixed.tok_s if fixed is not None else math.nan,
                    tok_s_runs=fixed.runs if fixed is not None else 0,
                    hit_pct=fixed.hit_pct if fixed is not None else math.nan,
                    app_rung_mb=rec.app_rung_mb,
                    app_verdict=_app_verdict(rec.app_rung_mb, rec.app_rung_reason, str(rec.lmk.get("app_text") or "")),
                    confidence=rec.confidence, summary=rec.summary))
    return History(tuple(rows))


def history(db: str | None, device: str | None = None, model: str | None = None,
            progress: Progress | None = None) -> History:
    """`bmoe-fleet history`: from the database alone (no campaign folder is read)."""
    h = history_of(stored_table(db, device, model), progress)
    if not h.rows:
        raise ResultsError("no recommendation can be made from these runs (none of the streamed runs finished or was killed)")
    return h


def site_history(db: str | None, table: pd.DataFrame, progress: Progress | None = None) -> History:
    """The history of the devices and models a site shows (its run `table`), from every campaign the
    database holds of them: only of those it holds more than one engine of, as only they get a
    history page (results.site.history_view.paged); the others' releases are not analysed."""
    engines = stored_engines(db)
    pairs = {p for p in zip(table[C.device], table[C.model]) if len(engines.get(p, ())) > 1}
    parts = [stored_table(db, d, m) for d, m in sorted(pairs)]
    return history_of(pd.concat(parts, ignore_index=True), progress) if parts else History(())


# ── compare against the previous release ───────────────────────────────────────────────────


def _only(values: Sequence[str], what: str, option: str) -> str:
    found = sorted(set(values))
    if len(found) != 1:
        raise ResultsError(f"{what} holds runs of {len(found)} engines ({', '.join(found)}): choose one with {option}")
    return found[0]


def baseline(db: str | None, campaign: str | Path | None = None, device: str | None = None,
             model: str | None = None, engine_b: str | None = None,
             engine_a: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame, str, str]:
    """(A's runs, B's runs, A's label, B's label) for `compare --db`: B is the campaign's runs (of
    `engine_b`), else the newest release's on `device` and `model`; A, for each device and model
    of B, the runs of the release before B's there (or of `engine_a`), from every campaign the
    database holds."""
    table = stored_table(db, device, model)
    if campaign is not None:
        where = str(Path(campaign).resolve())
        b = table[table[C.campaign_dir] == where]
        if not len(b):
            raise ResultsError(f"{campaign}: not in the database (bmoe-fleet db ingest {campaign} --db URL)"
                               + (" or no runs of that device and model" if device or model else ""))
        if engine_b is not None and not (b[C.engine] == engine_b).any():
            raise ResultsError(f"{campaign}: no runs of engine {engine_b!r} (engines there: "
                               f"{', '.join(sorted(set(b[C.engine])))})")
        engine = engine_b or _only(list(b[C.engine]), str(campaign), "--engine-b")
        b = b[b[C.engine] == engine]
        label_b = f"{campaign} ({engine})"
    else:
        if device is None or model is None:
            raise ResultsError("compare --db: give a campaign directory, or --device and --model")
        order = release_order(table)
        engine = engine_b or order[-1]
        if engine not in order:
            raise ResultsError(f"--engine-b {engine!r}: no runs of it on {device} {model} (engines: {', '.join(order)})")
        b = table[table[C.engine] == engine]
        label_b = f"{device} {model}: {engine}"
    parts, engines_a = [], []
    for (d, m), _ in b.groupby([C.device, C.model], sort=True):
        there = table[(table[C.device] == d) & (table[C.model] == m)]
        order = release_order(there)
        if engine_a is not None:
            if engine_a not in order:
                raise ResultsError(f"--engine-a {engine_a!r}: no runs of it on {d} {m} (engines: {', '.join(order)})")
            before = engine_a
        else:
            at = order.index(engine)
            if at == 0:
                raise ResultsError(f"{d} {m}: no release before {engine} in the database (engines there: "
                                   f"{', '.join(order)}): nothing to compare with")
            before = order[at - 1]
        parts.append(there[there[C.engine] == before])
        engines_a.append(before)
    a = pd.concat(parts, ignore_index=True)
    label_a = (f"the previous release ({', '.join(dict.fromkeys(engines_a))}: "
               f"{', '.join(sorted(set(a[C.campaign])))})")
    return a, b, label_a, label_b


def compare_release(db: str | None, campaign: str | Path | None = None, device: str | None = None,
                    model: str | None = None, engine_b: str | None = None, engine_a: str | None = None,
                    threshold_pct: float = 0.0) -> Comparison:
    """`compare --db URL [B]`: B against its baseline from the database, judged by the U test."""
    if not (threshold_pct >= 0 and math.isfinite(threshold_pct)):
        raise ResultsError(f"--threshold {threshold_pct:g}: give a percentage of 0 or more")
    a, b, label_a, label_b = baseline(db, campaign, device, model, engine_b, engine_a)
    return compare_tables(a, b, label_a, label_b, threshold_pct, U_TEST)
