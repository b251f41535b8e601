"""Plotly figures (plain `{"data": [...], "layout": {...}}` dicts) for the site's pages.

The pages embed them with jinja's `tojson` inside `<script type="application/json">` and
templates/site.js hands them to the plotly.min.js copied into the site, so charts work offline
from file://. Every number is JSON-safe (NaN becomes null, which plotly draws as a gap).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from results.analysis.analyze import GroupAnalysis
from results.read.columns import C
from results.read.run_keys import load_text
from results.read.series import Columns
from store.versioned import json_safe

PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
KILL = "#d62728"
FOUGHT = "#e67e00"        # budgets that survived while the device fought over them
CYCLE = "#ff7f0e"
SAFE = "#2ca02c"
FONT = {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12}


def _layout(title: str, **extra) -> dict[str, Any]:
    layout = {"title": {"text": title, "font": {"size": 14}}, "font": FONT, "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
              "legend": {"orientation": "h", "y": -0.18}, "hovermode": "closest", "paper_bgcolor": "#ffffff",
              "plot_bgcolor": "#fafafa"}
    layout.update(extra)
    return layout


def _vline(x: float, color: str, dash: str, label: str, y_top: float = 1.0) -> tuple[dict, dict]:
    shape = {"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": y_top,
             "line": {"color": color, "width": 1.5, "dash": dash}}
    note = {"x": x, "xref": "x", "y": y_top, "yref": "paper", "text": label, "showarrow": False, "xanchor": "left",
            "yanchor": "bottom", "font": {"size": 10, "color": color}}
    return shape, note


RECOMMENDED = "#00695c"


def budget_figure(g: GroupAnalysis, rec: Any = None) -> dict[str, Any]:
    """Hit % (top) and tok/s (bottom) against the budget, per series, with the token cycle, the LMK
    boundary, killed runs (an `auto` run at the budget it was sized to; one whose budget is not known
    at all marked along the axis's right end), the replayed LRU curve as the predicted hit % line (and
    under each --drop-cold-experts F a series ran, its replay beside the measured drop points),
    the predicted tok/s curve of each dense mode (results.replay.predict), and the recommendation (results.analysis.recommend.Recommendation): its ceiling and its fixed budget."""
    data: list[dict[str, Any]] = []
    series = g.series()
    for i, name in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        pts = [p for p in g.points if p.series == name and p.ok and not math.isnan(p.budget_mib)]
        label = name if len(series) > 1 else "measured"
        hover = [f"{p.label}<br>{p.ok}/{p.runs} runs ok" + (f"<br>{p.advice}" if p.advice else "") for p in pts]
        data.append({"type": "scatter", "mode": "markers+lines", "name": f"hit % ({label})",
                     "x": [p.budget_mib for p in pts], "y": [p.hit_pct for p in pts], "text": hover,
                     "marker": {"color": color, "size": 9, "symbol": ["diamond" if p.auto else "circle" for p in pts]},
                     "line": {"color": color, "width": 1}, "xaxis": "x", "yaxis": "y"})
        data.append({"type": "scatter", "mode": "markers+lines", "name": f"tok/s ({label})",
                     "x": [p.budget_mib for p in pts], "y": [p.tok_s for p in pts], "text": hover,
                     "error_y": {"type": "data", "symmetric": False,
                                 "array": [p.tok_s_max - p.tok_s for p in pts],
                                 "arrayminus": [p.tok_s - p.tok_s_min for p in pts], "color": color},
                     "marker": {"color": color, "size": 9, "symbol": ["diamond" if p.auto else "circle" for p in pts]},
                     "line": {"color": color, "width": 1, "dash": "dot"}, "xaxis": "x", "yaxis": "y2",
                     "showlegend": True})
    fought = [p for p in g.points if p.fought and not math.isnan(p.budget_mib)]
    if fought:
        # survived, but the device fought over it: drawn apart from the safe points, on the tok/s panel
        data.append({"type": "scatter", "mode": "markers", "name": "fought (not safe)",
                     "x": [p.budget_mib for p in fought], "y": [p.tok_s for p in fought],
                     "text": [f"{p.label}: {p.fought}" for p in fought],
                     "marker": {"color": FOUGHT, "size": 15, "symbol": "square-open", "line": {"width": 2}},
                     "xaxis": "x", "yaxis": "y2"})
    killed = [p for p in g.points if p.killed and not math.isnan(p.budget_mib)]
    if killed:
        data.append({"type": "scatter", "mode": "markers", "name": "killed (LMK)",
                     "x": [p.budget_mib for p in killed for _ in range(p.killed)],
                     "y": [0 for p in killed for _ in range(p.killed)],
                     "text": [f"{rid} ({p.label})" for p in killed for rid in p.killed_run_ids],
                     "marker": {"color": KILL, "size": 13, "symbol": "x"}, "xaxis": "x", "yaxis": "y2"})
    lost = [p for p in g.points if p.killed and math.isnan(p.budget_mib)]
    if lost:
        # killed before it printed the budget it was sized to: marked along the axis, at its right end
        known = [p.budget_mib for p in g.points if not math.isnan(p.budget_mib)]
        edge = max(known + [g.cycle_mib if not math.isnan(g.cycle_mib) else 0.0, 1.0]) * 1.05
        data.append({"type": "scatter", "mode": "markers", "name": "killed, budget unknown",
                     "x": [edge for p in lost for _ in range(p.killed)], "y": [0 for p in lost for _ in range(p.killed)],
                     "text": [f"{rid} ({p.label}): killed before it reported its budget" for p in lost
                              for rid in p.killed_run_ids],
                     "marker": {"color": KILL, "size": 13, "symbol": "x-open"}, "xaxis": "x", "yaxis": "y2"})
    if g.replay is not None:
        r = g.replay
        data.append({"type": "scatter", "mode": "lines", "name": "replayed LRU (predicted hit %)",
                     "x": list(r.budgets_mib), "y": list(r.hit_pct_cum),
                     "line": {"color": "#444444", "width": 2, "dash": "dash"}, "xaxis": "x", "yaxis": "y"})
        data += drop_replay_traces(g)
    for pred in g.predictions:
        # the whole predicted curve (docs/prediction.md): every budget, the measured points drawn on it
        curve = sorted((b.budget_mib, b.tok_s) for b in pred.budgets if math.isfinite(b.tok_s))
        name = "predicted tok/s" + (f" (dense {pred.dense_weights})" if len(g.predictions) > 1 else "")
        data.append({"type": "scatter", "mode": "lines", "name": name, "x": [x for x, _ in curve],
                     "y": [y for _, y in curve], "line": {"color": "#444444", "width": 2, "dash": "dash"},
                     "xaxis": "x", "yaxis": "y2"})
    shapes, notes = [], []
    if not math.isnan(g.cycle_mib):
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": 0, "x1": g.cycle_mib, "y0": 0, "y1": 1,
                       "fillcolor": "rgba(255,127,14,0.08)", "line": {"width": 0}, "layer": "below"})
        s, n = _vline(g.cycle_mib, CYCLE, "solid", f"token cycle {g.cycle_mib:g} MiB")
        shapes.append(s)
        notes.append(n)
    b = g.boundary
    if b.smallest_killed_mib is not None:
        s, n = _vline(b.smallest_killed_mib, KILL, "dash", f"killed at {b.smallest_killed_mib:g} MiB", 0.93)
        shapes.append(s)
        notes.append(n)
    if b.largest_safe_mib is not None:
        s, n = _vline(b.largest_safe_mib, SAFE, "dot", f"always survived {b.largest_safe_mib:g} MiB", 0.86)
        shapes.append(s)
        notes.append(n)
    if rec is not None and rec.auto is not None:
        s, n = _vline(rec.auto.cache_ceil_mb, RECOMMENDED, "dashdot",
                      f"recommended ceiling {rec.auto.cache_ceil_mb} MiB", 0.79)
        shapes.append(s)
        notes.append(n)
    if rec is not None and rec.fixed is not None:
        s, n = _vline(rec.fixed.cache_mb, RECOMMENDED, "solid", f"recommended --cache-mb {rec.fixed.cache_mb}", 0.72)
        shapes.append(s)
        notes.append(n)
    k = f"top-k {g.top_k}" if g.top_k is not None else "default top-k"
    if g.apps:
        k += f", {load_text(g.apps)}"
    layout = _layout(f"{g.model} ({k}) on {g.device}: hit % and tok/s against the cache budget",
                     xaxis={"title": {"text": "expert cache budget (MiB)"}, "rangemode": "tozero", "anchor": "y2"},
                     yaxis={"title": {"text": "hit %"}, "domain": [0.55, 1.0], "range": [0, 100]},
                     yaxis2={"title": {"text": "tok/s"}, "domain": [0.0, 0.45], "rangemode": "tozero"},
                     shapes=shapes, annotations=notes, height=520)
    return json_safe({"data": data, "layout": layout})


def _spelled(field: str) -> set[str]:
    """Every spelling of the engine flag that sets bmoe-py's config `field` (engine.interface.flags)."""
    from engine.interface.flags import FLAGS

    return {s for f in FLAGS if f.field == field for s in f.spellings}


