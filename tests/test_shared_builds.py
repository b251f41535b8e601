"""tests/conftest.py's built_once and copied_once: what `run.sh test` builds once for both pytest parts
and both workers (docs/decisions/test-shared-builds.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SHARED_ENV, built_once, copied_once, tree_key

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
