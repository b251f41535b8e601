"""The site's page contexts (results.site.pages) built from the analysis, the run table and the
recommendations: a device page, a model page, a run page, the index.

Strings from devices stay data here (the templates escape them); every string a page publishes
that could hold a host path goes through the Redactor (results.publish).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from engine.units import MIB
from results.analysis.analyze import Analysis, BudgetPoint, GroupAnalysis, Replay
from results.analysis.recommend_records import Recommendation, Recommendations
from results.analysis.tells import Tell
from results.numbers import is_missing
from results.publish import Redactor
from results.read.columns import C
from results.read.frames import row_views
from results.read.run_keys import load_text
from results.read.rundir import CampaignData, RunFolder
from results.read.series import fingerprint as series_fingerprint
from results.read.series import run_series
from results.read.tokens import PUBLISH_MIN_REPEATS, PUBLISHED_MIN_TOKENS
from results.read.turns import demand_hit_pct, gap_rereads, gap_taken
from results.site import charts
from results.site.pages import (
    CampaignRow,
    Chart,
    DeviceCard,
    DevicePage,
    GroupView,
    IndexPage,
    Link,
    ModelPage,
    PointRow,
    RecRow,
    RunPage,
    TurnRow,
)
from results.site.quality_view import quality_views
from results.site.site_format import Urls, fmt_celsius, fmt_kb, fmt_mib, fmt_num, fmt_pct, fmt_time, human_text
from store.outcomes import OK
from store.run_record import SCALARS, thawed

RecsByKey = Mapping[tuple[str, str, int | None, str], Recommendation]      # (device, model, top-k, apps)


class Ids:
    """Chart ids, unique within a page (each page has its own: a page depends on no other)."""

    def __init__(self) -> None:
        self.n = 0

    def next(self) -> str:
        """The next unused chart id."""
        self.n += 1
        return f"fig-{self.n}"


def _rec_row(r: Recommendation, root: str) -> RecRow:
    replay = ""
    if r.replay is not None:
        c = r.replay
        parts = []
        if c.predicted_hit_pct_at_fixed is not None and r.fixed is not None and r.fixed.cache_mb > 0:
            measured = f" (measured {c.measured_hit_pct_at_fixed:.1f} %)" if c.measured_hit_pct_at_fixed is not None \
                else ""
            parts.append(f"replayed LRU predicts {c.predicted_hit_pct_at_fixed:.1f} % hit at {r.fixed.cache_mb} MiB"
                         f"{measured}")
        if c.predicted_hit_pct_at_ceiling is not None and r.auto is not None:
            parts.append(f"{c.predicted_hit_pct_at_ceiling:.1f} % at the {r.auto.cache_ceil_mb} MiB ceiling")
        if c.knee_mib is not None:
            parts.append(f"knee {c.knee_mib:g} MiB")
        replay = "; ".join(parts)
    ev = r.evidence
    evidence = (f"{ev['runs']} runs; {ev['repeats_at_largest_safe']} at the largest safe budget, spread "
                f"{ev['spread_pct_at_largest_safe']:.0f} %" + (f"; not higher: {'; '.join(r.confidence_reasons)}"
                                                              if r.confidence_reasons else ""))
    verified = "; ".join(f"{name} {v['status']}" + (f" ({v['line']})" if v.get("line") else "")
                         for name, v in (r.verification or {}).items())
    return RecRow(
        device=Link(r.device, root + Urls.device(r.device)), model=Link(r.model, root + Urls.model(r.model)),
        top_k=str(r.top_k) if r.top_k is not None else "default", cycle=fmt_mib(r.cycle_mib) + (
            f" ({r.cycle_source})" if r.cycle_source else ""),
        fixed=shlex.join(r.fixed.argv) if r.fixed else "—", auto=shlex.join(r.auto.argv) if r.auto else "—",
        dense=f"--dense-weights {r.dense_mode}" if r.dense_mode else "—", confidence=r.confidence,
        summary=r.summary, reason=r.reason, cache_off=r.cache_off, replay=replay, evidence=evidence,
        verified=verified)


def publish_shortfall(run_ids: Sequence[str], table: pd.DataFrame) -> str:
    """Why the runs of one budget point fall short of `sweep --preset publish` (docs/method.md rules 5
    and 8: >= 256 tokens, >= 3 repeats, a reverse pass), or "" when they meet it."""
    mine = table[table[C.run_id].isin(list(run_ids))]
    if not len(mine):
        return ""
    missing = []
    tokens = pd.to_numeric(mine[C.tokens], errors="coerce")
    ok_tokens = tokens[mine[C.outcome] == OK]
    if len(ok_tokens) and ok_tokens.min() < PUBLISHED_MIN_TOKENS:
        missing.append(f"{ok_tokens.min():.0f} tokens < {PUBLISHED_MIN_TOKENS}")
    if len(mine) < PUBLISH_MIN_REPEATS:
        missing.append(f"{len(mine)} run{'s' if len(mine) != 1 else ''} < {PUBLISH_MIN_REPEATS}")
    if C.pass_ in mine.columns and mine[C.pass_].nunique() < 2:
        missing.append("no reverse pass")
    return ("below the publish bar: " + ", ".join(missing)) if missing else ""


def _point_row(p: BudgetPoint, root: str, table: pd.DataFrame) -> PointRow:
    runs = f"{p.ok}/{p.runs} ok" + (f", {p.killed} killed" if p.killed else "")
    tok = "—" if is_missing(p.tok_s) else (f"{fmt_num(p.tok_s)} ({fmt_num(p.tok_s_min)}–{fmt_num(p.tok_s_max)})"
                                     if p.ok > 1 else fmt_num(p.tok_s))
    outcome = dict(zip(table[C.run_id], table[C.outcome]))
    links = tuple(Link(f"r{i + 1}", root + Urls.run(rid), f"{rid}: {outcome.get(rid, '')}")
                  for i, rid in enumerate(p.run_ids))
    return PointRow(p.series, p.label, runs, fmt_pct(p.hit_pct), tok, fmt_num(p.s_per_token), fmt_kb(p.mem_avail_floor_kb),
                    f"under the cycle: {p.advice}" if p.under_cycle else "", links, publish_shortfall(p.run_ids, table),
                    _unfilled(p), f"{p.fought}: not counted as safe" if p.fought else "", _predicted_text(p))


def _predicted_text(p: BudgetPoint) -> str:
    """The predicted s/token at the point's budget and its error against the measured median."""
    if is_missing(p.predicted_s_per_tok):
        return ""
    error = p.prediction_error_pct
    return fmt_num(p.predicted_s_per_tok) + ("" if is_missing(error) else f" ({error:+.0f} %)") \
        + (", the prediction's anchor" if p.anchor else "")


