"""engine.procfs: `Key: N kB` files, parsed whole (parse_kb_fields) or kept open (KbFile)."""

from __future__ import annotations

from pathlib import Path

from engine.procfs import KbFile, parse_kb_fields

STATUS_KEYS = ("VmRSS", "RssAnon", "RssFile", "VmSwap", "Name", "VmHWM")


def test_kb_file_reads_what_parse_kb_fields_reads(tmp_path):
    """The same numbers as the whole-file parse, on copies of this host's own files (a copy: the
    live ones change between two reads)."""
    for source, keys in (("/proc/self/status", STATUS_KEYS), ("/proc/meminfo", ("MemTotal", "MemAvailable",
                                                                               "SwapFree", "Hugepagesize"))):
        copy = tmp_path / Path(source).name
        copy.write_bytes(Path(source).read_bytes())
        whole = parse_kb_fields(copy.read_text())
        f = KbFile(str(copy), keys)
        assert f.values() == {k: whole[k] for k in keys if k in whole}     # MemTotal: the first line
        f.close()


def test_kb_file_reads_the_file_again_on_each_call(tmp_path):
    path = tmp_path / "status"
    path.write_text("Name:\tx\nVmRSS:\t  100 kB\nVmSwap:\t0 kB\n")
    f = KbFile(str(path), ("VmRSS", "VmSwap", "RssAnon"))
    assert f.values() == {"VmRSS": 100, "VmSwap": 0}
    with open(path, "r+") as fh:             # the same file (inode), new text: as /proc regenerates it
        fh.write("Name:\tx\nVmRSS:\t  250 kB\nRssAnon:  7 kB\nVmSwap:\tnot a number\n")
        fh.truncate()
    assert f.values() == {"VmRSS": 250, "RssAnon": 7}
    assert f.values() == parse_kb_fields(path.read_text())     # a value that is no number: absent
    f.close()
    assert f.values() == {}                  # closed: nothing, as an unreadable file gives


def test_kb_file_that_cannot_be_opened_gives_nothing(tmp_path):
    assert KbFile(str(tmp_path / "missing"), ("VmRSS",)).values() == {}
