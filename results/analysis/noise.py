"""When two samples of one metric differ beyond noise (docs/results.md explains the numbers).

Two samples differ only when their ranges do not overlap and their medians differ by more than
noise_threshold() (as max(r, 1/r) - 1 of the median ratio r, so halving and doubling weigh the
same): max(NOISE_MIN, NOISE_CV_FACTOR x the larger coefficient of variation of the two), or
NOISE_DEFAULT when neither side has repeats.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

NOISE_MIN = 0.10
NOISE_CV_FACTOR = 3.0
NOISE_DEFAULT = 0.15


def median(xs: Iterable[float]) -> float:
    """The median of the values that are numbers (NaN when none is)."""
    xs = [x for x in xs if not math.isnan(x)]
    return float(np.median(xs)) if xs else math.nan



def cv(xs: Sequence[float]) -> float:
    """Coefficient of variation (sample std / mean) of two or more values, else NaN."""
    xs = [x for x in xs if not math.isnan(x)]
    if len(xs) < 2:
        return math.nan
    mean = float(np.mean(xs))
    return float(np.std(xs, ddof=1)) / abs(mean) if mean else math.nan


def noise_threshold(a: Sequence[float], b: Sequence[float], fallback: float = NOISE_DEFAULT) -> float:
    """The relative change under which two samples of one metric are the same (see the module doc)."""
    cvs = [c for c in (cv(a), cv(b)) if not math.isnan(c)]
    if not cvs:
        return max(NOISE_MIN, fallback)
    return max(NOISE_MIN, NOISE_CV_FACTOR * max(cvs))


def differs(a: Sequence[float], b: Sequence[float], fallback: float = NOISE_DEFAULT) -> tuple[bool, float, float]:
    """(b differs from a beyond noise, median ratio b/a, the threshold used)."""
    a = [x for x in a if not math.isnan(x)]
    b = [x for x in b if not math.isnan(x)]
    if not a or not b:
        return False, math.nan, math.nan
    ma, mb = float(np.median(a)), float(np.median(b))
    ratio = mb / ma if ma else math.nan
    threshold = noise_threshold(a, b, fallback)
    apart = max(b) < min(a) or min(b) > max(a)
    # symmetric: halving and doubling are the same size of change
    change = max(ratio, 1 / ratio) - 1 if ratio and not math.isnan(ratio) else math.nan
    return bool(apart and not math.isnan(change) and change > threshold), ratio, threshold


def typical_noise(cvs: Sequence[float]) -> float:
    """The noise threshold for cells without repeats: from the median coefficient of variation of
    the cells that have them (NOISE_DEFAULT when none has)."""
    cvs = [c for c in cvs if not math.isnan(c)]
    return max(NOISE_MIN, NOISE_CV_FACTOR * float(np.median(cvs))) if cvs else NOISE_DEFAULT