def _unfilled(p: BudgetPoint) -> str:
    """Why a budget that survived is not counted as safe (results.analysis.analyze's filled), or ""."""
    if p.filled or not p.ok:
        return ""
    return f"cache never filled (held {p.held_mib:.3g} MiB): not counted as safe"


def _drawable(figure: Mapping[str, Any]) -> bool:
    """A budget figure with at least one point: a group whose runs all failed has none."""
    return any(t.get("x") for t in figure["data"])


def _replay_text(r: Replay) -> str:
    return (f"replayed LRU from run {r.run_id}: knee {fmt_mib(r.knee_mib)}, first decode hit at "
            f"{fmt_mib(r.first_decode_hit_mib)}")


def _group_view(g: GroupAnalysis, rec: Recommendation | None, ids: Ids, table: pd.DataFrame) -> GroupView:
    root = "../"
    k = f"top-k {g.top_k}" if g.top_k is not None else "default top-k"
    replay = _replay_text(g.replay) if g.replay is not None else ""
    figure = charts.budget_figure(g, rec)
    # the group's runs: each point looks up its own among them, not among the whole table's
    table = table[table[C.run_id].isin({rid for p in (*g.points, *g.baselines) for rid in p.run_ids})]
    return GroupView(
        heading=f"{g.model} · {k}" + (f" · {load_text(g.apps)}" if g.apps else ""),
        model=Link(g.model, root + Urls.model(g.model)),
        chart=Chart(ids.next(), figure,
                    "hit % (top) and tok/s (bottom) against the cache budget; diamonds are auto budgets (a killed "
                    "auto run sits at the budget it was sized to); the shaded band is under the token cycle, where "
                    "--cache-mb 0 is strictly better; the recommended ceiling and fixed budget are marked")
        if _drawable(figure) else None,
        points=tuple(_point_row(p, root, table) for p in g.points),
        baselines=tuple(_point_row(p, root, table) for p in g.baselines),
        cycle=fmt_mib(g.cycle_mib) + (f" ({g.cycle_source})" if g.cycle_source else ""),
        boundary=g.boundary.text(), dense=g.dense.text(), replay=replay, tells=tuple(t.message for t in g.tells),
        recommendation=_rec_row(rec, root) if rec else None, planner=tuple(p.text() for p in g.planner),
        adb_verdict=g.boundary.adb_text() if g.boundary.app_replayed else "",
        app_verdict=g.boundary.app_text() if g.boundary.app_replayed else "")


