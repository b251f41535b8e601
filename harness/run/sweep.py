"""Run a preset's sweep to its end, then what the preset asks after the runs: the app preset's
app.json, the community preset's community.json and each device's storage probe (O_DIRECT reads of
the model file, as upstream's bench-report.sh probes a drive)."""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from engine.errors import BmoeError
from engine.units import KIB, MIB, is_digits
from harness.campaign.model import Campaign, remote_model_path
from harness.campaign.presets import Sweep
from results.analysis import android_app as app
from results.analysis.community import COMMUNITY_PROMPT, COMMUNITY_RUNS, COMMUNITY_TOKENS
from store import names, versioned

PROBE_BLOCK = 512 * KIB
PROBE_BLOCKS = 2048                    # 1 GiB, as bench-report.sh reads
PROBE_MAX_MIB_S = 30720                # faster than any drive: O_DIRECT was ignored (bench-report.sh's bound)


@dataclass(frozen=True)
class StorageProbe:
    """One device's storage probe (storage/<device>.json): O_DIRECT MiB/s, or why not measured."""

    device: str
    model: str
    offset_bytes: int
    bytes_read: int
    seconds: float | None
    mib_per_s: float | None          # None: not measured (see note)
    o_direct: bool
    note: str
    taken_at: float
    drive: str = ""                  # the drive the file sits on, as the device names it ("" unknown)

    def to_dict(self) -> dict[str, Any]:
        """storage/<device>.json as the store writes it (format and version first)."""
        return {**versioned.STORAGE.stamp(), **asdict(self)}


def run_sweep(sweep: Sweep, out_dir: str | os.PathLike, rerun_failed: bool = False, prepared=None):
    """Run a sweep (harness.run.runner.run_to_end); a community sweep then probes each device's
    storage. Returns how the run ended (status.RunEnd)."""
    from harness.run.runner import run_to_end

    campaign, notes = sweep.campaign, sweep.notes
    root = Path(out_dir).resolve()
    end = run_to_end(campaign, root, rerun_failed, prepared)
    if sweep.preset not in ("community", "app") or end.interrupted or not (root / names.PLAN_JSON).exists():
        return end
    if sweep.preset == "app":
        versioned.write_json(root / names.APP_JSON, app_record(campaign, notes))
        return end
    versioned.write_json(root / names.COMMUNITY_JSON,
                         {**versioned.COMMUNITY.stamp(), "prompt": COMMUNITY_PROMPT, "tokens": COMMUNITY_TOKENS,
                          "runs": COMMUNITY_RUNS, "engine_args": list(campaign.run.engine_args), "notes": list(notes)})
    devices = prepared.devices if prepared is not None else None
    if devices is None:
        from harness.campaign.device_resolution import resolve_devices

        devices = resolve_devices(campaign)
    model = campaign.models[0]
    for ref in devices:
        try:
            probe = probe_storage(ref, remote_model_path(ref.spec, model), model.name)
        except BmoeError as e:
            probe = StorageProbe(ref.spec, model.name, 0, 0, None, None, False, f"not measured: {e}", time.time())
        versioned.write_json(names.storage_record(root, ref.device_id), probe.to_dict())
    return end


def app_record(campaign: Campaign, notes: Sequence[str]) -> dict[str, Any]:
    """app.json: what of upstream's Android app the sweep ran, where it was read, and what it left out."""
    r = campaign.run
    return {**versioned.APP.stamp(), "upstream": {"settings_commit": app.UPSTREAM_SETTINGS_COMMIT,
                                                  "service_commit": app.UPSTREAM_SERVICE_COMMIT},
            "rungs_mb": list(app.APP_RUNGS_MB), "auto_ceil_mb": app.APP_AUTO_CEIL_MB, "prompt": r.prompt,
            "tokens": r.n_predict, "turns": r.turns, "idle_s": r.idle_s, "engine_args": list(r.engine_args),
            "notes": list(notes)}


