"""What each page template receives: one small dataclass per page (style.md), field by field.

`root` is the relative path from the page back to the site's top folder ("" or "../../"), so
every link works from file:// wherever the site is copied. `Chart` pairs a figure with the id of
the JSON block that carries it. Strings here are data (device names come from getprop): the
templates escape them, and file names derived from them go through report.slug().
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Chart:
    chart_id: str                    # the JSON block's id; site.js draws the figure into its div
    figure: dict[str, Any]           # plotly {"data", "layout"}
    caption: str = ""


@dataclass(frozen=True)
class Link:
    text: str
    href: str
    note: str = ""


@dataclass(frozen=True)
class RecRow:
    """One recommendation as a table row (index and device pages)."""

    device: Link
    model: Link
    top_k: str
    cycle: str
    fixed: str                       # "--cache-mb 39"
    auto: str                        # "--cache-mb auto --cache-ceil-mb 39" or "—"
    dense: str
    confidence: str
    reason: str
    cache_off: bool
    replay: str                      # "replay: 36.4 % hit predicted at 39 MiB; knee 30 MiB" or ""
    evidence: str                    # "6 runs, 2 repeats at 39 MiB, spread 12 %"


@dataclass(frozen=True)
class CampaignRow:
    label: str
    folder: str
    runs: int
    outcomes: str                    # "ok 6, lmk_killed 6"
    imported: bool


@dataclass(frozen=True)
class IndexPage:
    title: str
    root: str
    campaigns: tuple[CampaignRow, ...]
    devices: tuple[Link, ...]
    models: tuple[Link, ...]
    recommendations: tuple[RecRow, ...]
    defaults: tuple[Link, ...]       # per device: its default ceiling (text) linking to the device page
    tells: tuple[Link, ...]          # contamination tells, linking to a run
    runs: int


@dataclass(frozen=True)
class PointRow:
    series: str
    budget: str
    runs: str                        # "2/2 ok" or "0/2 ok, 2 killed"
    hit: str
    tok_s: str                       # median (min–max)
    s_per_token: str
    floor: str
    note: str                        # "under the cycle: cache 0 is strictly better here"
    run_links: tuple[Link, ...]


@dataclass(frozen=True)
class GroupView:
    """One (model, top-k) of a device: its chart and its numbers."""

    heading: str
    model: Link
    chart: Chart | None              # None when no run of the group has a point to draw
    points: tuple[PointRow, ...]
    baselines: tuple[PointRow, ...]
    cycle: str
    boundary: str
    dense: str
    replay: str
    tells: tuple[str, ...]
    recommendation: RecRow | None


@dataclass(frozen=True)
class DevicePage:
    title: str
    root: str
    device: str
    identity: tuple[tuple[str, str], ...]
    default: str
    default_notes: tuple[str, ...]
    groups: tuple[GroupView, ...]
    recommendations: tuple[RecRow, ...]


@dataclass(frozen=True)
class ModelPage:
    title: str
    root: str
    model: str
    shape: tuple[tuple[str, str], ...]
    cycles: tuple[tuple[str, str, str], ...]      # (top-k, priced cycle, measured token_demand)
    chart: Chart | None
    devices: tuple[Link, ...]
    runs: tuple[Link, ...]
    # per device (and top-k): measured hit % and tok/s against the budget, with the replayed LRU curve
    budget_charts: tuple[Chart, ...] = ()


@dataclass(frozen=True)
class RunPage:
    title: str
    root: str
    run_id: str
    device: Link
    model: Link
    outcome: str
    evidence: tuple[str, ...]
    argv: str                        # the exact command line, shell-quoted
    flags: tuple[str, ...]
    tells: tuple[str, ...]
    summary: tuple[tuple[str, str], ...]
    distribution: tuple[tuple[str, str], ...]
    config: tuple[tuple[str, str], ...]
    entry_state: tuple[tuple[str, str], ...]
    exit_state: tuple[tuple[str, str], ...]
    pressure: tuple[tuple[str, str], ...]
    charts: tuple[Chart, ...] = field(default=())
    files: tuple[str, ...] = field(default=())
    # the cores the run had and the engines that shared them (harness.cpushare); () when not recorded
    cpu: tuple[tuple[str, str], ...] = field(default=())