def _identity(name: str, camps: Sequence[CampaignData], table: pd.DataFrame) -> tuple[tuple[str, str], ...]:
    rec: Mapping[str, Any] = next((c.devices[name] for c in camps if name in c.devices), {})
    rows = [("device", name), ("kind", str(rec.get("kind") or "—"))]
    if rec.get("first_seen_at"):
        rows.append(("first seen", fmt_time(rec.get("first_seen_at"))))
    for key, label in (("serial", "serial"), ("manufacturer", "manufacturer"), ("model", "model"), ("soc", "SoC"),
                       ("abi", "ABI"), ("android_release", "Android"), ("sdk", "SDK"), ("kernel", "kernel")):
        if rec.get(key) not in (None, ""):
            rows.append((label, str(rec[key])))
    if rec.get("ram_total_kb"):
        rows.append(("RAM", f"{rec['ram_total_kb'] / 1024:,.0f} MiB ({rec['ram_total_kb'] / 1024 / 1024:.2f} GiB)"))
    if rec.get("swap_total_kb") is not None:
        rows.append(("swap", fmt_kb(rec.get("swap_total_kb"))))
    mine = table[table[C.device] == name]
    rows.append(("runs", f"{len(mine)} in {mine[C.campaign].nunique()} campaign(s)"))
    rows.append(("engines", ", ".join(sorted(set(mine[C.engine])))))
    return tuple(rows)


def _kv(mapping: Mapping[str, Any] | None, skip: Sequence[str] = (), redactor: Redactor | None = None,
        human: bool = False) -> tuple[tuple[str, str], ...]:
    if not mapping:
        return ()
    out = []
    for k, v in mapping.items():         # (a record's read-only mapping: only its nested values thawed)
        if k in skip:
            continue
        if type(v) not in SCALARS:
            v = thawed(v)
        if human:
            key, text = human_text(str(k), v)
        else:
            key, text = str(k), (json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else fmt_num(v)
                                 if isinstance(v, float) else str(v))
        out.append((key, redactor.text(text) if redactor is not None else text))
    return tuple(out)


