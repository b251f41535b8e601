"""The quality-against-speed section of a device page and of a model page: per (device, model, other
apps), every setting (lossy levers × budget) of results.analysis.quality.quality_front as a point of
quality loss against tok/s, the front joined, the recommended lossless default and the app's
default dropping marked, the app's cost in words, and the same numbers as a table
(docs/results.md "Pages", docs/decisions/quality-chart.md).

A section exists only where the campaign has a lossy setting with a quality value: a campaign of
lossless runs shows none, not an empty one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from results.analysis.android_app import APP_DROP_COLD
from results.analysis.app_drop import APP_NAME, app_cost, is_app_default
from results.analysis.quality import AGREEMENT, PPL
from results.analysis.recommend_records import Recommendation
from results.numbers import to_float
from results.read.columns import C
from results.read.frames import row_views
from results.read.quality import question_flags
from results.read.run_keys import budget_label, load_text
from results.site import charts
from results.site.pages import Chart, Link, QualityRow, QualityView
from results.site.site_format import Urls, fmt_num

AXIS_TITLES = {PPL: "quality loss: perplexity +% over the lossless reference",
               AGREEMENT: "quality loss: 100 × (1 − agreement with the lossless reference)",
               "": "quality loss: perplexity +% where measured (squares), else 100 × (1 − agreement) (circles)"}


def _budget_order(label: str) -> tuple[float, str]:
    head = label.split()[0] if label else ""
    try:
        return float(head), label
    except ValueError:
        return (0.0 if label == "cache 0" else math.inf), label


def _or_inf(x: Any) -> float:
    """A number to sort by, missing ones last."""
    v = to_float(x)
    return math.inf if math.isnan(v) else v


def _fmt(x: Any, fmt: str) -> str:
    v = to_float(x)
    return "—" if math.isnan(v) else format(v, fmt)


def _identical(s: Mapping[str, Any]) -> str:
    return f"{s['identical']} of {s['compared']}" if s["compared"] else "—"


def quality_views(front: pd.DataFrame, table: pd.DataFrame, recs: Sequence[Recommendation], next_id: Callable[[], str],
                  root: str, device: str | None = None, model: str | None = None) -> tuple[QualityView, ...]:
    """One view per (device, model, other apps) of these settings (one device's or one model's) that
    has a lossy setting with a quality value; () when none has."""
    if front.empty:
        return ()
    rows = {str(r[C.run_id]): r for r in row_views(table)}
    mine = front
    if device is not None:
        mine = mine[mine[C.device] == device]
    if model is not None:
        mine = mine[mine[C.model] == model]
    out = []
    for (dev, mod, apps), group in mine.groupby([C.device, C.model, C.apps], sort=True):
        settings = group.to_dict("records")
        if not any(s[C.lossy_levers] and not math.isnan(float(s["quality_loss"])) for s in settings):
            continue
        out.append(_view(str(dev), str(mod), str(apps), settings, rows, recs, next_id, root,
                         by_model=model is not None))
    return tuple(out)


def _recommended(settings: Sequence[Mapping[str, Any]], rows: Mapping[str, Mapping[str, Any]],
                 recs: Sequence[Recommendation], device: str, model: str, apps: str) -> tuple[int | None, str]:
    """The setting whose runs the recommendation of the model's own top-k measured as its fixed
    budget (its index, None when it is not one of them), and the sentence that says so."""
    own = {to_float(rows[r].get(C.model_top_k)) for s in settings for r in s["run_ids"] if r in rows}
    mine = [r for r in recs if (r.device, r.model, r.apps) == (device, model, apps)]
    rec = next((r for r in mine if r.top_k is not None and float(r.top_k) in own), None) \
        or next((r for r in mine if r.top_k is None), None)
    if rec is None:
        return None, "no recommendation at the model's own top-k"
    if rec.fixed is None:
        return None, "the recommendation names no fixed budget: nothing measured to mark"
    if not rec.fixed.measured:
        return None, f"the recommended --cache-mb {rec.fixed.cache_mb} was never run: nothing measured to mark"
    chosen, budget = set(rec.fixed.run_ids), budget_label(rec.fixed.cache_mb)
    overlap = [(len(chosen & set(s["run_ids"])) if s["budget"] == budget else 0, i) for i, s in enumerate(settings)]
    best, index = max(overlap, default=(0, -1))
    if not best:
        return None, f"the recommended --cache-mb {rec.fixed.cache_mb} was not measured as one of these settings"
    s = settings[index]
    return index, (f"{charts.RECOMMENDED_POINT}: --cache-mb {rec.fixed.cache_mb}, {fmt_num(float(s[C.tok_s]))} tok/s, "
                   f"{_fmt(s['peak_rss_mib'], '.1f')} MiB resident")


def _labels(settings: Sequence[Mapping[str, Any]], rows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Each setting in words: its levers ("lossless" for none), and what else varies among them."""
    extra: list[list[str]] = [[] for _ in settings]
    dense = {s[C.dense_weights] for s in settings}
    questions = [question_flags(next((rows[r] for r in s["run_ids"] if r in rows), {})) for s in settings]
    for i, s in enumerate(settings):
        if len(dense) > 1:
            extra[i].append(f"dense {s[C.dense_weights] or '?'}")
        if len(set(questions)) > 1:
            extra[i].append(f"flags {questions[i]}")
    return [" · ".join([s[C.lossy_levers] or "lossless", *e]) for s, e in zip(settings, extra, strict=True)]


