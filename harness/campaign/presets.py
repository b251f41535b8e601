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
  (bmoe-cli 0.19.0 lists `--overlap` but its build lacks the hook; harness/campaign/engine_probe.py),
  is left out and named in community.json. After the runs (harness/run/sweep.py), each device's storage is probed as upstream probes it: O_DIRECT
  reads of 512 KiB from the model file itself, from a quarter into it (past a freshly copied
  head), up to 1 GiB; the rate is kept in `storage/<device>.json`. `report --format community`
  prints the rows (results/analysis/community.py).
- app: what upstream's Android app runs (results/analysis/android_app.py, from its examples/android): every
  cache rung its settings offer (0, 500 … 6000 MiB, and Auto capped at 3000) as the budgets, its
  session-open flags as run flags where the engine has them (`-c 4096`, `--ubatch 512`, `--chatml`,
  `--no-think` for its per-request think=false, `--overlap`), 4 lanes, `--dense-weights anon`, the
  model's own top-k, 128 tokens of its default prompt per turn, and its session: 2 turns 240 s apart
  (`--turns`/`--idle-s`/`-n` override); each cache-on rung with and without the app's
  `--drop-cold-experts 0.75`, so the campaign prices it. A flag left out is named in app.json with its reason;
  recommend maps each recommendation onto the rungs (app_rung_mb).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from devices.adb.server import ENV_SERIAL, default_serial
from engine.errors import BmoeError
from engine.interface.flags import DROP_COLD_EXPERTS
from harness.campaign.defaults import PYTHON_ENGINE, SWEEP
from harness.campaign.engine_probe import protocol_flags
from harness.campaign.model import LOCAL, Campaign, CampaignError
from harness.campaign.options import campaign_from_options
from harness.campaign.sweep_options import BY_DEST, PRESETS
from results.analysis import android_app as app
from results.analysis.community import (
    COMMUNITY_LANES,
    COMMUNITY_PROMPT,
    COMMUNITY_RUNS,
    COMMUNITY_TOKENS,
)
from results.read.tokens import PUBLISH_MIN_REPEATS, PUBLISHED_MIN_TOKENS

QUICK = {"n_predict": SWEEP.n_predict, "repeats": SWEEP.repeats}   # the sweep's own defaults
# sweep options the protocol fixes: given with --preset community, they are refused
PROTOCOL_OPTIONS = {dest: BY_DEST[dest].flag for dest in ("cache_mb", "cache_ceil_mb", "dense_weights", "n_expert_used",
                                                          "io_threads", "repeats", "n_predict", "reverse_pass",
                                                          "engine_args", "flags")}
# sweep options the app's settings fix: given with --preset app, they are refused (tokens, repeats,
# passes, threads and the session's turns and gap are the user's, as they are in the app)
APP_OPTIONS = {key: flag for key, flag in PROTOCOL_OPTIONS.items() if key not in ("repeats", "n_predict",
                                                                                   "reverse_pass")}


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
    # the app's dropping, beside the same rung without it (what it costs: results.analysis.quality)
    drop, drop_notes = protocol_flags(engine, model, ((DROP_COLD_EXPERTS.typed, f"{app.APP_DROP_COLD:g}"),))
    notes = [*notes, *drop_notes]
    opts.update(cache_mb=["auto", *map(str, app.APP_RUNGS_MB)], cache_ceil_mb=[app.APP_AUTO_CEIL_MB],
                dense_weights=[app.APP_DENSE_WEIGHTS], n_expert_used=[0], io_threads=[app.APP_IO_THREADS],
                n_predict=opts["n_predict"] if "n_predict" in explicit else app.APP_N_PREDICT, turns=turns,
                idle_s=opts.get("idle_s") if "idle_s" in explicit else app.APP_IDLE_S,
                engine_args=[shlex.join(f) for f in flags],
                flags=[f"{name}=false,{value}" for name, value in drop], extra=_with_prompt(opts, app.APP_PROMPT))
    if not opts.get("name") or opts["name"] == SWEEP.name:
        opts["name"] = "app"
    return Sweep(campaign_from_options(**opts), "app", tuple(notes))


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


# bench-report.sh's threads on a computer: min(8, cores) (a phone runs the protocol's 4, THREADS_AUTO_MAX)
COMMUNITY_HOST_THREADS_MAX = 8


def attached_devices(adb: Sequence[str]) -> list[str]:
    """This host and every phone attached to the adb servers (ready to run commands): the --adb
    ones, else the one adb's environment names."""
    from devices.adb import server as adbmod

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
