"""The names of a campaign directory's files and folders (docs/campaign-dir.md), and the paths
they make. Every other module asks here instead of spelling a name.

```
DIR/campaign.toml  plan.json  ledger.jsonl  community.json
    devices/<device_id>.json  models/<model_id>.json  storage/<device>.json
    runs/<cell_id>/<attempt>/run.json metrics.csv route.csv stdout.txt stderr.txt samples.csv run.metrics
                             ppl.txt ppl-stderr.txt report.md
```

Ids passed in are already safe as one path component: `safe_id` and `device_id` below made them.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path


def safe_id(text: str) -> str:
    """A device or model string made safe as one path component (it is data, never a path)."""
    out = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.")
    return out[:80] or "x"


def device_id(spec: str) -> str:
    """A device as the campaign names it (local, a serial, HOST:PORT, virtual:NAME) as one path
    component: devices/<device_id>.json, storage/<device_id>.json, a run's `device_id`."""
    return safe_id(spec.replace(":", "-"))

# ── the directory ──────────────────────────────────────────────────────────────────────────────
CAMPAIGN_TOML = "campaign.toml"       # the resolved campaign (an import's: an [import] table)
PLAN_JSON = "plan.json"
LEDGER_JSONL = "ledger.jsonl"
COMMUNITY_JSON = "community.json"     # `sweep --preset community` only
APP_JSON = "app.json"                 # `sweep --preset app` only
RUNS_DIR = "runs"
DEVICES_DIR = "devices"
MODELS_DIR = "models"
STORAGE_DIR = "storage"               # `sweep --preset community` only
# any of these beside each other makes a folder a campaign directory (not upstream bench data)
CAMPAIGN_MARKERS = (PLAN_JSON, LEDGER_JSONL, CAMPAIGN_TOML)

# ── one attempt's folder ───────────────────────────────────────────────────────────────────────
RUN_JSON = "run.json"
METRICS_CSV = "metrics.csv"           # the engine's --csv, as pulled
ROUTE_CSV = "route.csv"               # --route-trace
STDOUT_TXT = "stdout.txt"
STDERR_TXT = "stderr.txt"
SAMPLES_CSV = "samples.csv"           # pressure samples (SAMPLE_COLUMNS)
RUN_METRICS = "run.metrics"           # upstream's `.metrics` sidecar keys
PPL_TXT = "ppl.txt"                   # the quality scoring run's stdout (`ppl:` …), raw bytes (run.json `quality`)
PPL_STDERR_TXT = "ppl-stderr.txt"     # … and its stderr
REPORT_MD = "report.md"               # an imported community report, as given (its sha256 is in run.json)
SAMPLE_COLUMNS = ("t_s", "mem_available_kb", "vm_hwm_kb", "vm_rss_kb", "cpu_temp_mc", "battery_temp_dc")
# ... then devices.reclaim.COLUMNS (vm_swap_kb … zram_used_kb); files written before the reclaim columns stop at the six
TMP_PREFIX = ".tmp-"                  # an attempt being assembled; readers skip dot-folders

# ── the site `report` writes (not a campaign directory, but the same kind of contract) ─────────
SITE_RECOMMENDATIONS_JSON = "recommendations.json"
SITE_RUNS_CSV = "runs.csv"

# ── under the fleet's home (~/.bmoe-fleet), not in the directory ───────────────────────────────
LOCKS_DIR = "locks"


def run_dir_rel(cell_id: str, attempt: int) -> str:
    """An attempt's folder relative to the directory, as the ledger records it."""
    return f"{RUNS_DIR}/{cell_id}/{attempt}"


def cell_runs(root: str | os.PathLike, cell_id: str) -> Path:
    """The folder holding every attempt of one cell."""
    return Path(root) / RUNS_DIR / cell_id


def run_dir(root: str | os.PathLike, cell_id: str, attempt: int) -> Path:
    """One attempt's folder."""
    return cell_runs(root, cell_id) / str(attempt)


def device_record(root: str | os.PathLike, device_id: str) -> Path:
    """devices/<device_id>.json."""
    return Path(root) / DEVICES_DIR / f"{device_id}.json"


def model_record(root: str | os.PathLike, model_id: str) -> Path:
    """models/<model_id>.json."""
    return Path(root) / MODELS_DIR / f"{model_id}.json"


def storage_record(root: str | os.PathLike, device_id: str) -> Path:
    """storage/<device_id>.json (a community sweep's storage probe)."""
    return Path(root) / STORAGE_DIR / f"{device_id}.json"


def is_campaign_dir(folder: str | os.PathLike) -> bool:
    """Whether a folder holds a campaign directory's own files."""
    return any((Path(folder) / marker).is_file() for marker in CAMPAIGN_MARKERS)


def dir_lock_name(root: str | os.PathLike) -> str:
    """The lock file name of a campaign directory (one per absolute path)."""
    return f"dir-{hashlib.sha256(str(root).encode()).hexdigest()[:16]}.lock"


def device_lock_name(lock_key: str) -> str:
    """The lock file name of a device (its key is shared by every name of one phone)."""
    return f"device-{lock_key}.lock"
