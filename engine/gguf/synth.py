"""Write real MoE GGUF files with random weights, following llama.cpp's conventions.

Tensor names, shapes (ggml order: ne[0] is the row), arch-prefixed metadata keys and a
byte-fallback SentencePiece vocabulary are those llama.cpp's loader expects for `qwen3moe` and
`gpt-oss`, so llama.cpp-based engines (bmoe-cli) can load what this writes.

Memory stays bounded for files of many GiB: tensor infos go through gguf's GGUFWriter
(`add_tensor_info` → header, KV, tensor-info), and tensor data is then generated and written in
chunks of at most `CHUNK_BYTES`, never a whole tensor at once. `shape_only` writes the same header
and extends the file sparsely to its full size, so a real model's shape can be priced without
its weights. Output is written under a temporary name and renamed at the end: a crash or Ctrl-C
never leaves a half-written file under the requested name.

Long because: it is one job, options in, file out. Its sections (options and
presets, the tensor plan, size fitting, values, writing) all read `SynthOptions` and `TensorSpec`,
and callers import only `synth_options` and `write_model`; split, the plan and the values would
import the options back from the writer's module (a cycle) or move them to a third one.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

from engine.errors import SynthError
from engine.units import MIB

CHUNK_BYTES = 4 * MIB
ProgressFn = Callable[[int, int], None]

_EXPERT_QUANTS = {
    "qwen3moe": ("F32", "F16", "Q8_0", "Q4_0"),
    "gpt-oss": ("MXFP4",),
}
_FILE_TYPES = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "MXFP4": gguf.LlamaFileType.MOSTLY_MXFP4_MOE,
}
N_SPECIAL_TOKENS = 3  # <unk>, <s>, </s>
MIN_VOCAB = N_SPECIAL_TOKENS + 256


@dataclass(frozen=True)
class SynthOptions:
    """Everything that determines a synthetic model's bytes (same options + seed = same file)."""

    preset: str
    arch: str
    n_layer: int
    n_expert: int
    top_k: int
    hidden: int
    expert_ffn: int
    vocab: int
    head_dim: int
    n_head: int
    n_head_kv: int
    quant: str
    seed: int = 0
    router_skew: float = 1.0
    context_length: int = 4096
    split_count: int = 1
    shape_only: bool = False
    target_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Defaults per preset; `None` head counts are derived from the hidden size.
_PRESETS: dict[str, dict[str, Any]] = {
    "qwen3moe": dict(arch="qwen3moe", n_layer=4, n_expert=16, top_k=4, hidden=256, expert_ffn=256,
                     vocab=512, head_dim=64, quant="Q8_0"),
    "gpt-oss": dict(arch="gpt-oss", n_layer=4, n_expert=16, top_k=4, hidden=256, expert_ffn=256,
                    vocab=512, head_dim=64, quant="MXFP4"),
    # The shape of openai/gpt-oss-120b as llama.cpp converts it (price it with --shape-only).
    "gpt-oss-120b": dict(arch="gpt-oss", n_layer=36, n_expert=128, top_k=4, hidden=2880, expert_ffn=2880,
                         vocab=201088, head_dim=64, n_head=64, n_head_kv=8, quant="MXFP4",
                         context_length=131072),
}
PRESETS = tuple(_PRESETS)


