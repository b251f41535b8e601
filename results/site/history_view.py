"""The history page of a device and model: the recommendation of each engine release's runs, in
release order (results.analysis.history), as a chart (results.site.charts.history_figure) and a table.
Written only when the site is built from a results database holding more than one release of them."""

from __future__ import annotations

import math

from results.analysis.history import History, ReleaseRow
from results.read.run_keys import budget_label, load_text
from results.site.charts import history_figure
from results.site.page_views import Ids
from results.site.pages import Chart, HistoryPage, HistoryRow, Link
from results.site.site_format import Urls, fmt_num, slug


def history_url(device: str, model: str) -> str:
    """The page's path relative to the site's top folder."""
    return f"history/{slug(device)}--{slug(model)}.html"


def _series(r: ReleaseRow) -> str:
    k = f"top-k {r.top_k}" if r.top_k is not None else "default top-k"
    return f"{k}, {load_text(r.apps)}"


def _row(r: ReleaseRow) -> HistoryRow:
    return HistoryRow(
        series=_series(r), engine=r.engine, release=r.release or "unknown", date=r.date or "—",
        campaigns=", ".join(r.campaigns), runs=str(r.runs),
        ceiling="cache off" if r.cache_off else f"{r.ceiling_mib} MiB" if r.ceiling_mib is not None else "—",
        fixed=budget_label(r.fixed_mib) if r.fixed_mib is not None else "—",
        tok_s=f"{fmt_num(r.tok_s)} (median of {r.tok_s_runs})" if not math.isnan(r.tok_s) else "—",
        hit=fmt_num(r.hit_pct), app=r.app_verdict or "—", confidence=r.confidence)


def paged(h: History) -> list[tuple[str, str]]:
    """The (device, model) pairs that get a history page: those with more than one release."""
    return [(device, model) for device, model in h.pairs() if len(h.releases(device, model)) >= 2]


def history_links(h: History, device: str) -> tuple[Link, ...]:
    """A device page's links to its history pages (the device page sits one folder down)."""
    return tuple(Link(f"{model} across engine releases", "../" + history_url(d, model))
                 for d, model in paged(h) if d == device)


def history_pages(h: History) -> list[tuple[str, HistoryPage]]:
    """(path, page) for each device and model with more than one release (chart ids its own)."""
    out = []
    for device, model in paged(h):
        rows = h.of(device, model)
        series: dict[str, list[ReleaseRow]] = {}
        for r in rows:
            series.setdefault(_series(r), []).append(r)
        chart = Chart(Ids().next(), history_figure(device, model, series),
                      "the recommended ceiling and the tok/s at the recommended fixed budget, per engine release")
        page = HistoryPage(f"{model} on {device} across engine releases", "../",
                           Link(device, "../" + Urls.device(device)), Link(model, "../" + Urls.model(model)), chart,
                           tuple(_row(r) for r in rows))
        out.append((history_url(device, model), page))
    return out
