"""A virtual phone's own zram swap device: made with zram-control/hot_add, mkswap'd, swapon'd; undone on stop.

Android swaps to one zram device (init's `swapon_all` of the fstab's `zramsize=` entry). Here each phone
gets its own `/dev/zramN` from `/sys/class/zram-control/hot_add`, its comp_algorithm (lz4 as on
Android) and disksize set, then `mkswap` and `swapon`. A swap device is global to the kernel, so
what makes it the phone's is the phone's memory cgroup (cgroup.py): its memsw limit is RAM + zram
and its swappiness Android's; every other phone has memsw = RAM (no swap at all). Processes of the
host outside any phone may still swap into it (the root cgroup has the host's vm.swappiness);
the device is swapon'd at the lowest priority (-2, below the kernel's default for a first swap) so
a host swap, where one exists, is used before it. The kernel picks a swap area by priority and
its allocator's turn (mm/swapfile.c swap_alloc_fast, swap_alloc_slow), never by cgroup: with two
zram phones up, one phone's pages may all land in the other's device, so no device's counters are
one phone's. A phone's swap traffic is its memory cgroup's (cgroup.SwapTraffic), and what its
swapped pages take in RAM is their share of every zram swap area's pool (`ram_for`).

What a phone made is recorded in its `.vphone/zram.json` (the device number) and reclaimed at the
next start when a daemon died without its stop (`reclaim`). Every device this module makes is
also named by a file in /run/bmoe-vphone-zram/ (the phone's folder and its daemon's pid), so
orphans whose daemon is gone are found even when their folder is not (`reclaim_orphans`); the
folder goes with its last file (host_records.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from devices.virtual import host_records
from devices.virtual.cgroup import daemon_alive
from engine.fsutil import atomic_write
from engine.units import is_digits

CONTROL = Path("/sys/class/zram-control")
SYS_BLOCK = Path("/sys/block")
REGISTRY = Path("/run/bmoe-vphone-zram")   # one file per device made here: zramN -> the phone's folder
SWAP_PRIORITY = -2
ALGORITHMS = ("lz4", "lzo-rle", "lzo", "zstd", "lz4hc", "842", "deflate")


class ZramUnavailable(Exception):
    """This host cannot give a phone a zram device (no zram module, or not root)."""


def available() -> str | None:
    """None when zram devices can be made here, else why not (one line)."""
    if not (CONTROL / "hot_add").exists():
        return "this host has no zram (no /sys/class/zram-control: modprobe zram, as root)"
    if not os.access(CONTROL / "hot_add", os.R_OK) or os.geteuid() != 0:
        return "making a zram device needs root (zram-control/hot_add)"
    return None


def algorithms() -> list[str]:
    """The compressors this kernel's zram offers (comp_algorithm of any device)."""
    for dev in sorted(SYS_BLOCK.glob("zram*")):
        with contextlib.suppress(OSError):
            return (dev / "comp_algorithm").read_text().replace("[", "").replace("]", "").split()
    return []


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


