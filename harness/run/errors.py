"""The errors of running a campaign (the CLI turns each into one line, exit 1).

Lock contention and unreadable files are the store's (store.errors: LockBusy, StoreError).
"""

from __future__ import annotations

import errno
import os

from engine.errors import BmoeError
from engine.safetext import printable


class RunnerError(BmoeError):
    """A campaign cannot run (its engine cannot start on a device, the output folder holds another
    campaign …)."""


class OtherCampaignError(RunnerError):
    """The output folder holds a campaign whose plan is not this one's."""


def disk_error(e: OSError, where: str | os.PathLike | None = None) -> RunnerError:
    """One line for a write that failed on this host (a full disk above all): the file, what went
    wrong, and that nothing half-written is kept, so a rerun resumes. Only a full disk or quota is
    told to free space; any other error (EPERM, EACCES, EROFS …) is told to fix it."""
    path = e.filename or where or "the campaign directory"
    full = e.errno in (errno.ENOSPC, errno.EDQUOT)
    what = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or str(e)).lower()
    fix = "free space" if full else "fix it"                  # an EPERM or EROFS is not cured by free space
    return RunnerError(f"{printable(str(path))}: {what}; nothing half-written was kept: {fix} and rerun to resume")
