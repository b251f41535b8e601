"""bmoe-py's hardware planner (`--auto`, `--plan`): (machine, model, what the caller typed) -> the
streaming config, each with the fact that decided it.

The rules and the printed plan follow upstream (Helldez/BigMoeOnEdge): core/src/plan/planner.cpp at
61bb2dc7 (the rules: regime, the "fits" air test, dense policy, cache budget and its floor, I/O
lanes, O_DIRECT, release-mmap, lossy off), planner.h at 0306fc80 (the policy margins), plan.cpp at
76eae483 (`explain()`, `to_flags()`, `best_lanes()`), allocate.cpp at cc663f99 (the cost model the
prediction comes from) and the store's newest cli/main.cpp (the front end: which flags pin, the
lines printed, `plan: predicted X s/token, measured Y`). A pure module: no I/O, no clock (the
measuring is engine.plan.probe), so a test can drive it with a made-up machine.

What bmoe-py leaves out, because it has no such thing: the capacity fitter and compute devices
(placement is always "none": everything is on the host), the headroom probe (`--probe-mem`), the
thread sweep, the accelerator lines. Its cost model is allocate.cpp's, cut down to the two lanes
bmoe-py has (docs/decisions/planner.md): a dense group costs its bytes at the measured
compute rate; the experts cost their token cycle at that rate plus the cycle's missed share read
at the storage probe's rate for this model's slice. The credited hit rate is linear in the cache,
as upstream's (cache bytes / expert bytes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from engine.contract.config import RunConfig
from engine.interface.flags import (
    AUTO,
    CACHE_MB,
    CTX_SIZE,
    DENSE_WEIGHTS,
    FORCE_CACHE,
    IO_THREADS,
    MOE_STREAM,
    NO_ODIRECT,
    THREADS,
)
from engine.stream.budget import CACHE_MIN_MB, IO_THREADS_MAX
from engine.units import GIB, KIB, MIB

# Decision sources, as the rationale prints them (planner.cpp source_name)
MEASURED, DERIVED, POLICY, OPERATOR, UNPROBED = "measured", "derived", "policy", "operator", "unprobed"

# What happens to anonymous memory the kernel wants back (bmoe/hardware_profile.h Overflow)
COMPRESS, SWAP, KILL, UNKNOWN = "compress", "swap", "kill", "unknown"
_OVERFLOW_NAME = {COMPRESS: "reclaimed into compressed RAM", SWAP: "swapped to disk",
                  KILL: "the process is killed", UNKNOWN: "unprobed"}

# Regimes (planner.cpp regime_name)
UNKNOWN_REGIME, NOT_MOE, FITS, EXPERTS_STREAM, DENSE_OVERSIZED = \
    "unknown", "not-moe", "fits", "experts-stream", "dense-oversized"

# The config a caller pins by typing their flag (or its env override): upstream's parameter keys,
# which are the names the decisions use.
KNOB_FLAGS = {"cache-mb": CACHE_MB, "io-threads": IO_THREADS, "dense-weights": DENSE_WEIGHTS,
              "threads": THREADS, "ctx-size": CTX_SIZE, "o-direct": NO_ODIRECT}
_CONVERTING = ("anon", "ahwb")   # dense modes that move the dense set out of reclaimable page cache


@dataclass(frozen=True)
class Policy:
    """planner.h PlannerPolicy: margins that are policy, not measurement."""

    margin_when_compressed: float = 0.10
    margin_when_swapped: float = 0.04
    margin_when_killed: float = 0.20
    margin_when_unknown: float = 0.15
    margin_min_bytes: int = 256 * MIB
    fits_air_ratio: float = 1.0

    def margin_bytes(self, overflow: str, budget: int) -> int:
        frac = {COMPRESS: self.margin_when_compressed, SWAP: self.margin_when_swapped,
                KILL: self.margin_when_killed}.get(overflow, self.margin_when_unknown)
        return max(int(budget * frac), self.margin_min_bytes)


@dataclass(frozen=True)
class RateSample:
    request_bytes: int
    lanes: int
    mib_per_s: float


@dataclass(frozen=True)
class Storage:
    """The storage probe's answers (bmoe/hardware_profile.h StorageFacts)."""

    rate_curve: tuple[RateSample, ...] = ()
    direct_ok: bool | None = None          # uncached reads work on the model's path (None: not asked)
    rate_spread: float = 1.0               # worst / best of the probe's repeats at the deciding size

    def rate_at(self, request_bytes: int, lanes: int) -> float:
        """The nearest measured request size at this lane count, never an interpolation (plan.cpp)."""
        samples = [s for s in self.rate_curve if s.lanes == lanes]
        if not samples:
            return 0.0
        return min(samples, key=lambda s: abs(s.request_bytes - request_bytes)).mib_per_s

    def best_lanes(self, request_bytes: int) -> int:
        """The LARGEST lane count within 5 % of the best rate (plan.cpp: more lanes inside the
        probe's resolution, as the machine that refuted the smallest-count rule showed); 0: no curve."""
        best = max((self.rate_at(request_bytes, s.lanes) for s in self.rate_curve), default=0.0)
        if best <= 0.0:
            return 0
        return max((s.lanes for s in self.rate_curve if self.rate_at(request_bytes, s.lanes) >= best * 0.95),
                   default=0)