@dataclass(frozen=True)
class Zram:
    """One zram device, /dev/zramN, used as the phone's swap."""
    num: int

    @property
    def sys(self) -> Path:
        return SYS_BLOCK / f"zram{self.num}"

    @property
    def dev(self) -> str:
        return f"/dev/zram{self.num}"

    @classmethod
    def create(cls, size_bytes: int, algorithm: str, owner: Path) -> Zram:
        reason = available()
        if reason:
            raise ZramUnavailable(reason)
        try:
            num = int((CONTROL / "hot_add").read_text())
        except (OSError, ValueError) as e:
            raise ZramUnavailable(f"zram-control/hot_add failed: {e}") from None
        z = cls(num)
        host_records.write_entry(REGISTRY, f"zram{num}", lambda entry: entry.write_text(f"{owner}\n{os.getpid()}\n"))
        try:
            _write(z.sys / "comp_algorithm", algorithm)
            _write(z.sys / "disksize", str(size_bytes))
            for _ in range(50):   # udev may take a moment to make the node
                if os.path.exists(z.dev):
                    break
                time.sleep(0.02)
            for argv in (["mkswap", z.dev], ["swapon", "-p", str(SWAP_PRIORITY), z.dev]):
                done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
                if done.returncode != 0:
                    raise ZramUnavailable(f"{argv[0]} {z.dev}: {(done.stderr or done.stdout).strip()}")
        except (OSError, ZramUnavailable) as e:
            z.remove()
            raise ZramUnavailable(str(e)) from None
        return z

    # -- reading ----------------------------------------------------------------------------
    def mm_stat(self) -> dict[str, int]:
        """orig_data_size compr_data_size mem_used_total mem_limit mem_used_max same_pages ..."""
        names = ("orig_data_size", "compr_data_size", "mem_used_total", "mem_limit", "mem_used_max",
                 "same_pages", "pages_compacted", "huge_pages")
        try:
            values = [int(v) for v in (self.sys / "mm_stat").read_text().split()]
        except (OSError, ValueError):
            return {}
        return dict(zip(names, values))

    # -- teardown ---------------------------------------------------------------------------
    def remove(self) -> None:
        """swapoff (pages come back into whoever owns them), reset, hot_remove; forget it."""
        if is_swap(self.dev):
            subprocess.run(["swapoff", self.dev], capture_output=True, timeout=120)
        for _ in range(20):
            try:
                _write(self.sys / "reset", "1")
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)
        # hot_remove answers EBUSY while anything holds the device open (udev's probe after the
        # reset, a swapoff still settling): retry for up to 2 s, then keep its registry entry so the
        # next start's reclaim_orphans removes it, and say so
        for attempt in range(40):
            try:
                _write(CONTROL / "hot_remove", str(self.num))
                break
            except OSError as e:
                if not self.sys.exists():
                    break
                if attempt == 39:
                    print(f"vphone: {self.dev} not removed ({e.strerror}); the next start retries",
                          file=sys.stderr, flush=True)
                    return
                time.sleep(0.05)
        host_records.remove_entry(REGISTRY, f"zram{self.num}")


def swap_areas() -> list[str]:
    """The devices and files /proc/swaps lists (every swap area of this kernel)."""
    with contextlib.suppress(OSError):
        return [line.split()[0] for line in Path("/proc/swaps").read_text().splitlines()[1:] if line.split()]
    return []


def ram_for(swapped_bytes: int) -> int:
    """What `swapped_bytes` of one phone's pages take in RAM as zram stores them: their share of
    the pool of every zram swap area, at its ratio (sum of mm_stat mem_used_total over sum of
    orig_data_size). Any of those devices may hold the phone's pages, and none says whose a page
    is, so a phone whose pages compress worse than the pool's average is charged a little less
    than its own, and the other more; exact with one zram phone swapping
    (docs/decisions/vphone-swap-counters.md)."""
    orig = used = 0
    for dev in swap_areas():
        if dev.startswith("/dev/zram") and is_digits(dev[9:]):
            stat = Zram(int(dev[9:])).mm_stat()
            orig += stat.get("orig_data_size", 0)
            used += stat.get("mem_used_total", 0)
    return swapped_bytes * used // orig if orig > 0 and swapped_bytes > 0 else 0


def is_swap(dev: str) -> bool:
    return dev in swap_areas()


def record(internal: Path, z: Zram | None) -> None:
    path = internal / "zram.json"
    if z is None:
        path.unlink(missing_ok=True)
    else:
        atomic_write(path, json.dumps({"num": z.num}) + "\n")


def reclaim(internal: Path) -> None:
    """Remove the device a previous daemon of this phone made and never removed (it was killed)."""
    path = internal / "zram.json"
    try:
        num = int(json.loads(path.read_text())["num"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    # only ours: a device whose registry entry names this phone (the number may have been reused)
    with contextlib.suppress(OSError, ValueError):
        if _owner(REGISTRY / f"zram{num}")[0] == internal.parent:
            Zram(num).remove()
    path.unlink(missing_ok=True)


def _owner(entry: Path) -> tuple[Path, int]:
    root, pid = entry.read_text().split("\n")[:2]
    return Path(root), int(pid)


def reclaim_orphans() -> list[int]:
    """Remove every device made here whose daemon is gone (killed before its stop)."""
    removed: list[int] = []
    if not REGISTRY.is_dir():
        return removed
    for entry in REGISTRY.glob("zram*"):
        with contextlib.suppress(OSError, ValueError):
            root, pid = _owner(entry)
            if pid != os.getpid() and not daemon_alive(pid):
                num = int(entry.name[4:])
                Zram(num).remove()
                (root / ".vphone" / "zram.json").unlink(missing_ok=True)
                removed.append(num)
    return removed
