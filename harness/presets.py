"""`bmoe-fleet sweep --preset quick|publish|community|app`: sweeps whose settings come with a purpose.

- quick: a first look — 32 tokens, one run per config, no reverse pass (the sweep's defaults).
- publish: what the method asks of a published number (docs/method.md rules 5 and 8): at least 256
  tokens, at least 3 repeats, and a reverse pass; -n or --repeats under that are refused. The
  site marks budget points whose runs do not meet it.
- community: BigMoeOnEdge's community-benchmark protocol (its docs/community-benchmarks.md and
  scripts/bench-report.sh), run on every attached phone and this host: 256 greedy tokens of its
  reference prompt, `--cache-mb auto`, 4 read lanes, `--dense-weights anon`, `--ubatch 512`,
  `--chatml`, `--overlap` where the engine has it, threads "auto" (the device's cores, at most 8 on
  this host and 4 on a phone, as the protocol says; `-t N` overrides), run twice (the report takes the second). The
  protocol flags are checked against the engine first: one it does not know, or refuses at load
  (bmoe-cli 0.19.0 lists `--overlap` but its build lacks the hook), is left out and named in
  community.json. After the runs, each device's storage is probed as upstream probes it: O_DIRECT
  reads of 512 KiB from the model file itself, from a quarter into it (past a freshly copied
  head), up to 1 GiB; the rate is kept in `storage/<device>.json`. `report --format community`
  prints the rows (results/analysis/community.py).
- app: what upstream's Android app runs (results/analysis/android_app.py, from its examples/android): every
  cache rung its settings offer (0, 500 … 6000 MiB, and Auto capped at 3000) as the budgets, its
  session-open flags as run flags where the engine has them (`-c 4096`, `--ubatch 512`, `--chatml`,
  `--no-think` for its per-request think=false, `--overlap`), 4 lanes, `--dense-weights anon`, the
  model's own top-k, 128 tokens of its default prompt per turn, and its session: 2 turns 240 s apart
  (`--turns`/`--idle-s`/`-n` override). A flag left out is named in app.json with its reason;
  recommend maps each recommendation onto the rungs (app_rung_mb).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from devices.adb import ENV_SERIAL, default_serial
from engine.errors import BmoeError
from engine.interface.flags import CACHE_MB, MODEL, MOE_STREAM, N_PREDICT, OVERLAP, PROMPT, THREADS, VERSION
from harness.campaign import LOCAL, Campaign, CampaignError, remote_model_path
from harness.campaign_options import campaign_from_options
from harness.defaults import PYTHON_ENGINE, SWEEP
from results.analysis import android_app as app
from results.analysis.community import (
    COMMUNITY_FLAGS,
    COMMUNITY_LANES,
    COMMUNITY_PROMPT,
    COMMUNITY_RUNS,
    COMMUNITY_TOKENS,
)
from results.read.tokens import PUBLISH_MIN_REPEATS, PUBLISHED_MIN_TOKENS
from store import names, versioned

PRESETS = ("quick", "publish", "community", "app")
QUICK = {"n_predict": SWEEP.n_predict, "repeats": SWEEP.repeats}   # the sweep's own defaults
# sweep options the protocol fixes: given with --preset community, they are refused
PROTOCOL_OPTIONS = {"cache_mb": "--cache-mb", "cache_ceil_mb": "--cache-ceil-mb", "dense_weights": "--dense-weights",
                    "n_expert_used": "--n-expert-used", "io_threads": "--io-threads", "repeats": "--repeats",
                    "n_predict": "-n", "reverse_pass": "--reverse-pass", "engine_args": "--engine-arg",
                    "flags": "--flag"}
# sweep options the app's settings fix: given with --preset app, they are refused (tokens, repeats,
# passes, threads and the session's turns and gap are the user's, as they are in the app)
APP_OPTIONS = {key: flag for key, flag in PROTOCOL_OPTIONS.items() if key not in ("repeats", "n_predict",
                                                                                   "reverse_pass")}
PROBE_BLOCK = 512 * 1024
PROBE_BLOCKS = 2048                    # 1 GiB, as bench-report.sh reads
PROBE_MAX_MIB_S = 30720                # faster than any drive: O_DIRECT was ignored (bench-report.sh's bound)


@dataclass(frozen=True)
class Sweep:
    """What `sweep` will run: the campaign, its preset, and notes on the protocol (community)."""

    campaign: Campaign
    preset: str | None = None
    notes: tuple[str, ...] = ()


def sweep_campaign(preset: str | None, explicit: set[str], options: Mapping[str, Any]) -> Sweep:
    """The campaign `sweep` means: its options as given, with a preset's settings where the user
    gave none (`explicit` names the options given on the command line)."""
    opts = dict(options)
    if not opts.get("devices") and preset != "community" and default_serial() is None:
        raise CampaignError(f"--device: name at least one device (local, an adb serial, virtual:NAME, HOST:PORT), "
                            f"or set {ENV_SERIAL}")
    if preset is None:
        return Sweep(campaign_from_options(**opts))
    if preset not in PRESETS:
        raise CampaignError(f"--preset {preset}: choose one of {', '.join(PRESETS)}")
    if preset == "quick":
        for key, value in QUICK.items():
            if key not in explicit:
                opts[key] = value
        return Sweep(campaign_from_options(**opts), preset)
    if preset == "publish":
        if "n_predict" not in explicit:
            opts["n_predict"] = PUBLISHED_MIN_TOKENS
        if "repeats" not in explicit:
            opts["repeats"] = PUBLISH_MIN_REPEATS
        if opts["n_predict"] < PUBLISHED_MIN_TOKENS:
            raise CampaignError(f"--preset publish: -n {opts['n_predict']} is under the {PUBLISHED_MIN_TOKENS} tokens a "
                                "published number needs (the cache must reach steady state); leave -n out or raise it")
        if opts["repeats"] < PUBLISH_MIN_REPEATS:
            raise CampaignError(f"--preset publish: --repeats {opts['repeats']} is under {PUBLISH_MIN_REPEATS}; a "
                                "published number reports a distribution")
        opts["reverse_pass"] = True
        return Sweep(campaign_from_options(**opts), preset)
    if preset == "app":
        return app_campaign(explicit, opts)
    return community_campaign(explicit, opts)


def _refuse_fixed(preset: str, fixed: Mapping[str, str], explicit: set[str], whose: str) -> None:
    """One line naming every option the preset fixes that was given anyway."""
    given = [flag for key, flag in fixed.items() if key in explicit]
    if given:
        raise CampaignError(f"--preset {preset} fixes {', '.join(given)} ({whose}); leave "
                            f"{'them' if len(given) > 1 else 'it'} out")


def _with_prompt(opts: Mapping[str, Any], prompt: str) -> dict[str, Any]:
    extra = dict(opts.get("extra") or {})
    extra["run"] = {**extra.get("run", {}), "prompt": prompt}
    return extra


def app_campaign(explicit: set[str], opts: dict[str, Any]) -> Sweep:
    """The campaign of upstream's Android app: its cache rungs as budgets, its session flags, its
    session (options its settings fix are refused; results.analysis.android_app holds what was read)."""
    _refuse_fixed("app", APP_OPTIONS, explicit, "upstream's Android app")
    turns = opts.get("turns") if "turns" in explicit else app.APP_TURNS
    if turns is None or turns < 2:
        raise CampaignError(f"--preset app runs a session, as the app does (--session): --turns {turns} must be 2 "
                            "or more")
    engine = opts.get("engine") or PYTHON_ENGINE
    model = next((str(m) for m in opts.get("models") or () if not str(m).startswith("device:")), None)
    flags, notes = protocol_flags(engine, model, app.APP_FLAGS)
    opts.update(cache_mb=["auto", *map(str, app.APP_RUNGS_MB)], cache_ceil_mb=[app.APP_AUTO_CEIL_MB],
                dense_weights=[app.APP_DENSE_WEIGHTS], n_expert_used=[0], io_threads=[app.APP_IO_THREADS],
                n_predict=opts["n_predict"] if "n_predict" in explicit else app.APP_N_PREDICT, turns=turns,
                idle_s=opts.get("idle_s") if "idle_s" in explicit else app.APP_IDLE_S,
                engine_args=[shlex.join(f) for f in flags], flags=(), extra=_with_prompt(opts, app.APP_PROMPT))
    if not opts.get("name") or opts["name"] == SWEEP.name:
        opts["name"] = "app"
    return Sweep(campaign_from_options(**opts), "app", (*notes, *app.APP_LEFT_OUT))


def community_campaign(explicit: set[str], opts: dict[str, Any]) -> Sweep:
    """The campaign of upstream's community-benchmark protocol (options it fixes are refused)."""
    _refuse_fixed("community", PROTOCOL_OPTIONS, explicit, "upstream's protocol")
    if len(opts.get("models") or ()) != 1:
        raise CampaignError("--preset community: give one --model (a row is one model on one machine)")
    serial = default_serial()
    devices = list(opts.get("devices") or ()) or ([LOCAL, serial] if serial else attached_devices(opts.get("adb") or ()))
    engine = opts.get("engine") or PYTHON_ENGINE
    model = opts["models"][0]
    flags, notes = protocol_flags(engine, None if str(model).startswith("device:") else str(model))
    extra = _with_prompt(opts, COMMUNITY_PROMPT)
    extra["run"]["host_threads_max"] = COMMUNITY_HOST_THREADS_MAX
    opts.update(devices=devices, cache_mb=["auto"], cache_ceil_mb=[0], dense_weights=["anon"], n_expert_used=[0],
                io_threads=[COMMUNITY_LANES], repeats=COMMUNITY_RUNS, n_predict=COMMUNITY_TOKENS, reverse_pass=False,
                engine_args=[" ".join(f) for f in flags], flags=(), extra=extra)
    if not opts.get("name") or opts["name"] == SWEEP.name:
        opts["name"] = "community"
    return Sweep(campaign_from_options(**opts), "community", tuple(notes))


