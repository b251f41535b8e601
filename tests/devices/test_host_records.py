"""devices.virtual.host_records: a record folder under /run is made with its first entry and goes
with its last, so no phone leaves one on the host; a folder removed by another daemon's last
removal while one writes is made again; an orphaned cgroup's entry stays until its group is gone."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from devices.virtual import host_records


def test_the_folder_comes_with_the_first_entry_and_goes_with_the_last(tmp_path):
    folder = tmp_path / "records"
    host_records.write_entry(folder, "zram7", lambda p: p.write_text("a\n"))
    host_records.write_entry(folder, "zram8", lambda p: p.write_text("b\n"))
    assert folder.stat().st_mode & 0o777 == 0o700 and sorted(p.name for p in folder.iterdir()) == ["zram7", "zram8"]
    host_records.remove_entry(folder, "zram7")
    assert [p.name for p in folder.iterdir()] == ["zram8"]
    host_records.remove_entry(folder, "zram8")
    assert not folder.exists()
    host_records.remove_entry(folder, "zram8")             # gone already: nothing to do, no error
    assert not folder.exists()


def test_a_folder_removed_between_its_making_and_the_write_is_made_again(tmp_path):
    folder = tmp_path / "records"
    tries: list[bool] = []

    def write(entry: Path) -> None:
        if not tries:                  # another daemon's last removal, just after this one made the folder
            entry.parent.rmdir()
        tries.append(entry.parent.is_dir())
        entry.write_text("pid\n")

    host_records.write_entry(folder, "leaf", write)
    assert tries == [False, True] and (folder / "leaf").read_text() == "pid\n"


@pytest.mark.root("makes a memory cgroup")
def test_an_orphaned_group_the_kernel_holds_keeps_its_entry_until_a_later_reclaim_removes_it(tmp_path, monkeypatch):
    """devices.virtual.cgroup.reclaim_orphans: a group whose daemon is gone is removed with its
    entry; one whose folder cannot be removed yet (here a group inside it) keeps its entry, so the
    next reclaim finds it again."""
    from devices.virtual import cgroup

    root = Path("/sys/fs/cgroup/memory")
    assert root.is_dir(), "this suite runs as root with a writable memory cgroup"
    group = root / f"bmoe-test-{uuid.uuid4().hex[:8]}"
    gone = subprocess.Popen(["true"])               # a pid that is no phone daemon: the group's owner is gone
    gone.wait()
    registry = tmp_path / "registry"
    monkeypatch.setattr(cgroup, "REGISTRY", registry)
    monkeypatch.setattr(cgroup.time, "sleep", lambda s: None)      # remove()'s retries, without their waits
    group.mkdir()
    (group / "held").mkdir()                        # rmdir of the group fails while this is in it
    try:
        host_records.write_entry(registry, group.name, lambda e: e.write_text(f"{gone.pid}\n{group}\n"))
        assert cgroup.reclaim_orphans() == []
        assert group.is_dir() and (registry / group.name).read_text() == f"{gone.pid}\n{group}\n"
        (group / "held").rmdir()
        assert cgroup.reclaim_orphans() == [group.name]
        assert not group.exists() and not registry.exists()
    finally:
        for path in (group / "held", group):
            if path.exists():
                path.rmdir()