def run_page(run: RunFolder, row: Mapping[str, Any], tells: Sequence[Tell], ids: Ids,
             redactor: Redactor | None = None) -> RunPage:
    """One run's page: its outcome and evidence, argv, distribution, per-token and memory charts
    (`tells`: the run's, results.analysis.analyze.tells_by_run)."""
    rec = run.record
    root = "../../"
    found = run_series(run.path)            # from the results database when it provides them (report --db)
    rows = found.metrics.rows if found.metrics is not None else None
    samples = found.samples
    chart_list = []
    fig = charts.token_figure(rows, row.get(C.steady_from_step))
    if fig:
        chart_list.append(Chart(ids.next(), fig, "per-token decode time split and cumulative hit %"))
    fig = charts.memory_figure(samples, rows)
    if fig:
        chart_list.append(Chart(ids.next(), fig, "MemAvailable and RSS while the engine ran"))
    turns: list[dict[str, Any]] = thawed(rec.turns)
    fig = charts.session_figure(samples, turns)
    if fig:
        chart_list.append(Chart(ids.next(), fig, "the engine's VmRSS, VmSwap and RssFile through the turns and gaps"))
    redactor = redactor or Redactor()
    argv = redactor.argv(list(rec.argv), row.get(C.device_kind) == "local")
    distribution = tuple((label, fmt_num(row.get(key))) for key, label in (
        (C.tokens, "tokens"), (C.mean_tok_s, "mean tok/s (tokens / Σ wall)"), (C.median_tok_s, "median tok/s"),
        (C.p5_tok_s, "p5 tok/s"), (C.p95_tok_s, "p95 tok/s"), (C.min_tok_s, "min tok/s (slowest token)"),
        (C.max_tok_s, "max tok/s (fastest token)"), (C.steady_from_step, "steady state from step"),
        (C.steady_mean_tok_s, "steady-state mean tok/s")))
    pressure = tuple((label, fn(row.get(key))) for key, label, fn in (
        (C.peak_rss_kb, "peak RSS", fmt_kb), (C.mem_avail_before_kb, "MemAvailable before", fmt_kb),
        (C.mem_avail_floor_kb, "MemAvailable floor", fmt_kb), (C.mem_avail_after_kb, "MemAvailable after", fmt_kb),
        (C.cpu_temp_max_mc, "CPU temperature max", lambda x: fmt_celsius(x, 1000)),
        (C.batt_temp_max_dc, "battery temperature max", lambda x: fmt_celsius(x, 10))))
    return RunPage(
        title=f"run {row[C.run_id]}", root=root, run_id=row[C.run_id],
        device=Link(row[C.device], root + Urls.device(row[C.device])),
        model=Link(row[C.model], root + Urls.model(row[C.model])), outcome=row[C.outcome],
        evidence=tuple(redactor.text(e) for e in rec.evidence),
        argv=shlex.join(argv) if argv else "(not recorded: imported from upstream files)",
        flags=tuple(f for f in str(row.get(C.flags) or "").split(",") if f),
        tells=tuple(t.message for t in tells),
        summary=_kv(rec.summary, redactor=redactor), distribution=distribution,
        config=_kv(rec.config.to_dict(), redactor=redactor),
        entry_state=_kv(rec.entry_state, redactor=redactor, human=True),
        exit_state=_kv(rec.exit_state, redactor=redactor, human=True),
        pressure=pressure + tuple((f"gate {k}", v) for k, v in _kv(rec.gate, redactor=redactor, human=True)),
        charts=tuple(chart_list), files=run.file_names(),
        cpu=_cpu_rows(thawed(rec.cpu), row), when=fmt_time(rec.started_at),
        turns=_turn_rows(turns, redactor), gap_taken=gap_taken(turns) if turns else "")


def run_page_inputs(run: RunFolder, row_digest: str, tells: Sequence[Tell], redactor: Redactor) -> str:
    """Everything run_page reads, as one text: a run page made again from equal inputs (and the
    same first chart id) is the same page (results.site.run_pages reuses it). Its run.json, its row
    of the run table (`row_digest`: results.read.frames.row_digests), its tells, its metrics CSV and
    samples (results.read.series.fingerprint), its files' names, and what the redactor replaces in
    its run.json (Redactor.fingerprint_in: the page a site of other campaigns made serves this one
    when none of theirs is named in it). The record is its run.json's bytes, hashed (what the
    record was read from: another bmoe-fleet, which may read it otherwise, starts a new list of pages)."""
    raw = run.record_bytes()
    return json.dumps([hashlib.sha256(raw).hexdigest(), row_digest, [(t.kind, t.message) for t in tells],
                       series_fingerprint(run.path), list(run.file_names()),
                       redactor.fingerprint_in(raw.decode("utf-8", "replace"))], ensure_ascii=False)


