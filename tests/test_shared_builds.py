"""tests/conftest.py's built_once and copied_once: what `run.sh test` builds once for both pytest parts
and both workers (docs/decisions/test-shared-builds.md); and BuildsAlone, which gives a build of the
rate part its cores alone. Each BuildsAlone below stands for one pytest process: flock(2) locks
belong to an open file, so two of them in one process exclude each other as two processes would."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import BUILDS_ALONE_ENV, SHARED_ENV, BuildsAlone, built_once, copied_once, tree_key

ROOT = Path(__file__).resolve().parents[1]
# another process asking for the same folder (as the other worker, or the other part, does)
OTHER = """
import sys
from pathlib import Path
from tests.conftest import built_once

class Factory:
    def mktemp(self, name):
        raise AssertionError("built again in the other process")

def build(folder: Path) -> None:
    raise AssertionError("built again in the other process")

print(built_once(Factory(), "thing", build))
"""


@pytest.fixture
def shared(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "shared"
    folder.mkdir()
    monkeypatch.setenv(SHARED_ENV, str(folder))
    return folder


def test_a_folder_is_built_once_per_run_and_another_process_reads_it(shared, tmp_path_factory):
    builds = []

    def build(folder: Path) -> None:
        builds.append(folder)
        (folder / "campaign.toml").write_text("version = 1\n")

    first = built_once(tmp_path_factory, "thing", build)
    again = built_once(tmp_path_factory, "thing", build)
    assert first == again == shared / f"thing-{tree_key()}" and len(builds) == 1
    other = subprocess.run([sys.executable, "-c", OTHER], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert other.returncode == 0, other.stderr[-2000:]
    assert other.stdout.strip() == str(first)


def test_a_build_that_failed_half_way_is_built_again(shared, tmp_path_factory):
    def broken(folder: Path) -> None:
        (folder / "half").write_text("x")
        raise RuntimeError("the engine crashed")

    with pytest.raises(RuntimeError):
        built_once(tmp_path_factory, "thing", broken)
    done = built_once(tmp_path_factory, "thing", lambda folder: (folder / "whole").write_text("y"))
    assert sorted(p.name for p in done.iterdir()) == [".built", "whole"]


def test_each_process_works_on_its_own_copy(shared, tmp_path_factory):
    def build(folder: Path) -> None:
        (folder / "camp").mkdir()
        (folder / "camp" / "ledger.jsonl").write_text("{}\n")

    a = copied_once(tmp_path_factory, "camp", build)
    b = copied_once(tmp_path_factory, "camp", build)
    (a / "camp" / "ledger.jsonl").write_text("changed by a test\n")
    assert (b / "camp" / "ledger.jsonl").read_text() == "{}\n"
    assert (built_once(tmp_path_factory, "camp", build) / "camp" / "ledger.jsonl").read_text() == "{}\n"
    assert not (a / ".built").exists()


def test_without_the_run_folder_it_builds_in_this_processs_temp_folder(tmp_path_factory, monkeypatch):
    monkeypatch.delenv(SHARED_ENV, raising=False)
    builds = []
    a = built_once(tmp_path_factory, "alone", builds.append)
    b = built_once(tmp_path_factory, "alone", builds.append)
    assert a != b and builds == [a, b] and a.parent == b.parent == tmp_path_factory.getbasetemp()


def _in_thread(step) -> threading.Event:
    """`step` run in a thread of its own; the event is set once it has returned."""
    done = threading.Event()
    threading.Thread(target=lambda: (step(), done.set()), daemon=True).start()
    return done


def _build_in_thread(who: BuildsAlone) -> tuple[threading.Event, threading.Event]:
    """A build by `who` in a thread: (set once it runs, set to end it)."""
    building, release = threading.Event(), threading.Event()

    def build() -> None:
        with who.paused(), who.exclusive():
            building.set()
            release.wait(30)

    threading.Thread(target=build, daemon=True).start()
    return building, release


def test_a_build_waits_for_the_running_tests_and_tests_wait_for_a_waiting_build(tmp_path, monkeypatch):
    monkeypatch.setenv(BUILDS_ALONE_ENV, str(tmp_path / "cores.lock"))
    testing, builder, late = BuildsAlone(), BuildsAlone(), BuildsAlone()
    testing.test_begins()
    building, release = _build_in_thread(builder)
    assert not building.wait(0.5)                 # a test runs: the build waits
    started = _in_thread(late.test_begins)        # a test starting now waits behind the build
    assert not started.wait(0.5)
    testing.test_ends()
    assert building.wait(10) and not started.is_set()
    release.set()
    assert started.wait(10)                       # the build done, the test runs
    late.test_ends()


def test_a_test_that_builds_lets_its_own_hold_go_and_takes_it_back(tmp_path, monkeypatch):
    monkeypatch.setenv(BUILDS_ALONE_ENV, str(tmp_path / "cores.lock"))
    me, other = BuildsAlone(), BuildsAlone()
    me.test_begins()
    with me.paused(), me.exclusive(), me.paused(), me.exclusive():    # a build within a build
        waiting = _in_thread(other.test_begins)
        assert not waiting.wait(0.5)              # no test of another process beside it
    assert waiting.wait(10)                       # the build over: tests run beside each other
    other.test_ends()
    building, release = _build_in_thread(other)
    assert not building.wait(0.5), "my test holds its cores shared again"
    me.test_ends()
    assert building.wait(10)
    release.set()


def test_without_the_variable_nothing_waits(tmp_path, monkeypatch):
    monkeypatch.delenv(BUILDS_ALONE_ENV, raising=False)
    a, b = BuildsAlone(), BuildsAlone()
    a.test_begins()
    building, release = _build_in_thread(b)
    assert building.wait(10)
    release.set()
    a.test_ends()
