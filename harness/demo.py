"""`bmoe-fleet demo`: the main job on an embedded default.

For now: synthesise a demo MoE model and price it. Later issues grow this into the demo
campaign (virtual phones, a sweep around the token cycle, the site and recommendations).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from engine.inspect import inspect_model
from engine.synth import synth_options, write_model
from engine.units import MIB

DEMO_MODEL_BYTES = 64 * MIB


def run_demo(out_dir: str, echo: Callable[[str], None] = print) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "demo-qwen3moe.gguf")
    options = synth_options("qwen3moe", size_bytes=DEMO_MODEL_BYTES, seed=1)
    result = write_model(path, options)
    echo(result.summary())
    echo("")
    echo(inspect_model(path).text)
    return path