def _turn_rows(turns: Sequence[Mapping[str, Any]], redactor: Redactor) -> tuple[TurnRow, ...]:
    if not turns:
        return ()
    rereads = [math.nan, *gap_rereads(turns)]
    out = []
    for turn, reread in zip(turns, rereads, strict=True):
        raw_gap = turn.get("gap")
        gap: Mapping[str, Any] = raw_gap if isinstance(raw_gap, Mapping) else {}
        apps = ", ".join(
            f"{a.get('name')} ({a.get('state')}, {fmt_mib(a.get('size_mib'))}"
            + (", killed by lmkd" if a.get("lmk_killed") else ", gone" if a.get("gone_by_end") else "") + ")"
            for a in gap.get("apps") or () if isinstance(a, Mapping))
        out.append(TurnRow(
            turn=fmt_num(turn.get("turn")), outcome=redactor.text(str(turn.get("outcome", ""))),
            tokens=fmt_num(turn.get("tokens")), s_per_token=fmt_num(turn.get("s_per_token")),
            hit=fmt_pct(turn.get("cache_hit_pct")), demand_hit=fmt_pct(demand_hit_pct(turn)),
            read=fmt_mib(turn.get("read_mib")), reread=fmt_mib(reread), majflt=fmt_num(turn.get("majflt_per_tok")),
            swap_in=fmt_mib(turn.get("swap_in_mib")), gap_idle=fmt_num(gap.get("idle_s")) if gap else "",
            gap_swap_max=fmt_kb(gap.get("vm_swap_max_kb")) if gap else "",
            gap_rss_min=fmt_kb(gap.get("vm_rss_min_kb")) if gap else "",
            gap_file_min=fmt_kb(gap.get("rss_file_min_kb")) if gap else "", gap_apps=redactor.text(apps)))
    return tuple(out)