def attached_devices(adb: Sequence[str]) -> list[str]:
    """This host and every phone attached to the adb servers (ready to run commands): the --adb
    ones, else the one adb's environment names."""
    from devices import adb as adbmod

    try:
        servers = [adbmod.AdbServer.parse(text) for text in adb] or [adbmod.default_server()]
    except BmoeError as e:
        raise CampaignError(f"--adb: {e}" if adb else str(e)) from None
    found = [LOCAL]
    for server in servers:
        try:
            adbmod.ensure_server(server)
            found += sorted(d.serial for d in server.client().list() if d.state == "device")
        except (BmoeError, *adbmod.TRANSPORT_ERRORS) as e:
            raise CampaignError(f"--preset community: adb server {server.host}:{server.port} does not answer ({e}); "
                                "name the devices with --device") from None
    return list(dict.fromkeys(found))


def _engine_command(engine: str) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BMOE_")}
    if engine == PYTHON_ENGINE:
        return [sys.executable, "-m", "engine"], env
    path = os.path.abspath(engine)
    env["LD_LIBRARY_PATH"] = os.path.dirname(path)
    return [path], env


# bench-report.sh's threads on a computer: min(8, cores) (a phone runs the protocol's 4, THREADS_AUTO_MAX)
COMMUNITY_HOST_THREADS_MAX = 8

