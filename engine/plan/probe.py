"""What the planner (engine.plan.planner) is given: the model from its GGUF header and the machine from
what it reports and what bmoe-py measures on it, as upstream's probes do (Helldez/BigMoeOnEdge
core/src/plan/hardware_probe.cpp at 0306fc80, model_probe.cpp, storage_probe.cpp, bandwidth_probe.cpp;
the order and the flags are cli/main.cpp's, the store's newest).

- residency budget: what `--cache-mb auto` sizes from (engine.stream.budget.available_memory: MemAvailable,
  and the memory cgroup's headroom where that is smaller — bmoe-py's documented extension);
- what a reclaim costs: hardware_probe.cpp's rule, from what the machine reclaims INTO: a zram
  block device and swap in /proc/meminfo is compress, swap without zram is swap, no swap is kill.
  Upstream looks for /sys/block/zram0 (Android's device); any zram device counts here, since a
  virtual phone's is numbered by hot_add;
- core classes: CPUs grouped by cpuinfo_max_freq, fastest first (nothing when any is unreadable);
- compute rate: bmoe-py's own matmul over one expert matrix of this model, at the run's threads
  (upstream: one GEMV on every backend), as weight GiB consumed per second;
- storage: O_DIRECT reads of this model's own expert slices at 1, 2 and 4 lanes, the median of
  three samples each (`--no-probe-io` skips it), and whether uncached reads work on its path.
"""

from __future__ import annotations

import glob
import os
import re
import statistics
import time
from collections.abc import Mapping

import numpy as np

from engine.contract.config import RunConfig
from engine.errors import BmoeError
from engine.gguf.model import ExpertSlice, ModelShape, load_model_shape
from engine.kernels.activation import Activation
from engine.kernels.matmul import matmul, raw_matrix
from engine.plan.planner import (
    COMPRESS,
    KILL,
    SWAP,
    UNKNOWN,
    Group,
    Machine,
    ModelProfile,
    Plan,
    RateSample,
    Storage,
    explain_lines,
    pinned_knobs,
    plan_run,
)
from engine.stream.budget import available_memory
from engine.stream.io import DirectReader
from engine.units import GIB, MIB, ascii_int

PROGRAM = "bmoe-py"            # the program the reproduce line names: the engine that made the plan

PROBE_LANES = (1, 2, 4)
PROBE_SAMPLES = 3
REQUESTS_PER_LANE = 4          # each sample keeps every lane busy for four slices
COMPUTE_REPEATS = 5
_SWAP_TOTAL = re.compile(r"^SwapTotal:\s+([0-9]+)\s*kB", re.MULTILINE)


def model_profile(path: str, n_expert_used: int = 0) -> tuple[ModelProfile, ModelShape | None]:
    """The model as the planner sees it, and its shape (None when the header cannot be read: the
    profile is then not ok and the plan declines, as upstream's does)."""
    try:
        shape = load_model_shape(path)
        top_k = shape.check_top_k(n_expert_used or shape.top_k or 1) if shape.n_expert else 0
    except (BmoeError, OSError, ValueError):
        return ModelProfile(ok=False), None
    if not shape.moe_layers or not top_k:
        return ModelProfile(ok=True, arch=shape.arch, n_layer=shape.n_layer, file_bytes=shape.file_bytes,
                            dense_bytes=shape.dense_bytes), shape
    cycle = shape.cycle_bytes(top_k)
    dense = shape.bound_dense_tensors
    groups: dict[str, list[int]] = {}
    row_gathered = set()
    for t in dense:
        name = _group_of(t.name)
        per_token = t.nbytes
        if name == "embedding":
            per_token = t.nbytes // max(t.ne[-1], 1)      # one row of the table a token reads
            row_gathered.add(name)
        got = groups.setdefault(name, [0, 0])
        got[0] += t.nbytes
        got[1] += per_token
    out = [Group(n, b, per, row_gathered=n in row_gathered) for n, (b, per) in groups.items()]
    out.append(Group("experts", shape.expert_bytes, cycle, streamable=True))
    order = ("embedding", "attention", "dense-ffn", "experts", "output", "other")
    return ModelProfile(
        ok=True, arch=shape.arch, n_expert=shape.n_expert, n_expert_used=top_k, n_moe_layer=len(shape.moe_layers),
        n_layer=shape.n_layer, file_bytes=shape.file_bytes, dense_bytes=sum(t.nbytes for t in dense),
        expert_bytes=shape.expert_bytes, token_cycle_bytes=cycle,
        expert_slice_bytes=max(s.nbytes for s in request_slices(shape)),
        largest_dense_tensor_bytes=max((t.nbytes for t in dense), default=0),
        groups=tuple(sorted(out, key=lambda g: order.index(g.name))),
    ), shape


def request_slices(shape: ModelShape) -> list[ExpertSlice]:
    """One read per (layer, expert): the expert's slice of the layer's widest expert tensor, the
    request size the plan prices (`expert_slice_bytes`) and the storage probe reads."""
    out = []
    for layer in shape.moe_layers:
        widest = max(range(len(layer.tensors)), key=lambda i: layer.tensors[i].nbytes)
        out += [layer.slices(e)[widest] for e in range(layer.n_expert)]
    return out


