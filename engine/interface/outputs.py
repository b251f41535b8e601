"""What bmoe-cli writes, by release: every output a reader of this project handles, declared once.

One `Output` per key or line: where it is written (the CSV preamble's `# k=v` lines, a per-token
column, the `# summary` trailer, a `--progress`/`--session` JSON line, a stdout or stderr line),
its unit, what it means, the release it appeared in and what later releases changed. A line's
values are `Field`s, each named as the reader's pattern names its group and, where it has one,
with the run-table column it lands in. results/ derives its readers from this table (the summary
and BMOE_DONE keys the run table takes, the counts the range checks know, the names the importer
renames, the console lines parse_console must match); tests/results/test_release_lines.py fails
when a line field with a run-table column is read by no reader's pattern.

Sources (Helldez/BigMoeOnEdge, read with the search tool, nothing copied):

- CHANGELOG.md at 006783f9: the 0.19.0 to 0.24.0 entries (speculative decoding and its `mtp:` /
  `ngram:` lines and trailer keys in 0.19; 0.20 is a recipe and build release whose binaries
  report 0.19.0; 0.21 the cycle warning and `cache_cycle_mb`; 0.22 stall as a union of stalled
  intervals, "not comparable with CSVs produced by older releases"; 0.23 the prefill attribution
  keys; 0.24 `--row-stream` (`row_*`, `moe-rows:`), `--expert-substitute` (`substitute_lambda`,
  `experts_reranked`/`experts_substituted`), `--ppl` (`ppl:`, `ppl-policy:`), `o_direct` as the
  open's real outcome).
- cli/main.cpp at 6441494b (after 0.24.0, NEXT here): the end-of-run printf formats (`mode:`,
  `plan: predicted X s/token, measured Y (E%)`, `moe-drop:`, `moe-substitute:`,
  `moe-route-ahead:`, `moe-rows:`, `moe-waits:`, `ppl:`/`ppl-policy:`), the planner's stderr
  `plan:` lines and its `plan: reproduce with` command line, and `cfg = plan.config` before the
  CSV sink opens: the plan is in the CSV header as the preamble's resolved settings.
- core/src/metrics/csv_metrics_sink.cpp, the store's newest version (its commit is not named by
  the store; it writes `cache_cycle_mb=%d` and `substitute_lambda`): the v2 preamble, the 29
  columns, the trailer's keys through `row_io_errors`.
- upstream's docs/telemetry.md at 4e4796ae (the `--progress` and session lines), docs/ngram.md and
  docs/expert-dropping.md (captured `ngram:` and `moe-drop:` lines, copied as fixtures).

`since=None` means the output is older than 0.19.0, the first release this table covers.

Long because: it is one declared table, read top to bottom (the preamble, the per-token columns,
the trailer, BMOE_DONE, the events, then the stdout and stderr lines), with the few lookups
results/ derives from it; split by place, the one list a reader holds against upstream's sources
would be spread over several files.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.interface.releases import NEXT, V0_19, V0_21, V0_22, V0_23, V0_24, Release

PREAMBLE, COLUMN, SUMMARY, DONE, READY, PROGRESS, STDOUT, STDERR = (
    "preamble", "column", "summary", "done", "ready", "progress", "stdout", "stderr")
PLACES = (PREAMBLE, COLUMN, SUMMARY, DONE, READY, PROGRESS, STDOUT, STDERR)
# the units a value can have; "count" is a non-negative whole number (results.read.parse_values)
UNITS = ("count", "count/token", "MiB", "MiB/token", "MiB/s", "bytes", "s", "s/token", "ms", "ms/token", "tok/s",
         "%", "frac", "x", "bool", "text", "ppl", "nats")


@dataclass(frozen=True)
class Change:
    """What a release changed about an output. comparable=False: values written before and after
    it measure different things and must not be compared."""

    release: Release
    what: str
    comparable: bool = True


@dataclass(frozen=True)
class Field:
    """One value of a line: its name (the reader's group name), unit and run-table column."""

    name: str
    unit: str
    column: str | None = None


@dataclass(frozen=True)
class Output:
    place: str                      # one of PLACES
    name: str                       # the key as written, or a line's name (its kind)
    unit: str                       # a key's unit; "" for a line (its fields carry theirs)
    meaning: str
    since: Release | None = None    # None: older than 0.19.0
    column: str | None = None       # the run-table column a key lands in
    fields: tuple[Field, ...] = ()  # a line's values
    prefix: str = ""                # how a line starts (a line)
    changes: tuple[Change, ...] = ()
    aliases: tuple[str, ...] = ()   # other names readers give the same setting (the importer renames them)
    config: bool = False            # a preamble key an imported run keeps as cell configuration

    def written_by(self, release: Release) -> bool:
        return self.since is None or release >= self.since


def _f(name: str, unit: str, column: str | None = None) -> Field:
    return Field(name, unit, column)


_STALL_022 = Change(V0_22, "under --overlap, stall is the union of stalled intervals (the wall time at least one "
                           "compute thread was blocked on a streamed expert), no longer the summed per-thread "
                           "block time over the thread count", comparable=False)
_O_DIRECT_024 = Change(V0_24, "the open's real outcome (the AND across shards after every refusal and downgrade), "
                              "no longer the requested setting: 1 on macOS meant nothing before")

_PRE: tuple[Output, ...] = (
    Output(PREAMBLE, "engine", "text", "the engine's release as the build reports it (0.20.0 builds say 0.19.0)",
           column="engine"),
    Output(PREAMBLE, "model", "text", "the -m path as given", config=True),
    Output(PREAMBLE, "arch", "text", "the model's architecture", config=True, column="arch"),
    Output(PREAMBLE, "n_layer", "count", "the model's blocks", config=True, column="n_layer"),
    Output(PREAMBLE, "n_expert", "count", "experts per MoE layer", config=True, column="n_expert"),
    Output(PREAMBLE, "n_expert_used", "count", "the top-k the run applied", config=True, aliases=("top_k",),
           column="n_expert_used"),
    Output(PREAMBLE, "threads", "count", "compute threads (-t)", config=True),
    Output(PREAMBLE, "n_ctx", "count", "context size (-c)", config=True),
    Output(PREAMBLE, "n_ubatch", "count", "prefill micro-batch (0: the context)"),
    Output(PREAMBLE, "chatml", "bool", "the ChatML template was applied"),
    Output(PREAMBLE, "moe_stream", "bool", "experts streamed from flash (--moe-stream)", config=True),
    Output(PREAMBLE, "cache_mb", "MiB", "the expert cache budget asked (auto: the sized budget)", config=True,
           aliases=("cache_mib",)),
    Output(PREAMBLE, "cache_auto", "bool", "--cache-mb auto", config=True),
    Output(PREAMBLE, "cache_floor_mb", "MiB", "RAM auto leaves free", config=True, aliases=("cache_floor_mib",)),
    Output(PREAMBLE, "cache_ceil_mb", "MiB", "the cap on auto (0: none)", config=True, aliases=("cache_ceil_mib",),
           column="cache_ceil_mb"),
    Output(PREAMBLE, "cache_cycle_mb", "MiB", "one token's worst-case routed expert bytes at the applied top-k",
           since=V0_21, config=True, column="cache_cycle_mb",
           changes=(Change(V0_21, "written by upstream as an integer rounded up (%d); bmoe-py writes %.1f"),)),
    Output(PREAMBLE, "force_cache", "bool", "--force-cache", config=True),
    Output(PREAMBLE, "load_all", "bool", "--load-all"),
    Output(PREAMBLE, "io_threads", "count", "read lanes (--io-threads)", config=True),
    Output(PREAMBLE, "o_direct", "bool", "expert reads bypassed the page cache", config=True, column="o_direct",
           changes=(_O_DIRECT_024,)),
    Output(PREAMBLE, "overlap", "bool", "reads overlapped with FFN compute (--overlap)", config=True),
    Output(PREAMBLE, "io_two_wave", "bool", "--io-two-wave"),
    Output(PREAMBLE, "prefetch", "count", "temporal prefetch depth (--prefetch)", config=True),
    Output(PREAMBLE, "route_ahead", "count", "layers early the routing was committed (--route-ahead; lossy)",
           column="route_ahead"),
    Output(PREAMBLE, "predict_prefetch", "bool", "--predict-prefetch"),
    Output(PREAMBLE, "predict_log", "bool", "--predict-log"),
    Output(PREAMBLE, "predict_spec_max", "count", "--predict-spec-max"),
    Output(PREAMBLE, "prefetch_sync", "bool", "--prefetch-sync"),
    Output(PREAMBLE, "dense_weights", "text", "the dense-weight policy", config=True),
    Output(PREAMBLE, "drop_cold_frac", "x", "--drop-cold-experts threshold, times uniform (0: off; lossy)",
           column="drop_cold_frac"),
    Output(PREAMBLE, "drop_renorm", "bool", "kept weights renormalised after a drop"),
    Output(PREAMBLE, "drop_prefill", "bool", "drops also in the prefill"),
    Output(PREAMBLE, "substitute_lambda", "x", "--expert-substitute margin, times the score range (0: off; lossy)",
           since=V0_24, column="substitute_lambda"),
    Output(PREAMBLE, "temp", "x", "sampling temperature (0: greedy)"),
    Output(PREAMBLE, "top_k", "count", "the sampler's top-k (not the experts')"),
    Output(PREAMBLE, "top_p", "frac", "the sampler's top-p"),
    Output(PREAMBLE, "seed", "count", "the sampler's seed"),
    Output(PREAMBLE, "compute_trace_layers", "bool", "--compute-trace-layers"),
    Output(PREAMBLE, "spec", "text", "the draft source: off, mtp or ngram", since=V0_19, column="spec"),
    Output(PREAMBLE, "spec_draft_max", "count", "--draft width", since=V0_19),
    Output(PREAMBLE, "mtp_p_min", "frac", "--mtp-p-min", since=V0_19),
    Output(PREAMBLE, "ngram_min_match", "count", "--ngram-min-match", since=V0_19),
)

_COLUMNS: tuple[Output, ...] = tuple(
    Output(COLUMN, name, unit, meaning, changes=changes) for name, unit, meaning, changes in (
        ("step", "count", "1-based token index", ()), ("steps", "count", "tokens asked", ()),
        ("wall_ms", "ms", "the token's wall time", ()), ("io_ms", "ms", "flash read time (lane busy time under overlap)", ()),
        ("compute_ms", "ms", "the residual after the measured terms", ()), ("read_bytes", "bytes", "flash bytes read", ()),
        ("cache_hit_pct", "%", "cumulative hit rate (-1: no cache)", ()),
        ("stall_ms", "ms", "wall time compute lost to reads under overlap", (_STALL_022,)),
        ("mgmt_ms", "ms", "cache management", ()), ("majflt", "count", "major faults", ()),
        ("cpu_ms", "ms", "CPU time over all threads", ()),
        ("dense_resident_frac", "frac", "dense set still in RAM (-1: not sampled)", ()),
        ("turn", "count", "session turn", ()), ("majflt_mib", "MiB", "major-fault bytes", ()),
        ("cache_budget_mib", "MiB", "the cache budget", ()), ("rss_mib", "MiB", "RSS", ()),
        ("rss_anon_mib", "MiB", "RssAnon", ()), ("rss_file_mib", "MiB", "RssFile", ()),
        ("swap_mib", "MiB", "VmSwap", ()), ("mem_available_mib", "MiB", "MemAvailable", ()),
        ("mem_free_mib", "MiB", "MemFree", ()), ("swap_free_mib", "MiB", "SwapFree", ()),
        ("loop_overhead_ms", "ms", "time between decodes", ()),
        ("mtp_batch", "count", "positions of a speculative verify decode (on its first row)", ()),
        ("mtp_draft_ms", "ms", "drafting time, outside wall_ms", ()), ("drain_ms", "ms", "previous-batch drain", ()),
        ("adopt_ms", "ms", "adoption wait", ()), ("ra_issue_ms", "ms", "route-ahead read issue", ()),
        ("ra_wd_ms", "ms", "route-ahead watchdog", ()),
    ))

_SUMMARY: tuple[Output, ...] = (
    Output(SUMMARY, "tokens", "count", "tokens generated", column="tokens"),
    Output(SUMMARY, "s/tok", "s/token", "decode seconds per token (drafting excluded)", column="s_per_tok"),
    Output(SUMMARY, "tok/s", "tok/s", "decode rate (drafting excluded)", column="tok_s_summary"),
    Output(SUMMARY, "read_MiB", "MiB", "flash read, speculative reads included", column="read_mib"),
    Output(SUMMARY, "io_s", "s", "flash read time"),
    Output(SUMMARY, "compute_s/tok", "s/token", "the compute residual", column="compute_s_per_tok"),
    Output(SUMMARY, "io_s/tok", "s/token", "flash read time per token", column="io_s_per_tok"),
    Output(SUMMARY, "cache_hit_pct", "%", "cumulative hit rate, prefill included (-1: no cache)", column="cache_hit_pct"),
    Output(SUMMARY, "n_prompt", "count", "prompt tokens", column="n_prompt"),
    Output(SUMMARY, "load_s", "s", "model load", column="load_s"),
    Output(SUMMARY, "prefill_s", "s", "prefill wall time", column="prefill_s"),
    Output(SUMMARY, "prefill_tps", "tok/s", "prefill rate"),
    Output(SUMMARY, "stall_s/tok", "s/token", "overlap stall per token", column="stall_s_per_tok",
           changes=(_STALL_022,)),
    Output(SUMMARY, "mgmt_s/tok", "s/token", "cache management per token", column="mgmt_s_per_tok"),
    Output(SUMMARY, "cache_resident_MiB", "MiB", "the cache's resident bytes at the end", column="cache_resident_mib"),
    Output(SUMMARY, "cache_budget_MiB", "MiB", "the budget the run had", column="cache_mb"),
    Output(SUMMARY, "cache_resizes", "count", "budget resizes"),
    Output(SUMMARY, "spec_read_MiB", "MiB", "prefetch reads"),
    Output(SUMMARY, "spec_experts", "count", "experts read ahead"),
    Output(SUMMARY, "spec_useful", "count", "read-ahead experts a later routing hit"),
    Output(SUMMARY, "majflt/tok", "count/token", "major faults per token", column="majflt_per_tok"),
    Output(SUMMARY, "cpu_s/tok", "s/token", "CPU seconds per token", column="cpu_s_per_tok"),
    Output(SUMMARY, "token_demand_MiB", "MiB", "distinct expert bytes one token routes, measured",
           column="token_demand_mib"),
    Output(SUMMARY, "layer_demand_MiB", "MiB", "the widest layer's routed bytes", column="layer_demand_mib"),
    Output(SUMMARY, "experts_routed", "count", "routed (layer, expert) slots", column="experts_routed"),
    Output(SUMMARY, "experts_dropped", "count", "slots --drop-cold-experts discarded", column="experts_dropped"),
    Output(SUMMARY, "experts_reranked", "count", "slots --expert-substitute examined", since=V0_24,
           column="experts_reranked"),
    Output(SUMMARY, "experts_substituted", "count", "slots that went to a resident expert", since=V0_24,
           column="experts_substituted"),
    Output(SUMMARY, "loop_overhead_s/tok", "s/token", "time between decodes", column="loop_overhead_s_per_tok"),
    Output(SUMMARY, "mtp_drafted", "count", "draft tokens proposed (either source)", since=V0_19,
           column="spec_drafted"),
    Output(SUMMARY, "mtp_accepted", "count", "draft tokens the target confirmed", since=V0_19, column="spec_accepted"),
    Output(SUMMARY, "mtp_decodes", "count", "verify decodes (= tokens without speculation)", since=V0_19,
           column="spec_decodes"),
    Output(SUMMARY, "mtp_draft_s/tok", "s/token", "drafting cost, outside s/tok", since=V0_19,
           column="spec_draft_s_per_tok"),
    Output(SUMMARY, "drafted_steps", "count", "verify decodes that had a draft", since=V0_19, column="drafted_steps"),
    Output(SUMMARY, "ra_committed", "count", "routings --route-ahead committed", column="ra_committed"),
    Output(SUMMARY, "ra_passthrough", "count", "routings it passed through", column="ra_passthrough"),
    Output(SUMMARY, "ra_agree_pct", "%", "committed slots the router agreed with", column="ra_agree_pct"),
    Output(SUMMARY, "ra_gemv_ms/tok", "ms/token", "the prediction's worker CPU"),
    Output(SUMMARY, "ra_issue_ms/tok", "ms/token", "issuing the committed reads"),
    Output(SUMMARY, "ra_wd_ms/tok", "ms/token", "the fresh-gate watchdog"),
    Output(SUMMARY, "drain_s/tok", "s/token", "previous-batch drain (inside compute)"),
    Output(SUMMARY, "adopt_s/tok", "s/token", "adoption wait (inside mgmt)"),
    Output(SUMMARY, "evictions", "count", "cache evictions", column="evictions"),
    Output(SUMMARY, "rereads", "count", "reads of an entry the cache held once", column="rereads"),
    Output(SUMMARY, "cache_cuts", "count", "times --cache-dynamic shrank the budget (July 2026 builds)"),
    *(Output(SUMMARY, key, unit, meaning, since=V0_23, column=key) for key, unit, meaning in (
        ("prefill_cpu_s", "s", "the prompt phase's CPU time"),
        ("prefill_read_mib", "MiB", "the prompt phase's flash read"),
        ("prefill_io_s", "s", "the prompt phase's flash read time"),
        ("prefill_stall_s", "s", "the prompt phase's overlap stall"),
        ("prefill_mgmt_s", "s", "the prompt phase's cache management"))),
    *(Output(SUMMARY, key, unit, meaning, since=NEXT) for key, unit, meaning in (
        ("prefill_dev_tokens", "count", "prompt tokens prefilled on a device (--prefill-device)"),
        ("prefill_dev_nodes", "count", "graph nodes the device ran"),
        ("prefill_dev_read_mib", "MiB", "the device prefill's flash read"),
        ("prefill_dev_stall_s", "s", "the device prefill's stall"))),
    *(Output(SUMMARY, key, unit, meaning, since=V0_24, column=key.lower()) for key, unit, meaning in (
        ("row_table_MiB", "MiB", "row-gathered tables taken off the resident set (--row-stream)"),
        ("row_resident_MiB", "MiB", "their rows held in the window"),
        ("row_rows", "count", "rows gathered"),
        ("row_reads", "count", "16 KiB slab reads"),
        ("row_read_MiB", "MiB", "bytes those reads fetched"),
        ("row_evictions", "count", "slabs the window handed back"),
        ("row_io_errors", "count", "failed row reads (the output is not trustworthy)"))),
)

# BMOE_DONE (--session): snake_case twins of the trailer's keys, and a few of its own
_DONE: tuple[Output, ...] = (
    *(Output(DONE, key, unit, "as the trailer's", column=column) for key, unit, column in (
        ("tokens", "count", "tokens"), ("tok_s", "tok/s", None), ("prefill_s", "s", "prefill_s"),
        ("prefill_tps", "tok/s", None), ("load_s", "s", "load_s"), ("cache_hit_pct", "%", None),
        ("n_prompt", "count", "n_prompt"), ("compute_s_tok", "s/token", None), ("io_s_tok", "s/token", None),
        ("cache_resident_mib", "MiB", None), ("cache_budget_mib", "MiB", None), ("read_mib", "MiB", None),
        ("stall_s_tok", "s/token", None), ("mgmt_s_tok", "s/token", None), ("majflt_tok", "count/token", None),
        ("cpu_s_tok", "s/token", None), ("token_demand_mib", "MiB", None), ("mtp_drafted", "count", "spec_drafted"),
        ("mtp_accepted", "count", "spec_accepted"), ("mtp_decodes", "count", "spec_decodes"),
        ("mtp_draft_s_tok", "s/token", "spec_draft_s_per_tok"), ("drafted_steps", "count", "drafted_steps"),
        ("loop_overhead_s_tok", "s/token", None))),
    Output(DONE, "id", "count", "the request's id"), Output(DONE, "cancelled", "bool", "the turn was cancelled"),
    Output(DONE, "n_past", "count", "context length after the turn"),
    Output(DONE, "reasoning", "text", "the reasoning text"), Output(DONE, "text", "text", "the answer"),
    *(Output(DONE, key, unit, "as the trailer's", since=V0_23, column=key) for key, unit in (
        ("prefill_cpu_s", "s"), ("prefill_read_mib", "MiB"), ("prefill_io_s", "s"), ("prefill_stall_s", "s"),
        ("prefill_mgmt_s", "s"))),
)

_EVENTS: tuple[Output, ...] = (
    *(Output(READY, key, unit, meaning) for key, unit, meaning in (
        ("load_s", "s", "model load"), ("arch", "text", "architecture"), ("n_ctx", "count", "context size"),
        ("think_ctl", "text", "how think=false is honoured"), ("n_expert_used", "count", "top-k"))),
    *(Output(PROGRESS, key, unit, meaning) for key, unit, meaning in (
        ("step", "count", "1-based token index"), ("steps", "count", "tokens asked"), ("wall_ms", "ms", "wall time"),
        ("io_ms", "ms", "read time"), ("compute_ms", "ms", "the residual"), ("mgmt_ms", "ms", "cache management"),
        ("stall_ms", "ms", "overlap stall"), ("read_mb", "MiB", "flash read this token"),
        ("cache_hit_pct", "%", "cumulative hit rate"), ("majflt", "count", "major faults"),
        ("cpu_ms", "ms", "CPU time"), ("resident_frac", "frac", "cache residency"),
        ("delta_text", "text", "the token's bytes"))),
)

_N = "count"
_LINES: tuple[Output, ...] = (
    # stdout, end of run
    Output(STDOUT, "generation", "", "tokens decoded and their rate", prefix="generation:",
           fields=(_f("tokens", _N), _f("s_per_token", "s/token"), _f("tok_per_s", "tok/s"))),
    Output(STDOUT, "plan-check", "", "the planner's prediction against what the run measured (--auto)", since=NEXT,
           prefix="plan: predicted",
           fields=(_f("plan_predicted_s_per_tok", "s/token", "plan_predicted_s_per_tok"),
                   _f("plan_measured_s_per_tok", "s/token", "plan_measured_s_per_tok"),
                   _f("plan_error_pct", "%", "plan_error_pct"),
                   _f("plan_credited_hit_pct", "%", "plan_credited_hit_pct"),
                   _f("plan_measured_hit_pct", "%"))),
    Output(STDOUT, "compute", "", "CPU occupancy, CPU seconds per token, threads, major faults", prefix="compute:",
           fields=(_f("cpu_occupancy_pct", "%"), _f("cpu_s_per_token", "s/token"), _f("threads", _N),
                   _f("majflt_per_token", "count/token"))),
    Output(STDOUT, "spec-accepted", "", "drafts accepted and tokens per verify decode (--mtp/--ngram)", since=V0_19,
           prefix="mtp:|ngram:",
           fields=(_f("spec_source", "text", "spec_source"), _f("spec_accepted", _N, "spec_accepted"),
                   _f("spec_drafted", _N, "spec_drafted"), _f("spec_accept_pct", "%", "spec_accept_pct"),
                   _f("tokens_per_decode", "x", "tokens_per_decode"), _f("spec_decodes", _N, "spec_decodes"),
                   _f("spec_tokens", _N))),
    Output(STDOUT, "spec-effective", "", "drafting's cost and the rate that includes it: the speculative run's "
                                         "real tok/s", since=V0_19, prefix="mtp:|ngram:",
           fields=(_f("spec_source", "text", "spec_source"), _f("spec_draft_s_per_tok", "s/token", "spec_draft_s_per_tok"),
                   _f("effective_tok_s", "tok/s", "effective_tok_s"), _f("reported_tok_s", "tok/s"))),
    Output(STDOUT, "ngram-coverage", "", "verify decodes that had an n-gram draft", since=V0_19, prefix="ngram:",
           fields=(_f("drafted_steps", _N, "drafted_steps"), _f("spec_decodes", _N),
                   _f("drafted_steps_pct", "%", "drafted_steps_pct"))),
    Output(STDOUT, "mtp-read-split", "", "streamed MiB split between the MTP head's routing and the widened verify "
                                         "batch", since=V0_19, prefix="mtp:",
           fields=(_f("read_mib", "MiB"), _f("mtp_head_read_mib", "MiB", "mtp_head_read_mib"),
                   _f("mtp_head_read_pct", "%"), _f("verify_read_mib", "MiB"))),
    Output(STDOUT, "prefill", "", "prompt, model load, time to first token", prefix="prefill:",
           fields=(_f("tokens", _N), _f("prefill_s", "s"), _f("tok_per_s", "tok/s"), _f("load_s", "s"),
                   _f("ttft_s", "s"))),
    Output(STDOUT, "mode", "", "what the run was: expert streaming (with its cache, dense mode, overlap) or mmap, "
                               "a baseline", since=NEXT, prefix="mode:",
           fields=(_f("mode", "text", "mode"), _f("mode_cache", "text", "mode_cache"), _f("mode_dense", "text"),
                   _f("mode_overlap", "text"))),
    Output(STDOUT, "moe-stream", "", "flash reads and the decode split", prefix="moe-stream:",
           fields=(_f("read_mib", "MiB"), _f("read_mib_per_token", "MiB/token"), _f("decode_s_per_token", "s/token"),
                   _f("compute_s_per_token", "s/token"), _f("cache_mgmt_s_per_token", "s/token"),
                   _f("flash_io_s_per_token", "s/token"), _f("flash_mib_per_s", "MiB/s"))),
    Output(STDOUT, "moe-cache", "", "hit rate, resident MiB, the auto budget", prefix="moe-cache:",
           fields=(_f("hit_pct", "%"), _f("resident_mib", "MiB"), _f("budget_mib", "MiB"))),
    Output(STDOUT, "moe-cache-churn", "", "evictions and re-reads", prefix="moe-cache:",
           fields=(_f("evictions", _N), _f("rereads", _N), _f("rereads_per_token", "count/token"))),
    Output(STDOUT, "moe-rows", "", "row-gathered tables off the resident set (--row-stream)", since=V0_24,
           prefix="moe-rows:",
           fields=(_f("row_table_mib", "MiB", "row_table_mib"), _f("row_resident_mib", "MiB", "row_resident_mib"),
                   _f("row_rows", _N, "row_rows"), _f("row_reads", _N, "row_reads"),
                   _f("row_read_mib", "MiB", "row_read_mib"))),
    Output(STDOUT, "moe-rows-failed", "", "failed row reads", since=V0_24, prefix="moe-rows:",
           fields=(_f("row_io_errors", _N, "row_io_errors"),)),
    Output(STDOUT, "moe-overlap", "", "overlap stall per token", prefix="moe-overlap:",
           fields=(_f("stall_s_per_token", "s/token"),), changes=(_STALL_022,)),
    Output(STDOUT, "moe-waits", "", "the eval thread's drain and adoption waits", prefix="moe-waits:",
           fields=(_f("drain_s_per_token", "s/token", "drain_s_per_tok"),
                   _f("adopt_s_per_token", "s/token", "adopt_s_per_tok"))),
    Output(STDOUT, "moe-prefetch", "", "speculative reads and how many were useful", prefix="moe-prefetch:",
           fields=(_f("speculative_mib", "MiB"), _f("useful_experts", _N), _f("experts", _N), _f("useful_pct", "%"))),
    Output(STDOUT, "moe-spec-gate", "", "router prediction recall (July 2026 builds)", prefix="moe-spec-gate:",
           fields=(_f("recall_pct", "%"),)),
    Output(STDOUT, "moe-drop", "", "what --drop-cold-experts discarded", prefix="moe-drop:",
           fields=(_f("experts_dropped", _N, "experts_dropped"), _f("experts_routed", _N, "experts_routed"),
                   _f("drop_pct", "%", "drop_pct"), _f("drop_threshold", "x", "drop_threshold"))),
    Output(STDOUT, "moe-substitute", "", "reranked slots that went to a resident expert (--expert-substitute)",
           since=V0_24, prefix="moe-substitute:",
           fields=(_f("experts_substituted", _N, "experts_substituted"),
                   _f("experts_reranked", _N, "experts_reranked"), _f("substituted_pct", "%", "substituted_pct"),
                   _f("substitute_margin", "x"))),
    Output(STDOUT, "moe-route-ahead", "", "routings committed N layers early and their agreement with the router",
           prefix="moe-route-ahead:",
           fields=(_f("route_ahead_layers", _N), _f("ra_committed", _N, "ra_committed"),
                   _f("ra_passthrough", _N, "ra_passthrough"), _f("ra_agree_pct", "%", "ra_agree_pct"))),
    Output(STDOUT, "moe-route-ahead-cost", "", "the prediction's CPU and the eval thread's issue and watchdog time",
           prefix="moe-route-ahead:",
           fields=(_f("ra_gemv_ms_per_tok", "ms/token", "ra_gemv_ms_per_tok"), _f("ra_gemv_jobs", _N),
                   _f("ra_gemv_ms", "ms"), _f("ra_issue_ms_per_tok", "ms/token", "ra_issue_ms_per_tok"),
                   _f("ra_wd_ms_per_tok", "ms/token", "ra_wd_ms_per_tok"))),
    Output(STDOUT, "ppl", "", "teacher-forced perplexity of a fixed text (--ppl)", since=V0_24, prefix="ppl:",
           fields=(_f("ppl", "ppl", "ppl"), _f("ppl_nll", "nats", "ppl_nll"), _f("ppl_hits", _N),
                   _f("ppl_scored", _N, "ppl_scored"), _f("ppl_hit_pct", "%", "ppl_hit_pct"),
                   _f("ppl_seconds", "s"))),
    Output(STDOUT, "ppl-policy", "", "what the lossy policies did while scoring", since=V0_24, prefix="ppl-policy:",
           fields=(_f("experts_dropped", _N, "experts_dropped"), _f("experts_routed", _N, "experts_routed"),
                   _f("experts_substituted", _N, "experts_substituted"),
                   _f("experts_reranked", _N, "experts_reranked"))),
    # stderr, at load
    Output(STDERR, "cache-auto", "", "auto sizing: available, left free, the budget, its cap", prefix="bmoe: cache auto",
           fields=(_f("available_mib", "MiB"), _f("free_mib", "MiB"), _f("budget_mib", "MiB"), _f("cap_mib", "MiB"))),
    Output(STDERR, "cache-reserve", "", "RAM auto reserves for the dense-weight conversion", prefix="bmoe: cache auto",
           fields=(_f("cache_reserve_mib", "MiB"),)),
    Output(STDERR, "dense-warmup", "", "dense warm-up", prefix="bmoe: dense warm-up",
           fields=(_f("mib", "MiB"), _f("seconds", "s"))),
    Output(STDERR, "dense-dropped", "", "mmap pages dropped after the anon copy", prefix="bmoe: dense-weights=",
           fields=(_f("dense_dropped_mib", "MiB"),)),
    Output(STDERR, "dense-anon", "", "dense weights copied to anonymous buffers", prefix="bmoe: dense-weights=",
           fields=(_f("mib", "MiB"), _f("buffers", _N))),
    Output(STDERR, "streaming-on", "", "the `bmoe:` banner: experts, O_DIRECT, lanes, cache, shards",
           prefix="bmoe: expert streaming ON",
           fields=(_f("n_expert", _N), _f("o_direct", "bool"), _f("io_threads", _N), _f("cache_mib", "MiB"),
                   _f("shards", _N)), changes=(_O_DIRECT_024,)),
    Output(STDERR, "cycle-warning", "", "the budget is under the model's token cycle", prefix="bmoe: WARNING",
           fields=(_f("budget_mib", "MiB"), _f("cycle_mib", "MiB"), _f("top_k", _N)),
           changes=(Change(V0_21, "upstream's own from 0.21 (bmoe-py printed it first)"),)),
    Output(STDERR, "dense-weights-refused", "", "a bad --dense-weights value (exit 2)", prefix="bmoe: --dense-weights"),
    Output(STDERR, "plan-reproduce", "", "the command line that reproduces the plan (--auto/--plan), on the next "
                                         "line; its --cache-mb is the budget the plan chose", since=NEXT,
           prefix="plan: reproduce with",
           fields=(_f("plan_flags", "text", "plan_flags"), _f("plan_cache_mb", "MiB", "plan_cache_mb"))),
    Output(STDERR, "plan-regime", "", "the planner's regime: fits | experts-stream | dense-oversized | not-moe | "
                                      "unknown (--plan-explain)", since=NEXT, prefix="plan: regime",
           fields=(_f("plan_regime", "text", "plan_regime"),)),
    Output(STDERR, "plan-cost", "", "the plan's predicted cost per token, and with nothing resident (--plan-explain)",
           since=NEXT, prefix="plan:   cost",
           fields=(_f("plan_cost_ms_per_tok", "ms/token", "plan_cost_ms_per_tok"),
                   _f("plan_worst_ms_per_tok", "ms/token"))),
    Output(STDERR, "plan-declined", "", "why the plan declined streaming (the run is then a baseline)", since=NEXT,
           prefix="plan:   declined:", fields=(_f("plan_declined", "text", "plan_declined"),)),
    Output(STDERR, "plan-explain", "", "the planner's other lines (machine, devices, model, decisions, probes)",
           since=NEXT, prefix="plan:", fields=(_f("plan_lines", "count", "plan_lines"),)),
    # either stream: refusals and errors
    Output(STDERR, "config-error", "", "the engine refused its configuration", prefix="config error:"),
    Output(STDERR, "arg-error", "", "an unknown flag or a missing value", prefix="unknown arg:|missing value for"),
    Output(STDERR, "runtime-error", "", "a failure after load began", prefix="error:"),
    Output(STDERR, "warning", "", "a warning the run went on after", prefix="warning:"),
)

OUTPUTS: tuple[Output, ...] = _PRE + _COLUMNS + _SUMMARY + _DONE + _EVENTS + _LINES


def outputs(place: str, release: Release | None = None) -> tuple[Output, ...]:
    """The outputs written at `place` (by `release`, when given: the ones it writes)."""
    if place not in PLACES:
        raise ValueError(f"not an output place: {place!r} (one of {', '.join(PLACES)})")
    return tuple(o for o in OUTPUTS if o.place == place and (release is None or o.written_by(release)))


def line(name: str) -> Output:
    """The stdout or stderr line of that name."""
    for o in OUTPUTS:
        if o.place in (STDOUT, STDERR) and o.name == name:
            return o
    raise KeyError(name)


def columns(place: str) -> dict[str, str]:
    """{key as written: run-table column} of the keys at `place` that land in the run table."""
    return {o.name: o.column for o in outputs(place) if o.column}


def line_columns() -> dict[str, dict[str, str]]:
    """{line name: {field: run-table column}} of the lines whose values land in the run table."""
    return {o.name: {f.name: f.column for f in o.fields if f.column} for o in OUTPUTS
            if o.place in (STDOUT, STDERR) and any(f.column for f in o.fields)}


def text_fields() -> frozenset[str]:
    """The stdout/stderr line fields whose unit is text: a reader keeps them as written, never a number."""
    return frozenset(f.name for o in OUTPUTS if o.place in (STDOUT, STDERR) for f in o.fields if f.unit == "text")


def count_keys() -> frozenset[str]:
    """Every key and line field whose unit is a count (the range checks' non-negative whole numbers)."""
    names = {o.name for o in OUTPUTS if o.unit == "count"}
    names |= {f.name for o in OUTPUTS for f in o.fields if f.unit == "count"}
    return frozenset(names)


def reader_aliases() -> dict[str, str]:
    """{another reader's name: the preamble key} (`cache_mib` -> `cache_mb` …): what the importer renames."""
    return {alias: o.name for o in outputs(PREAMBLE) for alias in o.aliases}


def config_keys() -> tuple[str, ...]:
    """The preamble keys an imported run keeps as its cell configuration, in table order."""
    return tuple(o.name for o in outputs(PREAMBLE) if o.config)


def bool_keys(place: str) -> tuple[str, ...]:
    return tuple(o.name for o in outputs(place) if o.unit == "bool")


def comparable(place: str, name: str, a: Release, b: Release) -> bool:
    """Whether values of an output written by releases a and b measure the same thing: False when
    a change marked not comparable lies between them (after the older, at or before the newer)."""
    older, newer = sorted((a, b))
    for o in OUTPUTS:
        if o.place == place and o.name == name:
            return not any(not c.comparable and older < c.release <= newer for c in o.changes)
    raise KeyError(f"{place} {name}")


STALL_UNION, STALL_MEAN = "union", "per-thread mean"


def stall_basis(oldest: Release, newest: Release | None = None) -> str:
    """What a build's stall figures measure, for a build that may be any release from oldest to
    newest: the union of stalled intervals (0.22 on), the per-thread mean (before), or "" when the
    range straddles the change."""
    newest = newest or oldest
    if oldest >= V0_22:
        return STALL_UNION
    if newest < V0_22:
        return STALL_MEAN
    return ""


def o_direct_is_outcome(oldest: Release) -> bool:
    """`o_direct` reports what the open achieved (0.24 on), not what was asked."""
    return oldest >= V0_24


def cycle_is_rounded_up(oldest: Release) -> bool:
    """Upstream's `cache_cycle_mb` is an integer rounded up (0.21 on)."""
    return oldest >= V0_21


def prefill_attributed(oldest: Release) -> bool:
    return oldest >= V0_23