def _drop_lever(flags: Sequence[str]) -> Any:
    """The --drop-cold-experts lever a point's pass-through flags set (None: none, or no number)."""
    from results.errors import ReplayError
    from results.replay.drop_replay import DropLever

    frac_flag, prefill_flag = _spelled("drop_cold_frac"), _spelled("drop_prefill")
    frac = None
    for i, flag in enumerate(flags):
        name, eq, value = flag.partition("=")
        if name in frac_flag:
            frac = value if eq else (flags[i + 1] if i + 1 < len(flags) else None)
    try:
        number = float(frac) if frac is not None else math.nan
        return DropLever(number, in_prefill=bool(prefill_flag & set(flags))) if number > 0 else None
    except (ValueError, ReplayError):   # not a number, or outside [0, 1]: the engine refused those runs
        return None


def _lossy_traces(g: GroupAnalysis, lever: Any, points: Sequence[Any], like: Any) -> list[Any]:
    """The route trace a drop run of this lever wrote (a traced drop run), with its budget: of the
    lowest budget that has one (drop_replay.drop_curve_from replays every budget from it), among
    the runs of the replay trace's own campaign directory (run ids are campaign/cell/attempt), held
    to the lever by check_lossy; [] when none has one."""
    from results.errors import ReplayError
    from results.read.route_trace import TraceError, read_route_trace
    from results.replay.drop_replay import LossyTrace, check_lossy
    from store import names

    assert g.replay is not None
    replay_path = Path(g.replay.trace_path)
    if len(replay_path.parents) < 4:
        return []
    root, campaign = replay_path.parents[3], str(g.replay.run_id).split("/", 1)[0]
    for p in sorted(points, key=lambda p: p.budget_mib):
        for run_id in p.run_ids:
            label, _, rest = str(run_id).partition("/")
            cell, _, attempt = rest.rpartition("/")
            path = root / names.RUNS_DIR / cell / attempt / names.ROUTE_CSV
            if label != campaign or not cell or not attempt or not path.is_file():
                continue
            try:
                lossy = LossyTrace(read_route_trace(path), p.budget_mib)
                check_lossy(lossy, lever, like=like)
            except (TraceError, OSError, ReplayError):
                continue
            return [lossy]
    return []