def _group_of(tensor: str) -> str:
    if tensor.startswith("token_embd"):
        return "embedding"
    if tensor.startswith("output."):
        return "output"
    part = tensor.split(".")[2] if tensor.startswith("blk.") and tensor.count(".") >= 2 else ""
    if part.startswith("attn"):
        return "attention"
    if part.startswith("ffn"):
        return "dense-ffn"
    return "other"


def anon_overflow(meminfo: str = "/proc/meminfo", sys_block: str = "/sys/block") -> str:
    """hardware_probe.cpp probe_anon_overflow on Linux."""
    try:
        with open(meminfo, encoding="ascii", errors="replace") as f:
            m = _SWAP_TOTAL.search(f.read())
    except OSError:
        return UNKNOWN
    swap_kb = int(m[1]) if m else 0
    if swap_kb > 0 and glob.glob(os.path.join(sys_block, "zram*")):
        return COMPRESS
    return SWAP if swap_kb > 0 else KILL


def core_classes(cpus: list[int], root: str = "/sys/devices/system/cpu") -> tuple[int, ...]:
    """CPUs per reported maximum frequency, fastest first; () when any CPU does not say."""
    khz = []
    for cpu in cpus:
        try:
            with open(f"{root}/cpu{cpu}/cpufreq/cpuinfo_max_freq", encoding="ascii") as f:
                v = ascii_int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return ()
        if v <= 0:
            return ()
        khz.append(v)
    counts: dict[int, int] = {}
    for v in sorted(khz, reverse=True):
        counts[v] = counts.get(v, 0) + 1
    return tuple(counts.values())


def compute_gibs(shape: ModelShape, threads: int) -> float:
    """Weight GiB per second bmoe-py's matmul consumes on one expert matrix of this model."""
    layer = shape.moe_layers[0]
    info = layer.tensors[0]
    piece = layer.slices(0)[0]
    with DirectReader(io_threads=1, o_direct=False) as reader:
        data = reader.read_slices([piece])[0]
    w = raw_matrix(data, info.qtype, info.ne[0], info.ne[1], info.name)
    act = Activation(np.random.default_rng(0).standard_normal((1, info.ne[0])).astype(np.float32))
    best = float("inf")
    for _ in range(COMPUTE_REPEATS):
        t0 = time.perf_counter()
        matmul(act, w, max(1, threads))
        best = min(best, time.perf_counter() - t0)
    return piece.nbytes / best / GIB if best > 0 else 0.0


def storage(shape: ModelShape) -> Storage:
    """The read-rate curve at this model's slice size over PROBE_LANES, and whether O_DIRECT held
    (asked whatever the run's own --no-odirect says: a pin decides the knob, not the fact)."""
    slices = request_slices(shape)
    if not slices:
        return Storage()
    stride = 7919 % len(slices) or 1     # spread the requests over the file, not one run of it
    slice_bytes = max(s.nbytes for s in slices)
    curve, direct, spread, at = [], None, 1.0, 0
    for lanes in PROBE_LANES:
        rates = []
        for _ in range(PROBE_SAMPLES):
            batch = []
            for _ in range(lanes * REQUESTS_PER_LANE):
                batch.append(slices[at % len(slices)])
                at += stride
            with DirectReader(io_threads=lanes, o_direct=True) as reader:
                t0 = time.perf_counter()
                reader.read_slices(batch)
                dt = time.perf_counter() - t0
                direct = reader.o_direct if direct is None else (direct and reader.o_direct)
            rates.append(sum(s.nbytes for s in batch) / MIB / dt if dt > 0 else 0.0)
        curve.append(RateSample(slice_bytes, lanes, statistics.median(rates)))
        if min(rates) > 0:
            spread = max(spread, max(rates) / min(rates))
    return Storage(tuple(curve), direct_ok=direct, rate_spread=spread)


def machine(shape: ModelShape | None, threads: int, probe_io: bool) -> Machine:
    """The machine, probed quiet first and I/O last, as cli/main.cpp orders it."""
    avail = available_memory().bytes or 0
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except OSError:
        cpus = list(range(os.cpu_count() or 0))
    host = compute_gibs(shape, threads) if shape is not None and shape.moe_layers else 0.0
    store = storage(shape) if probe_io and shape is not None and shape.moe_layers else Storage()
    return Machine(avail, anon_overflow(), len(cpus), core_classes(cpus), host, store)


def plan_for(cfg: RunConfig, environ: Mapping[str, str]) -> tuple[Plan, list[str]]:
    """Probe, then plan `cfg`: the plan and its explanation lines (printed with --plan-explain).
    A flag the caller typed, or its env override, pins its knob (cli/main.cpp)."""
    profile, shape = model_profile(cfg.model_path, cfg.n_expert_used)
    hw = machine(shape, cfg.n_threads, cfg.probe_io)
    pins = pinned_knobs(cfg.typed, (k for k, v in environ.items() if v))
    plan = plan_run(cfg, hw, profile, pins)
    return plan, explain_lines(hw, profile, plan, cfg.model_path, PROGRAM)
