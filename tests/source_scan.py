"""The source scan the one-spelling tests share (tests/results/test_budget_label.py,
tests/store/test_outcome_names.py, tests/store/test_attempted.py): a check run over every module of
the project and the benchmarks but the one that owns a spelling, each finding named by file and line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "devices", "harness", "results", "store", "benchmarks")


def found_outside(home: Path, scan: Callable[[str], list[str]], packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """`scan`'s findings (each "line: what") in every module of `packages` but `home`, as "path:line: what"."""
    return [f"{path.relative_to(ROOT)}:{finding}" for package in packages
            for path in sorted((ROOT / package).rglob("*.py")) if path != home
            for finding in scan(path.read_text(encoding="utf-8"))]


def assert_none_outside(home: Path, scan: Callable[[str], list[str]], what: str, plants: tuple[str, ...],
                        packages: tuple[str, ...] = PACKAGES) -> None:
    """Fail, naming each place, where a module but `home` has what `scan` looks for; first, that
    `scan` finds each of `plants` (sources that spell it a second way), so the check can fail."""
    missed = [plant for plant in plants if not scan(plant)]
    assert plants and missed == [], f"the scan for {what} misses {missed}"
    found = found_outside(home, scan, packages)
    assert found == [], f"{what} outside {home.relative_to(ROOT)}:\n" + "\n".join(found)