def _drop_predicted(c: Any) -> str:
    """A drop point's predicted reads and drops, and the routing they came from."""
    source = (f"from the drop run's trace at {c.routing_budget_mib:g} MiB" if c.routing_path
              else "from the lossless trace: reads a lower bound")
    return f"{c.decode_read_mib_per_token:.2f} MiB/token and {c.drop_pct:.1f} % dropped predicted ({source})"


def drop_replay_traces(g: GroupAnalysis) -> list[dict[str, Any]]:
    """The replayed LRU under each --drop-cold-experts F the group's series ran (results.replay.drop_replay),
    as predicted hit % lines on the hit panel beside the measured drop points, which carry the
    predicted flash MiB/token and drop % in their hover. Every budget is replayed from the route
    trace of the group's drop run of that F at the lowest budget that has one (a traced drop run: a lossy run's
    routing, docs/replay.md "Under dropping"), from the group's lossless trace where it has none
    (then the reads are a lower bound, and the hover says so). No line without a replay or
    without drop runs; a trace that no longer reads is left out, as the page's other parts do."""
    from results.errors import ReplayError
    from results.read.route_trace import TraceError, read_route_trace
    from results.replay.drop_replay import drop_curve_from

    if g.replay is None:
        return []
    levers: dict[Any, list[Any]] = {}
    for p in g.points:
        lever = _drop_lever(p.flags)
        if lever is not None and p.ok and not math.isnan(p.budget_mib):
            levers.setdefault(lever, []).append(p)
    if not levers:
        return []
    try:
        trace = read_route_trace(g.replay.trace_path)
    except (TraceError, OSError):
        return []
    out: list[dict[str, Any]] = []
    for i, (lever, points) in enumerate(sorted(levers.items(), key=lambda kv: kv[0].frac)):
        budgets = sorted(set(g.replay.budgets_mib) | {p.budget_mib for p in points})
        try:
            curve = {c.budget_mib: c for c in drop_curve_from(trace, lever, budgets,
                                                              _lossy_traces(g, lever, points, trace))}
        except ReplayError:
            continue

        color = PALETTE[(i + 3) % len(PALETTE)]
        name = f"drop {lever.frac:g}" + (", in prefill" if lever.in_prefill else "")
        out.append({"type": "scatter", "mode": "lines", "name": f"replayed LRU, {name} (predicted hit %)",
                    "x": budgets, "y": [curve[b].hit_pct_cum if b > 0 else None for b in budgets],
                    "text": [_drop_predicted(curve[b]) for b in budgets],
                    "line": {"color": color, "width": 2, "dash": "dashdot"}, "xaxis": "x", "yaxis": "y"})
        out.append({"type": "scatter", "mode": "markers", "name": f"measured, {name}",
                    "x": [p.budget_mib for p in points], "y": [p.hit_pct for p in points],
                    "text": [f"{p.label}: {p.hit_pct:.1f} % hit measured, {curve[p.budget_mib].hit_pct_cum:.1f} % "
                             f"predicted; {_drop_predicted(curve[p.budget_mib])}" for p in points],
                    "marker": {"color": color, "size": 11, "symbol": "star-open", "line": {"width": 2}},
                    "xaxis": "x", "yaxis": "y"})
    return out