_UNKNOWN_RE = re.compile(r"(unknown arg: .*|config error: .*|error: .*)")


def protocol_flags(engine: str, model_path: str | None,
                   flags: Sequence[tuple[str, ...]] = COMMUNITY_FLAGS) -> tuple[list[tuple[str, ...]], list[str]]:
    """The protocol flags this engine takes (run on this host), and a note for each it does not.
    A flag is asked for with `--version` after it (parsed, nothing loaded); `--overlap`, which a
    build can list and still refuse at load, is also tried on the model with one token."""
    argv0, env = _engine_command(engine)
    kept: list[tuple[str, ...]] = []
    notes: list[str] = []
    for flag in flags:
        answer = _run(argv0 + list(flag) + [VERSION.typed], env)
        if answer is None:
            raise CampaignError(f"--engine {engine}: cannot be run on this host to check the protocol's flags")
        if answer[0] != 0:
            notes.append(f"{flag[0]} left out: the engine does not take it ({_line(answer[1], flag[0])})")
            continue
        kept.append(flag)
    overlap = (OVERLAP.typed,)
    if overlap in kept and model_path and os.path.isfile(model_path):
        one_token = [MODEL.typed, model_path, PROMPT.typed, "x", N_PREDICT.typed, "1", THREADS.typed, "1",
                     MOE_STREAM.typed, CACHE_MB.typed, "0", OVERLAP.typed]
        answer = _run(argv0 + one_token, env, timeout_s=600)
        if answer is not None and answer[0] != 0 and "overlap" in answer[1]:
            kept.remove(overlap)
            notes.append(f"{OVERLAP.typed} left out: the engine refuses it at load ({_line(answer[1], 'overlap')})")
    return kept, notes


def _run(argv: list[str], env: Mapping[str, str], timeout_s: float = 60) -> tuple[int, str] | None:
    try:
        done = subprocess.run(argv, env=dict(env), capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.returncode, (done.stderr + done.stdout).decode("utf-8", "replace")


def _line(text: str, needle: str) -> str:
    from engine.safetext import excerpt

    lines = [line.strip() for line in text.splitlines() if needle in line and _UNKNOWN_RE.search(line)]
    lines = lines or [line.strip() for line in text.splitlines() if _UNKNOWN_RE.search(line)]
    return excerpt(lines[0] if lines else "no reason given", 160)


# ── after the runs: the storage probe ─────────────────────────────────────────────────────────


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
    """Run a sweep (harness.runner.run_to_end); a community sweep then probes each device's
    storage. Returns how the run ended (status.RunEnd)."""
    from harness.runner import run_to_end

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
        from harness.device_resolution import resolve_devices

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
_DD_RE = re.compile(r"(\d+) bytes.*?copied,\s*([\d.]+)\s*s")


def probe_storage(ref, path: str, model: str) -> StorageProbe:
    """O_DIRECT reads of 512 KiB from `path` on the device, from a quarter into the file, up to
    1 GiB or its end: the rate the expert stream can see at its own request size. This host and
    virtual phones read with PROBE_PY; a phone with `dd iflag=direct` (GNU or busybox dd) with dd.
    Android's toybox dd has no iflag=direct: such a phone says so instead of a number."""
    import shlex

    device = ref.open()
    out = device.run(["stat", "-c", "%s", path], timeout_s=60)
    text = out.stdout.decode("utf-8", "replace").strip()
    if out.exit_status != 0 or not text.isdigit():
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
    rate = done / (1 << 20) / seconds
    if rate > PROBE_MAX_MIB_S:
        return StorageProbe(device, model, offset, done, seconds, None, False,
                            f"not measured: {rate:.0f} MiB/s is no drive's rate: O_DIRECT was ignored", time.time())
    return StorageProbe(device, model, offset, done, seconds, round(rate, 1), True, "", time.time())
