"""What one engine run came to, from what it left behind (docs/method.md rule 4).

A campaign's attempt is classified from its exit status, its stderr, its metrics CSV and the
low-memory killer's lines (classify); a single command line run outside a campaign
(`recommend --verify`) is judged accepted, refused or failed (judge_single_run). Both read the
engine's configuration refusals the same way. What an engine line says is read by the console
parser's verdicts (results.read.parse_console: o_direct_seen, is_refusal, is_error, accepted_line).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from devices.base import RunOutcome
from devices.lmk import LmkEvent
from engine.units import parse_number
from results.read.parse_console import accepted_line, is_error, is_refusal, o_direct_seen
from store import outcomes
from store.cells import CellConfig


@dataclass(frozen=True)
class Classified:
    """A run's outcome (store.outcomes) and the evidence for it."""

    outcome: str
    evidence: tuple[str, ...]


def o_direct_in_effect(stderr: bytes, metrics) -> int | None:
    """Whether expert reads really bypassed the page cache: the engine's `bmoe: expert streaming ON
    … o_direct=N` stderr line, which both engines print after any fallback (bmoe-cli's CSV preamble
    records what was asked for, not what happened); else the preamble's value; None if neither."""
    seen = o_direct_seen(stderr.decode("utf-8", "replace"))
    if seen is not None:
        return seen
    value = metrics.preamble.get("o_direct") if metrics is not None else None
    return parse_number(value) if value is not None else None


def classify(outcome: RunOutcome, kills: Sequence[LmkEvent], metrics, o_direct_asked: bool,
             moe_stream: bool) -> Classified:
    """docs/method.md rule 4, from what one run left behind. `metrics` is a results.read.parse.MetricsFile
    (or None when the engine wrote no CSV); `kills` are the lmkd/kernel kill lines of this process."""
    status = outcome.exit_status
    err_lines = [line for line in outcome.stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    if outcome.timed_out:
        return Classified(outcomes.TIMEOUT, (f"no exit within the timeout; killed after {outcome.wall_s:.1f} s",))
    if outcome.killed_by_sigkill:
        lmk = [k for k in kills if k.source != "kernel-oom"]
        if lmk:
            return Classified(outcomes.LMK_KILLED,
                              (f"exit status {status} (SIGKILL)",) + tuple(k.line for k in lmk))
        if kills:   # only the kernel's OOM killer claimed it: the backstop, not the low-memory killer
            return Classified(outcomes.KILLED, (f"exit status {status} (SIGKILL) by the kernel OOM killer",)
                              + tuple(k.line for k in kills))
        return Classified(outcomes.KILLED, (f"exit status {status} (SIGKILL) with no lmkd or kernel kill line for "
                                            f"pid {outcome.pid}",))
    if status is None:
        return Classified(outcomes.ENGINE_ERROR, ("exit status unknown",))
    if status != 0:
        refused = [line for line in err_lines if is_refusal(line)]
        if status in (1, 2) and refused:
            return Classified(outcomes.CONFIG_ERROR, (f"exit status {status}", refused[0]))
        errors = [line for line in err_lines if is_error(line)] or err_lines[-1:]
        return Classified(outcomes.ENGINE_ERROR, (f"exit status {status}",) + tuple(errors[:1]))
    if metrics is None:
        return Classified(outcomes.INVALID, ("exit status 0 but no metrics CSV",))
    if metrics.summary is None:
        return Classified(outcomes.INVALID, ("exit status 0 but the CSV has no summary line",))
    if moe_stream and o_direct_asked and o_direct_in_effect(outcome.stderr, metrics) == 0:
        return Classified(outcomes.INVALID, ("o_direct=0: O_DIRECT was asked for but the engine fell back to "
                                             "buffered reads (is the model on a FUSE or tmpfs filesystem?)",))
    return Classified(outcomes.OK, ())


def result_of(metrics, config: CellConfig) -> dict[str, Any]:
    """The headline numbers of a run from its CSV summary (None where not measured)."""
    out: dict[str, Any] = {"tokens": None, "tok_per_s": None, "cache_hit_pct": None, "budget_mib": None,
                           "cycle_mb": config.cycle_mb}
    if metrics is None or metrics.summary is None:
        return out
    s = metrics.summary
    out["tokens"] = s.get("tokens")
    out["tok_per_s"] = s.get("tok/s")
    hit = s.get("cache_hit_pct")
    out["cache_hit_pct"] = None if hit is None or hit == -1 else hit
    budget = s.get("cache_budget_MiB")
    if budget is None and "cache_mb" in metrics.preamble and str(metrics.preamble.get("cache_auto", "0")) == "0":
        budget = parse_number(metrics.preamble["cache_mb"])  # a fixed budget is what was asked; auto is not known
    out["budget_mib"] = budget
    return out


def judge_single_run(outcome: RunOutcome) -> tuple[str, str]:
    """(status, the engine's line) of one run: refused is the engine's own configuration refusal
    (the `config_error` of a campaign), accepted an exit 0, anything else failed."""
    err = outcome.stderr.decode("utf-8", "replace")
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    if outcome.exit_status == 0 and not outcome.killed_by_sigkill:
        seen = accepted_line(err + "\n" + outcome.stdout.decode("utf-8", "replace"))
        return "accepted", (seen if seen is not None else "exit status 0")
    refused = [line for line in lines if is_refusal(line)]
    if outcome.exit_status in (1, 2) and refused:
        return "refused", refused[0]
    if outcome.timed_out:
        return "failed", f"no exit within the timeout ({outcome.wall_s:.0f} s)"
    errors = [line for line in lines if is_error(line)] or lines[-1:]
    return "failed", f"exit status {outcome.exit_status}" + (f": {errors[0]}" if errors else "")
