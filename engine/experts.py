"""Where the forward pass gets expert weights: the ExpertSource interface and its resident form.

The forward pass routes a whole batch at one layer first, then asks its source ONCE for the
experts the batch routed to (in routing order). A source answers with each expert's raw slices (the
bytes `ExpertLayer.slices(e)` names, in `ExpertLayer.tensors` order); the forward pass
dequantizes them itself. So a streaming source (engine/stream.py: O_DIRECT reads into a
byte-budgeted LRU) and the resident source below are interchangeable and produce the same bits.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from gguf import GGMLQuantizationType

from .errors import ModelError
from .model import ExpertLayer, ModelShape
from .weights import dequantize_bytes


class ExpertSource(Protocol):
    def fetch(self, layer: int, experts: Sequence[int]) -> Mapping[int, Sequence[np.ndarray]]:
        """Raw bytes (1-D uint8 arrays) of each requested expert's slices, in ExpertLayer.tensors order.

        Called ONCE per layer per forward batch with the batch's routed expert ids in routing
        order (token-major, slot order; repeats included): one lookup per unique expert."""
        ...


class ResidentExpertSource:
    """Every expert read straight from a read-only memory map: the model 'resident', as
    bmoe-cli runs without --moe-stream (mmap, page cache does the caching)."""

    def __init__(self, shape: ModelShape, anonymous: bool = False):
        """`anonymous`: copy every expert byte into anonymous memory at load (llama.cpp's
        --no-mmap) — a model larger than RAM then does not fit, as on a phone."""
        self.shape = shape
        self._layers = {layer.layer: layer for layer in shape.moe_layers}
        self._maps = {path: np.memmap(path, dtype=np.uint8, mode="r") for path in shape.paths}
        if anonymous:
            self._maps = {path: _read_whole(path) for path in shape.paths}

    def fetch(self, layer: int, experts: Sequence[int]) -> Mapping[int, Sequence[np.ndarray]]:
        moe = self._layers.get(layer)
        if moe is None:
            raise ModelError(f"layer {layer} has no streamed expert tensors")
        out: dict[int, tuple[np.ndarray, ...]] = {}
        for e in experts:
            out[int(e)] = tuple(self._maps[s.path][s.offset:s.offset + s.nbytes] for s in moe.slices(int(e)))
        return out


def _read_whole(path: str) -> np.ndarray:
    out = np.empty(os.path.getsize(path), dtype=np.uint8)
    with open(path, "rb", buffering=0) as fh:
        view, done = memoryview(out), 0
        while done < out.size:
            n = fh.readinto(view[done:done + (64 << 20)])
            if not n:
                raise ModelError(f"{path}: file shrank while it was being read")
            done += n
    return out


@dataclass(frozen=True)
class ExpertMatrices:
    """One expert's FFN as float32 numpy matrices, with the storage types that decide how
    ggml rounds the activation each one multiplies (see forward.mul_mat)."""

    gate: np.ndarray   # [n_ff, n_embd]
    up: np.ndarray     # [n_ff, n_embd]
    down: np.ndarray   # [n_embd, n_ff]
    gate_qtype: GGMLQuantizationType
    up_qtype: GGMLQuantizationType
    down_qtype: GGMLQuantizationType


def _kind(name: str) -> str:
    # blk.N.ffn_<kind>_exps.weight
    return name.split(".")[2][len("ffn_"):-len("_exps")]


def dequantize_expert(layer: ExpertLayer, raw: Sequence[np.ndarray]) -> ExpertMatrices:
    """Turn one expert's raw slices (ExpertLayer.tensors order) into its (gate, up, down) matrices.

    Handles split gate/up/down and fused `ffn_gate_up_exps` (gate rows first, then up rows,
    as build_moe_ffn views them). Each slice is shaped by its tensor's ne[:-1] and qtype.
    """
    if len(raw) != len(layer.tensors):
        raise ModelError(f"layer {layer.layer}: expected {len(layer.tensors)} expert slices, got {len(raw)}")
    mats: dict[str, tuple[np.ndarray, GGMLQuantizationType]] = {}
    for info, data in zip(layer.tensors, raw):
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = np.frombuffer(data, dtype=np.uint8)
        data = np.asarray(data)
        if data.dtype != np.uint8:
            data = data.reshape(-1).view(np.uint8)
        want = info.nbytes // layer.n_expert
        if data.ndim != 1 or data.size != want:
            raise ModelError(f"{info.name}: one expert's slice is {want} bytes, source gave {data.size}")
        mats[_kind(info.name)] = (dequantize_bytes(data, info, info.ne[:-1]), info.qtype)
    if "gate_up" in mats:
        both, qtype = mats.pop("gate_up")
        n_ff = both.shape[0] // 2
        mats["gate"] = (both[:n_ff], qtype)
        mats["up"] = (both[n_ff:], qtype)
    missing = {"gate", "up", "down"} - set(mats)
    if missing:
        raise ModelError(f"layer {layer.layer}: expert tensors lack {sorted(missing)} (have {sorted(mats)})")
    return ExpertMatrices(
        gate=mats["gate"][0], up=mats["up"][0], down=mats["down"][0],
        gate_qtype=mats["gate"][1], up_qtype=mats["up"][1], down_qtype=mats["down"][1],
    )
