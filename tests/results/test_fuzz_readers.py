"""Property-based fuzzing of every results reader: damaged copies of the real upstream files and
the hand-made captures of newer lines and sessions (tests/results/mutants.py) are parsed, or
refused with one clean error of the project's own type (a BmoeError, one terminal-safe line naming
the file, and its line for a number's refusal); never an uncaught exception, never a parsed value
no engine could print (a bool for a count, a part over its whole, a numeral in other digits read as
a number), never NaN in stored JSON.

Repeatable on CI: derandomized, no example database, a fixed number of examples per reader (the
whole file takes well under a minute). benchmarks/fuzz_readers.py runs the same mutators 10,000
times per reader.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.results.mutants import (
    IMPORT_SEEDS,
    NUMBER_OPERATIONS,
    OPERATIONS,
    READERS,
    Reader,
    import_mutant,
    mutate,
    read_mutant,
)

FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MAX_OPS = 3


def _mutant(data: st.DataObject, seed: Path, operations=OPERATIONS) -> bytes:
    """One to three operations on the seed's bytes, every choice drawn from hypothesis."""
    n_ops = data.draw(st.integers(1, MAX_OPS), label="operations")
    return mutate(seed.read_bytes(), lambda n: data.draw(st.integers(0, n - 1)), n_ops, operations)


@pytest.mark.parametrize("reader", READERS, ids=[r.name for r in READERS])
def test_reader_parses_or_refuses_cleanly(reader: Reader):
    seen: set[str] = set()

    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        seed = data.draw(st.sampled_from(reader.seeds), label="seed")
        with tempfile.TemporaryDirectory(prefix="fuzz-") as folder:
            outcome, _ = read_mutant(reader, seed, _mutant(data, seed), Path(folder))
        seen.add(outcome)

    run()
    # the mutants reach both sides: a fuzzer that only ever hits the refusals tests nothing else
    assert seen == {"accepted", "refused"}


def test_importer_on_a_folder_parses_or_refuses_cleanly():
    seen: set[str] = set()

    @settings(FUZZ, max_examples=100)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        files = data.draw(st.sampled_from(IMPORT_SEEDS), label="folder")
        index = data.draw(st.integers(0, len(files) - 1), label="mutated file")
        outcome, _ = import_mutant(files, index, _mutant(data, files[index]))
        seen.add(outcome)

    run()
    assert seen == {"accepted", "refused"}


def test_numbers_no_engine_prints_are_refused_or_never_stored():
    """The number operations alone (a numeral in other digits or with `_`, a bool, a part over its
    whole, a huge or negative number) on every reader's seeds and the importer's folders: each
    mutant refused in one line naming file and line, or accepted with no such value stored."""
    readers = [*READERS, None]
    seen: set[str] = set()

    @settings(FUZZ, max_examples=300)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        reader = data.draw(st.sampled_from(readers), label="reader")
        if reader is None:
            files = data.draw(st.sampled_from(IMPORT_SEEDS), label="folder")
            index = data.draw(st.integers(0, len(files) - 1), label="mutated file")
            outcome, _ = import_mutant(files, index, _mutant(data, files[index], NUMBER_OPERATIONS))
        else:
            seed = data.draw(st.sampled_from(reader.seeds), label="seed")
            with tempfile.TemporaryDirectory(prefix="fuzz-") as folder:
                outcome, _ = read_mutant(reader, seed, _mutant(data, seed, NUMBER_OPERATIONS), Path(folder))
        seen.add(outcome)

    run()
    assert seen == {"accepted", "refused"}


def test_every_mutation_changes_a_real_file():
    """Each operation does damage on a real fixture (a no-op mutator would fuzz nothing)."""
    seeds = [READERS[0].seeds[0].read_bytes(), *(p.read_bytes() for p in IMPORT_SEEDS[5])]   # a CSV, newer lines
    for operation in OPERATIONS:
        changed = [operation(seed, lambda n, k=k: (k * 7919) % n) != seed for seed in seeds for k in range(1, 6)]
        assert any(changed), operation.__name__
