"""Property-based fuzzing of the virtual adbd over a real socket: damaged sync requests inside a
correct adb transport, and damaged transport messages (tests/devices/sync_mutants.py). The daemon
answers FAIL, serves, or closes; it never crashes and never hangs (a fresh connection's STAT is
answered after every mutant, and a connection whose peer hung up is closed).

Derandomized, no example database, a fixed number of examples; benchmarks/fuzz_readers.py sends
10,000 of each kind.
"""

from __future__ import annotations

import pytest

from devices.virtual import manager
from devices.virtual.phone import Layout
from tests.devices import sync_mutants as sm
from tests.devices.conftest import start_phone
from tests.fuzzing import fuzz


@pytest.fixture(scope="module")
def fuzz_phone(adb_server, phone_home):
    phone = start_phone(adb_server, phone_home, "fuzzsync", 128 << 20)
    try:
        yield phone
    finally:
        manager.down(phone.name, home=phone_home, adb_host="127.0.0.1", adb_port=adb_server.port)


@pytest.mark.parametrize("kind, examples", [("sync", 80), ("wire", 40)])
def test_the_daemon_answers_fail_or_closes_on_damaged_traffic(fuzz_phone, kind, examples):
    def one(pick, n_ops: int) -> str:
        seed = sm.SEEDS[pick(len(sm.SEEDS))]
        mutant = sm.mutate(sm.wire_seed(seed) if kind == "wire" else seed, pick, n_ops, kind)
        return sm.run_mutant(fuzz_phone.port, kind, mutant, pick)

    assert fuzz(one, examples) == {"accepted", "refused"}     # both sides reached: the fuzzer tests something
    # and no service raised on the way (a NUL in a path, a negative SEND mode did: answered now)
    assert sm.service_exceptions(Layout(fuzz_phone.root).daemon_log) == []


def test_every_seed_is_served_whole(fuzz_phone):
    """The undamaged conversations are answered in full (so a refusal above is the damage's)."""
    phone = fuzz_phone
    for seed in sm.SEEDS:
        got = sm.sync_session(phone.port, seed, lambda n: n - 1)
        assert b"FAIL" not in got["replies"] and not got["stalled"], got
    assert sm.run_mutant(phone.port, "wire", sm.wire_seed(sm.SEEDS[0]), lambda n: 0) == "accepted"
