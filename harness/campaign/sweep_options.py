"""Every option of `bmoe-fleet sweep`, declared once: its command line (names, type, default,
help) and the campaign-file key its value goes to (docs/decisions/sweep-options.md).

The list is what the command is built from (harness/cli/campaign.py turns each declaration into a
click option), what harness.campaign.options writes into the campaign a file would hold, and what
harness.campaign.presets names options by; tests/harness/test_sweep_options.py holds the three to
it. Standard library and the defaults table only: the CLI reads it to build its help, and click
stays the CLI's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.campaign.defaults import QUALITY, SWEEP

PRESETS = ("quick", "publish", "community", "app")   # harness.campaign.presets


@dataclass(frozen=True)
class SweepOption:
    """One option of `bmoe-fleet sweep`: how it is typed, and where its value goes."""

    names: tuple[str, ...]          # as typed: ("-n", "--n-predict"); the first names it in messages
    dest: str                       # its value's name: the command's parameter, campaign_from_options' keyword
    help: str
    key: str | None = None          # the campaign-file key it sets: TABLE.KEY ("run.n_predict") or a
    #                                 top-level KEY ("name"); None: how the sweep runs, not the campaign
    kind: type = str                # the value's type (of each value of a list); bool: an on/off flag
    listed: bool = False            # repeatable, each value split at commas: a list of `kind`
    multiple: bool = False          # repeatable, each value whole: a tuple
    default: Any = None             # the value when the option is not given
    show_default: bool = False
    required: bool = False
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    minimum: float | None = None    # smaller values are the command line's mistake (exit 2)
    above: bool = False             # … and the minimum itself too
    path: str = ""                  # "file" or "dir": the value names one
    keep_empty: bool = False        # an empty list still goes into the campaign, whose reader refuses it;
    #                                 otherwise a value that is None, False or empty leaves the key out

    def __post_init__(self) -> None:
        if self.kind is bool and self.default is None:      # an on/off flag is off unless given
            object.__setattr__(self, "default", False)

    @property
    def flag(self) -> str:
        """The name messages give it (`-n`, `--cache-mb`)."""
        return self.names[0]


def _listed(values: tuple) -> str:
    return ",".join(map(str, values))


DRY_RUN = SweepOption(("--dry-run",), "dry_run", "Print the plan (every cell's exact engine command line) and stop.",
                      kind=bool)
RERUN_FAILED = SweepOption(("--rerun-failed",), "rerun_failed",
                           "Also run again the cells whose latest outcome is not ok.", kind=bool)
AS_JSON = SweepOption(("--json",), "as_json", "Print the plan or the final status as JSON.", kind=bool)

# In the order `sweep --help` lists them.
SWEEP_OPTIONS: tuple[SweepOption, ...] = (
    SweepOption(("--device",), "devices",
                "local, an adb serial, virtual:NAME or HOST:PORT (repeatable, or comma separated). Default: "
                "$ANDROID_SERIAL; with --preset community, this host and $ANDROID_SERIAL, else this host and "
                "every phone attached to the adb servers.",
                key="fleet.devices", listed=True),
    SweepOption(("--preset",), "preset",
                "quick: 32 tokens, one run per config; publish: at least 256 tokens, 3 repeats and a reverse "
                "pass (what a published number needs); community: upstream's community-benchmark protocol "
                "(docs/results.md), then each device's storage probe; `report --format community` prints the "
                "rows; app: what upstream's Android app runs, its cache rungs as budgets, its session flags and "
                "a 2-turn session (docs/campaigns.md); `recommend` names the app rung.",
                choices=PRESETS),
    SweepOption(("--model",), "models",
                "A GGUF model on this host (pushed to phones), or device:PATH, one already on every device "
                "(nothing pushed; on local, a path on this host). Repeatable.",
                key="models", multiple=True, required=True, path="file", keep_empty=True),
    SweepOption(("--engine",), "engine",
                "bmoe-py, or the path of a bmoe-cli binary (the lib*.so* beside it go along) for this host "
                "and virtual phones; ABI=PATH (repeatable, one per ABI) the bmoe-cli built for real phones of "
                "that ABI: --engine arm64-v8a=build-android/bin/bmoe-cli.",
                key="engine", multiple=True, default=SWEEP.engine, show_default=True,
                metavar="bmoe-py|PATH|ABI=PATH"),
    SweepOption(("--cache-mb",), "cache_mb",
                "Budgets: 0, auto, cycle*F (F x the model's token cycle), a MiB number, planner (the engine's "
                "own pick), mmap, resident.",
                key="axes.cache_mb", listed=True, default=SWEEP.cache_mb, show_default=True, keep_empty=True),
    SweepOption(("--cache-ceil-mb",), "cache_ceil_mb",
                f"Caps for the auto budgets (default {_listed(SWEEP.cache_ceil_mb)}: none).",
                key="axes.cache_ceil_mb", kind=int, listed=True, default=SWEEP.cache_ceil_mb),
    SweepOption(("--dense-weights",), "dense_weights", "Dense-weight policies: mmap, warm, anon (ahwb on Android bmoe-cli).",
                key="axes.dense_weights", listed=True, default=SWEEP.dense_weights, show_default=True,
                keep_empty=True),
    SweepOption(("--n-expert-used",), "n_expert_used", "Top-k values (default: the model's own).",
                key="axes.n_expert_used", kind=int, listed=True, default=SWEEP.n_expert_used),
    SweepOption(("--io-threads",), "io_threads", f"Expert-read lanes (default {_listed(SWEEP.io_threads)}).",
                key="axes.io_threads", kind=int, listed=True, default=SWEEP.io_threads),
    SweepOption(("-t", "--threads"), "threads",
                f"Compute threads (-t) of every run; {SWEEP.threads} (the default): each device's online cores, "
                "at most 4.",
                key="run.threads", metavar="N|auto"),
    SweepOption(("--engine-arg",), "engine_args",
                "Engine arguments passed to every run, split like a shell line (repeatable): "
                "--engine-arg '--ubatch 512' --engine-arg --no-think.",
                key="run.engine_args", multiple=True, default=(), metavar="ARGS"),
    SweepOption(("--flag",), "flags",
                "An engine flag as an axis (repeatable): --flag --prefetch=0,2; true passes the flag alone, "
                "false leaves it out; -t, --n-expert-used, --io-threads, --dense-weights become that axis.",
                key="axes.flags", multiple=True, default=(), metavar="NAME=V1,V2"),
    SweepOption(("--apps",), "apps",
                "Other apps open beside the engine, one load per value: none, cached:1GiB, "
                "cached:1GiB+perceptible:512MiB (STATE:SIZE[:compressible][:active]; phones only).",
                key="axes.apps", listed=True, metavar="LOAD,LOAD"),
    SweepOption(("--run-as",), "run_as",
                "How the engine is started, an axis (axes.run_as): shell (default: over adb, as a phone's user "
                "runs it; lmkd never considers it), app-service or app-top (virtual phones only: as the app, "
                "registered with lmkd at adj 200 or 0, to check the app's replayed verdict against a real kill).",
                key="axes.run_as", listed=True, metavar="HOW,HOW"),
    SweepOption(("--turns",), "turns",
                "Turns of one engine session per run (run.turns; default 1, a one-shot run): the engine runs "
                "with --session and gets N requests, an idle gap between them.",
                key="run.turns", kind=int, metavar="N"),
    SweepOption(("--idle-s",), "idle_s", "Seconds of idle between a session's turns (run.idle_s).",
                key="run.idle_s", kind=float, metavar="S"),
    SweepOption(("--gap-apps",), "gap_apps",
                "One load of other apps started during each gap and stopped at its end (run.gap_apps), e.g. "
                "cached:64MiB; phones only.",
                key="run.gap_apps", metavar="LOAD"),
    SweepOption(("--quality",), "quality",
                "Measure output quality beside speed (run.quality): on runs every cell with --progress (its "
                "answer's tokens), adds a lossless reference cell where a group has only lossy ones and, at "
                "bmoe-cli 0.24 or later, a --ppl scoring run after each; auto (the default) is on when a cell is "
                "lossy (--drop-cold-experts, --expert-substitute, --route-ahead above 0, or a top-k not the "
                "model's own).",
                key="run.quality", choices=QUALITY),
    SweepOption(("--plan",), "planner",
                "Also run the engine's own planner on each device: a \"planner\" budget per dense mode, "
                "recorded with its plan and shown beside the measured boundary (bmoe-cli after 0.24; bmoe-py "
                "then claims that release).",
                key="axes.cache_mb", kind=bool),
    SweepOption(("--adaptive",), "adaptive",
                "Spend cells only where the prediction is unsure ([plan] adaptive): cache 0 with a route trace, "
                "then the predicted knee and largest safe budget, then bisection of the kill-or-fight boundary; "
                "a group whose cells miss their prediction falls back to the --cache-mb grid.",
                key="plan.adaptive", kind=bool),
    SweepOption(("--resolution-mb",), "resolution_mb",
                "With --adaptive: bisect until the bracket is this narrow (default 0: a quarter of the token "
                "cycle).",
                key="plan.resolution_mb", kind=int, minimum=0, metavar="MIB"),
    SweepOption(("--max-error-pct",), "max_error_pct",
                "With --adaptive: a measured cell further than this from its predicted s/token sends its group "
                "to the grid (default 25).",
                key="plan.max_error_pct", kind=float, minimum=0, above=True, metavar="PCT"),
    SweepOption(("--repeats",), "repeats", "Runs of every config, interleaved across configs.",
                key="run.repeats", kind=int, minimum=1, default=SWEEP.repeats, show_default=True),
    SweepOption(("--reverse-pass",), "reverse_pass", "Run the whole sequence a second time in reverse order.",
                key="run.reverse_pass", kind=bool),
    SweepOption(("-n", "--n-predict"), "n_predict", "Tokens to generate per run (256 or more for a published number).",
                key="run.n_predict", kind=int, minimum=1, default=SWEEP.n_predict, show_default=True),
    SweepOption(("--timeout",), "timeout_s",
                f"Seconds before a run is killed and recorded as a timeout (default {SWEEP.timeout_s:g}).",
                key="run.timeout_s", kind=float, minimum=0, above=True),
    SweepOption(("--device-timeout-s",), "device_timeout_s",
                "Seconds a phone may leave the harness without an answer mid-run before the cell is "
                f"device_lost (default {SWEEP.device_timeout_s:g}).",
                key="run.device_timeout_s", kind=float, minimum=0, above=True),
    SweepOption(("--adb",), "adb",
                "adb server HOST:PORT (repeatable). Default: $ADB_SERVER_SOCKET, else $ANDROID_ADB_SERVER_ADDRESS "
                "and $ANDROID_ADB_SERVER_PORT, else 127.0.0.1:5037.",
                key="fleet.adb", listed=True),
    SweepOption(("--name",), "name", "Campaign name.", key="name", default=SWEEP.name, show_default=True),
    SweepOption(("-o", "--out"), "out_dir",
                "Campaign directory; the equivalent campaign file is written into it as campaign.toml.",
                required=True, path="dir"),
    DRY_RUN,
    RERUN_FAILED,
    AS_JSON,
)

BY_DEST: dict[str, SweepOption] = {o.dest: o for o in SWEEP_OPTIONS}