@dataclass(frozen=True)
class Machine:
    """What the machine reported and what was measured on it (bmoe/hardware_profile.h)."""

    residency_budget_bytes: int            # what this process may hold (0: not reported)
    anon_overflow: str = UNKNOWN
    n_cores: int = 0
    core_classes: tuple[int, ...] = ()     # CPUs per reported maximum frequency, fastest first
    host_gibs: float = 0.0                 # the compute rate: weight bytes a matmul consumes per second
    storage: Storage = field(default_factory=Storage)

    @property
    def label(self) -> str:
        return f"{self.n_cores} cores, {self.residency_budget_bytes // MIB} MiB available"


@dataclass(frozen=True)
class Group:
    """One weight group's demand (bmoe/model_profile.h GroupDemand)."""

    name: str                              # embedding | attention | dense-ffn | experts | output | other
    bytes: int
    bytes_per_token: int
    row_gathered: bool = False
    streamable: bool = False


@dataclass(frozen=True)
class ModelProfile:
    """The model as its GGUF header describes it; nothing loaded (bmoe/model_profile.h)."""

    ok: bool
    arch: str = ""
    n_expert: int = 0
    n_expert_used: int = 0
    n_moe_layer: int = 0
    n_layer: int = 0
    file_bytes: int = 0
    dense_bytes: int = 0
    expert_bytes: int = 0
    token_cycle_bytes: int = 0
    expert_slice_bytes: int = 0            # one expert's slice of one tensor: the request size
    largest_dense_tensor_bytes: int = 0
    groups: tuple[Group, ...] = ()

    @property
    def is_moe(self) -> bool:
        return self.n_moe_layer > 0 and self.expert_bytes > 0


@dataclass(frozen=True)
class Decision:
    knob: str
    value: str
    source: str
    reason: str


@dataclass(frozen=True)
class GroupCost:
    name: str
    lane: str
    resident_bytes: int
    s_per_tok: float
    reason: str


