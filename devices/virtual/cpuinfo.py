"""A virtual phone's own cores: a cpuset, and the files that show them.

Cores (`--cpus N`): a cpuset cgroup `<cpuset mount>/<own>/bmoe-vphone-NAME-XXXXXX` whose cpuset.cpus
are N of this host's cores, picked by `allocate` so that phones share no core while the host has
enough (the cores fewest other phones hold, lowest number first). Every process of the phone joins
it (the memory cgroup's procs files list it), so sched_getaffinity, hence `nproc`, is N. The
phone's `/sys/devices/system/cpu/online` and `/proc/cpuinfo` are generated for those N cores
(host numbering: the kernel schedules it on cpu 1, so it says cpu 1) and bound over the host's.

Flash (`--storage-mbps R`) is pacedfs.py's.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from devices.virtual.cgroup import PREFIX, _mounts, _own_path

ONLINE_PATH = Path("sys/devices/system/cpu/online")   # under the phone's root
CPUINFO_PATH = Path("proc/cpuinfo")


class ResourceUnavailable(Exception):
    """A cpuset cgroup cannot be made here (one line why)."""


def parse_list(text: str) -> list[int]:
    """A kernel cpu list ("0-3,6") as numbers."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def format_list(cpus: list[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def host_cpus() -> list[int]:
    """The cores this process may run on (what a phone's cores are taken from)."""
    return sorted(os.sched_getaffinity(0))


def _hierarchy(controller: str) -> Path | None:
    mount = next((m for m in _mounts() if m[1] == "cgroup" and controller in m[2]), None)
    return Path(mount[0] + _own_path(controller).rstrip("/")) if mount else None


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def taken_cpus(exclude_leaf: str) -> dict[int, int]:
    """How many other phones' cpusets hold each core (phones found by their cgroup name prefix)."""
    base = _hierarchy("cpuset")
    counts: dict[int, int] = {}
    if base is None or not base.is_dir():
        return counts
    for d in base.glob(PREFIX + "*"):
        if d.name == exclude_leaf:
            continue
        with contextlib.suppress(OSError, ValueError):
            for c in parse_list((d / "cpuset.cpus").read_text()):
                counts[c] = counts.get(c, 0) + 1
    return counts


def allocate(n: int, leaf: str) -> list[int]:
    """N of this host's cores for a phone: those fewest other phones hold, lowest number first."""
    cpus = host_cpus()
    if n > len(cpus):
        raise ResourceUnavailable(f"{n} cores asked, this host has {len(cpus)}")
    taken = taken_cpus(leaf)
    return sorted(sorted(cpus, key=lambda c: (taken.get(c, 0), c))[:n])


def make_cpuset(leaf: str, cpus: list[int]) -> Path:
    base = _hierarchy("cpuset")
    if base is None:
        raise ResourceUnavailable("no cpuset cgroup hierarchy is mounted")
    path = base / leaf
    try:
        path.mkdir(exist_ok=True)
        mems = (base / "cpuset.mems").read_text().strip() or "0"
        _write(path / "cpuset.mems", mems)
        _write(path / "cpuset.cpus", format_list(cpus))
    except OSError as e:
        raise ResourceUnavailable(f"cpuset cgroup not usable: {e}") from None
    return path


def write(root: Path, cpus: list[int]) -> None:
    """The phone's /sys/devices/system/cpu/online and /proc/cpuinfo for its cores (in place: bound over)."""
    from devices.virtual.meminfo import write_in_place

    (root / ONLINE_PATH).parent.mkdir(parents=True, exist_ok=True)
    write_in_place(root / ONLINE_PATH, _ranges(cpus) + "\n")
    blocks = Path("/proc/cpuinfo").read_text().strip().split("\n\n")
    keep = []
    for block in blocks:
        first = block.split("\n", 1)[0]
        if first.startswith("processor") and int(first.split(":")[1]) in cpus:
            block = re.sub(r"^(siblings|cpu cores)(\s*): [0-9]+$", lambda m: f"{m[1]}{m[2]}: {len(cpus)}", block,
                           flags=re.M)
            keep.append(block)
    if not keep or not blocks[0].startswith("processor"):   # arm64 puts common lines last
        keep = [b for b in blocks if not b.startswith("processor")] + keep
    (root / CPUINFO_PATH).parent.mkdir(parents=True, exist_ok=True)
    write_in_place(root / CPUINFO_PATH, "\n\n".join(keep) + "\n\n")


def _ranges(cpus: list[int]) -> str:
    out: list[list[int]] = []
    run: list[int] = []
    for c in sorted(cpus):
        if run and c != run[-1] + 1:
            out.append(run)
            run = []
        run.append(c)
    if run:
        out.append(run)
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in out)