def _cpu_rows(cpu: Mapping[str, Any] | None, row: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    if not cpu:
        return ()
    verdict = {True: "yes: more compute threads than cores", False: "no", None: "unknown (cores not reported)"}
    return (("cores", fmt_num(cpu.get("cores"))),
            ("cores online / usable", f"{fmt_num(cpu.get('cores_online'))} / {fmt_num(cpu.get('cores_usable'))}"),
            ("this engine's compute threads", fmt_num(cpu.get("threads"))),
            ("threads at once on these cores", fmt_num(cpu.get("threads_sum"))),
            ("other engines on these cores", row.get(C.cpu_engines) or "none"),
            ("kernel boot id", str(cpu.get("boot_id") or "unknown")
             + (" (this host's)" if cpu.get("shares_host") else "")),
            ("oversubscribed", verdict.get(cpu.get("oversubscribed"), "unknown")))


def device_page(device: str, camps: Sequence[CampaignData], analysis: Analysis, recs: Recommendations,
                rec_by_key: RecsByKey, ids: Ids, redactor: Redactor, front: pd.DataFrame | None = None) -> DevicePage:
    """A device's page: its identity, its default, per model and top-k the budget sweep, and per model
    with a lossy setting measured its quality against speed (`front`: results.analysis.quality.quality_front)."""
    table = analysis.table
    groups = [g for g in analysis.groups if g.device == device]
    dev_recs = next((d for d in recs.devices if d.device == device), None)
    return DevicePage(
        title=f"device {device}", root="../", device=device,
        identity=tuple((k, redactor.text(v)) for k, v in _identity(device, camps, table)),
        default=shlex.join(dev_recs.default.argv) if dev_recs else "no streamed runs: nothing to recommend",
        default_notes=dev_recs.default.notes if dev_recs else (),
        groups=tuple(_group_view(g, rec_by_key.get(g.key), ids, table) for g in groups if g.points),
        recommendations=tuple(_rec_row(r, "../") for r in (dev_recs.recommendations if dev_recs else ())),
        quality=quality_views(front, table, recs.all(), ids.next, "../", device=device) if front is not None else ())


def model_page(name: str, camps: Sequence[CampaignData], table: pd.DataFrame, analysis: Analysis,
               ids: Ids, recs: RecsByKey | None = None, redactor: Redactor | None = None,
               front: pd.DataFrame | None = None) -> ModelPage:
    """A model's page: its shape, its cycle per top-k (priced and measured), its devices and runs, and
    per device with a lossy setting measured its quality against speed (`front`, as device_page's)."""
    root = "../"
    rec: Mapping[str, Any] = next((c.models[name] for c in camps if name in c.models), {})
    mine = table[table[C.model] == name]
    shape = [("model", name)]
    for key, label in ((C.arch, "architecture"), (C.n_layer, "layers"), (C.n_expert, "experts per layer"),
                       ("top_k", "top-k (own)")):
        v = rec.get(key)
        if v in (None, "") and key in mine.columns:
            vals = [x for x in mine[key] if not is_missing(x) and x != ""]
            v = vals[0] if vals else None
        if v not in (None, ""):
            shape.append((label, fmt_num(v)))
    for key, label in (("expert_bytes", "expert bank"), ("dense_bytes", "dense weights"), ("file_bytes", "file")):
        if rec.get(key):
            shape.append((label, f"{rec[key] / MIB:,.1f} MiB"))
    if rec.get("sha256"):
        shape.append(("sha256", str(rec["sha256"])))
    if rec.get("path"):
        shape.append(("file", (redactor or Redactor()).text(str(rec["path"])) if str(rec["path"]).startswith("device:")
                      else os.path.basename(str(rec["path"]))))
    prices = {int(p["top_k"]): float(p["cycle_mib"]) for p in rec.get("prices") or ()}
    for g in analysis.groups:
        if g.model == name and g.top_k is not None and not is_missing(g.cycle_mib) and g.cycle_source != "token_demand":
            prices.setdefault(g.top_k, g.cycle_mib)
    measured: dict[int, float] = {}
    for k, demand in zip(mine[C.n_expert_used], mine[C.token_demand_mib]):
        if not is_missing(k) and not is_missing(demand):
            measured[int(k)] = float(demand)
    ks = sorted(set(prices) | set(measured))
    cycles = tuple((str(k), fmt_mib(prices.get(k)), fmt_mib(measured.get(k))) for k in ks)
    fig = charts.cycle_figure(name, sorted(prices.items()), sorted(measured.items()))
    devices = tuple(Link(d, root + Urls.device(d), f"{(mine[C.device] == d).sum()} runs")
                    for d in sorted(set(mine[C.device])))
    runs = tuple(Link(r[C.run_id], root + Urls.run(r[C.run_id]), f"{r[C.device]} · {r[C.budget_label]} · {r[C.outcome]}")
                 for r in row_views(mine))
    figures = [(g, charts.budget_figure(g, (recs or {}).get(g.key))) for g in analysis.groups
               if g.model == name and g.points]
    budget_charts = tuple(
        Chart(ids.next(), f, f"on {g.device}" + (f" (top-k {g.top_k})" if g.top_k else "")
              + (f": {_replay_text(g.replay)}" if g.replay is not None else ": no route trace to replay"))
        for g, f in figures if _drawable(f))
    cycle_chart = Chart(ids.next(), fig, "the cache budget must hold one token cycle, or hit % is 0") if fig else None
    quality = quality_views(front, table, list((recs or {}).values()), ids.next, root, model=name) \
        if front is not None else ()
    return ModelPage(title=f"model {name}", root=root, model=name, shape=tuple(shape), cycles=cycles,
                     chart=cycle_chart, devices=devices, runs=runs, budget_charts=budget_charts, quality=quality)


def index_page(analysis: Analysis, recs: Recommendations) -> IndexPage:
    """The site's front page: campaigns, devices, models, each device's recommendations, the rule."""
    table = analysis.table
    devices = sorted(set(table[C.device]))
    models = sorted(set(table[C.model]))
    return IndexPage(
        title="Expert-cache benchmarks", root="", campaigns=tuple(_campaign_rows(recs)),
        devices=tuple(Link(d, Urls.device(d), _device_note(d, table)) for d in devices),
        models=tuple(Link(m, Urls.model(m), f"{(table[C.model] == m).sum()} runs") for m in models),
        cards=tuple(DeviceCard(Link(d.device, Urls.device(d.device)), _identity_line(d.identity),
                               shlex.join(d.default.argv), d.default.notes,
                               tuple(_rec_row(r, "") for r in d.recommendations)) for d in recs.devices),
        rule=_rule_text(recs.rules), engines=", ".join(sorted({str(e) for e in table[C.engine] if e})),
        tells=tuple(Link(t.run_ids[0], Urls.run(t.run_ids[0]), f"{t.kind}: {t.message}") for t in analysis.tells),
        runs=len(table))


def _campaign_rows(recs: Recommendations) -> list[CampaignRow]:
    out = []
    for c in recs.campaigns:
        first, last = c.get("first_run"), c.get("last_run")
        out.append(CampaignRow(c["label"], c["runs"], ", ".join(f"{k} {v}" for k, v in c["outcomes"].items()),
                               c["imported"], ", ".join(c["engines"]) or "—", _dates(first, last)))
    return out


def _dates(first: str | None, last: str | None) -> str:
    """Two ISO UTC stamps as a local span: "2026-08-01 10:02 – 10:40 UTC" (the date once on one day)."""
    import calendar
    import time

    if not first:
        return "—"
    a, b = (time.localtime(calendar.timegm(time.strptime(x, "%Y-%m-%dT%H:%M:%SZ"))) for x in (first, last or first))
    start, zone = time.strftime("%Y-%m-%d %H:%M", a), time.strftime("%Z", b)
    end = time.strftime("%H:%M" if a[:3] == b[:3] else "%Y-%m-%d %H:%M", b)
    return f"{start} {zone}" if end == time.strftime("%H:%M", a) else f"{start} – {end} {zone}"


def _identity_line(identity: Mapping[str, Any]) -> str:
    parts = [" ".join(str(x) for x in (identity.get("manufacturer"), identity.get("model")) if x),
             str(identity.get("soc") or ""),
             f"{identity['mem_total_kb'] / 1024:,.0f} MiB RAM" if identity.get("mem_total_kb") else "",
             str(identity.get("kind") or "")]
    return " · ".join(p for p in parts if p)


def _rule_text(rules: Mapping[str, Any]) -> str:
    rule = rules.get("unmeasured") or {}
    if not rule.get("knots_mib"):
        return ""
    knots = ", ".join(f"{m:,.0f} MiB RAM → {c:,.0f}" for m, c in rule["knots_mib"][1:])
    text = (f"--cache-mb auto --cache-ceil-mb N, N from MemTotal: linear through {knots} (resting on "
            f"{', '.join(rule['rests_on'])}), +{rule['slope_after']:.3f} MiB per MiB past the last")
    if rule.get("min_ram_mib") is not None:
        text += f"; --cache-mb 0 under {rule['min_ram_mib']:,} MiB of RAM"
    return text


def _device_note(device: str, table: pd.DataFrame) -> str:
    mine = table[table[C.device] == device]
    kinds = sorted({k for k in mine[C.device_kind] if k})
    ram = mine[C.ram_total_kb].max()
    parts = [", ".join(kinds)] if kinds else []
    if not is_missing(ram):
        parts.append(f"{ram / 1024:,.0f} MiB RAM")
    parts.append(f"{len(mine)} runs")
    return " · ".join(parts)
