"""The rule for phones never measured, drawn from every device the results database holds
(`recommend --db`; docs/decisions/fleet-rule-db.md).

A device of the database is its name with what its runs report of it (kind, MemTotal): the same
name with another MemTotal (`local` on two hosts, one virtual profile changed) is another phone,
labelled with its MemTotal. A device whose kind or MemTotal cannot place a point
(fleet_rules.not_a_point) is listed as left out, with where its runs came from, before any of
its runs is read. Each other device counts by its newest release on each model (history's order,
results.analysis.history.release_order; every campaign of that release pooled): the recommendation
of those runs alone, and its default as device_default works it out (recommendations_from).
Older releases do not count: the rule is for the engine an app ships now, and a release that
changed what the engine holds in RAM makes its old ceilings another engine's.

The database is read in two steps (results.db.load): a few columns of every run, grouped
(run_groups), then whole rows of the chosen groups only (runs_of). Their speed is not predicted
(analyze's predictions_made): a ceiling never rests on a prediction, and predicting reads every
run's per-token file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from results.analysis.analyze import analyze
from results.analysis.fleet_rules import fleet_rules, not_a_point
from results.analysis.history import engine_release, release_order
from results.analysis.quality import QualityBound
from results.analysis.recommend import Verify, recommend, recommendations_from, rule_floors
from results.analysis.recommend_records import Recommendations
from results.db.load import run_groups, runs_of, stored_folders
from results.errors import ResultsError
from results.read.columns import C
from results.read.series import provided

_KEY = (C.device, C.device_kind, C.ram_total_kb)
NO_RUN = "no streamed run finished or was killed in its newest release: nothing to size from"


def _labels(row_keys: Sequence[tuple[Any, ...]]) -> dict[tuple[Any, ...], str]:
    """Each device key's label (`row_keys`: each group row's key): its name, with its kind and
    MemTotal where two keys share the name."""
    keys = list(dict.fromkeys(row_keys))
    out: dict[tuple[Any, ...], str] = {}
    for key in keys:
        name, kind, ram = key
        if sum(1 for k in keys if k[0] == name) == 1:
            out[key] = name
            continue
        mem = f"MemTotal {ram / 1024:,.0f} MiB" if isinstance(ram, float) and not math.isnan(ram) else "no MemTotal"
        label = f"{name} ({kind or 'unknown'}, {mem})"
        while label in out.values():
            label += "'"
        out[key] = label
    return out


def _key(row: Any) -> tuple[Any, ...]:
    ram = row[C.ram_total_kb]
    return (row[C.device], row[C.device_kind], math.nan if ram is None else float(ram))


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _mine(groups: pd.DataFrame, row_keys: Sequence[tuple[Any, ...]], key: tuple[Any, ...]) -> pd.DataFrame:
    return groups[[all(_same(a, b) for a, b in zip(k, key)) for k in row_keys]]


def provenance(groups: pd.DataFrame) -> dict[str, Any]:
    """Where a device's counted runs came from: the campaigns (their labels), the engines and the
    bmoe-cli releases they are, how many runs, and the sources of the imported ones (a community
    report's issue or text hash, an upstream file)."""
    engines = sorted(set(groups[C.engine]))
    releases = sorted({str(r) for r in map(engine_release, engines) if r is not None})
    return {"campaigns": sorted(set(groups[C.campaign])), "engines": engines, "releases": releases,
            "runs": int(groups["runs"].sum()),
            "reports": sorted({s for s, imp in zip(groups["source"], groups[C.imported]) if imp and s})}


def database_rules(db: str | None) -> dict[str, Any]:
    """The rule for phones never measured from every device the database holds (module doc), each
    point and each device left out with its provenance."""
    groups = run_groups(db)
    if not len(groups):
        raise ResultsError("no runs in the database (bmoe-fleet db ingest DIR… --db URL fills it)")
    row_keys = [_key(r) for r in groups.to_dict("records")]
    labels = _labels(row_keys)
    left_out: list[dict[str, Any]] = []
    chosen: list[pd.DataFrame] = []
    counted: dict[str, dict[str, Any]] = {}
    for key, label in labels.items():
        mine = _mine(groups, row_keys, key)
        why = not_a_point(key[1], key[2])
        if why is not None:
            left_out.append({"device": label, "reason": why, "provenance": provenance(mine)})
            continue
        newest = [mine[(mine[C.model] == m) & (mine[C.engine] == release_order(sub)[-1])]
                  for m, sub in mine.groupby(C.model, sort=True)]
        chosen += newest
        counted[label] = provenance(pd.concat(newest))
    table = runs_of(db, pd.concat(chosen) if chosen else groups.iloc[:0])
    devices = []
    if len(table):
        table[C.device] = [labels[_key(r)] for r in table[list(_KEY)].to_dict("records")]
        identities = {str(r[C.device]): {"kind": r[C.device_kind], "manufacturer": r[C.device_manufacturer],
                                         "model": r[C.device_model], "soc": r[C.device_soc],
                                         "android_release": r[C.android_release], "ram_total_kb": r[C.ram_total_kb]}
                      for r in table.drop_duplicates(C.device).to_dict("records")}
        analysis = analyze(table, predictions_made=False)
        devices = list(recommendations_from(analysis, (), identities).devices)
        floors = rule_floors(devices, {r[C.run_id]: r for r in analysis.table.to_dict("records")})
    else:
        floors = []
    sized = {d.device for d in devices}
    left_out += [{"device": label, "reason": NO_RUN, "provenance": p} for label, p in counted.items()
                 if label not in sized]
    rules = fleet_rules(devices, floors, counted, left_out)
    rules["unmeasured"]["drawn_from"] = {"campaigns": int(groups["campaign_id"].nunique()), "devices": len(labels)}
    return rules


def recommend_with_db(dirs: Sequence[str | Path], db: str, verify: Verify | None = None,
                      max_quality_loss: QualityBound | None = None,
                      table: pd.DataFrame | None = None) -> Recommendations:
    """`recommend --db URL [DIRS…]`: the recommendations of DIRS (their run `table` from the
    database, and the per-token series their predictions read, as `report --db` takes them: no
    run folder is read but the route traces the replay chooses), the rule for phones never
    measured from every device the database holds; no DIRS: the rule alone."""
    rules = database_rules(db)
    if not dirs:
        return Recommendations((), (), rules)
    series = stored_folders(db, zip(table[C.device], table[C.model]), records=False)[0] if table is not None else {}
    with provided(series):
        recs = recommend(dirs, None, verify, max_quality_loss, table)
    return replace(recs, rules=rules)

