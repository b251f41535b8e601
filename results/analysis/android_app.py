"""Upstream's Android app as data: the command line its settings open a session with, the cache rungs
its settings offer, and a recommendation mapped onto those rungs.

Read (never copied) from BigMoeOnEdge's examples/android: `AppSettings.kt` (its `sessionArgv`, the
field defaults and `CACHE_CHOICES`) and `SettingsScreen.kt` at commit 07045c19a009; `RunService.kt`
(the foreground service that execs bmoe-cli once with `--session` and writes one JSON request per
prompt) and `MainActivity.kt` at commit 03753187b176. docs/campaigns.md ("The app's command line")
lists what was found and what the preset leaves out. `sweep --preset app` (harness.campaign.presets) runs it;
results.analysis.recommend names the rung (`app_rung_mb`) in every recommendation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine.interface.flags import CHATML, CTX_SIZE, NO_THINK, OVERLAP, UBATCH
from results.analysis.analyze import BudgetPoint, LmkBoundary
from results.read.run_keys import budget_label

UPSTREAM_SETTINGS_COMMIT = "07045c19a009f48cd92c1d39c053199f7bf45c99"   # AppSettings.kt, SettingsScreen.kt
UPSTREAM_SERVICE_COMMIT = "03753187b1769ab0e5dd0cc80ac7fc5f4b3761c0"    # RunService.kt, MainActivity.kt

# CACHE_CHOICES without its Auto entry (-1, run as `auto` with the ceiling below): the fixed budgets,
# in MiB, a user can pick. 500 and 1000 sit under the engine's 1500 MiB floor; the app (and the
# harness, for 1..1499) adds --force-cache to them.
APP_RUNGS_MB = (0, 500, 1000, 1250, 1500, 1750, 2000, 3000, 4000, 5000, 6000)
APP_AUTO_CEIL_MB = 3000          # cacheCeilMb's default: the cap the Auto rung runs with
APP_DEFAULT_CACHE_MB = 2000      # cacheMb's default: what the app ships
APP_THREADS = 4                  # -t
APP_IO_THREADS = 4               # --io-threads
APP_DENSE_WEIGHTS = "anon"       # --dense-weights
APP_N_PREDICT = 128              # DEFAULT_N_PREDICT: tokens a turn asks for
APP_PROMPT = "Explain what a mixture-of-experts model is, in two sentences."   # MainActivity's default prompt
# dropColdPct's default, 75 (a percentage of the uniform share 1/top-k; "LOSSY and cache-dependent —
# it changes the output, and not reproducibly"): sessionArgv sends it as `--drop-cold-experts 0.75`
# whenever a cache is on. The preset runs every cache-on rung with it and without it (the engine
# refuses it at --cache-mb 0: harness.plan.grid.without_cache), so a campaign says what it costs; the
# site marks where a campaign measured it on the quality chart (results.site.quality_view).
APP_DROP_COLD = 0.75
# the session-open flags the harness does not set itself, in sessionArgv's order; each is kept only
# where the engine takes it (harness.campaign.engine_probe.protocol_flags). --no-think stands for the app's
# per-request `"think": false`: the harness's requests carry no think key (harness.run.turns).
APP_FLAGS = ((CTX_SIZE.typed, "4096"), (UBATCH.typed, "512"), (CHATML.typed,), (NO_THINK.typed,), (OVERLAP.typed,))
# session use: two turns with an idle gap between them, as upstream's scripts/rewarm-ab.sh ("same argv
# the Android app uses") measures the app's session; the app itself unloads after 10 minutes idle
APP_TURNS = 2
APP_IDLE_S = 240.0


@dataclass(frozen=True)
class AppRung:
    """The app rung a recommendation maps to (None: no rung is safe) and why."""

    rung_mb: int | None
    reason: str


def rung_problem(rung_mb: int, points: Sequence[BudgetPoint], boundary: LmkBoundary, ceiling_mib: float,
                 cycle_mib: float) -> str:
    """Why one rung cannot be named ("" when it can): over the ceiling, under the token cycle, never
    measured, killed, fought over, a run that did not finish, or a cache that never filled."""
    if rung_mb > ceiling_mib + 1e-9:
        return f"over the {ceiling_mib:g} MiB ceiling"
    if rung_mb > 0 and not math.isnan(cycle_mib) and rung_mb < cycle_mib:
        return f"under the {cycle_mib:g} MiB token cycle"
    at = [p for p in points if not p.auto and p.budget_mib == rung_mb]
    if not at:
        return "not measured"
    killed = boundary.smallest_killed_mib
    if any(p.killed for p in at) or (rung_mb > 0 and killed is not None and rung_mb >= killed):
        return "killed" if any(p.killed for p in at) else f"at or over the {killed:g} MiB that was killed"
    fought = next((p.fought or p.gap_taken for p in at if p.fought or p.gap_taken), "")
    if fought or (rung_mb > 0 and boundary.fought and rung_mb >= boundary.fought[0][0]):
        return fought or f"at or over {boundary.fought_text()}"
    if any(p.ok < p.runs or p.ok == 0 for p in at):
        return "not every run finished"
    if not all(p.filled for p in at):
        return "survived without filling its cache"
    return ""


def app_rung(points: Sequence[BudgetPoint], boundary: LmkBoundary, ceiling_mib: float,
             cycle_mib: float) -> AppRung:
    """The largest app rung at or under the recommended ceiling (0 when the recommendation is
    --cache-mb 0) that was measured and survived every run with its cache filled, never killed or
    fought over; None, with each rung's reason, when there is none."""
    skipped: list[str] = []
    for rung in sorted(APP_RUNGS_MB, reverse=True):
        problem = rung_problem(rung, points, boundary, ceiling_mib, cycle_mib)
        if not problem:
            runs = sum(p.runs for p in points if not p.auto and p.budget_mib == rung)
            name = budget_label(rung)
            passed = f"; above it: {'; '.join(skipped)}" if skipped else ""
            return AppRung(rung, f"app rung {name}: the largest of the app's rungs at or under the "
                                 f"{ceiling_mib:g} MiB ceiling measured safe ({runs} run(s)){passed}")
        if rung <= ceiling_mib + 1e-9:         # the rungs over the ceiling go without saying
            skipped.append(f"{budget_label(rung)} {problem}")
    return AppRung(None, f"no app rung is measured safe at or under the {ceiling_mib:g} MiB ceiling: "
                         + "; ".join(skipped))
