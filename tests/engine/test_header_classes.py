"""bmoe-py refuses what bmoe-cli refuses (docs/decisions/gguf-header-reader.md): each malformed-header class llama.cpp's
gguf loader refuses (tests/engine/gguf_classes.py) — overlapping, misaligned, reversed and all-zero
tensor offsets, a duplicate tensor name, a duplicate key, a wrong tensor count, a tensor relabelled
to another type, data past the end — is refused by bmoe-py with the same exit code as the real
bmoe-cli (differential, needs BMOE_CLI), in llama.cpp's words, in one line; and, over generated
inputs (hypothesis: which tensor, which value), the header reader refuses every offset, name, key
and type class with the message llama.cpp would print, computed here independently.
"""

from __future__ import annotations

import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import ModelError
from engine.gguf.header import read_header
from engine.gguf.inspect import inspect_model
from engine.gguf.synth import synth_options, write_model
from tests.engine.gguf_classes import CLASSES, Parsed, build, parse

PROJECT = Path(__file__).resolve().parents[2]
DIMS: dict[str, Any] = dict(layers=2, experts=4, top_k=2, hidden=64, expert_ffn=32, vocab=260)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> dict[str, tuple[Path, Parsed]]:
    """Two small real models: qwen3moe (F32/F16/Q8_0 tensors) and gpt-oss (MXFP4 experts)."""
    folder = tmp_path_factory.mktemp("header-classes")
    out = {}
    for preset, seed in (("qwen3moe", 5), ("gpt-oss", 3)):
        path = folder / f"{preset}.gguf"
        write_model(path, synth_options(preset, seed=seed, **DIMS))
        out[preset] = (path, parse(path.read_bytes()))
    return out


def test_a_rebuilt_header_is_the_model_byte_for_byte_and_is_accepted(seeds):
    for path, parsed in seeds.values():
        assert build(parsed) == path.read_bytes()
        assert inspect_model(str(path)).shape.n_expert == 4


def _cli(cli: str, model: Path) -> tuple[int, list[str]]:
    done = subprocess.run([cli, "-m", str(model), "-n", "1", "-t", "1", "-p", "hi"], capture_output=True,
                          timeout=120, stdin=subprocess.DEVNULL, cwd=PROJECT)
    return done.returncode, [ln for ln in done.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]


def test_bmoe_py_gives_bmoe_cli_s_exit_code_and_words_on_every_malformed_header_class(seeds, tmp_path, capfd):
    """bmoe-cli as the real process; bmoe-py as its entry point's run() (what `main` exits with),
    in this process, so nine Python start-ups do not cost the suite ~40 s."""
    from engine.app.cli import run as bmoe_py

    cli = os.environ.get("BMOE_CLI")
    if not cli:
        pytest.skip("BMOE_CLI is not set: the real bmoe-cli is the reference here")
    _, parsed = seeds["qwen3moe"]
    cases = []
    for name, make in CLASSES.items():
        model = tmp_path / f"{name}.gguf"
        model.write_bytes(build(make(parsed, 1)))
        cases.append((name, model))
    with ThreadPoolExecutor(2) as pool:
        by_cli = list(pool.map(lambda c: _cli(cli, c[1]), cases))
    capfd.readouterr()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BMOE_")}
    for (name, model), (cli_rc, cli_err) in zip(cases, by_cli):
        py_rc = bmoe_py(["-m", str(model), "-n", "1", "-t", "1", "-p", "hi"], env)
        py_err = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
        where = f"{name}: bmoe-cli {cli_rc} {cli_err[-4:]}, bmoe-py {py_rc} {py_err}"
        assert cli_rc != 0 and py_rc == cli_rc, where
        assert len(py_err) == 1 and py_err[0].startswith("error: ") and "Traceback" not in py_err[0], where
        # where bmoe-cli's gguf reader names the reason, bmoe-py says the same words after the same
        # prefix; a cut tensor count is refused by llama.cpp's model loader after the header
        # ("llama_model_load: error loading model: check_tensor_dims: …"): the same words again
        said = [ln.split(": ", 1)[1] for ln in cli_err if ln.startswith("gguf_init_from_reader: ")
                and "failed to read" not in ln]
        loader = [ln.split("error loading model: ", 1)[1] for ln in cli_err
                  if ln.startswith("llama_model_load: error loading model: check_tensor_dims: ")]
        if said or loader or name == "data_past_eof":
            assert py_err[0].startswith(f"error: failed to load model: {model}: "), where
        if said:
            assert said[0].strip() in py_err[0], where
        if loader:
            assert py_err[0] == f"error: failed to load model: {model}: {loader[0].strip()}", where
        assert bool(said) == (name not in ("tensor_count", "data_past_eof")), where
        assert bool(loader) == (name == "tensor_count"), where


