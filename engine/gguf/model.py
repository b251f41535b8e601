"""A MoE model's shape and prices, from its GGUF header(s) alone.

The engine streams each routed expert's slice of the `ffn_*_exps` weights with O_DIRECT; this
module says where those slices are and what they cost. Pricing follows the seed
(docs/cache-sizing.md upstream): the worst-case token cycle is every bound MoE layer's
one-expert bytes times min(top_k, n_expert); below it a global LRU hits 0 %.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ModelError
from engine.gguf.header import GGUFHeader, TensorInfo, read_header
from engine.safetext import one_line
from engine.units import MIB

# A token cycle's price in MiB, rounded one way in one place: the plan's `cycle_mb`, the model
# records, the run table (from a GGUF), the route-trace replay and the analysis all price it so.
# (What an engine prints is its own: bmoe-py's one decimal, upstream's integer rounded up from 0.21.)
CYCLE_PRICE_DIGITS = 3


def cycle_price_mib(cycle_bytes: float) -> float:
    """A token cycle of `cycle_bytes` priced in MiB (CYCLE_PRICE_DIGITS decimals)."""
    return round(cycle_bytes / MIB, CYCLE_PRICE_DIGITS)
# the shape record's format (`model inspect --json`, and a campaign directory's models/*.json)
SHAPE_FORMAT, SHAPE_VERSION = "bmoe-fleet.model-shape", 1

# Streamed expert weights: split gate/up/down, or gate+up fused. Biases and scales stay dense.
_EXPERT_RE = re.compile(r"^blk\.([0-9]+)\.ffn_(gate|up|down|gate_up)_exps\.weight$")
_LAYER_RE = re.compile(r"^blk\.([0-9]+)\.")
MAX_LAYERS = 512   # llama.cpp's LLAMA_MAX_LAYERS: bmoe-cli refuses a block_count above it
_SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<no>[0-9]{5})-of-(?P<count>[0-9]{5})\.gguf$")


@dataclass(frozen=True)
class ExpertSlice:
    """Where one expert's share of one expert tensor lives on disk."""

    tensor: str
    path: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class ExpertLayer:
    """The streamed expert tensors of one MoE layer."""

    layer: int
    n_expert: int
    tensors: tuple[TensorInfo, ...]

    @property
    def expert_bytes(self) -> int:
        """Bytes one expert streams in this layer (the sum of its slices)."""
        return sum(t.nbytes // self.n_expert for t in self.tensors)

    def slices(self, expert: int) -> tuple[ExpertSlice, ...]:
        if not 0 <= expert < self.n_expert:
            raise ModelError(f"expert {expert} out of range 0..{self.n_expert - 1} in layer {self.layer}")
        out = []
        for t in self.tensors:
            stride = t.nbytes // self.n_expert
            out.append(ExpertSlice(t.name, t.path, t.offset + expert * stride, stride))
        return tuple(out)


@dataclass(frozen=True)
class ModelShape:
    paths: tuple[str, ...]
    name: str
    arch: str
    n_layer: int
    n_expert: int
    top_k: int | None
    moe_layers: tuple[ExpertLayer, ...]
    layer_dense_bytes: dict[int, int]
    global_dense_bytes: int
    header_bytes: int
    file_bytes: int
    dense_tensors: tuple[TensorInfo, ...]
    metadata: dict[str, Any] = field(repr=False)

    # ---- sizes ---------------------------------------------------------------------------
    @property
    def dense_bytes(self) -> int:
        """Every non-expert tensor byte (embeddings, attention, norms, router, biases, lm_head)."""
        return self.global_dense_bytes + sum(self.layer_dense_bytes.values())

    @property
    def expert_bytes(self) -> int:
        """Every streamable expert byte: the whole expert bank."""
        return sum(layer.expert_bytes * layer.n_expert for layer in self.moe_layers)

    @property
    def n_nextn_layers(self) -> int:
        """Trailing next-token-prediction (MTP) blocks: in the file, never bound by the engine."""
        return int(self.metadata.get(f"{self.arch}.nextn_predict_layers") or 0)

    @property
    def bound_dense_tensors(self) -> tuple[TensorInfo, ...]:
        """The dense tensors a run uses: every non-expert tensor except those of the nextn/MTP
        blocks, which no decode reads (so --dense-weights anon neither converts nor reserves them)."""
        first_nextn = self.n_layer - self.n_nextn_layers
        if first_nextn >= self.n_layer:
            return self.dense_tensors
        out = []
        for t in self.dense_tensors:
            m = _LAYER_RE.match(t.name)
            if not (m and int(m[1]) >= first_nextn):
                out.append(t)
        return tuple(out)

    def dense_ranges(self) -> dict[str, list[tuple[int, int]]]:
        """Per shard, the byte ranges [lo, hi) that are not bound expert tensors: header, dense
        tensors, padding and tail — what upstream's warm-up sweeps and its residency sensor probes."""
        experts: dict[str, list[tuple[int, int]]] = {p: [] for p in self.paths}
        for layer in self.moe_layers:
            for t in layer.tensors:
                experts[t.path].append((t.offset, t.offset + t.nbytes))
        out: dict[str, list[tuple[int, int]]] = {}
        for path, spans in experts.items():
            ranges, pos = [], 0
            for lo, hi in sorted(spans):
                if lo > pos:
                    ranges.append((pos, lo))
                pos = max(pos, hi)
            size = os.path.getsize(path)
            if pos < size:
                ranges.append((pos, size))
            out[path] = ranges
        return out

    @property
    def widest_expert_bytes(self) -> int:
        return max(layer.expert_bytes for layer in self.moe_layers)

    def quant_types(self) -> dict[str, dict[str, int]]:
        """Bytes per quant type, for expert and dense tensors separately."""
        out: dict[str, dict[str, int]] = {"expert": {}, "dense": {}}
        for layer in self.moe_layers:
            for t in layer.tensors:
                out["expert"][t.qtype.name] = out["expert"].get(t.qtype.name, 0) + t.nbytes
        for t in self.dense_tensors:
            out["dense"][t.qtype.name] = out["dense"].get(t.qtype.name, 0) + t.nbytes
        return out

    # ---- prices --------------------------------------------------------------------------
    def check_top_k(self, top_k: int) -> int:
        if top_k < 1:
            raise ModelError(f"top-k must be at least 1, got {top_k}")
        if top_k > self.n_expert:
            raise ModelError(f"top-k {top_k} is above this model's n_expert of {self.n_expert}")
        return top_k

    def cycle_bytes(self, top_k: int) -> int:
        """Worst-case distinct expert bytes one token routes: every MoE layer, k disjoint experts."""
        k = min(self.check_top_k(top_k), self.n_expert)
        return sum(layer.expert_bytes for layer in self.moe_layers) * k

    def cycle_mib(self, top_k: int) -> float:
        return self.cycle_bytes(top_k) / MIB

    def layer_demand_bytes(self, top_k: int) -> int:
        """The widest single layer's routed bytes: the mechanical minimum of any cache."""
        return self.widest_expert_bytes * min(self.check_top_k(top_k), self.n_expert)

    def layer_demand_mib(self, top_k: int) -> float:
        return self.layer_demand_bytes(top_k) / MIB

    def default_top_ks(self) -> list[int]:
        """The model's own top-k, plus 2 and 4 where they differ and fit."""
        ks = [self.top_k] if self.top_k else []
        ks += [k for k in (2, 4) if k not in ks and k <= self.n_expert]
        return ks

    def to_dict(self, top_ks: list[int]) -> dict[str, Any]:
        return {
            "format": SHAPE_FORMAT,
            "version": SHAPE_VERSION,
            "paths": list(self.paths),
            "name": self.name,
            "arch": self.arch,
            "n_layer": self.n_layer,
            "n_expert": self.n_expert,
            "top_k": self.top_k,
            "moe_layers": [layer.layer for layer in self.moe_layers],
            "file_bytes": self.file_bytes,
            "header_bytes": self.header_bytes,
            "dense_bytes": self.dense_bytes,
            "global_dense_bytes": self.global_dense_bytes,
            "expert_bytes": self.expert_bytes,
            "quant_types": self.quant_types(),
            "layers": [
                {
                    "layer": layer.layer,
                    "expert_bytes": layer.expert_bytes,
                    "dense_bytes": self.layer_dense_bytes.get(layer.layer, 0),
                    "tensors": [
                        {
                            "name": t.name,
                            "type": t.qtype.name,
                            "path": t.path,
                            "offset": t.offset,
                            "expert_stride_bytes": t.nbytes // layer.n_expert,
                        }
                        for t in layer.tensors
                    ],
                }
                for layer in self.moe_layers
            ],
            "prices": [
                {
                    "top_k": k,
                    "cycle_bytes": self.cycle_bytes(k),
                    "cycle_mib": cycle_price_mib(self.cycle_bytes(k)),
                    "layer_demand_bytes": self.layer_demand_bytes(k),
                    "layer_demand_mib": round(self.layer_demand_mib(k), 3),
                }
                for k in top_ks
            ],
        }


def split_paths(path: str) -> tuple[str, ...]:
    """All shards of a split model given any one of them; a plain file is its own list."""
    m = _SPLIT_RE.match(os.path.basename(path))
    count = int(m["count"]) if m else 0
    if not m or not 1 <= int(m["no"]) <= count:
        # "-00001-of-00000" names no split: bmoe-cli loads such a file as the one file it is
        return (path,)
    folder = os.path.dirname(path)
    paths = tuple(os.path.join(folder, f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1))
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise ModelError(f"{path}: split model is missing {len(missing)} of {count} shards, first {missing[0]}")
    return paths


def _meta(metadata: dict[str, Any], arch: str, key: str) -> Any:
    return metadata.get(f"{arch}.{key}")


def _count(value: Any, key: str, path: str) -> int | None:
    """A metadata count as an int (None when absent); anything else is a damaged header."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelError(f"{path}: corrupt GGUF header: {one_line(key, 60)}={one_line(str(value), 40)} is not a "
                         "count")
    return value


# The expert tensors a MoE layer needs, one of these sets (gpt-oss and qwen3moe: separate gate and
# up; a fused gate_up elsewhere), in the order llama.cpp's loader creates them (llama-model.cpp:
# gate, down, up), which refuses the first one missing ("check_tensor_dims: tensor … not found").
EXPERT_SETS = (("ffn_gate_exps", "ffn_down_exps", "ffn_up_exps"), ("ffn_gate_up_exps", "ffn_down_exps"))


def engine_refusal(shape: ModelShape) -> str | None:
    """Why bmoe-cli (llama.cpp's loader) will refuse a file whose header reads, in its words: a MoE
    layer without a whole set of expert tensors (a tensor count cut short drops one), or None.
    Pricing does not refuse it (a shape-only file of tests and benchmarks may be priced; `model
    inspect` marks it); bmoe-py's Session refuses it as bmoe-cli does."""
    for layer in shape.moe_layers:
        kinds = {t.name.split(".")[2] for t in layer.tensors}
        if any(set(needed) <= kinds for needed in EXPERT_SETS):
            continue
        needed = EXPERT_SETS[1] if "ffn_gate_up_exps" in kinds else EXPERT_SETS[0]
        missing = next(k for k in needed if k not in kinds)
        return f"check_tensor_dims: tensor 'blk.{layer.layer}.{missing}.weight' not found"
    return None


def load_model_shape(path: str | os.PathLike[str]) -> ModelShape:
    """Read every shard's header and price the model. Raises ModelError with a one-line reason."""
    paths = split_paths(os.fspath(path))
    headers: list[GGUFHeader] = [read_header(p) for p in paths]
    metadata = dict(headers[0].metadata)
    declared = _count(metadata.get("split.count"), "split.count", paths[0])
    if declared is not None and declared != len(paths):
        raise ModelError(f"{paths[0]}: header says split.count={declared} but {len(paths)} shard(s) were found")
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelError(f"{paths[0]}: GGUF has no general.architecture")
    tensors = [t for h in headers for t in h.tensors]
    n_layer = _count(_meta(metadata, arch, "block_count"), f"{arch}.block_count", paths[0])
    if n_layer is None:
        raise ModelError(f"{paths[0]}: GGUF has no {one_line(arch, 60)}.block_count")
    if not 0 < n_layer <= MAX_LAYERS:
        # bmoe-cli asserts this (llama-model.cpp) before it allocates anything per layer
        raise ModelError(f"{paths[0]}: corrupt GGUF header: {one_line(arch, 60)}.block_count={n_layer} is not "
                         f"1 to {MAX_LAYERS} (llama.cpp's LLAMA_MAX_LAYERS)")
    # Trailing next-token-prediction blocks name expert tensors but are never bound by the engine.
    n_bound = n_layer - (_count(_meta(metadata, arch, "nextn_predict_layers"), f"{arch}.nextn_predict_layers",
                                paths[0]) or 0)

    by_layer: dict[int, list[TensorInfo]] = {}
    dense: list[TensorInfo] = []
    for t in tensors:
        m = _EXPERT_RE.match(t.name)
        if m and int(m[1]) < n_bound:
            by_layer.setdefault(int(m[1]), []).append(t)
        else:
            dense.append(t)
    if not by_layer:
        raise ModelError(f"{paths[0]}: not a MoE model: no ffn_*_exps expert tensors (arch {one_line(arch, 60)})")

    n_expert_meta = _count(_meta(metadata, arch, "expert_count"), f"{arch}.expert_count", paths[0])
    moe_layers = []
    n_expert = 0
    for layer in sorted(by_layer):
        layer_tensors = tuple(by_layer[layer])
        counts = {t.ne[-1] for t in layer_tensors if len(t.ne) >= 3}
        if len(counts) != 1 or any(len(t.ne) < 3 for t in layer_tensors):
            raise ModelError(f"{paths[0]}: layer {layer} expert tensors disagree on the expert count: {sorted(counts)}")
        layer_n_expert = counts.pop()
        if layer_n_expert < 1:
            raise ModelError(f"{paths[0]}: corrupt GGUF header: layer {layer} expert tensors hold 0 experts")
        if n_expert_meta is not None and layer_n_expert != n_expert_meta:
            raise ModelError(f"{paths[0]}: layer {layer} has {layer_n_expert} experts but "
                             f"{one_line(arch, 60)}.expert_count={n_expert_meta}")
        n_expert = max(n_expert, layer_n_expert)
        moe_layers.append(ExpertLayer(layer, layer_n_expert, layer_tensors))

    layer_dense: dict[int, int] = {}
    global_dense = 0
    for t in dense:
        m = _LAYER_RE.match(t.name)
        if m:
            layer_dense[int(m[1])] = layer_dense.get(int(m[1]), 0) + t.nbytes
        else:
            global_dense += t.nbytes

    top_k = _count(_meta(metadata, arch, "expert_used_count"), f"{arch}.expert_used_count", paths[0])
    name = metadata.get("general.name") or os.path.basename(paths[0])
    return ModelShape(
        paths=paths,
        name=str(name),
        arch=arch,
        n_layer=n_layer,
        n_expert=n_expert,
        top_k=int(top_k) if top_k is not None else None,
        moe_layers=tuple(moe_layers),
        layer_dense_bytes=layer_dense,
        global_dense_bytes=global_dense,
        header_bytes=sum(h.header_bytes for h in headers),
        file_bytes=sum(h.file_bytes for h in headers),
        dense_tensors=tuple(dense),
        metadata=metadata,
    )


