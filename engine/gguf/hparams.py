"""A model's hyper-parameters as llama.cpp's loader reads them from GGUF metadata (qwen3moe, gpt-oss):
heads, experts, gating and the RoPE/YaRN constants its context derives."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.errors import ForwardError, ModelError
from engine.gguf.model import ModelShape

F32 = np.float32

SUPPORTED_ARCHS = ("qwen3moe", "gpt-oss")


@dataclass(frozen=True)
class RopeParams:
    n_dims: int
    freq_base: float
    freq_scale: float
    ext_factor: float
    attn_factor: float
    beta_fast: float
    beta_slow: float
    n_ctx_orig: int


@dataclass(frozen=True)
class Hparams:
    arch: str
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_expert: int
    n_expert_used: int
    rms_eps: float
    kq_scale: float
    rope: RopeParams
    rope_swa: RopeParams
    n_swa: int
    swa_layers: tuple[bool, ...]
    gating: str            # "softmax" (probs then top-k) or "softmax_weight" (top-k logits then softmax)
    norm_weights: bool     # renormalise the k selected weights to sum 1
    weights_scale: float
    ffn_act: str           # "swiglu" or "swiglu_oai"
    ffn_norm: str          # per-layer norm tensor before the MoE ("ffn_norm" / "post_attention_norm")
    out_rows_before_moe: bool = True  # the last layer drops unwanted rows before its MoE (else after)

    @staticmethod
    def from_shape(shape: ModelShape) -> Hparams:
        md, arch = shape.metadata, shape.arch
        if arch not in SUPPORTED_ARCHS:
            raise ForwardError(f"bmoe-py's forward pass knows {', '.join(SUPPORTED_ARCHS)}; this model is {arch}")

        def key(name: str, default: Any = None, required: bool = False) -> Any:
            value = md.get(f"{arch}.{name}", default)
            if required and value is None:
                raise ModelError(f"{shape.paths[0]}: GGUF has no {arch}.{name}")
            if isinstance(value, list):
                if len(set(value)) != 1:
                    raise ForwardError(f"{arch}.{name} varies per layer ({value}); not supported")
                value = value[0]
            return value

        n_embd = int(key("embedding_length", required=True))
        n_head = int(key("attention.head_count", required=True))
        n_head_kv = int(key("attention.head_count_kv", n_head))
        head_k = int(key("attention.key_length", n_embd // n_head))
        head_v = int(key("attention.value_length", n_embd // n_head))
        n_rot = int(key("rope.dimension_count", head_k))
        n_layer = shape.n_layer
        n_ctx_train = int(key("context_length", 4096))
        emb = next((t for t in shape.dense_tensors if t.name == "token_embd.weight"), None)
        if emb is None:
            raise ModelError(f"{shape.paths[0]}: model has no token_embd.weight")
        n_vocab = int(emb.ne[1])

        # rope scaling (llama_model::load_hparams + llama_context's YaRN set-up)
        scaling = str(key("rope.scaling.type", "linear"))
        factor = float(key("rope.scaling.factor", 0.0) or key("rope.scale_linear", 0.0) or 0.0)
        freq_scale = 1.0 if (factor == 0.0 or scaling == "none") else float(F32(1.0) / F32(factor))
        ext_factor = float(key("rope.scaling.yarn_ext_factor", -1.0))
        if ext_factor < 0:
            ext_factor = 1.0 if scaling == "yarn" else 0.0
        attn_factor = F32(key("rope.scaling.yarn_attn_factor", 1.0))
        if ext_factor != 0.0:
            yarn_factor = F32(1.0) / F32(freq_scale)
            log_mul = F32(key("rope.scaling.yarn_log_multiplier", 0.0))

            def mscale(scale: np.float32, m: np.float32) -> np.float32:
                return F32(1.0) if scale <= 1 else F32(F32(F32(0.1) * m) * F32(np.log(scale))) + F32(1.0)

            if log_mul != 0:
                attn_factor = F32(mscale(yarn_factor, F32(1.0)) / mscale(yarn_factor, log_mul))
            else:
                attn_factor = mscale(yarn_factor, F32(1.0))
            # cancel the factor ggml's rope_yarn multiplies back in
            attn_factor = F32(attn_factor * F32(F32(1.0) / F32(F32(1.0) + F32(F32(0.1) * F32(np.log(yarn_factor))))))
        attn_factor = F32(attn_factor * F32(key("rope.scaling.attn_factor", 1.0)))
        n_ctx_orig = int(key("rope.scaling.original_context_length", n_ctx_train))
        rope = RopeParams(
            n_dims=n_rot,
            freq_base=float(key("rope.freq_base", 10000.0)),
            freq_scale=freq_scale,
            ext_factor=ext_factor,
            attn_factor=float(attn_factor),
            beta_fast=float(key("rope.scaling.yarn_beta_fast", 32.0)),
            beta_slow=float(key("rope.scaling.yarn_beta_slow", 1.0)),
            n_ctx_orig=n_ctx_orig,
        )
        freq_base_swa = key("rope.freq_base_swa")
        rope_swa = rope if freq_base_swa is None else RopeParams(**{**rope.__dict__, "freq_base": float(freq_base_swa)})

        if arch == "gpt-oss":
            n_swa = int(key("attention.sliding_window", 0))
            pattern = md.get(f"{arch}.attention.sliding_window_pattern", 2)
            if isinstance(pattern, list):
                swa_layers = tuple(bool(v) for v in pattern[:n_layer])
            else:
                # llama_hparams::set_swa_pattern(n, dense_first=false): the last of every n is dense
                n = int(pattern)
                swa_layers = tuple(n == 0 or il % n < n - 1 for il in range(n_layer))
            kq_scale = float(F32(1.0) / F32(math.sqrt(float(F32(n_rot)))))
            gating, norm_w, act, ffn_norm = "softmax_weight", False, "swiglu_oai", "post_attention_norm"
        else:
            n_swa, swa_layers = 0, (False,) * n_layer
            kq_scale = float(F32(1.0) / F32(math.sqrt(float(F32(head_v)))))
            gating, norm_w, act, ffn_norm = "softmax", True, "swiglu", "ffn_norm"

        return Hparams(
            arch=arch, n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv,
            head_dim_k=head_k, head_dim_v=head_v, n_expert=shape.n_expert,
            n_expert_used=int(key("expert_used_count", required=True)),
            rms_eps=float(F32(key("attention.layer_norm_rms_epsilon", 1e-5))), kq_scale=kq_scale,
            rope=rope, rope_swa=rope_swa, n_swa=n_swa, swa_layers=swa_layers, gating=gating,
            norm_weights=norm_w, weights_scale=float(key("expert_weights_scale", 0.0) or 0.0),
            ffn_act=act, ffn_norm=ffn_norm, out_rows_before_moe=arch != "gpt-oss",
        )

