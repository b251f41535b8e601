"""`model inspect`: a model's shape and prices as text and as a versioned JSON record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.gguf.model import ModelShape, engine_refusal, load_model_shape
from engine.safetext import one_line
from engine.units import MIB, format_bytes

TEXT_NAME_CHARS = 120   # the model's name and arch are the file's strings: shown escaped and cut


@dataclass(frozen=True)
class ModelReport:
    shape: ModelShape
    top_ks: tuple[int, ...]
    text: str
    data: dict[str, Any]
    refusal: str | None = None      # why the engine will refuse this file (model.engine_refusal)


def _layer_runs(shape: ModelShape) -> list[tuple[int, int, int]]:
    """Consecutive MoE layers with equal one-expert bytes, as (first, last, bytes)."""
    runs: list[tuple[int, int, int]] = []
    for layer in shape.moe_layers:
        if runs and runs[-1][2] == layer.expert_bytes and runs[-1][1] + 1 == layer.layer:
            runs[-1] = (runs[-1][0], layer.layer, layer.expert_bytes)
        else:
            runs.append((layer.layer, layer.layer, layer.expert_bytes))
    return runs


def _types(bytes_by_type: dict[str, int]) -> str:
    return ", ".join(f"{name} {format_bytes(n)}" for name, n in sorted(bytes_by_type.items(), key=lambda kv: -kv[1]))


def inspect_model(path: str, top_ks: list[int] | None = None) -> ModelReport:
    shape = load_model_shape(path)
    ks = tuple(top_ks) if top_ks else tuple(shape.default_top_ks())
    for k in ks:
        shape.check_top_k(k)
    quants = shape.quant_types()
    n_files = len(shape.paths)
    lines = [
        f"model     {one_line(shape.name, TEXT_NAME_CHARS)} ({one_line(shape.arch, TEXT_NAME_CHARS)}), "
        f"{n_files} file{'s' if n_files > 1 else ''}, "
        f"{format_bytes(shape.file_bytes)}",
        f"layers    {shape.n_layer} ({len(shape.moe_layers)} MoE), {shape.n_expert} experts, "
        f"top-k {shape.top_k if shape.top_k is not None else 'unset'}",
    ]
    for first, last, nbytes in _layer_runs(shape):
        span = f"layer {first}" if first == last else f"layers {first}-{last}"
        lines.append(f"expert    {nbytes:,} B per expert ({nbytes / MIB:.2f} MiB), {span}")
    lines += [
        f"experts   {format_bytes(shape.expert_bytes)} in all ({_types(quants['expert'])})",
        f"dense     {format_bytes(shape.dense_bytes)} ({_types(quants['dense'])}), "
        f"{format_bytes(shape.global_dense_bytes)} outside the layers, header {shape.header_bytes:,} B",
    ]
    lines += [
        f"top-k {k}: token cycle {shape.cycle_mib(k):.1f} MiB, widest layer {shape.layer_demand_mib(k):.1f} MiB"
        for k in ks
    ]
    refusal = engine_refusal(shape)
    data = shape.to_dict(list(ks))
    if refusal is not None:
        lines.insert(0, f"the engine will refuse this file: {one_line(refusal, 2 * TEXT_NAME_CHARS)}")
        data["engine_refuses"] = refusal
    return ModelReport(shape, ks, "\n".join(lines), data, refusal)
