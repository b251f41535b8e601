"""When two samples of one metric differ beyond noise (docs/results.md explains the numbers).

Two samples differ only when their ranges do not overlap and their medians differ by more than
noise_threshold() (as max(r, 1/r) - 1 of the median ratio r, so halving and doubling weigh the
same): max(NOISE_MIN, NOISE_CV_FACTOR x the larger coefficient of variation of the two), or
NOISE_DEFAULT when neither side has repeats.

`compare` against a release from the results database (results.analysis.history) judges with
`u_differs` instead: the Mann-Whitney U test (two-sided, exact without ties for up to U_EXACT_MAX
runs in all, else the normal approximation with the tie correction) must give p < U_ALPHA, and
the median ratio must still clear robust_threshold(): noise_threshold's rule with each side's
spread taken as 1.4826 x its median absolute deviation over its median, so that one run unlike
its repeats (which the ranks already discount) cannot raise the bar past a real change
(docs/decisions/history.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

NOISE_MIN = 0.10
NOISE_CV_FACTOR = 3.0
NOISE_DEFAULT = 0.15
U_ALPHA = 0.05               # the U test's two-sided level: 4 runs a side whose ranges part give p = 0.029
MAD_SCALE = 1.4826           # the MAD of normal values times this is their standard deviation
U_EXACT_MAX = 40             # runs in all up to which, without ties, p is the exact distribution's


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


def noise_threshold(a: Sequence[float], b: Sequence[float], fallback: float = NOISE_DEFAULT,
                    spread: Callable[[Sequence[float]], float] = cv) -> float:
    """The relative change under which two samples of one metric are the same (see the module doc);
    `spread` measures each side's variation (cv, the default, or robust_cv)."""
    cvs = [c for c in (spread(a), spread(b)) if not math.isnan(c)]
    if not cvs:
        return max(NOISE_MIN, fallback)
    return max(NOISE_MIN, NOISE_CV_FACTOR * max(cvs))


def robust_cv(xs: Sequence[float]) -> float:
    """The coefficient of variation as the median absolute deviation sees it: MAD_SCALE x the MAD
    over |median| (the sample std over the mean for normal values; one outlier moves it little) of
    two or more values, else NaN."""
    xs = [x for x in xs if not math.isnan(x)]
    if len(xs) < 2:
        return math.nan
    mid = float(np.median(xs))
    return MAD_SCALE * float(np.median(np.abs(np.array(xs) - mid))) / abs(mid) if mid else math.nan


def robust_threshold(a: Sequence[float], b: Sequence[float], fallback: float = NOISE_DEFAULT) -> float:
    """noise_threshold() with robust_cv() for each side's spread."""
    return noise_threshold(a, b, fallback, robust_cv)


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


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, tied values given their mean rank."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(1, len(x) + 1, dtype=np.float64)
    for value in np.unique(x):
        same = x == value
        if same.sum() > 1:
            ranks[same] = ranks[same].mean()
    return ranks


def _u_counts(n1: int, n2: int) -> np.ndarray:
    """How many of the C(n1+n2, n1) orderings give U = 0, 1, … n1*n2 (the coefficients of the
    Gaussian binomial: an ordering ends in a value of sample 1, which beats all n2 of sample 2, or
    in one of sample 2, which beats none)."""
    table = [[np.ones(1)] * (n2 + 1)]
    for i in range(1, n1 + 1):
        row = [np.ones(1)]
        for j in range(1, n2 + 1):
            counts = np.zeros(i * j + 1)
            last1 = table[i - 1][j]
            counts[j:j + len(last1)] += last1
            last2 = row[j - 1]
            counts[:len(last2)] += last2
            row.append(counts)
        table.append(row)
    return table[n1][n2]


def mann_whitney_p(a: Sequence[float], b: Sequence[float], exact_max: int = U_EXACT_MAX) -> float:
    """The two-sided p-value of the Mann-Whitney U test of a against b (NaN dropped; NaN when a
    side is empty): exact when the values have no ties and there are at most `exact_max` of them,
    else the normal approximation with the tie correction and a continuity correction of 1/2."""
    x = np.array([v for v in a if not math.isnan(v)], dtype=np.float64)
    y = np.array([v for v in b if not math.isnan(v)], dtype=np.float64)
    n1, n2 = len(x), len(y)
    if not n1 or not n2:
        return math.nan
    both = np.concatenate([x, y])
    ranks = _ranks(both)
    u1 = float(ranks[:n1].sum()) - n1 * (n1 + 1) / 2
    u = min(u1, n1 * n2 - u1)
    tied = len(np.unique(both)) < len(both)
    if not tied and n1 + n2 <= exact_max:
        counts = _u_counts(n1, n2)
        return min(1.0, 2 * float(counts[:round(u) + 1].sum() / counts.sum()))
    n = n1 + n2
    _, sizes = np.unique(both, return_counts=True)
    variance = n1 * n2 / 12 * ((n + 1) - float((sizes ** 3 - sizes).sum()) / (n * (n - 1)))
    if variance <= 0:
        return 1.0                    # every value the same
    z = (n1 * n2 / 2 - u - 0.5) / math.sqrt(variance)
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def u_differs(a: Sequence[float], b: Sequence[float], fallback: float = NOISE_DEFAULT) \
        -> tuple[bool, float, float, float]:
    """(b differs from a, median ratio b/a, the noise threshold, the U test's p): the U test gives
    p < U_ALPHA and the ratio clears robust_threshold() (module doc)."""
    a = [x for x in a if not math.isnan(x)]
    b = [x for x in b if not math.isnan(x)]
    if not a or not b:
        return False, math.nan, math.nan, math.nan
    ma, mb = float(np.median(a)), float(np.median(b))
    ratio = mb / ma if ma else math.nan
    threshold = robust_threshold(a, b, fallback)
    p = mann_whitney_p(a, b)
    change = max(ratio, 1 / ratio) - 1 if ratio and not math.isnan(ratio) else math.nan
    return bool(p < U_ALPHA and not math.isnan(change) and change > threshold), ratio, threshold, p
