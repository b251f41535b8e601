"""Shared fixtures: real GGUF files written with engine.synth (small, so the suite stays fast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.synth import synth_options, write_model

FIXTURES = Path(__file__).parent / "fixtures"
UPSTREAM_HOST = FIXTURES / "upstream" / "host-v2-0.19.0"


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


def make_model(folder: Path, name: str, preset: str = "qwen3moe", **dims) -> Path:
    path = folder / name
    if not path.exists():
        write_model(path, synth_options(preset, **dims))
    return path


@pytest.fixture(scope="session")
def small_qwen(models_dir) -> Path:
    """3 layers, 8 experts, top-2, hidden 64, expert FFN 96, Q8_0 experts."""
    return make_model(models_dir, "small-qwen.gguf", "qwen3moe", layers=3, experts=8, top_k=2,
                      hidden=64, expert_ffn=96, vocab=300, quant="Q8_0", seed=7)


@pytest.fixture(scope="session")
def small_gptoss(models_dir) -> Path:
    """2 layers, 4 experts, top-2, hidden 64, expert FFN 32, MXFP4 experts."""
    return make_model(models_dir, "small-gptoss.gguf", "gpt-oss", layers=2, experts=4, top_k=2,
                      hidden=64, expert_ffn=32, vocab=260, seed=3)