def _view(device: str, model: str, apps: str, settings: list[dict[str, Any]], rows: Mapping[str, Mapping[str, Any]],
          recs: Sequence[Recommendation], next_id: Callable[[], str], root: str, by_model: bool) -> QualityView:
    settings.sort(key=lambda s: (_budget_order(s["budget"]), _or_inf(s["quality_loss"]), _or_inf(-to_float(s[C.tok_s]))))
    labels = _labels(settings, rows)
    drawn = [not math.isnan(float(s["quality_loss"])) and not math.isnan(float(s[C.tok_s])) for s in settings]
    bases = {s["quality_basis"] for s, d in zip(settings, drawn, strict=True) if d}
    basis = next(iter(bases)) if len(bases) == 1 else ""
    recommended, rec_text = _recommended(settings, rows, recs, device, model, apps)
    apps_at = [i for i, s in enumerate(settings) if is_app_default(s) and drawn[i]]
    costs = tuple(app_cost(settings[i], settings, rows).text for i in apps_at) or (
        f"{APP_NAME} was not measured here: no run of --drop-cold-experts {APP_DROP_COLD:g} alone",)
    points = []
    for i, s in enumerate(settings):
        hover = "<br>".join([
            labels[i], f"budget {s['budget']}" + (f" · top-k {s['top_k']:g}" if not math.isnan(s["top_k"]) else ""),
            f"{s['ok']}/{s['runs']} runs ok · {fmt_num(float(s[C.tok_s]))} tok/s",
            f"agreement {_fmt(s['agreement'], '.2f')} · {_identical(s)} outputs identical"
            + (f" · ppl {float(s[C.ppl_loss_pct]):+.2f}%" if not math.isnan(float(s[C.ppl_loss_pct])) else ""),
            f"{_fmt(s['peak_rss_mib'], '.1f')} MiB resident (median peak RSS)",
            "on the front" if s["on_front"] else "beaten by a setting at least as fast, as good and as small"])
        points.append({"budget": s["budget"], "x": float(s["quality_loss"]) if drawn[i] else math.nan,
                       "y": float(s[C.tok_s]), "on_front": bool(s["on_front"]), "basis": s["quality_basis"],
                       "hover": hover})
    where = f"on {device}" if by_model else model
    load = f" ({load_text(apps)})" if apps else ""
    title = f"{model} on {device}{load}: tok/s against quality loss"
    figure = charts.quality_figure(title, points, AXIS_TITLES[basis], recommended if recommended is not None
                                   and drawn[recommended] else None, apps_at, APP_NAME)
    table_rows = tuple(QualityRow(
        setting=labels[i], budget=str(s["budget"]), top_k=_fmt(s["top_k"], "g"), runs=f"{s['ok']}/{s['runs']} ok",
        tok_s=fmt_num(float(s[C.tok_s])),
        loss=(f"{float(s['quality_loss']):.1f} ({s['quality_basis']})" if drawn[i] else "not compared"),
        agreement=_fmt(s["agreement"], ".2f"), identical=_identical(s),
        ppl=_fmt(s[C.ppl_loss_pct], "+.2f") + ("%" if not math.isnan(float(s[C.ppl_loss_pct])) else ""),
        resident=_fmt(s["peak_rss_mib"], ".1f"), front="yes" if s["on_front"] else "",
        marks=", ".join(m for m, on in (("recommended", i == recommended), ("app's default", i in apps_at)) if on),
        run_links=tuple(Link(f"r{j + 1}", root + Urls.run(r), r) for j, r in enumerate(s["run_ids"])))
        for i, s in enumerate(settings))
    return QualityView(
        heading=f"{where}{load}: quality against speed",
        chart=Chart(next_id(), figure, "one point per setting (lossy levers × budget): tok/s against what its "
                    "output lost to the lossless reference; each budget's front (no setting at least as fast, as "
                    "good and as small: memory counts too, so a front point may sit under another here) is joined; the "
                    "recommended lossless default and the app's default dropping are marked"),
        axis=AXIS_TITLES[basis], recommended=rec_text, app_costs=costs, rows=table_rows)
