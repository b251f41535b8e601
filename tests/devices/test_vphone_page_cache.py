"""A file pushed to a virtual phone is the phone's page cache, not the daemon's (docs/decisions/vphone-page-cache.md).

memcg v1 charges a page-cache page to the group whose task first brings it in. The sync service
runs in the daemon, outside the phone's memory cgroup, so a pushed file left in the page cache
would be charged there: a model the engine maps (its dense weights) would cost the phone's RAM
nothing and never be reclaimed or re-read under its pressure. The service writes the file out and
drops its pages after a push (syncsvc.leave_page_cache), so the phone's first read faults them in
under the phone's group, as on a phone where adbd's writes and the engine's reads are one RAM.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from engine.units import MIB

FILE_MIB = 32


def _cache_bytes(root: Path) -> int:
    """The phone's memory cgroup's page cache (v1 memory.stat total_cache)."""
    state = json.loads((root / ".vphone/state.json").read_text())
    stat = dict(line.split() for line in Path(state["cgroup"]["path"], "memory.stat").read_text().splitlines())
    return int(stat["total_cache"])


@pytest.mark.parametrize("storage_mbps", [0, 400], ids=["data", "paced-data"])
def test_a_pushed_file_is_charged_to_the_phone_that_reads_it(adb_server, make_phone, tmp_path, storage_mbps):
    # on a paced /data (pacedfs.py) the pages are its FUSE inode's, charged to the reader as well
    phone = make_phone("pagecache", 128 * MIB, storage_mbps=storage_mbps)
    src = tmp_path / "blob.bin"
    src.write_bytes(os.urandom(FILE_MIB * MIB))      # cached on the host, charged to this test
    before = _cache_bytes(phone.root)
    r = adb_server.run("-s", phone.serial, "push", str(src), "/data/local/tmp/blob.bin")
    assert r.returncode == 0, r.stderr
    pushed = _cache_bytes(phone.root)
    assert pushed - before < 4 * MIB, (before, pushed)      # the push charged the phone nothing
    r = adb_server.run("-s", phone.serial, "shell", "cat /data/local/tmp/blob.bin > /dev/null")
    assert r.returncode == 0, r.stderr
    read = _cache_bytes(phone.root)
    # the phone's first read brought the pages in (without the drop they were the daemon's: ~0 here)
    assert read - pushed >= FILE_MIB * MIB * 0.9, (pushed, read)


@pytest.mark.parametrize("storage_mbps", [0, 400], ids=["data", "paced-data"])
def test_the_page_cache_outlives_another_open_of_the_file(adb_server, make_phone, tmp_path, storage_mbps):
    # a phone's file system keeps a file's page cache when another process opens it; FUSE drops
    # the inode's cache on every open unless the server answers FOPEN_KEEP_CACHE, which would free
    # a mapped model's pages whenever the engine opens its expert readers (and move the fight)
    phone = make_phone("keepcache", 128 * MIB, storage_mbps=storage_mbps)
    src = tmp_path / "blob.bin"
    src.write_bytes(os.urandom(FILE_MIB * MIB))
    assert adb_server.run("-s", phone.serial, "push", str(src), "/data/local/tmp/blob.bin").returncode == 0
    r = adb_server.run("-s", phone.serial, "shell", "cat /data/local/tmp/blob.bin > /dev/null")
    assert r.returncode == 0, r.stderr
    read = _cache_bytes(phone.root)
    r = adb_server.run("-s", phone.serial, "shell", ": < /data/local/tmp/blob.bin")   # open, read nothing
    assert r.returncode == 0, r.stderr
    reopened = _cache_bytes(phone.root)
    assert read - reopened < FILE_MIB * MIB * 0.1, (read, reopened)
    # and a file the harness rewrites at its host path is read as it now is, not from the old pages
    src.write_bytes(os.urandom(FILE_MIB * MIB))
    assert adb_server.run("-s", phone.serial, "push", str(src), "/data/local/tmp/blob.bin").returncode == 0
    r = adb_server.run("-s", phone.serial, "shell", "sha256sum /data/local/tmp/blob.bin")
    assert r.returncode == 0 and hashlib.sha256(src.read_bytes()).hexdigest().encode() in r.stdout, r.stdout