@dataclass(frozen=True)
class Plan:
    regime: str
    config: RunConfig                      # the run as the plan resolved it (`plan.config` upstream)
    decisions: tuple[Decision, ...]
    token_cycle_bytes: int = 0
    cache_budget_bytes: int = 0
    declined: str = ""                     # why streaming was declined ("" : it was not)
    predicted_s_per_tok: float = 0.0       # 0: the cost model had no rate to price with
    worst_s_per_tok: float = 0.0
    cache_bytes: int = 0                   # the cache the cost model credited
    costs: tuple[GroupCost, ...] = ()
    expert_bytes: int = 0

    @property
    def credited_hit_pct(self) -> float:
        """cli/main.cpp: 100 x cache bytes / expert bytes; -1 when nothing was credited."""
        return 100.0 * self.cache_bytes / self.expert_bytes if self.cache_bytes > 0 and self.expert_bytes else -1.0

    def explain(self) -> list[str]:
        """The rationale, line by line (plan.cpp Plan::explain)."""
        out = [f"plan: regime {self.regime}"]
        if self.token_cycle_bytes:
            out.append(f"plan:   token cycle {self.token_cycle_bytes // MIB} MiB")
        out += [f"plan:   {d.knob:<14} {d.value:<10} [{d.source}] {d.reason}" for d in self.decisions]
        if self.predicted_s_per_tok > 0:
            out.append(f"plan:   cost {self.predicted_s_per_tok * 1000:.1f} ms/token predicted, "
                       f"{self.worst_s_per_tok * 1000:.1f} ms/token with nothing resident")
            out += [f"plan:     {c.name:<10} {c.lane:<14} {c.resident_bytes // MIB:6d} MiB held, "
                    f"{c.s_per_tok * 1000:7.2f} ms/token  {c.reason}" for c in self.costs]
        if self.declined:
            out.append(f"plan:   declined: {self.declined}")
        return out

    def to_flags(self) -> str:
        """The flags that reproduce the plan, each only where it differs from the default (plan.cpp)."""
        k, d = self.config, RunConfig()
        if not k.moe_stream:
            return f"# streaming declined; run without {MOE_STREAM.name}"
        words = [MOE_STREAM.name]
        if k.cache_mb != d.cache_mb:
            words.append(f"{CACHE_MB.name} {k.cache_mb}")
        if k.force_cache:
            words.append(FORCE_CACHE.name)
        if k.io_threads != d.io_threads:
            words.append(f"{IO_THREADS.name} {k.io_threads}")
        if not k.o_direct:
            words.append(NO_ODIRECT.name)
        if k.dense_weights != d.dense_weights:
            words.append(f"{DENSE_WEIGHTS.name} {k.dense_weights}")
        if k.n_threads != d.n_threads:
            words.append(f"{THREADS.name} {k.n_threads}")
        if k.n_ctx != d.n_ctx:
            words.append(f"{CTX_SIZE.name} {k.n_ctx}")
        return " ".join(words)


