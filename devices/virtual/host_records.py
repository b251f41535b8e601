"""The folders under /run where phones record what they made on the host (zram.REGISTRY: the zram
devices; cgroup.REGISTRY: the cgroups), one file per thing made, so that a daemon killed before its
stop leaves what it made findable by the next start. A folder is made with its first entry and
removed with its last: with no phone up, none is left on the host.

Two daemons may start and stop at once: a folder removed by one's last removal between another's
making it and writing its entry is made again (`write_entry`); a removal that finds the folder not
empty leaves it (`remove_entry`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

_TRIES = 10


def write_entry(folder: Path, name: str, write: Callable[[Path], object]) -> None:
    """Entry `name` of `folder` written by `write(path)`, the folder made first (mode 0700)."""
    for attempt in range(_TRIES):
        folder.mkdir(mode=0o700, exist_ok=True)
        try:
            write(folder / name)
            return
        except FileNotFoundError:          # the folder went with another's last entry: made again
            if attempt == _TRIES - 1:
                raise


def remove_entry(folder: Path, name: str) -> None:
    """Entry `name` of `folder` removed, and the folder with it when it was the last."""
    (folder / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):      # not empty (another's entry), or already gone
        folder.rmdir()