def _derive_heads(hidden: int, head_dim: int) -> tuple[int, int]:
    n_head = max(1, hidden // head_dim)
    return n_head, n_head // 2 if n_head % 2 == 0 else 1


def _validate(o: SynthOptions) -> SynthOptions:
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise SynthError(msg)

    allowed = _EXPERT_QUANTS[o.arch]
    need(o.quant in allowed, f"--quant {o.quant} is not offered for {o.arch}; choose one of {', '.join(allowed)}")
    need(o.n_layer >= 1, f"--layers must be at least 1, got {o.n_layer}")
    need(o.n_expert >= 1, f"--experts must be at least 1, got {o.n_expert}")
    need(1 <= o.top_k <= o.n_expert, f"--top-k must be in 1..{o.n_expert} (the expert count), got {o.top_k}")
    need(o.hidden >= 32 and o.hidden % 32 == 0, f"--hidden must be a positive multiple of 32, got {o.hidden}")
    need(o.expert_ffn >= 32 and o.expert_ffn % 32 == 0,
         f"--expert-ffn must be a positive multiple of 32, got {o.expert_ffn}")
    need(o.vocab >= MIN_VOCAB, f"--vocab must be at least {MIN_VOCAB} (3 specials + 256 byte tokens), got {o.vocab}")
    need(o.n_head % o.n_head_kv == 0, f"head count {o.n_head} is not a multiple of the KV head count {o.n_head_kv}")
    need(o.router_skew >= 0, f"--router-skew must be >= 0, got {o.router_skew}")
    need(o.split_count >= 1, f"--split must be at least 1, got {o.split_count}")
    return o


def synth_options(preset: str, *, layers: int | None = None, experts: int | None = None,
                  top_k: int | None = None, hidden: int | None = None, expert_ffn: int | None = None,
                  vocab: int | None = None, quant: str | None = None, seed: int = 0,
                  router_skew: float = 1.0, size_bytes: int | None = None, split_count: int = 1,
                  shape_only: bool = False) -> SynthOptions:
    """Resolve a preset plus overrides (and an optional target size) into complete options."""
    if preset not in _PRESETS:
        raise SynthError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    base = dict(_PRESETS[preset])
    given = {"n_layer": layers, "n_expert": experts, "top_k": top_k, "hidden": hidden,
             "expert_ffn": expert_ffn, "vocab": vocab, "quant": quant}
    base.update({k: v for k, v in given.items() if v is not None})
    explicit_heads = "n_head" in base and hidden is None
    if not explicit_heads:
        base["n_head"], base["n_head_kv"] = _derive_heads(base["hidden"], base["head_dim"])
    options = SynthOptions(preset=preset, seed=seed, router_skew=router_skew, split_count=split_count,
                           shape_only=shape_only, target_bytes=size_bytes, **base)
    if size_bytes is not None:
        free = {name for name, v in (("n_layer", layers), ("hidden", hidden), ("expert_ffn", expert_ffn),
                                     ("n_expert", experts)) if v is None}
        options = _fit_size(options, size_bytes, free)
    return _validate(options)


# ---- the tensor plan ---------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorSpec:
    """One tensor to write. `ne` in ggml order; `kind` picks how its values are generated."""

    name: str
    ne: tuple[int, ...]
    qtype: GGMLQuantizationType
    kind: str  # norm | matrix | embed | router | bias | sinks | expert

    @property
    def nbytes(self) -> int:
        block_elems, block_bytes = GGML_QUANT_SIZES[self.qtype]
        return math.prod(self.ne) // block_elems * block_bytes


def plan_tensors(o: SynthOptions) -> list[TensorSpec]:
    """The tensors llama.cpp's loader expects for the arch, in file order."""
    f32 = GGMLQuantizationType.F32
    dense = GGMLQuantizationType.F32 if o.quant == "F32" else GGMLQuantizationType.F16
    expert_q = GGMLQuantizationType[o.quant]
    d, ff, E = o.hidden, o.expert_ffn, o.n_expert
    q_dim, kv_dim = o.n_head * o.head_dim, o.n_head_kv * o.head_dim
    specs = [
        TensorSpec("token_embd.weight", (d, o.vocab), dense, "embed"),
        TensorSpec("output_norm.weight", (d,), f32, "norm"),
        TensorSpec("output.weight", (d, o.vocab), dense, "matrix"),
    ]
    for i in range(o.n_layer):
        p = f"blk.{i}."
        specs += [
            TensorSpec(p + "attn_norm.weight", (d,), f32, "norm"),
            TensorSpec(p + "attn_q.weight", (d, q_dim), dense, "matrix"),
            TensorSpec(p + "attn_k.weight", (d, kv_dim), dense, "matrix"),
            TensorSpec(p + "attn_v.weight", (d, kv_dim), dense, "matrix"),
            TensorSpec(p + "attn_output.weight", (q_dim, d), dense, "matrix"),
        ]
        if o.arch == "qwen3moe":
            specs += [
                TensorSpec(p + "attn_q_norm.weight", (o.head_dim,), f32, "norm"),
                TensorSpec(p + "attn_k_norm.weight", (o.head_dim,), f32, "norm"),
                TensorSpec(p + "ffn_norm.weight", (d,), f32, "norm"),
                TensorSpec(p + "ffn_gate_inp.weight", (d, E), f32, "router"),
            ]
        else:  # gpt-oss: biases everywhere, attention sinks, a post-attention norm, a router bias
            specs += [
                TensorSpec(p + "attn_q.bias", (q_dim,), f32, "bias"),
                TensorSpec(p + "attn_k.bias", (kv_dim,), f32, "bias"),
                TensorSpec(p + "attn_v.bias", (kv_dim,), f32, "bias"),
                TensorSpec(p + "attn_output.bias", (d,), f32, "bias"),
                TensorSpec(p + "attn_sinks.weight", (o.n_head,), f32, "sinks"),
                TensorSpec(p + "post_attention_norm.weight", (d,), f32, "norm"),
                TensorSpec(p + "ffn_gate_inp.weight", (d, E), f32, "router"),
                TensorSpec(p + "ffn_gate_inp.bias", (E,), f32, "router_bias"),
                TensorSpec(p + "ffn_gate_exps.bias", (ff, E), f32, "bias"),
                TensorSpec(p + "ffn_up_exps.bias", (ff, E), f32, "bias"),
                TensorSpec(p + "ffn_down_exps.bias", (d, E), f32, "bias"),
            ]
        specs += [
            TensorSpec(p + "ffn_gate_exps.weight", (d, ff, E), expert_q, "expert"),
            TensorSpec(p + "ffn_up_exps.weight", (d, ff, E), expert_q, "expert"),
            TensorSpec(p + "ffn_down_exps.weight", (ff, d, E), expert_q, "expert"),
        ]
    return specs


def build_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece vocabulary with byte fallback: any text tokenises.

    Specials, the 256 `<0xXX>` byte tokens, then word pieces built so every piece's prefixes come
    first (so SPM's bigram merges can reach them).
    """
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    alphabet = ["\u2581"] + list(letters) + list(letters.upper()) + list("0123456789.,;:!?'\"-()")
    pieces: list[str] = []
    seen = set(tokens)

    def add(piece: str) -> None:
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)

    for ch in alphabet:
        add(ch)
    frontier = ["\u2581" + c for c in letters] + [a + b for a in letters for b in letters]
    need = n_vocab - len(tokens)
    while len(pieces) < need:
        for piece in frontier:
            add(piece)
            if len(pieces) >= need:
                break
        else:
            # Grow one letter only from as many pieces as can still be used: memory stays bounded.
            frontier = [p + c for p in frontier[: need // len(letters) + 1] for c in letters]
    pieces = pieces[:need]
    # Longer pieces score higher, as in trained SPM models where merged pieces beat their parts.
    scores = [0.0] * len(tokens) + [-1000.0 + len(p) * 10.0 - i * 1e-4 for i, p in enumerate(pieces)]
    return tokens + pieces, scores, [int(t) for t in types] + [int(gguf.TokenType.NORMAL)] * len(pieces)


# ---- size fitting -----------------------------------------------------------------------------

def estimate_file_bytes(o: SynthOptions) -> int:
    """Tensor data (aligned) plus a close estimate of the header, per shard."""
    data = sum((s.nbytes + 31) // 32 * 32 for s in plan_tensors(o))
    vocab_bytes = o.vocab * 17 if o.vocab > MIN_VOCAB else o.vocab * 24
    header = 4096 + vocab_bytes + 80 * len(plan_tensors(o)) * 1
    return data + header * o.split_count


def _with(o: SynthOptions, **changes: Any) -> SynthOptions:
    if "hidden" in changes and o.preset != "gpt-oss-120b":
        changes["n_head"], changes["n_head_kv"] = _derive_heads(changes["hidden"], o.head_dim)
    return dataclasses.replace(o, **changes)


def _solve(o: SynthOptions, target: int, set_value: Callable[[SynthOptions, int], SynthOptions],
           lo: int, hi: int) -> SynthOptions:
    """The value in lo..hi (estimate increasing in it) whose file size is closest to target."""
    if estimate_file_bytes(set_value(o, lo)) >= target:
        return set_value(o, lo)
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if estimate_file_bytes(set_value(o, mid)) <= target:
            lo = mid
        else:
            hi = mid
    below, above = set_value(o, lo), set_value(o, hi)
    err_below = target - estimate_file_bytes(below)
    err_above = estimate_file_bytes(above) - target
    return below if err_below <= err_above else above


def _fit_size(o: SynthOptions, target: int, free: set[str]) -> SynthOptions:
    """Choose the free dimensions so the file reaches `target` bytes.

    Layers grow slowly with size (4 at 64 MiB, about 12 at 1 GiB); then hidden and expert FFN
    grow together, and expert FFN alone takes up the remainder in steps of 32.
    """
    if not free:
        raise SynthError("--size needs at least one free dimension: leave out --layers, --hidden, --expert-ffn or --experts")
    if "n_layer" in free:
        o = _with(o, n_layer=int(min(32, max(4, round(2 * math.log2(max(target, 16 * MIB) / (16 * MIB)))))))
    if {"hidden", "expert_ffn"} <= free:
        o = _solve(o, target, lambda x, v: _with(x, hidden=64 * v, expert_ffn=64 * v), 1, 1024)
        o = _solve(o, target, lambda x, v: _with(x, expert_ffn=32 * v), 1, 8192)
    elif "expert_ffn" in free:
        o = _solve(o, target, lambda x, v: _with(x, expert_ffn=32 * v), 1, 1 << 16)
    elif "hidden" in free:
        o = _solve(o, target, lambda x, v: _with(x, hidden=64 * v), 1, 4096)
    elif "n_expert" in free:
        o = _solve(o, target, lambda x, v: _with(x, n_expert=max(v, x.top_k)), 1, 4096)
    else:
        o = _solve(o, target, lambda x, v: _with(x, n_layer=v), 1, 4096)
    got = estimate_file_bytes(o)
    if abs(got - target) > 0.05 * target:
        raise SynthError(f"cannot reach {target / MIB:.0f} MiB with the fixed dimensions; "
                         f"the closest is {got / MIB:.0f} MiB — leave more dimensions free")
    return o


# ---- values -----------------------------------------------------------------------------------

def _rng(o: SynthOptions, name: str, chunk: int) -> np.random.Generator:
    return np.random.default_rng([o.seed, zlib.crc32(name.encode()), chunk])


def _popularity(o: SynthOptions, layer_name: str) -> np.ndarray:
    """Per-expert routing boost: a Zipf-like tail over a per-layer random order of experts."""
    order = _rng(o, layer_name + "#popularity", 0).permutation(o.n_expert)
    boost = np.empty(o.n_expert, dtype=np.float32)
    boost[order] = 1.0 / np.arange(1, o.n_expert + 1, dtype=np.float32)
    return o.router_skew * boost


def _shared_direction(o: SynthOptions) -> np.ndarray:
    """A direction every token embedding leans along, so routers can prefer experts consistently."""
    u = _rng(o, "#shared-direction", 0).standard_normal(o.hidden).astype(np.float32)
    return u / np.linalg.norm(u)


def _encode(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    return values.astype(np.float32 if qtype == GGMLQuantizationType.F32 else np.float16)


def _random_block_rows(qtype: GGMLQuantizationType, rng: np.random.Generator, n_rows: int, row_len: int,
                       std: float) -> np.ndarray:
    """Random quantised blocks whose values have about `std`, written directly as block bytes.

    Quantising random floats through gguf.quants runs at 15-200 MB/s, too slow for GiB files;
    a random block is as valid a weight as a quantised one and costs one RNG call.
    """
    n_blocks = n_rows * row_len // 32
    if qtype == GGMLQuantizationType.MXFP4:
        # [e8m0 scale][16 nibble bytes]; values 2^(e-128)*k, the doubled e2m1 table's k has RMS 5.85.
        e_center = round(128 + math.log2(std / 5.85))
        scale = (e_center + rng.integers(-1, 2, size=(n_blocks, 1))).astype(np.uint8)
        payload = rng.integers(0, 256, size=(n_blocks, 16), dtype=np.uint8)
    elif qtype == GGMLQuantizationType.Q8_0:
        # [f16 d][32 int8]; uniform ints in -127..127 have RMS 73.3.
        scale = np.full((n_blocks, 1), std / 73.3, dtype=np.float16).view(np.uint8)
        payload = rng.integers(-127, 128, size=(n_blocks, 32), dtype=np.int8).view(np.uint8)
    elif qtype == GGMLQuantizationType.Q4_0:
        # [f16 d][16 nibble bytes]; values (q-8)*d, q uniform in 0..15 has RMS 4.61 around 8.
        scale = np.full((n_blocks, 1), std / 4.61, dtype=np.float16).view(np.uint8)
        payload = rng.integers(0, 256, size=(n_blocks, 16), dtype=np.uint8)
    else:
        raise SynthError(f"internal error: no block generator for {qtype.name}")
    return np.concatenate([scale, payload], axis=1).reshape(n_rows, -1)


def _chunks(o: SynthOptions, spec: TensorSpec) -> Iterator[np.ndarray]:
    """The tensor's bytes as consecutive chunks of whole rows, each at most ~CHUNK_BYTES."""
    row_len = spec.ne[0]
    n_rows = math.prod(spec.ne[1:]) if len(spec.ne) > 1 else 1
    row_bytes = spec.nbytes // n_rows
    rows_per_chunk = max(1, CHUNK_BYTES // max(row_bytes, 1))
    std = 1.0 / math.sqrt(row_len)
    for chunk, start in enumerate(range(0, n_rows, rows_per_chunk)):
        rows = min(rows_per_chunk, n_rows - start)
        rng = _rng(o, spec.name, chunk)
        if spec.kind == "expert" and spec.qtype not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            yield _random_block_rows(spec.qtype, rng, rows, row_len, std)
            continue
        if spec.kind == "norm":
            values = 1.0 + 0.05 * rng.standard_normal((rows, row_len), dtype=np.float32)
        elif spec.kind in ("bias", "sinks"):
            values = 0.02 * rng.standard_normal((rows, row_len), dtype=np.float32)
        elif spec.kind == "router_bias":
            values = (3.0 * _popularity(o, spec.name.rsplit(".", 2)[0])).reshape(rows, row_len)
        elif spec.kind == "embed":
            # With skew, the shared direction carries about half of each embedding's norm.
            values = 0.5 * rng.standard_normal((rows, row_len), dtype=np.float32)
            values += 0.35 * min(o.router_skew, 1.0) * math.sqrt(row_len) * _shared_direction(o)
        elif spec.kind == "router":
            values = std * rng.standard_normal((rows, row_len), dtype=np.float32)
            # Only the popularity boost may favour an expert consistently: drop the random rows'
            # component along the direction every token shares.
            u = _shared_direction(o)
            values -= (values @ u)[:, None] * u[None, :]
            if o.arch == "qwen3moe":  # no router bias: lean popular experts' rows toward the shared direction
                boost = _popularity(o, spec.name.rsplit(".", 2)[0])[start:start + rows]
                values += (3.0 / math.sqrt(row_len)) * boost[:, None] * _shared_direction(o)[None, :]
        else:  # matrix, expert
            values = std * rng.standard_normal((rows, row_len), dtype=np.float32)
        yield _encode(values, spec.qtype)


# ---- writing ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SynthResult:
    options: SynthOptions
    paths: tuple[str, ...]
    file_bytes: int
    elapsed_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"format": "bmoe-fleet.synth", "version": 1, "paths": list(self.paths),
                "file_bytes": self.file_bytes, "elapsed_s": round(self.elapsed_s, 3),
                "options": self.options.to_dict()}

    def summary(self) -> str:
        o = self.options
        what = "shape only (sparse)" if o.shape_only else o.quant + " experts"
        lines = [
            f"wrote {', '.join(self.paths)}",
            f"  {o.arch}: {o.n_layer} layers x {o.n_expert} experts (top-{o.top_k}), hidden {o.hidden}, "
            f"expert FFN {o.expert_ffn}, vocab {o.vocab}, {what}",
            f"  {self.file_bytes / MIB:,.1f} MiB in {self.elapsed_s:.1f} s",
        ]
        if o.target_bytes:
            lines[-1] += f" (target {o.target_bytes / MIB:,.1f} MiB, {100 * (self.file_bytes / o.target_bytes - 1):+.1f} %)"
        return "\n".join(lines)


def _add_metadata(w: GGUFWriter, o: SynthOptions) -> None:
    w.add_name(f"synth-{o.preset}-{o.n_layer}x{o.n_expert}-h{o.hidden}-{o.quant}")
    w.add_context_length(o.context_length)
    w.add_embedding_length(o.hidden)
    w.add_block_count(o.n_layer)
    w.add_feed_forward_length(o.expert_ffn)
    w.add_head_count(o.n_head)
    w.add_head_count_kv(o.n_head_kv)
    w.add_key_length(o.head_dim)
    w.add_value_length(o.head_dim)
    w.add_expert_count(o.n_expert)
    w.add_expert_used_count(o.top_k)
    w.add_expert_feed_forward_length(o.expert_ffn)
    w.add_file_type(_FILE_TYPES[o.quant])
    if o.quant not in ("F32", "F16"):
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if o.arch == "qwen3moe":
        w.add_rope_freq_base(1_000_000.0)
        w.add_layer_norm_rms_eps(1e-6)
    else:
        w.add_rope_freq_base(150_000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_sliding_window(128)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(4096)
    tokens, scores, types = build_vocab(o.vocab)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    # Provenance of the synthetic weights (llama.cpp ignores unknown keys).
    w.add_uint32("bmoe.synth.seed", o.seed & 0xFFFFFFFF)
    w.add_float32("bmoe.synth.router_skew", o.router_skew)
    w.add_string("bmoe.synth.preset", o.preset)


def shard_paths(out: str | os.PathLike[str], split_count: int) -> tuple[str, ...]:
    p = Path(out)
    if split_count == 1:
        return (str(p),)
    return tuple(str(p.with_name(gguf.SHARD_NAME_FORMAT.format(p.stem, i + 1, split_count)))
                 for i in range(split_count))


def write_model(out: str | os.PathLike[str], o: SynthOptions, progress: ProgressFn | None = None) -> SynthResult:
    """Write the model to `out` (or its -0000i-of-0000N shards). Atomic: temp names, then rename."""
    started = time.monotonic()
    out = Path(out)
    if out.suffix != ".gguf":
        raise SynthError(f"{out}: the output name must end in .gguf")
    if not out.parent.is_dir():
        raise SynthError(f"{out.parent}: no such folder")
    final = shard_paths(out, o.split_count)
    tmp_base = out.with_name(f".{out.stem}.partial-{os.getpid()}.gguf")
    specs = plan_tensors(o)
    n_per_shard = math.ceil(len(specs) / o.split_count)
    if o.split_count > 1 and math.ceil(len(specs) / n_per_shard) != o.split_count:
        raise SynthError(f"cannot split {len(specs)} tensors into {o.split_count} shards")
    writer = GGUFWriter(tmp_base, o.arch, split_max_tensors=n_per_shard if o.split_count > 1 else 0)
    tmp_paths: list[str] = []
    try:
        _add_metadata(writer, o)
        by_name = {s.name: s for s in specs}
        for s in specs:
            writer.add_tensor_info(s.name, tuple(reversed(s.ne)), np.dtype(np.float32), s.nbytes, raw_dtype=s.qtype)
        tmp_paths = [str(p) for p in writer.format_shard_names(tmp_base)]
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        shard_specs = [[by_name[name] for name in shard] for shard in writer.tensors]
        writer.write_ti_data_to_file()
        total = sum(s.nbytes for s in specs)
        done = 0
        assert writer.fout is not None      # write_header_to_file opened every shard
        for fout, shard in zip(writer.fout, shard_specs):
            writer.write_padding(fout, fout.tell())
            if o.shape_only:
                end = fout.tell() + sum(GGUFWriter.ggml_pad(s.nbytes, writer.data_alignment) for s in shard)
                fout.truncate(end)
                done += sum(s.nbytes for s in shard)
                if progress:
                    progress(done, total)
                continue
            for spec in shard:
                written = 0
                for chunk in _chunks(o, spec):
                    chunk.tofile(fout)
                    written += chunk.nbytes
                    done += chunk.nbytes
                    if progress:
                        progress(done, total)
                if written != spec.nbytes:
                    raise SynthError(f"internal error: wrote {written} bytes for {spec.name}, planned {spec.nbytes}")
                writer.write_padding(fout, spec.nbytes)
        writer.close()
        for tmp, dst in zip(tmp_paths, final):
            os.replace(tmp, dst)
    except BaseException:
        writer.close()
        for tmp in tmp_paths:
            if os.path.exists(tmp):
                os.unlink(tmp)
        raise
    return SynthResult(o, final, sum(os.path.getsize(p) for p in final), time.monotonic() - started)
