"""A virtual phone's flash read rate (issue 24 item 4, `--storage-mbps`), through the real adb server.

A file in the phone's /data that is not in the page cache, read by the phone's own shell (`cat`,
buffered: readahead misses reach the disk as bios of the phone's blkio group), takes at least its
size over the limit, less the one slice of credit a fresh group starts with; the group counts the
bytes. What the limit does not do (a burst after idle time runs at the disk's speed) is measured in
benchmarks/bench_vphone_storage.py, not asserted here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MIB = 1 << 20
LIMIT_MIBS = 20
FILE_MIB = 30        # 1.5 s at the limit; ~0.1 s at this host's disk rate


def _blkio_read_bytes(root: Path) -> int:
    state = json.loads((root / ".vphone/state.json").read_text())
    for path in state["cgroup"]["extra"]:
        f = Path(path, "blkio.throttle.io_service_bytes")
        if f.exists():
            return sum(int(line.split()[2]) for line in f.read_text().splitlines()
                       if len(line.split()) == 3 and line.split()[1] == "Read")
    raise AssertionError(f"no blkio group among {state['cgroup']['extra']}")


def _uncached_file(path: Path, size_bytes: int) -> None:
    with open(path, "wb") as f:
        f.write(os.urandom(size_bytes))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def test_a_throttled_phone_reads_its_flash_at_the_limit(adb_server, make_phone):
    phone = make_phone("flash", 64 * MIB, storage_mbps=LIMIT_MIBS)
    _uncached_file(phone.root / "data" / "blob.bin", FILE_MIB * MIB)
    before = _blkio_read_bytes(phone.root)
    # timed inside the phone: adb's own start-up is not the flash's
    out = adb_server.run("-s", phone.serial, "shell",
                         "a=$(date +%s%N); cat /data/blob.bin > /dev/null; b=$(date +%s%N); echo $((b - a))")
    elapsed_s = int(out.stdout.decode().split()[-1]) / 1e9
    counted_mib = (_blkio_read_bytes(phone.root) - before) / MIB
    assert counted_mib >= FILE_MIB * 0.95, counted_mib          # the reads went through the phone's group
    # at least the size over the limit, less a fresh group's first slice (100 ms here: 2 MiB)
    assert elapsed_s >= (FILE_MIB - 0.1 * LIMIT_MIBS * 2) / LIMIT_MIBS, elapsed_s
