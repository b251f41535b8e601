"""The sweep's defaults, in one table: what a campaign gets for an axis or run setting it does not
name. The campaign model (harness.campaign.model: Axes, RunSettings; harness.campaign.options) and the
`sweep` command's options both read them from here, so the CLI's help and the file's meaning
cannot drift apart. No imports beyond the standard library: the CLI loads it to build its help.
"""

from __future__ import annotations

from dataclasses import dataclass

PYTHON_ENGINE = "bmoe-py"   # `sweep --engine` value for this project's engine
# run.quality (`sweep --quality`): measure what the lossy levers do to the text; "auto": when a cell is lossy
QUALITY_AUTO, QUALITY_ON, QUALITY_OFF = "auto", "on", "off"
QUALITY = (QUALITY_AUTO, QUALITY_ON, QUALITY_OFF)


@dataclass(frozen=True)
class SweepDefaults:
    cache_mb: tuple[int | str, ...] = (0, "auto")
    cache_ceil_mb: tuple[int, ...] = (0,)        # caps for `auto` budgets; 0: none
    dense_weights: tuple[str, ...] = ("anon",)
    n_expert_used: tuple[int, ...] = (0,)        # 0 = the model's own top-k
    io_threads: tuple[int, ...] = (4,)
    threads: int | str = "auto"                  # -t: the device's online cores (harness.run.cpushare)
    quality: str = QUALITY_AUTO
    n_predict: int = 32
    repeats: int = 1
    timeout_s: float = 1800.0
    device_timeout_s: float = 30.0              # a phone silent this long mid-run is lost
    name: str = "sweep"
    engine: str = PYTHON_ENGINE


SWEEP = SweepDefaults()
