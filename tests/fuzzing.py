"""The hypothesis driver every mutant-based fuzz test shares: each example draws its choices
(`pick(n)`, a choice in 0..n-1) and its number of operations (1 to 3) from hypothesis, so the
mutators are the benchmarks' own (they draw from random.Random instead).

Repeatable on CI: derandomized, no example database, a fixed number of examples.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
MAX_OPS = 3


def fuzz(one: Callable[[Callable[[int], int], int], str], examples: int) -> set[str]:
    """Run `one(pick, n_ops)` on `examples` examples; the outcomes it returned ("accepted",
    "refused"). An exception it raises fails the test, with the example shrunk and printed."""
    seen: set[str] = set()

    @settings(FUZZ, max_examples=examples)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        def pick(n: int) -> int:
            return data.draw(st.integers(0, n - 1))
        seen.add(one(pick, data.draw(st.integers(1, MAX_OPS), label="operations")))

    run()
    return seen