def _mib(n: int) -> str:
    return str(n // MIB)


def plan_run(base: RunConfig, hw: Machine, model: ModelProfile, pinned: Iterable[str] = (),
             policy: Policy = Policy()) -> Plan:
    """Resolve a run (planner.cpp plan_run). Never fails: an unreadable model or an unprofiled
    machine yields a plan that declines streaming and says why."""
    pins = frozenset(pinned)
    config = base
    notes: list[Decision] = []

    def note(knob: str, value: str, source: str, reason: str) -> None:
        notes.append(Decision(knob, value, source, reason))

    def is_pinned(knob: str, value: str) -> bool:
        if knob not in pins:
            return False
        note(knob, value, OPERATOR, "set by the caller; the planner leaves it alone")
        return True

    def declined(regime: str, why: str, token_cycle_bytes: int = 0, cache_budget_bytes: int = 0) -> Plan:
        return Plan(regime, replace(config, moe_stream=False), tuple(notes), declined=why,
                    expert_bytes=model.expert_bytes, token_cycle_bytes=token_cycle_bytes,
                    cache_budget_bytes=cache_budget_bytes)

    if not model.ok:
        note("moe-stream", "off", UNPROBED, "model profile unavailable")
        return declined(UNKNOWN_REGIME, "the model file could not be read, so nothing about it could be planned")
    if not model.is_moe:
        note("moe-stream", "off", DERIVED, "the file carries no expert tensors")
        return declined(NOT_MOE, "this model has no routed experts: there is nothing for the expert streamer to do")
    if hw.residency_budget_bytes <= 0:
        note("moe-stream", "off", UNPROBED, "machine not profiled")
        return declined(UNKNOWN_REGIME, "this machine reported no residency budget, so no size could be derived "
                                        "from it")

    holdable = hw.residency_budget_bytes
    margin = policy.margin_bytes(hw.anon_overflow, holdable)
    usable = max(holdable - margin, 0)
    host_all, host_dense = model.file_bytes, model.dense_bytes
    regime = FITS if host_all <= usable else EXPERTS_STREAM if host_dense <= usable else DENSE_OVERSIZED
    # Fitting is not the same as being left alone: where a reclaim is cheap, residency needs air.
    air = max(usable - host_all, 0)
    air_short = regime == FITS and hw.anon_overflow == COMPRESS and air < host_all * policy.fits_air_ratio
    if air_short:
        regime = EXPERTS_STREAM if host_dense <= usable else DENSE_OVERSIZED

    note("placement", "none", UNPROBED, "the capacity fitter was not run, so no layer is placed on a device: "
                                        "everything is on the host")
    note("regime", regime, DERIVED,
         f"on the host {_mib(host_all)} MiB (dense {_mib(host_dense)}) against {_mib(usable)} MiB usable, which is "
         f"the {_mib(holdable)} MiB this process may hold (as reported available, unmeasured) less a "
         f"{_mib(margin)} MiB margin ({_OVERFLOW_NAME.get(hw.anon_overflow, 'unprobed')})")
    if air_short:
        note("residency", "not verified", DERIVED,
             f"the host set fits with {_mib(air)} MiB to spare against the {_mib(host_all)} MiB it would hold, and "
             f"a reclaim is cheap here ({_OVERFLOW_NAME[hw.anon_overflow]}): a model that fits only just is "
             "reclaimed from underneath and refaults its weights one page at a time, so the experts stream "
             f"instead. Run without {AUTO.name} to keep plain residency")
    if regime == FITS:
        note("moe-stream", "off", DERIVED, "the model fits: hand the placement to llama.cpp instead")
        return declined(FITS, "what is left on the host fits in this machine's residency budget; streaming it "
                              "from flash would only add reads that resident weights do not need")

    # ── the dense policy: decided by what a reclaim costs here ──
    if not is_pinned("dense-weights", config.dense_weights):
        if hw.anon_overflow == UNKNOWN:
            note("dense-weights", "anon", POLICY, "what a reclaim costs here was not probed; anonymous buffers are "
                                                  "the default that at least keeps the dense set off a flash refault")
        else:
            note("dense-weights", "anon", DERIVED,
                 "no reclaim-exempt store here, so anonymous buffers are what keeps the dense set off a flash "
                 f"refault (a reclaim then means: {_OVERFLOW_NAME[hw.anon_overflow]})")
        config = replace(config, dense_weights="anon")
    converts = config.dense_weights in _CONVERTING
    dense_pending = host_dense if converts else 0
    if converts and model.largest_dense_tensor_bytes > hw.residency_budget_bytes:
        dense_pending = max(dense_pending - model.largest_dense_tensor_bytes, 0)

    # ── the cache budget, and the floor that is the model's own arithmetic ──
    cycle = model.token_cycle_bytes
    budget = min(max(usable - dense_pending, 0), model.expert_bytes)
    if cycle == 0:
        note("moe-stream", "off", UNPROBED, "expert slice size unknown")
        return declined(regime, "the model's expert shapes could not be read, so the cache floor could not be "
                                "derived", cache_budget_bytes=budget)
    cache_pinned = "cache-mb" in pins
    if budget < cycle and cache_pinned:
        note("cache-floor", f"{_mib(cycle)} MiB", DERIVED,
             f"the derived budget ({_mib(budget)} MiB) is under this model's token cycle, but the caller pinned "
             "cache-mb and a pin is the caller's authority: proceeding with the pinned value")
    elif budget < cycle:
        note("moe-stream", "off", DERIVED, "budget below the derived cache floor")
        return declined(regime, f"a cache of {_mib(budget)} MiB is below this model's worst-case token cycle of "
                                f"{_mib(cycle)} MiB: under that floor the cache evicts what the same token still "
                                "needs, so it costs its memory and returns no hits at all",
                        token_cycle_bytes=cycle, cache_budget_bytes=budget)
    config = replace(config, moe_stream=True)
    note("moe-stream", "on", DERIVED,
         "the experts do not fit but the dense set does" if regime == EXPERTS_STREAM else
         "neither set fits, so the experts stream and the dense policy degrades with them (a tensor larger than "
         "this budget is left mapped rather than made resident)")
    if not is_pinned("cache-mb", str(max(config.cache_mb, 0))):
        config = replace(config, cache_auto=False, cache_mb=budget // MIB)
        note("cache-mb", _mib(budget), DERIVED,
             f"{_mib(usable)} MiB usable less {_mib(dense_pending)} MiB the dense policy is about to make "
             f"non-reclaimable, capped at the {_mib(model.expert_bytes)} MiB the experts occupy")
        if 0 < config.cache_mb < CACHE_MIN_MB:
            config = replace(config, force_cache=True)
            note("force-cache", "on", DERIVED,
                 f"the budget clears this model's token cycle of {_mib(cycle)} MiB but sits under the generic "
                 f"{CACHE_MIN_MB} MiB guard, so the derived floor is used as the authority")

    # ── the I/O policy: from the machine's own rate curve ──
    if not is_pinned("io-threads", str(config.io_threads)):
        want = hw.storage.best_lanes(model.expert_slice_bytes)
        if want > 0:
            config = replace(config, io_threads=max(1, min(want, IO_THREADS_MAX)))
            note("io-threads", str(config.io_threads), MEASURED,
                 f"the highest measured rate for this model's {model.expert_slice_bytes // KIB} KiB expert slice "
                 "on this storage")
        else:
            note("io-threads", str(config.io_threads), UNPROBED,
                 "no read-rate curve for this machine; keeping the default lane count")
    if not is_pinned("o-direct", "on" if config.o_direct else "off"):
        if hw.storage.direct_ok is True:
            config = replace(config, o_direct=True)
            note("o-direct", "on", MEASURED, "uncached reads return correct bytes on this path")
        elif hw.storage.direct_ok is False:
            config = replace(config, o_direct=False)
            note("o-direct", "off", MEASURED, "uncached reads do not return correct bytes on this path, so they "
                                              "are not used")
        else:
            note("o-direct", "on" if config.o_direct else "off", UNPROBED,
                 "unverified here; the reader checks at open and falls back to buffered reads by itself")
    note("release-mmap", "off", UNPROBED, "whether a live mapping serialises reads was not measured on this machine")
    note("lossy", "off", POLICY, "no quality budget was given, and a policy that changes the output must never "
                                 "arm itself")
    if not is_pinned("threads", str(config.n_threads)):
        if len(hw.core_classes) > 1:
            shape = " + ".join(str(n) for n in hw.core_classes)
            note("threads", str(config.n_threads), UNPROBED,
                 f"this machine's cores are not alike ({shape} by reported maximum frequency), which is measured - "
                 "but the rule that turned that into a count was refuted on a machine of exactly this shape, so the "
                 "default stands until a thread sweep says otherwise")
        else:
            note("threads", str(config.n_threads), UNPROBED, "no thread sweep was run; the default stands")

    cost = allocate(hw, model, config)
    return Plan(regime, config, tuple(notes), token_cycle_bytes=cycle, cache_budget_bytes=budget,
                expert_bytes=model.expert_bytes, **cost)


def allocate(hw: Machine, model: ModelProfile, config: RunConfig) -> dict:
    """The cost of the resolved run per token (allocate.cpp, cut down to bmoe-py's lanes): {} when
    there is no compute rate or no read rate to price with (the plan then predicts nothing)."""
    stream_mibs = hw.storage.rate_at(model.expert_slice_bytes, hw.storage.best_lanes(model.expert_slice_bytes))
    if hw.host_gibs <= 0 or stream_mibs <= 0 or not config.moe_stream:
        return {}
    resident = config.dense_weights in _CONVERTING
    cache = min(config.cache_mb * MIB, model.expert_bytes)
    costs: list[GroupCost] = []
    total = worst = 0.0
    for g in model.groups:
        compute = g.bytes_per_token / GIB / hw.host_gibs
        if g.streamable:
            read = g.bytes_per_token / MIB / stream_mibs
            miss = 1.0 - cache / model.expert_bytes if model.expert_bytes else 1.0
            s = compute + read * miss
            costs.append(GroupCost(g.name, "expert-stream", cache, s,
                                   f"the token cycle read at {stream_mibs:.0f} MiB/s, {100 * (1 - miss):.0f}% of it "
                                   "credited to the cache"))
            total, worst = total + s, worst + compute + read
            continue
        lane = "row-stream" if g.row_gathered else "resident" if resident else "mmap"
        reason = ("row-gathered: only the rows the graph asks for are read" if g.row_gathered else
                  "resident: read whole, every token" if resident else
                  "left mapped: a refault's price was not measured here, so only its compute is priced")
        costs.append(GroupCost(g.name, lane, g.bytes if resident and not g.row_gathered else 0, compute, reason))
        total, worst = total + compute, worst + compute
    return {"predicted_s_per_tok": total, "worst_s_per_tok": worst, "cache_bytes": cache, "costs": tuple(costs)}


def pinned_knobs(typed_flags: Iterable[str], environ_pins: Iterable[str] = ()) -> frozenset[str]:
    """The config a caller pinned: a flag typed (by any spelling's flag name) or its env override set."""
    typed = set(typed_flags)
    env = set(environ_pins)
    return frozenset(k for k, f in KNOB_FLAGS.items() if f.name in typed or (f.env and f.env in env))


def check_line(plan: Plan, measured_s_per_tok: float, measured_hit_pct: float) -> str:
    """stdout after the run (cli/main.cpp): the prediction against what the run measured; "" when
    the plan predicted nothing."""
    if plan.predicted_s_per_tok <= 0 or measured_s_per_tok <= 0:
        return ""
    err = 100.0 * (plan.predicted_s_per_tok / measured_s_per_tok - 1.0)
    line = f"plan: predicted {plan.predicted_s_per_tok:.3f} s/token, measured {measured_s_per_tok:.3f} ({err:+.0f}%)"
    if plan.credited_hit_pct >= 0 and measured_hit_pct >= 0:
        line += f"; cache hits credited {plan.credited_hit_pct:.0f}%, measured {measured_hit_pct:.1f}%"
    return line


def explain_lines(hw: Machine, model: ModelProfile, plan: Plan, model_path: str, program: str) -> list[str]:
    """What `--plan-explain` (and `--plan`) prints on stderr, in cli/main.cpp's order: the machine,
    its one device (bmoe-py computes on the host alone), the model and its groups, the rationale,
    and last the command line that reproduces the plan."""
    out = [f"plan: machine {hw.label}",
           f"plan: device CPU (host): one token {hw.host_gibs:.1f} GiB/s (unverified), 0 tokens wide 0 GiB/s "
           "(unverified)"]
    if model.ok:
        out.append(f"plan: model {model.arch}, {model.n_expert} experts top-{model.n_expert_used} over "
                   f"{model.n_moe_layer} of {model.n_layer} blocks")
        for g in model.groups:
            if g.bytes:
                tag = "  (row-gathered)" if g.row_gathered else "  (streamable)" if g.streamable else ""
                out.append(f"plan:   {g.name:<10} {g.bytes // MIB:7d} MiB, {g.bytes_per_token // MIB:7d} MiB/token{tag}")
    out += plan.explain()
    out += ["plan: reproduce with", f"  {program} -m {model_path} {plan.to_flags()}"]
    return out
