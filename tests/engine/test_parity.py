"""bmoe-cli 0.19.0 behaviours bmoe-py reproduces, checked without the binary (the values were read
off the real bmoe-cli; tests/engine/test_differential.py compares the two engines live)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFWriter

from engine.contract.config import NOT_IMPLEMENTED, UsageExit, parse_args, validate_run
from engine.forward.weights import DenseResidency
from engine.gguf.model import load_model_shape
from engine.stream.budget import AvailableMemory, CacheFlags, ConfigError, resolve_budget
from engine.units import MIB
from results.read.parse import read_metrics_csv
from tests.conftest import UPSTREAM_HOST
from tests.engine.test_engine_cli import bmoe_py as run_py

TINY = str(UPSTREAM_HOST / "tiny-qwen3moe.gguf")


def refused(argv: list[str], env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        validate_run(parse_args(["-m", TINY, *argv], env or {}))
    return str(info.value)


@pytest.mark.parametrize("argv, text", [
    (["-n", "0"], "n_predict must be positive"),
    (["-n", "-3", "-t", "0"], "n_predict must be positive"),        # validate()'s order
    (["-t", "0"], "n_threads must be positive"),
    (["-c", "0"], "n_ctx must be positive"),
    (["--n-expert-used", "-1"], "n_expert_used must be >= 0 (0 = model default)"),
    (["--temp", "0.5", "--top-k", "-1"], "sampling.top_k must be >= 0 (0 disables the top-k stage)"),
    (["--temp", "0.5", "--top-p", "0"], "sampling.top_p must be in (0, 1]"),
    (["--temp", "0.5", "--top-p", "1.0000001"], "sampling.top_p must be in (0, 1]"),
    (["-n", "0", "--moe-stream", "--io-threads", "9"], "n_predict must be positive"),
    (["--moe-stream", "--io-threads", "9"], "moe.io_threads must be in [1, 8]"),
])
def test_validate_refuses_with_bmoe_clis_text_in_its_order(argv, text):
    assert refused(argv) == text


def test_sampling_ranges_bind_only_when_sampling():
    validate_run(parse_args(["-m", TINY, "--top-p", "1.5", "--top-k", "-1"], {}))  # greedy: inert
    # --temp is a float32 in bmoe-cli: 1e-50 is 0 there, so still greedy
    validate_run(parse_args(["-m", TINY, "--temp", "1e-50", "--top-p", "7"], {}))
    cfg = parse_args(["-m", TINY, "--temp", "0.123456789", "--top-p", "0.5abc"], {})
    assert cfg.temp == float(np.float32(0.123456789)) and cfg.top_p == 0.5  # atof: numeric prefix


@pytest.mark.parametrize("flag, named", [("-m", "-m"), ("--model", "-m"), ("-p", "-p"), ("--prompt", "-p"),
                                         ("-n", "-n"), ("--n-predict", "-n"), ("-t", "-t"), ("--threads", "-t"),
                                         ("-c", "-c"), ("--ctx-size", "-c"), ("--cache-mb", "--cache-mb"),
                                         ("--n-expert-used", "--n-expert-used"), ("--seed", "--seed")])
def test_missing_value_names_the_flag_as_bmoe_cli_does(flag, named):
    with pytest.raises(UsageExit) as info:
        parse_args(["-m", TINY, flag], {})
    assert str(info.value) == f"missing value for {named}" and info.value.code == 1


@pytest.mark.parametrize("flag", NOT_IMPLEMENTED)
def test_flags_bmoe_py_lacks_are_unknown_args(flag):
    with pytest.raises(UsageExit) as info:
        parse_args(["-m", TINY, flag, "1"], {})
    assert str(info.value) == f"unknown arg: {flag}" and info.value.code == 1 and info.value.with_usage


def test_env_overrides_for_missing_features_are_refused():
    assert refused([], {"BMOE_OVERLAP": "1"}) == "moe.overlap requires moe.enabled"  # bmoe-cli's own refusal
    assert refused(["--moe-stream"], {"BMOE_OVERLAP": "1"}) == (
        "BMOE_OVERLAP asks for moe.overlap, which bmoe-py does not implement (unset it)")
    assert refused(["--moe-stream", "--cache-mb", "2", "--force-cache"], {"BMOE_PREDICT_PREFETCH": "1"}).startswith(
        "BMOE_PREDICT_PREFETCH asks for moe.predict_prefetch")
    validate_run(parse_args(["-m", TINY, "--moe-stream"], {"BMOE_OVERLAP": "0"}))  # 0 is off, as atoi reads it


def test_without_moe_stream_streaming_flags_are_recorded_raw_and_ignored(tmp_path):
    """bmoe-cli 0.19.0's preamble without --moe-stream: cache_auto, floor, ceiling, force_cache and
    dense_weights as typed; cache_mb, io_threads, o_direct, prefetch, predict_spec_max 0. And no
    dense-weights line: the policy is not applied (the model is mapped)."""
    csv = tmp_path / "r.csv"
    r = run_py("-m", TINY, "-n", 4, "--cache-mb", "auto", "--cache-floor-mb", 100, "--cache-ceil-mb", 50,
               "--force-cache", "--prefetch", 2, "--io-threads", 2, "--no-odirect", "--dense-weights", "warm",
               "--temp", "0.123456", "--top-p", "0.912345", "--top-k", 7, "--seed", 5, "--csv", csv)
    assert r.returncode == 0, r.stderr
    assert r.stderr == b""
    p = read_metrics_csv(csv).preamble
    assert {k: p[k] for k in ("moe_stream", "cache_mb", "cache_auto", "cache_floor_mb", "cache_ceil_mb", "force_cache",
                              "io_threads", "o_direct", "prefetch", "predict_spec_max", "dense_weights", "temp",
                              "top_k", "top_p", "seed")} == {
        "moe_stream": "0", "cache_mb": "0", "cache_auto": "1", "cache_floor_mb": "100", "cache_ceil_mb": "50",
        "force_cache": "1", "io_threads": "0", "o_direct": "0", "prefetch": "0", "predict_spec_max": "0",
        "dense_weights": "warm", "temp": "0.1235", "top_k": "7", "top_p": "0.9123", "seed": "5"}


def test_route_trace_names_the_model_as_given_and_an_unwritable_path_warns(tmp_path):
    trace = tmp_path / "t.csv"
    r = run_py("-m", f"{UPSTREAM_HOST.name}/tiny-qwen3moe.gguf", "-n", 2, "--moe-stream", "--route-trace", trace,
               cwd=UPSTREAM_HOST.parent)
    assert r.returncode == 0, r.stderr
    head = trace.read_text().splitlines()[:2]
    assert head[1].startswith(f"# model={UPSTREAM_HOST.name}/tiny-qwen3moe.gguf arch=qwen3moe ")
    r = run_py("-m", TINY, "-n", 2, "--moe-stream", "--route-trace", tmp_path / "no" / "such" / "dir.csv")
    assert r.returncode == 0 and b"Traceback" not in r.stderr
    assert r.stderr.decode().splitlines()[0] == f"warning: could not open route trace {tmp_path}/no/such/dir.csv"


def test_ahwb_fails_at_load_after_the_auto_lines():
    r = run_py("-m", TINY, "-n", 2, "--moe-stream", "--cache-mb", "auto", "--dense-weights", "ahwb")
    lines = r.stderr.decode().splitlines()
    assert r.returncode == 1 and r.stdout == b"The capital of Japan is"
    assert lines[0] == "bmoe: cache auto — reserving 1 MiB for the dense-weight conversion"
    assert lines[1].startswith("bmoe: cache auto — ") and lines[-4:] == [
        "bmoe: --dense-weights ahwb needs reclaim-exempt memory, which this platform does not provide (Android only)",
        "bmoe: dense-weights init failed", "", "error: expert stream source init failed"]
    assert run_py("-m", TINY, "-n", 2, "--dense-weights", "ahwb").returncode == 0  # ignored without streaming


def test_the_dense_reservation_skips_nextn_blocks(tmp_path):
    """An MTP/nextn block is never bound or read, so `auto` under anon must not reserve RAM for it."""
    path = tmp_path / "mtp.gguf"
    w = GGUFWriter(path, "qwen3moe")
    w.add_block_count(2)
    w.add_uint32("qwen3moe.nextn_predict_layers", 1)
    w.add_expert_count(2)
    w.add_tensor("token_embd.weight", np.zeros((16, 32), dtype=np.float32))
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.zeros(32, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_up_exps.weight", np.zeros((2, 8, 32), dtype=np.float32))
    w.add_tensor("blk.1.nextn.eh_proj.weight", np.zeros((64, 1 << 14), dtype=np.float32))  # 4 MiB
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shape = load_model_shape(path)
    assert {t.name for t in shape.bound_dense_tensors} == {"token_embd.weight", "blk.0.attn_norm.weight"}
    budget = resolve_budget(CacheFlags(cache_auto=True, cache_floor_mb=0), shape, 1, AvailableMemory(8 << 30, None))
    assert budget.dense_reserved_bytes == 16 * 32 * 4 + 32 * 4  # not the 4 MiB nextn projection
    assert all("reserving" not in m or m.endswith("reserving 0 MiB for the dense-weight conversion")
               for m in budget.auto_messages)
    assert budget.budget_bytes == shape.expert_bytes and budget.budget_bytes < MIB


def test_dense_residency_probes_resident_memory():
    buf = np.ones(1 << 20, dtype=np.uint8)  # touched: every page resident
    assert DenseResidency([(buf.ctypes.data, buf.nbytes)]).sample() == 1.0
    assert DenseResidency([]).sample() == -1.0