def token_figure(rows: Columns | None, steady_from: float | None) -> dict[str, Any] | None:
    """Per-token wall / io / compute / mgmt ms, and the cumulative hit % (`rows`: the metrics CSV's,
    results.read.series)."""
    if rows is None or not len(rows) or "wall_ms" not in rows.columns:
        return None
    # the traces hold only JSON's own values: their columns made so once each (json_safe), not the figure walked whole
    x = json_safe(rows["step"] if "step" in rows.columns else list(range(1, len(rows) + 1)))
    data = []
    for column, color in (("wall_ms", "#222222"), ("io_ms", "#1f77b4"), ("compute_ms", "#2ca02c"),
                          ("mgmt_ms", "#9467bd")):
        if column in rows.columns:
            data.append({"type": "scatter", "mode": "lines+markers", "name": column.replace("_ms", " ms"),
                         "x": x, "y": json_safe(rows[column]), "line": {"color": color, "width": 1.5},
                         "marker": {"size": 4}, "yaxis": "y"})
    if C.cache_hit_pct in rows.columns:
        hit = rows[C.cache_hit_pct].astype(float)
        with np.errstate(invalid="ignore"):
            shown = np.where(hit >= 0, hit, np.nan)
        data.append({"type": "scatter", "mode": "lines", "name": "hit % (cumulative)", "x": x,
                     "y": json_safe(shown), "line": {"color": CYCLE, "width": 2}, "yaxis": "y2"})
    shapes, notes = [], []
    if steady_from is not None and not math.isnan(steady_from):
        s, n = _vline(steady_from, "#7f7f7f", "dot", "steady state from here")
        shapes.append(s)
        notes.append(n)
    layout = _layout("per token: wall, flash I/O, compute, cache management (ms) and hit %",
                     xaxis={"title": {"text": "decode step"}},
                     yaxis={"title": {"text": "ms"}, "rangemode": "tozero"},
                     yaxis2={"title": {"text": "hit %"}, "overlaying": "y", "side": "right", "range": [0, 100]},
                     shapes=shapes, annotations=notes, height=380,
                     margin={"l": 60, "r": 60, "t": 50, "b": 50})
    return {"data": data, "layout": json_safe(layout)}


