"""What bmoe-cli takes on its command line, by release: every flag this project reads, writes or
refuses, declared once.

One `Flag` per flag: its name as typed (and its short form and other spellings), the kind of value
it takes, its default, the release it appeared in (and left in), which engines take it, and its
ROLE, which is what every other layer needs to know about it:

- RUN: belongs to one run, not to its settings (its model, prompt, length and output files). The
  harness writes them; a recommended command line leaves them out.
- BUDGET: how big the expert cache is and whether there is one. The harness writes them from
  `axes.cache_mb` and friends; a recommendation sets its own.
- AXIS: a setting the campaign already sweeps (`-t`, `--n-expert-used`, `--io-threads`,
  `--dense-weights`): as an `[axes.flags]` key it becomes that axis.
- HARNESS: otherwise written by the harness (`--no-odirect` from `run.o_direct`, the deprecated
  dense aliases).
- SESSION: the harness's way of driving a multi-turn cell, not a setting.
- PLANNER: hands the budget to the engine's own planner (NEXT): the harness's budget flags and the
  planner's pick cannot both hold.
- NO_RUN: the engine makes no measurement run after it (help, version, plans, configuration dumps).
- TUNING: everything else. Passed through as written, sweepable as an `[axes.flags]` key.

Derived from it: bmoe-py's flag vocabulary and what it refuses (engine.contract.config), the flags a campaign
may pass through (harness.campaign.flags), the settings of a recommended command line (results), and the
argv of a cell (store.settings). docs/engine-contract.md says where the table lives;
tests/engine/test_interface_flags.py holds it to the real build's `--help` and greps the tree for
flag names written anywhere else.

Sources (Helldez/BigMoeOnEdge, read with the search tool, nothing copied):

- 0.19 and 0.20: the real build in ../shared/peer (the 0.20.0 source, reporting 0.19.0): its
  `--help` lists every flag it parses (a flag it does not list is `unknown arg`, checked one by one);
  cli/main.cpp at 039b8f1e (0.23, whose usage text is the same list: 0.21 to 0.23 added no flag).
- 0.24: CHANGELOG.md at 006783f9 (`--release-mmap`, `--row-stream`, `--row-stream-mb`,
  `--expert-substitute`, `--ppl`, `--ppl-step`, `--ppl-list`, `--ppl-choices`).
- NEXT: the store's newest cli/main.cpp (68,658 characters; the store names no commit for it: its
  front-end flags, `--auto`/`--plan-run`, `--plan`/`--plan-only`, `--probe`, `--plan-explain`,
  `--probe-io`, `--no-probe-io`, `--probe-mem`, `--no-probe-mem`, `--show-config`,
  `--describe-params`, `--ppl-skip`; and "with --moe-stream and no --cache-mb, the cache is sized
  automatically") and core/src/params.cpp at 06e225fd (its parameter table: `--threads-batch`,
  `--ngram-max-match`, `--gpu-layers`, `--dense-on-device`, `--tensor-overrides`, `--devices`).
  A flag first seen there has since=NEXT even where an unstored 0.24 build may already have had it.

bmoe-py implements the flags with `bmoe_py=True`; every other bmoe-cli flag it refuses exactly as
bmoe-cli refuses an unknown one. `engines=PY_ONLY` marks bmoe-py's own (bmoe-cli 0.19 says
`unknown arg` to them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.interface.outputs import Change
from engine.interface.releases import NEXT, V0_19, V0_24, Release

# the kinds of value a flag takes
NONE, INT, U32, FLOAT, TEXT, PATH, CHOICE, MIB_OR_AUTO, LIST, TOKENS = (
    "none", "int", "u32", "float", "text", "path", "choice", "MiB|auto", "list", "tokens")
# roles (the module docstring says what each means)
RUN, BUDGET, AXIS, HARNESS, SESSION, PLANNER, NO_RUN, TUNING = (
    "run", "budget", "axis", "harness", "session", "planner", "no-run", "tuning")
ROLES = (RUN, BUDGET, AXIS, HARNESS, SESSION, PLANNER, NO_RUN, TUNING)
BMOE_CLI, BMOE_PY = "bmoe-cli", "bmoe-py"
BOTH, PY_ONLY, CLI_ONLY = (BMOE_CLI, BMOE_PY), (BMOE_PY,), (BMOE_CLI,)


@dataclass(frozen=True)
class Flag:
    name: str                        # as typed: the long form where there is one
    value: str = NONE                # one of the value kinds above
    role: str = TUNING
    meaning: str = ""
    short: str = ""                  # "-t"
    aliases: tuple[str, ...] = ()    # other spellings the engine reads as this flag
    default: str = ""                # as the engine's help states it
    choices: tuple[str, ...] = ()    # a CHOICE flag's values
    since: Release | None = None     # None: older than 0.19.0, the first release this table covers
    until: Release | None = None     # the first release without it
    engines: tuple[str, ...] = CLI_ONLY
    bmoe_py: bool = False            # bmoe-py implements it (engines includes bmoe-py)
    field: str = ""                  # bmoe-py's RunConfig field it sets
    sets: bool | str | None = None   # a NONE flag: the value it sets its field to
    axis: str = ""                   # AXIS: the campaign axis it maps onto (harness.campaign.model.Axes)
    harness: str = ""                # where a campaign sets it instead (RUN, BUDGET, HARNESS, PLANNER)
    key: str = ""                    # the key a reader of a captured command line records it under
                                     # (an imported run's config; results.read.parse_config), with `sets`
    env: str = ""                    # the env override the engine reads for it (flag wins)
    changes: tuple[Change, ...] = ()
    needs_cache: bool = False        # refused without the LRU cache (cache_mb > 0 or auto): a campaign
                                     # leaves it out of cache-off cells (harness.plan.grid)

    @property
    def spellings(self) -> tuple[str, ...]:
        """Every way to type it: the name, the short form, the aliases."""
        return (self.name, *((self.short,) if self.short else ()), *self.aliases)

    @property
    def typed(self) -> str:
        """How this project writes it in an argv: the short form where there is one (`-t`)."""
        return self.short or self.name

    @property
    def takes_value(self) -> bool:
        return self.value != NONE

    def taken_by(self, engine: str, release: Release | None = None) -> bool:
        """Whether `engine` takes it (for bmoe-cli at `release`, when given; bmoe-py: when it implements it)."""
        if engine == BMOE_PY:   # at a claimed release (engine.claim), only what that release has
            return self.bmoe_py and (release is None or self.since is None or self.since <= release)
        if engine not in self.engines:
            return False
        return release is None or ((self.since is None or self.since <= release)
                                   and (self.until is None or release < self.until))


def _py(field: str, sets: bool | str | None = None) -> dict[str, Any]:
    """What a flag bmoe-py implements adds to its row."""
    return {"engines": BOTH, "bmoe_py": True, "field": field, "sets": sets}


_USE_CACHE = "use axes.cache_mb"
_USE_PLANNER = "use axes.cache_mb = [\"planner\"] (or sweep --plan): the harness runs --auto --plan-explain"
FLAGS: tuple[Flag, ...] = (
    # ── the run: files, prompt, length (0.19 --help order, then bmoe-py's own) ──
    Flag("--model", PATH, RUN, "gguf model (required; a split model by its first shard)", short="-m",
         harness="use [models]", key="model_path", **_py("model_path")),
    Flag("--prompt", TEXT, RUN, "prompt text", short="-p", harness="use run.prompt", **_py("prompt")),
    Flag("--prompt-tokens", TOKENS, RUN, "comma-separated token ids instead of -p (any vocabulary)",
         harness="use run.prompt", engines=PY_ONLY, bmoe_py=True, field="prompt_tokens"),
    Flag("--n-predict", INT, RUN, "tokens to generate", short="-n", default="128", harness="use run.n_predict", key="n_predict",
         **_py("n_predict")),
    Flag("--threads", INT, AXIS, "compute threads", short="-t", default="4", axis="threads", key="threads", **_py("n_threads")),
    Flag("--ctx-size", INT, TUNING, "context size", short="-c", default="2048", key="n_ctx", **_py("n_ctx")),
    Flag("--ubatch", INT, TUNING, "widest graph computed at once (0 = as wide as the context)", key="n_ubatch"),
    Flag("--chatml", NONE, TUNING, "wrap the prompt in the model family's chat turn", key="chatml", sets=True),
    Flag("--no-think", NONE, TUNING, "render the chat template with reasoning disabled", key="think", sets=False),
    Flag("--progress", NONE, TUNING, "machine telemetry, one JSON line per token", env="BMOE_PROGRESS", key="progress",
         **_py("progress", True)),
    Flag("--session", NONE, SESSION, "keep the model loaded and serve JSON prompt requests from stdin",
         **_py("session", True)),
    Flag("--csv", PATH, RUN, "per-token metrics CSV", harness="it writes the metrics CSV itself", **_py("csv_path")),
    Flag("--route-trace", PATH, RUN, "per-step per-layer MoE routing trace (needs --moe-stream)",
         harness="use run.route_trace", **_py("route_trace_path")),
    Flag("--compute-trace", PATH, TUNING, "diagnostics: time every graph node"),
    Flag("--compute-trace-layers", PATH, TUNING, "diagnostics: the compute trace at layer granularity"),
    Flag("--io-trace", PATH, TUNING, "diagnostics: one row per expert read"),
    Flag("--n-expert-used", INT, AXIS, "active MoE experts per token (top-k); 0 = the model's", default="0",
         axis="n_expert_used", env="BMOE_N_EXPERT_USED", key="top_k", **_py("n_expert_used")),
    Flag("--help", NONE, NO_RUN, "show the usage text and exit", short="-h", engines=BOTH, bmoe_py=True),
    Flag("--version", NONE, NO_RUN, "print the engine version and exit", engines=BOTH, bmoe_py=True),
    # ── sampling ──
    Flag("--temp", FLOAT, TUNING, "sampling temperature; <= 0 keeps greedy", default="0", **_py("temp")),
    Flag("--top-k", INT, TUNING, "top-k cutoff when sampling", default="40", **_py("top_k")),
    Flag("--top-p", FLOAT, TUNING, "nucleus cutoff in (0,1] when sampling", default="0.95", **_py("top_p")),
    Flag("--seed", U32, TUNING, "RNG seed for sampling (default: random per run)", **_py("seed")),
    # ── self-speculative decoding ──
    Flag("--mtp", NONE, TUNING, "draft with the model's multi-token-prediction head", since=V0_19),
    Flag("--ngram", NONE, TUNING, "draft from repeated text in the prompt and the answer", since=V0_19),
    Flag("--draft", INT, TUNING, "tokens drafted per verify batch", default="3", since=V0_19),
    Flag("--mtp-p-min", FLOAT, TUNING, "--mtp only: the head's confidence floor", default="0", since=V0_19),
    Flag("--ngram-min-match", INT, TUNING, "--ngram only: shortest matching run allowed to draft", default="3",
         since=V0_19),
    # ── expert streaming ──
    Flag("--moe-stream", NONE, BUDGET, "stream only the routed experts per token", key="moe_stream",
         harness=f"{_USE_CACHE} (\"mmap\" and \"resident\" run without it)",
         changes=(Change(NEXT, "without --cache-mb it sizes the cache automatically (--cache-mb auto)"),),
         **_py("moe_stream", True)),
    Flag("--cache-mb", MIB_OR_AUTO, BUDGET, "LRU expert cache budget in MiB (0 = off), or auto", default="0",
         harness=_USE_CACHE, env="BMOE_CACHE_MB", **_py("cache_mb")),
    Flag("--cache-floor-mb", INT, BUDGET, "with --cache-mb auto: RAM to leave free", default="1536",
         harness="use axes.cache_floor_mb", key="cache_floor_mib", **_py("cache_floor_mb")),
    Flag("--cache-ceil-mb", INT, BUDGET, "with --cache-mb auto: upper bound on the budget (0 = no cap)",
         default="0", harness="use axes.cache_ceil_mb", key="cache_ceil_mib", **_py("cache_ceil_mb")),
    Flag("--io-threads", INT, AXIS, "parallel expert-read lanes", default="4", axis="io_threads",
         env="BMOE_IO_THREADS", key="io_threads", **_py("io_threads")),
    Flag("--no-odirect", NONE, HARNESS, "do not bypass the page cache for expert reads", harness="use run.o_direct",
         key="o_direct", **_py("o_direct", False)),
    Flag("--dense-weights", CHOICE, AXIS, "dense (non-expert) weight policy", default="anon",
         choices=("mmap", "warm", "anon", "ahwb"), axis="dense_weights", key="dense_weights", **_py("dense_weights")),
    Flag("--dense-odirect", NONE, HARNESS, "deprecated alias of --dense-weights anon",
         harness="use axes.dense_weights (a deprecated alias of --dense-weights anon)", key="dense_weights", **_py("dense_weights", "anon")),
    Flag("--no-warm-dense", NONE, HARNESS, "deprecated alias of --dense-weights mmap",
         harness="use axes.dense_weights (a deprecated alias of --dense-weights mmap)", key="dense_weights",
         **_py("dense_weights", "mmap")),
    Flag("--load-all", NONE, TUNING, "debug: read all experts each token", key="load_all", sets=True),
    Flag("--force-cache", NONE, BUDGET, "allow a cache-mb in the pathological band",
         harness=f"{_USE_CACHE} (the harness adds it for budgets of 1..1499 MiB)", key="force_cache", **_py("force_cache", True)),
    Flag("--overlap", NONE, TUNING, "overlap async expert reads with FFN compute", env="BMOE_OVERLAP", key="overlap",
         sets=True),
    Flag("--io-two-wave", NONE, TUNING, "publish a layer's first-projection reads first", since=V0_19),
    Flag("--prefetch", INT, TUNING, "temporally prefetch the next K layers' experts", default="0",
         env="BMOE_PREFETCH", key="prefetch", **_py("prefetch")),
    Flag("--prefetch-sync", NONE, TUNING, "debug/tests: complete each speculative read when issued",
         **_py("prefetch_sync", True)),
    Flag("--drop-cold-experts", FLOAT, TUNING, "LOSSY: skip a cold, low-weight routed expert that misses",
         needs_cache=True, **_py("drop_cold_frac")),
    Flag("--drop-no-renorm", NONE, TUNING, "do not rescale the surviving weights after a drop",
         needs_cache=True, **_py("drop_renorm", False)),
    Flag("--drop-in-prefill", NONE, TUNING, "drop during prefill too", needs_cache=True, **_py("drop_prefill", True)),
    Flag("--route-ahead", INT, TUNING, "LOSSY: commit decode routing to a prediction N layers early", since=V0_19),
    Flag("--predict-log", NONE, TUNING, "diagnostics: how much routing could be known a layer early",
         env="BMOE_PREDICT_LOG"),
    Flag("--predict-prefetch", NONE, TUNING, "read predicted expert misses on the idle lanes",
         env="BMOE_PREDICT_PREFETCH"),
    Flag("--predict-spec-max", INT, TUNING, "speculated predicted misses per layer", default="2"),
    Flag("--list-archs", NONE, NO_RUN, "print the supported MoE architectures and exit", engines=BOTH, bmoe_py=True),
    Flag("--no-mmap", NONE, BUDGET, "without --moe-stream: every weight in anonymous memory",
         harness=f"{_USE_CACHE} (\"resident\")", engines=PY_ONLY, bmoe_py=True, field="no_mmap", sets=True),
    Flag("--spec-gate", NONE, TUNING, "older builds' speculation gate (read in captures)", until=V0_19,
         key="spec_gate", sets=True),
    # ── 0.24 ──
    Flag("--release-mmap", NONE, TUNING, "unmap the model file after load", since=V0_24),
    Flag("--row-stream", NONE, TUNING, "serve row-gathered dense tables from flash", since=V0_24),
    Flag("--row-stream-mb", INT, TUNING, "resident window for row-streamed tables", default="64", since=V0_24),
    Flag("--expert-substitute", FLOAT, TUNING, "LOSSY: prefer cached experts within L of the score range",
         since=V0_24, needs_cache=True, **_py("substitute_lambda")),
    Flag("--ppl", PATH, NO_RUN, "score FILE's perplexity instead of generating", since=V0_24, **_py("ppl_path")),
    Flag("--ppl-step", NONE, TUNING, "with --ppl: score one token per decode", since=V0_24, **_py("ppl_step", True)),
    Flag("--ppl-list", PATH, NO_RUN, "score every text FILE names, in one session", since=V0_24, **_py("ppl_list")),
    Flag("--ppl-choices", LIST, TUNING, "with --ppl: each choice's log-probability after the text", since=V0_24,
         **_py("ppl_choices")),
    # ── after 0.24 (NEXT) ──
    Flag("--ppl-skip", INT, TUNING, "with --ppl: leading tokens evaluated but not scored", default="8", since=NEXT,
         **_py("ppl_skip")),
    Flag("--threads-batch", INT, TUNING, "prefill threads (0 = the compute threads)", default="0", since=NEXT),
    Flag("--ngram-max-match", INT, TUNING, "--ngram only: longest suffix considered", since=NEXT),
    Flag("--gpu-layers", INT, TUNING, "layers stored on a compute device", default="0", since=NEXT),
    Flag("--dense-on-device", NONE, TUNING, "EXPERIMENTAL: dense weights on a shared-memory accelerator",
         since=NEXT),
    Flag("--tensor-overrides", TEXT, TUNING, "debug: the capacity fitter's per-tensor placement", since=NEXT),
    Flag("--devices", CHOICE, TUNING, "which compute devices llama.cpp may use", default="all",
         choices=("all", "cpu"), since=NEXT),
    Flag("--auto", NONE, PLANNER, "resolve the streaming knobs with the hardware planner", aliases=("--plan-run",),
         harness=_USE_PLANNER, since=NEXT, key="auto_plan", **_py("auto_plan", True)),
    Flag("--plan", NONE, NO_RUN, "print the plan and the flags that reproduce it, then exit",
         aliases=("--plan-only",), since=NEXT, **_py("plan_only", True)),
    Flag("--plan-explain", NONE, PLANNER, "with --auto: print the plan, then run it", harness=_USE_PLANNER,
         since=NEXT, **_py("plan_explain", True)),
    Flag("--probe", NONE, NO_RUN, "--plan, plus the memory probe", since=NEXT),
    Flag("--probe-io", NONE, PLANNER, "plan with the storage read probe (--auto does by default)",
         harness=_USE_PLANNER, since=NEXT, **_py("probe_io", True)),
    Flag("--no-probe-io", NONE, TUNING, "plan without the storage read probe", since=NEXT,
         **_py("probe_io", False)),
    Flag("--probe-mem", NONE, PLANNER, "measure how much memory the machine lets the engine keep",
         harness="a planner cell runs the planner as --auto does (bmoe-py has no memory probe)", since=NEXT),
    Flag("--no-probe-mem", NONE, TUNING, "never measure memory unasked", since=NEXT,
         **_py("probe_mem_when_decisive", False)),
    Flag("--show-config", NONE, NO_RUN, "print the resolved configuration as JSON and exit", since=NEXT),
    Flag("--describe-params", NONE, NO_RUN, "print every engine parameter as JSON and exit", since=NEXT),
)


def _index() -> dict[str, Flag]:
    out: dict[str, Flag] = {}
    for f in FLAGS:
        for s in f.spellings:
            if s in out:
                raise ValueError(f"{s} is declared twice in engine.interface.flags")
            out[s] = f
    return out


_BY_SPELLING = _index()


# the flags other modules name, by name: what the harness writes into every cell's command line
# (store.engine_argv), the protocols' run flags (community, the app), the version question
MODEL, PROMPT, N_PREDICT, THREADS, N_EXPERT_USED, MOE_STREAM, CACHE_MB, CACHE_FLOOR_MB, CACHE_CEIL_MB, \
    FORCE_CACHE, IO_THREADS, NO_ODIRECT, DENSE_WEIGHTS, NO_MMAP, SESSION_MODE, CSV, ROUTE_TRACE, \
    CTX_SIZE, UBATCH, CHATML, NO_THINK, OVERLAP, VERSION, HELP, LIST_ARCHS, PROGRESS, \
    AUTO, PLAN, PLAN_EXPLAIN, PROBE, PROBE_IO, NO_PROBE_IO, PROBE_MEM, NO_PROBE_MEM, \
    DROP_COLD_EXPERTS, DROP_NO_RENORM, DROP_IN_PREFILL, EXPERT_SUBSTITUTE, ROUTE_AHEAD, PPL = (
        _BY_SPELLING[s] for s in (
            "--model", "--prompt", "--n-predict", "--threads", "--n-expert-used", "--moe-stream", "--cache-mb",
            "--cache-floor-mb", "--cache-ceil-mb", "--force-cache", "--io-threads", "--no-odirect",
            "--dense-weights", "--no-mmap", "--session", "--csv", "--route-trace",
            "--ctx-size", "--ubatch", "--chatml", "--no-think", "--overlap", "--version", "--help", "--list-archs",
            "--progress", "--auto", "--plan", "--plan-explain", "--probe", "--probe-io", "--no-probe-io",
            "--probe-mem", "--no-probe-mem",
            # the lossy levers and the scoring run a campaign's quality runs use (store.quality)
            "--drop-cold-experts", "--drop-no-renorm", "--drop-in-prefill", "--expert-substitute", "--route-ahead",
            "--ppl"))


def flag(spelling: str) -> Flag:
    """The flag typed as `spelling` (its name, short form or an alias). KeyError when none."""
    return _BY_SPELLING[spelling]


def spellings(flags: Iterable[Flag]) -> tuple[str, ...]:
    return tuple(s for f in flags for s in f.spellings)


def with_role(*roles: str) -> tuple[Flag, ...]:
    for r in roles:
        if r not in ROLES:
            raise ValueError(f"not a flag role: {r!r} (one of {', '.join(ROLES)})")
    return tuple(f for f in FLAGS if f.role in roles)


def taken_by(engine: str, release: Release | None = None) -> tuple[Flag, ...]:
    """The flags `engine` takes (bmoe-cli at `release`, when given)."""
    return tuple(f for f in FLAGS if f.taken_by(engine, release))


def reader_keys() -> dict[str, tuple[str, bool | str | None]]:
    """{spelling: (the key a captured command line's reader records it under, the value a switch
    sets it to; None: the flag's own value)} for the flags such a reader keeps."""
    return {s: (f.key, f.sets) for f in FLAGS if f.key for s in f.spellings}


def refused_by_bmoe_py(release: Release = V0_19) -> tuple[str, ...]:
    """bmoe-cli's flags at `release` that bmoe-py does not implement, each as typed (it refuses
    them as an unknown flag, so a cell asking for one is a config error, never something else)."""
    return spellings(f for f in FLAGS if f.taken_by(BMOE_CLI, release) and not f.bmoe_py)


def by_name() -> dict[str, Flag]:
    """{every spelling: its flag}."""
    return dict(_BY_SPELLING)
