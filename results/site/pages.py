"""What each page template receives: one small dataclass per page (docs/style.md), field by field.

`root` is the relative path from the page back to the site's top folder ("" or "../../"), so
every link works from file:// wherever the site is copied. `Chart` pairs a figure with the id of
the JSON block that carries it. Strings here are data (device names come from getprop): the
templates escape them, and file names derived from them go through site_format.slug().
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
    fixed: str                       # the measured command line of the fixed budget, or "—"
    auto: str                        # "--moe-stream --cache-mb auto … --cache-ceil-mb 39 …" or "—"
    dense: str
    confidence: str
    summary: str                     # the why in one short clause (the full reason is one click away)
    reason: str
    cache_off: bool
    replay: str                      # "replay: 36.4 % hit predicted at 39 MiB; knee 30 MiB" or ""
    evidence: str                    # "6 runs, 2 repeats at 39 MiB, spread 12 %"
    verified: str = ""               # "fixed accepted; auto accepted" after `recommend --verify`


@dataclass(frozen=True)
class CampaignRow:
    label: str
    runs: int
    outcomes: str                    # "ok 6, lmk_killed 6"
    imported: bool
    engines: str                     # "bmoe-py 0.1.0, 0.19.0"
    dates: str                       # "2026-08-01 10:02 – 10:40" (local time of the site's build)


@dataclass(frozen=True)
class DeviceCard:
    """A device on the index: what it is, what to ship on it, and its recommendations (a stacked
    card on a phone-width screen)."""

    device: Link
    identity: str                    # "Google Pixel 8 · gs301 · 7,823 MiB RAM"
    default: str                     # the default's command line
    notes: tuple[str, ...]
    recommendations: tuple[RecRow, ...]


@dataclass(frozen=True)
class IndexPage:
    title: str
    root: str
    campaigns: tuple[CampaignRow, ...]
    devices: tuple[Link, ...]
    models: tuple[Link, ...]
    cards: tuple[DeviceCard, ...]    # per device: identity, default, recommendations
    rule: str                        # the rule for phones never measured, in words ("" when there is none)
    engines: str                     # every engine version the runs used
    tells: tuple[Link, ...]          # contamination tells, linking to a run
    runs: int
    needs_plotly: bool = False       # the index draws nothing
    histories: tuple[Link, ...] = ()   # a device and model across engine releases (a site from a results database)


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
    publish: str = ""                # "below the publish bar: 8 tokens < 256, …" or "" when it meets it
    unfilled: str = ""               # "cache never filled (held 638 MiB): not counted as safe" or ""
    fought: str = ""                 # "fought: 42 MiB/token swapped in; …: not counted as safe" or ""
    predicted: str = ""              # "0.0122 (−84 %)": the predicted s/token and its error, or ""


@dataclass(frozen=True)
class TurnRow:
    """One turn of a session run, with the idle gap before it (empty strings for the first)."""

    turn: str
    outcome: str
    tokens: str
    s_per_token: str
    hit: str                         # the engine's cumulative cache_hit_pct
    demand_hit: str                  # the turn's own hit rate by bytes (results.read.turns.demand_hit_pct)
    read: str
    reread: str                      # read above the warm need: what the gap before it took
    majflt: str
    swap_in: str
    gap_idle: str
    gap_swap_max: str
    gap_rss_min: str
    gap_file_min: str
    gap_apps: str                    # "co.gcached1 (cached, 160 MiB, killed by lmkd)"


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
    planner: tuple[str, ...] = ()    # the engine's own planner beside the boundary (results.analysis.planner_check)
    # the two answers side by side: what the runs over adb showed (lmkd never considers an engine
    # adb started), and the app's verdict replayed from their samples ("" when none was replayed)
    adb_verdict: str = ""
    app_verdict: str = ""


@dataclass(frozen=True)
class QualityRow:
    """One setting (lossy levers × budget) of a quality chart, as the table under it shows it."""

    setting: str                     # "drop 0.75", "drop 0.75, top-k 1 of 2", "lossless"
    budget: str
    top_k: str
    runs: str                        # "2/2 ok"
    tok_s: str                       # the median
    loss: str                        # "75.0 (agreement)", "1.20 (ppl)", or "not compared"
    agreement: str
    identical: str                   # "0 of 2"
    ppl: str                         # "+1.20%" or "—"
    resident: str                    # median peak RSS, MiB
    front: str                       # "yes" on its budget's front, else ""
    marks: str                       # "recommended", "app's default" or ""
    run_links: tuple[Link, ...]


@dataclass(frozen=True)
class QualityView:
    """One (device, model, other apps): tok/s against quality loss per setting, the recommended lossless
    default and the app's default dropping marked (results.site.quality_view)."""

    heading: str
    chart: Chart
    axis: str                        # what the quality loss is: perplexity, agreement, or both
    recommended: str                 # the recommended point in words, or why none is marked
    app_costs: tuple[str, ...]       # the app's default dropping at each budget measured, or that it was not
    rows: tuple[QualityRow, ...]


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
    quality: tuple[QualityView, ...] = ()      # per model with a lossy setting measured; () none
    histories: tuple[Link, ...] = ()            # its history pages (a site built from a results database)

    @property
    def needs_plotly(self) -> bool:
        return any(g.chart is not None for g in self.groups) or bool(self.quality)


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
    quality: tuple[QualityView, ...] = ()      # per device with a lossy setting measured; () none

    @property
    def needs_plotly(self) -> bool:
        return self.chart is not None or bool(self.budget_charts) or bool(self.quality)


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
    # the cores the run had and the engines that shared them (harness.run.cpushare); () when not recorded
    cpu: tuple[tuple[str, str], ...] = field(default=())
    when: str = ""                   # started, local time
    turns: tuple[TurnRow, ...] = field(default=())     # a session run's turns; () for a one-shot run
    gap_taken: str = ""              # results.read.turns.gap_taken's reason, "" when no gap took the cache

    @property
    def needs_plotly(self) -> bool:
        return bool(self.charts)


@dataclass(frozen=True)
class HistoryRow:
    """One engine release of a device and model (results.analysis.history.ReleaseRow, as text)."""

    series: str                      # "top-k 2, with no other apps"
    engine: str
    release: str
    date: str
    campaigns: str
    runs: str
    ceiling: str                     # "39 MiB" or "cache off"
    fixed: str                       # the recommended fixed budget
    tok_s: str                       # "12.3 (median of 4)"
    hit: str
    app: str                         # the app rung and the app's verdict, or "—"
    confidence: str


@dataclass(frozen=True)
class HistoryPage:
    """A device and model across engine releases, from the results database (results.site.history_view)."""

    title: str
    root: str
    device: Link
    model: Link
    chart: Chart
    rows: tuple[HistoryRow, ...]
    needs_plotly: bool = True