# ── property: the reader refuses each class over generated inputs, with llama.cpp's reason ──────

OFFSET_CLASSES = ("overlap", "misaligned", "reversed_offsets", "zero_offsets", "relabelled_type")


def _padded(n: int, align: int) -> int:
    return -(-n // align) * align


def _llama_reason(p: Parsed) -> str | None:
    """What llama.cpp's gguf_init_from_reader prints first for `p`, from the fields alone."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    keys: dict[bytes, int] = {}
    for i, (key, _) in enumerate(p.kvs):
        if key in keys:
            return f"duplicate key '{key.decode()}' for tensors {keys[key]} and {i}"
        keys[key] = i
    names: dict[bytes, int] = {}
    for i, t in enumerate(p.tensors):
        if t.name in names:
            return f"duplicate tensor name '{t.name.decode()}' for tensors {names[t.name]} and {i}"
        names[t.name] = i
        be, _ = GGML_QUANT_SIZES[GGMLQuantizationType(t.qtype)]
        if t.ne[0] % be:
            return None                                        # a block-size refusal: not drawn here
    expected = 0
    for t in p.tensors:
        if t.offset != expected:
            return f"tensor '{t.name.decode()}' has offset {t.offset}, expected {expected}"
        be, bb = GGML_QUANT_SIZES[GGMLQuantizationType(t.qtype)]
        n = 1
        for d in t.ne:
            n *= d
        expected += _padded(n // be * bb, p.alignment)
    return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(preset=st.sampled_from(["qwen3moe", "gpt-oss"]),
       cls=st.sampled_from([*OFFSET_CLASSES, "duplicate_tensor_name", "duplicate_key"]),
       i=st.integers(min_value=0, max_value=10 ** 6), twice=st.booleans(), j=st.integers(0, 10 ** 6))
def test_the_reader_refuses_each_class_as_llama_cpp_does(seeds, tmp_path, preset, cls, i, twice, j):
    _, parsed = seeds[preset]
    bad = CLASSES[cls](parsed, i)
    if twice:                                                  # a second damage of another class on top
        bad = CLASSES[OFFSET_CLASSES[j % len(OFFSET_CLASSES)]](bad, j)
    reason = _llama_reason(bad)
    model = tmp_path / f"{preset}.gguf"
    model.write_bytes(build(bad))
    if reason is None:                                         # e.g. a swap of two same-size tensors' offsets
        return
    with pytest.raises(ModelError) as info:
        read_header(model)
    line = str(info.value)
    assert "\n" not in line and line == f"{model}: {reason}", (line, reason)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(preset=st.sampled_from(["qwen3moe", "gpt-oss"]), k=st.integers(0, 10 ** 6),
       cut=st.integers(1, 10 ** 6))
def test_inspect_refuses_a_short_data_section_and_marks_a_wrong_tensor_count(seeds, tmp_path, preset, k, cut):
    _, parsed = seeds[preset]
    short = tmp_path / f"{preset}-short.gguf"
    short.write_bytes(build(CLASSES["data_past_eof"](parsed, cut)))
    with pytest.raises(ModelError) as info:
        inspect_model(str(short))
    line = str(info.value)
    assert "\n" not in line and re.fullmatch(
        rf"{re.escape(str(short))}: truncated GGUF: tensor \S+ ends at byte \d+ but the file is \d+ bytes", line), line
    # a count cut short drops the last tensor infos: read as padding, the header still parses, but a
    # layer lacks an expert tensor, which bmoe-cli's loader refuses ("... not found"): marked, not priced silently
    counted = tmp_path / f"{preset}-count.gguf"
    counted.write_bytes(build(CLASSES["tensor_count"](parsed, k)))
    report = inspect_model(str(counted))
    assert report.refusal and re.fullmatch(r"check_tensor_dims: tensor 'blk\.\d+\.ffn_\w+_exps\.weight' not found",
                                           report.refusal), report.refusal
    assert report.text.splitlines()[0] == f"the engine will refuse this file: {report.refusal}"
    assert report.data["engine_refuses"] == report.refusal
    assert inspect_model(str(seeds[preset][0])).refusal is None