# One reader for every device that can run this host's Python: this host, and virtual phones (they
# execute host programs). It prints dd's summary shape, so both answers parse alike.
PROBE_PY = """
import mmap, os, sys, time
path, skip, blocks, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
buf = mmap.mmap(-1, size)
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
done, began = 0, time.perf_counter()
for i in range(blocks):
    n = os.preadv(fd, [buf], (skip + i) * size)
    done += n
    if n < size:
        break
print(f"{done} bytes copied, {time.perf_counter() - began:.6f} s")
"""
# The drive under a file, as bench-report.sh finds it: df's source, its block device with the
# partition number dropped, that device's model in sysfs (a device-mapper volume: the one below it),
# else the block device's name. Argument: the file.
DRIVE_SH = (
    'src=$(df -P "$1" 2>/dev/null | tail -n 1 | cut -d" " -f1); '
    'b=$(basename "$(readlink -f "$src" 2>/dev/null || echo "$src")"); '
    'for s in /sys/block/"$b"/slaves/*; do [ -e "$s" ] && b=$(basename "$s"); break; done; '
    'for d in "$b" "$(echo "$b" | sed -E "s/p?[0-9]+$//")"; do '
    'm=$(cat /sys/block/"$d"/device/model 2>/dev/null | sed "s/[[:space:]]*$//"); '
    '[ -n "$m" ] && { echo "$m"; exit 0; }; done; echo "$b"'
)
_DD_RE = re.compile(r"([0-9]+) bytes.*?copied,\s*([0-9.]+)\s*s")


def probe_storage(ref, path: str, model: str) -> StorageProbe:
    """O_DIRECT reads of 512 KiB from `path` on the device, from a quarter into the file, up to
    1 GiB or its end: the rate the expert stream can see at its own request size. This host and
    virtual phones read with PROBE_PY; a phone with `dd iflag=direct` (GNU or busybox dd) with dd.
    Android's toybox dd has no iflag=direct: such a phone says so instead of a number."""
    device = ref.open()
    out = device.run(["stat", "-c", "%s", path], timeout_s=60)
    text = out.stdout.decode("utf-8", "replace").strip()
    if out.exit_status != 0 or not is_digits(text):
        return StorageProbe(ref.spec, model, 0, 0, None, None, False, f"not measured: no size for {path}", time.time())
    skip = int(text) // 4 // PROBE_BLOCK
    if ref.kind in ("local", "virtual"):
        argv = [sys.executable, "-c", PROBE_PY, path, str(skip), str(PROBE_BLOCKS), str(PROBE_BLOCK)]
    else:
        argv = ["sh", "-c", f"dd if={shlex.quote(path)} of=/dev/null bs={PROBE_BLOCK} skip={skip} "
                            f"count={PROBE_BLOCKS} iflag=direct 2>&1"]
    out = device.run(argv, timeout_s=600)
    said = (out.stdout + out.stderr).decode("utf-8", "replace")
    m = _DD_RE.search(said)
    if out.exit_status != 0 or not m:
        from engine.safetext import excerpt

        why = excerpt(said.strip().splitlines()[-1] if said.strip() else "no output", 120)
        hint = " (Android's toybox dd reads no O_DIRECT: run the probe by hand)" if "iflag" in said else ""
        return StorageProbe(ref.spec, model, skip * PROBE_BLOCK, 0, None, None, False,
                            f"not measured: the O_DIRECT read failed ({why}){hint}", time.time())
    probe = _probe_result(ref.spec, model, skip * PROBE_BLOCK, int(m[1]), float(m[2]))
    drive = device.run(["sh", "-c", DRIVE_SH, "sh", path], timeout_s=60)
    name = drive.stdout.decode("utf-8", "replace").strip().splitlines()
    return replace(probe, drive=name[-1][:80]) if drive.exit_status == 0 and name else probe


def _probe_result(device: str, model: str, offset: int, done: int, seconds: float) -> StorageProbe:
    if done <= 0 or seconds <= 0:
        return StorageProbe(device, model, offset, done, seconds, None, True,
                            "not measured: nothing read past the first quarter", time.time())
    rate = done / MIB / seconds
    if rate > PROBE_MAX_MIB_S:
        return StorageProbe(device, model, offset, done, seconds, None, False,
                            f"not measured: {rate:.0f} MiB/s is no drive's rate: O_DIRECT was ignored", time.time())
    return StorageProbe(device, model, offset, done, seconds, round(rate, 1), True, "", time.time())
