"""devices.virtual.host_records: a record folder under /run is made with its first entry and goes
with its last, so no phone leaves one on the host; a folder removed by another daemon's last
removal while one writes is made again."""

from __future__ import annotations

from pathlib import Path

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