def memory_figure(samples: Columns | None, rows: Columns | None) -> dict[str, Any] | None:
    """MemAvailable and RSS over the run: the ~1 Hz pressure samples (seconds) and the engine's own
    per-token columns (decode steps)."""
    data = []
    if samples is not None and len(samples):
        t = json_safe(samples["t_s"])         # (as token_figure's traces)
        for column, name, color in (("mem_available_kb", "MemAvailable (samples)", "#1f77b4"),
                                    ("vm_rss_kb", "RSS (samples)", "#d62728"), ("vm_hwm_kb", "peak RSS (samples)",
                                                                               "#ff9896")):
            if column in samples.columns:
                data.append({"type": "scatter", "mode": "lines+markers", "name": name, "x": t,
                             "y": json_safe(samples[column] / 1024), "line": {"color": color}, "xaxis": "x",
                             "yaxis": "y"})
    if rows is not None and len(rows):
        x = json_safe(rows["step"] if "step" in rows.columns else list(range(1, len(rows) + 1)))
        for column, name, color in (("mem_available_mib", "MemAvailable (per token)", "#1f77b4"),
                                    ("rss_mib", "RSS (per token)", "#d62728"),
                                    ("rss_anon_mib", "anon RSS (per token)", "#9467bd"),
                                    ("cache_budget_mib", "cache budget", CYCLE)):
            if column in rows.columns:
                data.append({"type": "scatter", "mode": "lines", "name": name, "x": x, "y": json_safe(rows[column]),
                             "line": {"color": color, "dash": "dot"}, "xaxis": "x2", "yaxis": "y2"})
    if not data:
        return None
    layout = _layout("memory: MemAvailable and RSS (MiB)",
                     xaxis={"title": {"text": "seconds since start (samples)"}, "domain": [0, 0.47]},
                     xaxis2={"title": {"text": "decode step (engine)"}, "domain": [0.53, 1.0], "anchor": "y2"},
                     yaxis={"title": {"text": "MiB"}, "rangemode": "tozero"},
                     yaxis2={"anchor": "x2", "rangemode": "tozero"}, height=360)
    return {"data": data, "layout": json_safe(layout)}


