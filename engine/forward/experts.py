"""Where the forward pass gets expert weights: the ExpertSource interface and its resident form.

The forward pass routes a whole batch at one layer first, then asks its source ONCE for the
experts the batch routed to (in routing order). A source answers with each expert's raw slices (the
bytes `ExpertLayer.slices(e)` names, in `ExpertLayer.tensors` order); the forward pass
multiplies them as stored (`expert_weights`, engine.kernels.matmul). So a streaming source
(engine/stream/source.py: O_DIRECT reads into a byte-budgeted LRU) and the resident source below are
interchangeable and produce the same bits.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from gguf import GGMLQuantizationType

from engine.errors import ModelError
from engine.gguf.model import ExpertLayer, ModelShape
from engine.kernels.matmul import RawMatrix, dequantize, raw_matrix
from engine.units import MIB


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
        self._maps: dict[str, np.ndarray] = {path: np.memmap(path, dtype=np.uint8, mode="r") for path in shape.paths}
        if anonymous:
            self._maps = {path: _read_whole(path) for path in shape.paths}
        # each expert's views, made once: the same objects every fetch (`stable_slices`), so a
        # caller may keep what it derived from them
        self._slices: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}

    stable_slices = True

    def fetch(self, layer: int, experts: Sequence[int]) -> Mapping[int, Sequence[np.ndarray]]:
        moe = self._layers.get(layer)
        if moe is None:
            raise ModelError(f"layer {layer} has no streamed expert tensors")
        out: dict[int, tuple[np.ndarray, ...]] = {}
        for e in experts:
            key = (layer, int(e))
            got = self._slices.get(key)
            if got is None:
                got = self._slices[key] = tuple(self._maps[s.path][s.offset:s.offset + s.nbytes]
                                                for s in moe.slices(int(e)))
            out[int(e)] = got
        return out


def _read_whole(path: str) -> np.ndarray:
    out = np.empty(os.path.getsize(path), dtype=np.uint8)
    with open(path, "rb", buffering=0) as fh:
        view, done = out.data, 0
        while done < out.size:
            n = fh.readinto(view[done:done + 64 * MIB])
            if not n:
                raise ModelError(f"{path}: file shrank while it was being read")
            done += n
    return out


@dataclass(frozen=True)
class ExpertWeights:
    """One expert's FFN as stored: gate [n_ff, n_embd], up [n_ff, n_embd], down [n_embd, n_ff]
    rows of GGUF blocks (views of the source's bytes), for engine.kernels.matmul."""

    gate: RawMatrix
    up: RawMatrix
    down: RawMatrix


@dataclass(frozen=True)
class ExpertMatrices:
    """One expert's FFN as float32 numpy matrices, with the storage types that decide how
    ggml rounds the activation each one multiplies (see ops.mul_mat)."""

    gate: np.ndarray   # [n_ff, n_embd]
    up: np.ndarray     # [n_ff, n_embd]
    down: np.ndarray   # [n_embd, n_ff]
    gate_qtype: GGMLQuantizationType
    up_qtype: GGMLQuantizationType
    down_qtype: GGMLQuantizationType


def _kind(name: str) -> str:
    # blk.N.ffn_<kind>_exps.weight
    return name.split(".")[2][len("ffn_"):-len("_exps")]


def expert_weights(layer: ExpertLayer, raw: Sequence[np.ndarray]) -> ExpertWeights:
    """One expert's raw slices (ExpertLayer.tensors order) as its (gate, up, down) matrices, as stored.

    Handles split gate/up/down and fused `ffn_gate_up_exps` (gate rows first, then up rows,
    as build_moe_ffn views them). Each slice is shaped by its tensor's ne[:-1] and qtype.
    """
    if len(raw) != len(layer.tensors):
        raise ModelError(f"layer {layer.layer}: expected {len(layer.tensors)} expert slices, got {len(raw)}")
    mats: dict[str, RawMatrix] = {}
    for info, data in zip(layer.tensors, raw):
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = np.frombuffer(data, dtype=np.uint8)
        data = np.asarray(data)
        if data.dtype != np.uint8:
            data = data.reshape(-1).view(np.uint8)
        want = info.nbytes // layer.n_expert
        if data.ndim != 1 or data.size != want:
            raise ModelError(f"{info.name}: one expert's slice is {want} bytes, source gave {data.size}")
        mats[_kind(info.name)] = raw_matrix(data, info.qtype, info.ne[0], info.ne[1], info.name)
    if "gate_up" in mats:
        both = mats.pop("gate_up")
        n_ff = both.m // 2
        mats["gate"], mats["up"] = both.rows(0, n_ff), both.rows(n_ff, both.m)
    missing = {"gate", "up", "down"} - set(mats)
    if missing:
        raise ModelError(f"layer {layer.layer}: expert tensors lack {sorted(missing)} (have {sorted(mats)})")
    return ExpertWeights(mats["gate"], mats["up"], mats["down"])


def dequantize_expert(layer: ExpertLayer, raw: Sequence[np.ndarray]) -> ExpertMatrices:
    """One expert's (gate, up, down) as float32 matrices (references and tests; the forward pass
    multiplies the stored blocks, `expert_weights`)."""
    w = expert_weights(layer, raw)
    return ExpertMatrices(
        gate=dequantize(w.gate), up=dequantize(w.up), down=dequantize(w.down),
        gate_qtype=w.gate.qtype, up_qtype=w.up.qtype, down_qtype=w.down.qtype,
    )
