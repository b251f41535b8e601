"""The outcome vocabulary of an attempt (docs/campaign-dir.md, "Ledger line").

A *result* is what the run says about its configuration (an LMK kill is a result); an
*infrastructure* outcome says the run could not be made (a device lost, a push that failed) and is
retried. A cell is done when its latest attempt's outcome is a result.

The names and sets here are the vocabulary's one spelling: every other module compares with them
and lists them through them (tests/store/test_outcome_names.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OK = "ok"
LMK_KILLED = "lmk_killed"
KILLED = "killed"
CONFIG_ERROR = "config_error"
ENGINE_ERROR = "engine_error"
TIMEOUT = "timeout"
INVALID = "invalid"
DEVICE_LOST = "device_lost"
PUSH_FAILED = "push_failed"

RESULTS = (OK, LMK_KILLED, KILLED, CONFIG_ERROR, ENGINE_ERROR, TIMEOUT, INVALID)
INFRA = (DEVICE_LOST, PUSH_FAILED)
OUTCOMES = RESULTS + INFRA
KILLS = (LMK_KILLED, KILLED)        # killed by the low-memory killer, or by a SIGKILL nobody claimed


def is_done(record: Mapping[str, Any] | None, rerun_failed: bool = False) -> bool:
    """Whether a cell whose latest ledger line is `record` needs no further attempt."""
    if record is None or record["outcome"] in INFRA:
        return False
    return record["outcome"] == OK or not rerun_failed