def session_figure(samples: Columns | None, turns: Sequence[Mapping[str, Any]] | None) -> dict[str, Any] | None:
    """A session run's memory through its turns and gaps: the engine's VmRSS, VmSwap and RssFile
    from the ~1 Hz samples (seconds), each idle gap shaded and each turn's answer marked, so what
    the gap took (RSS down, swap up) sits beside the turn that paid for it."""
    if not turns or samples is None or not len(samples):
        return None
    t = samples["t_s"]
    data = [{"type": "scatter", "mode": "lines+markers", "name": name, "x": t, "y": samples[column] / 1024,
             "line": {"color": color}}
            for column, name, color in (("vm_rss_kb", "VmRSS", "#d62728"), ("vm_swap_kb", "VmSwap", FOUGHT),
                                        ("rss_file_kb", "RssFile", "#1f77b4"))
            if column in samples.columns and pd.notna(samples[column]).any()]
    if not data:
        return None
    shapes, notes = [], []
    for turn in turns:
        gap = turn.get("gap")
        if isinstance(gap, Mapping) and gap.get("start_t_s") is not None and gap.get("end_t_s") is not None:
            shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": gap["start_t_s"], "x1": gap["end_t_s"],
                           "y0": 0, "y1": 1, "fillcolor": "#bbbbbb", "opacity": 0.25, "line": {"width": 0},
                           "layer": "below"})
        if turn.get("answered_t_s") is not None:
            shape, note = _vline(turn["answered_t_s"], "#555555", "dot", f"turn {turn.get('turn')}")
            shapes.append(shape)
            notes.append(note)
    layout = _layout("session: the engine's memory through its turns (gaps shaded, MiB)",
                     xaxis={"title": {"text": "seconds since start"}},
                     yaxis={"title": {"text": "MiB"}, "rangemode": "tozero"}, shapes=shapes, annotations=notes,
                     height=360)
    return json_safe({"data": data, "layout": layout})


def cycle_figure(model: str, prices: Sequence[tuple[int, float]],
                 measured: Sequence[tuple[int, float]]) -> dict[str, Any] | None:
    """The token cycle per top-k (priced), with the measured token_demand_MiB per top-k."""
    if not prices and not measured:
        return None
    data = []
    if prices:
        data.append({"type": "bar", "name": "token cycle (priced, worst case)", "x": [k for k, _ in prices],
                     "y": [c for _, c in prices], "marker": {"color": CYCLE}})
    if measured:
        data.append({"type": "scatter", "mode": "markers", "name": "token_demand_MiB (measured)",
                     "x": [k for k, _ in measured], "y": [c for _, c in measured],
                     "marker": {"color": "#222222", "size": 10, "symbol": "diamond"}})
    layout = _layout(f"{model}: token cycle per top-k", xaxis={"title": {"text": "top-k"}, "dtick": 1},
                     yaxis={"title": {"text": "MiB per token"}, "rangemode": "tozero"}, height=360)
    return json_safe({"data": data, "layout": layout})


APP_DEFAULT = "#e67e00"   # the app's default dropping on the quality chart
RECOMMENDED_POINT = "recommended (the lossless default)"


def quality_figure(title: str, points: Sequence[Mapping[str, Any]], x_title: str, recommended: int | None,
                   app: Sequence[int], app_name: str) -> dict[str, Any]:
    """tok/s (y) against quality loss (x), one point per setting (results.site.quality_view): per
    budget the front joined (filled markers) and the settings it beats (open markers); the
    recommended lossless default a star, the app's default dropping an open diamond, each named.
    A point is a mapping of budget, x (NaN: not drawn), y, on_front, basis (ppl, agreement) and hover."""
    budgets = list(dict.fromkeys(p["budget"] for p in points))
    shape = {"ppl": "square", "agreement": "circle"}
    data: list[dict[str, Any]] = []
    for i, budget in enumerate(budgets):
        color = PALETTE[i % len(PALETTE)]
        label = f" at {budget}" if len(budgets) > 1 else ""
        mine = [p for p in points if p["budget"] == budget and not math.isnan(p["x"]) and not math.isnan(p["y"])]
        front = sorted((p for p in mine if p["on_front"]), key=lambda p: (p["x"], -p["y"]))
        beaten = [p for p in mine if not p["on_front"]]
        for name, pts, mode, fill in ((f"front{label}", front, "lines+markers", ""),
                                      (f"beaten{label}", beaten, "markers", "-open")):
            if pts:
                data.append({"type": "scatter", "mode": mode, "name": name, "x": [p["x"] for p in pts],
                             "y": [p["y"] for p in pts], "text": [p["hover"] for p in pts], "hoverinfo": "text",
                             "marker": {"color": color, "size": 11 if fill == "" else 9,
                                        "symbol": [shape.get(p["basis"], "circle") + fill for p in pts]},
                             "line": {"color": color, "width": 2}})
    xs = [p["x"] for p in points if not math.isnan(p["x"])]
    pad = max(max(xs, default=1.0) - min(xs + [0.0]), 1.0) * 0.06       # a point at 0 loss is drawn whole
    middle = (min(xs + [0.0]) + max(xs, default=1.0)) / 2
    notes = []
    for name, idx, symbol, color in ((RECOMMENDED_POINT, [recommended] if recommended is not None else [], "star",
                                      RECOMMENDED),
                                     (app_name, list(app), "diamond-open", APP_DEFAULT)):
        pts = [points[i] for i in idx if not math.isnan(points[i]["x"])]
        if not pts:
            continue
        data.append({"type": "scatter", "mode": "markers", "name": name, "x": [p["x"] for p in pts],
                     "y": [p["y"] for p in pts], "text": [f"{name}<br>{p['hover']}" for p in pts], "hoverinfo": "text",
                     "marker": {"color": color, "size": 20, "symbol": symbol, "line": {"color": color, "width": 3}}})
        # the name on the side of the point with room for it (a point right of the middle: to its left)
        notes += [{"x": p["x"], "y": p["y"], "xref": "x", "yref": "y", "text": name, "showarrow": True,
                   "arrowhead": 2, "ax": -40 if p["x"] > middle else 40, "xanchor": "right" if p["x"] > middle
                   else "left", "ay": -30 if color == RECOMMENDED else 30, "font": {"size": 11, "color": color}}
                  for p in pts]
    layout = _layout(title, xaxis={"title": {"text": x_title}, "zeroline": True,
                                   "range": [min(xs + [0.0]) - pad, max(xs, default=1.0) + pad]},
                     yaxis={"title": {"text": "tok/s (median)"}, "rangemode": "tozero"}, annotations=notes,
                     height=420)
    return json_safe({"data": data, "layout": layout})



