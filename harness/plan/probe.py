"""The knee behind a campaign's `cache_mb = "knee*F"` budgets.

One short route-traced probe run per (device, model, top-k) — cache 0, `run.probe_tokens` tokens
(default: the sweep's n_predict, at most 64, so the trace is the sweep runs' own),
the campaign's prompt (harness.plan.grid.probe_config) — and its trace replayed through the exact LRU
curve (results.replay.replay): the knee is where more MiB start buying fewer decode hits. The sweep then
measures F x that budget on the device; the probe's run folder keeps the trace, so pages draw the
predicted curve with the measured points on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.errors import BmoeError


class ProbeError(BmoeError):
    """A probe's trace gives no knee (unreadable, or no expert is ever looked up twice)."""


@dataclass(frozen=True)
class Knee:
    knee_mib: int
    first_decode_hit_mib: float | None


def knee_of_trace(path: str | Path) -> Knee:
    from results.errors import ReplayError
    from results.read.route_trace import TraceError, read_route_trace
    from results.replay.lru_replay import access_sequence, first_decode_hit_mib, knee_mib, stack_distances

    try:
        seq = access_sequence(read_route_trace(path))
        distance = stack_distances(seq)
    except (TraceError, ReplayError, OSError) as e:
        raise ProbeError(f"the probe's route trace {path}: {e}") from None
    knee = knee_mib(seq, distance)
    if knee is None:
        raise ProbeError(f"the probe's route trace {path} never looks an expert up twice; "
                         "raise run.probe_tokens")
    return Knee(knee, first_decode_hit_mib(seq, distance))