def history_figure(device: str, model: str, series: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """The recommended ceiling (top) and the tok/s at the recommended fixed budget (bottom, median
    with the runs' count in the hover) against the engine release, in release order, one line per
    top-k and load of other apps (`series`: its name → results.analysis.history.ReleaseRow in order).
    A release whose recommendation is --cache-mb 0 draws its ceiling at 0, marked so."""
    data: list[dict[str, Any]] = []
    for i, (name, rows) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        x = [r.engine.replace(" (", "<br>(") for r in rows]      # a claim on a line of its own under the axis
        ceiling_text = [f"{r.engine}<br>" + ("cache off: --cache-mb 0" if r.cache_off else
                                             f"--cache-ceil-mb {r.ceiling_mib}") for r in rows]
        data.append({"type": "scatter", "mode": "markers+lines", "name": f"ceiling MiB ({name})", "x": x,
                     "y": [0 if r.cache_off else r.ceiling_mib for r in rows], "text": ceiling_text,
                     "marker": {"color": color, "size": 10, "symbol": ["x" if r.cache_off else "circle" for r in rows]},
                     "line": {"color": color, "width": 1}, "xaxis": "x", "yaxis": "y"})
        data.append({"type": "scatter", "mode": "markers+lines", "name": f"tok/s ({name})", "x": x,
                     "y": [r.tok_s for r in rows],
                     "text": [f"{r.engine}<br>median of {r.tok_s_runs} run(s) at "
                              + (f"--cache-mb {r.fixed_mib}" if r.fixed_mib is not None else "no fixed budget")
                              for r in rows],
                     "marker": {"color": color, "size": 10}, "line": {"color": color, "width": 1, "dash": "dot"},
                     "xaxis": "x", "yaxis": "y2"})
    layout = _layout(f"{model} on {device}: the recommendation across engine releases",
                     xaxis={"title": {"text": "engine release (in release order)"}, "type": "category", "anchor": "y2"},
                     yaxis={"title": {"text": "ceiling MiB"}, "domain": [0.55, 1.0], "rangemode": "tozero"},
                     yaxis2={"title": {"text": "tok/s"}, "domain": [0.0, 0.45], "rangemode": "tozero"}, height=520)
    return json_safe({"data": data, "layout": layout})
