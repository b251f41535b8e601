"""engine.gguf.model: shapes and prices from GGUF headers, checked against hand-computed bytes."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter

from engine.errors import ModelError
from engine.gguf.model import load_model_shape
from engine.gguf.synth import synth_options, write_model
from engine.units import MIB
from tests.conftest import UPSTREAM_HOST

# Q8_0: 34 bytes per 32 weights; MXFP4: 17 bytes per 32; F16: 2 bytes; F32: 4 bytes.


def test_qwen3moe_prices_match_hand_computed_bytes(tiny_model):
    shape = load_model_shape(tiny_model)
    assert (shape.arch, shape.n_layer, shape.n_expert, shape.top_k) == ("qwen3moe", 3, 8, 2)
    one_matrix = 64 * 96 // 32 * 34          # gate, up and down are each 64x96 per expert
    assert [layer.expert_bytes for layer in shape.moe_layers] == [3 * one_matrix] * 3 == [19584] * 3
    per_layer_dense = 64 * 4 + 4 * (64 * 64 * 2) + 3 * (64 * 4) + 64 * 8 * 4
    assert shape.layer_dense_bytes == {0: per_layer_dense, 1: per_layer_dense, 2: per_layer_dense}
    assert shape.global_dense_bytes == 2 * (300 * 64 * 2) + 64 * 4
    assert shape.expert_bytes == 3 * 8 * 19584
    assert shape.cycle_bytes(2) == 3 * 19584 * 2
    assert shape.cycle_mib(8) == pytest.approx(3 * 19584 * 8 / MIB)
    assert shape.layer_demand_bytes(2) == 19584 * 2
    assert shape.quant_types()["expert"] == {"Q8_0": shape.expert_bytes}
    assert set(shape.quant_types()["dense"]) == {"F16", "F32"}


def test_gptoss_biases_count_as_dense(small_gptoss):
    shape = load_model_shape(small_gptoss)
    assert (shape.arch, shape.n_layer, shape.n_expert, shape.top_k) == ("gpt-oss", 2, 4, 2)
    one_matrix = 64 * 32 // 32 * 17
    assert [layer.expert_bytes for layer in shape.moe_layers] == [3 * one_matrix] * 2
    attention = 64 * 4 + 4 * (64 * 64 * 2) + 4 * (64 * 4) + 1 * 4 + 64 * 4
    router = 64 * 4 * 4 + 4 * 4
    expert_biases = 2 * (32 * 4 * 4) + 64 * 4 * 4
    assert shape.layer_dense_bytes == {0: attention + router + expert_biases, 1: attention + router + expert_biases}
    assert shape.cycle_bytes(2) == 2 * 3 * one_matrix * 2
    assert all(t.name.endswith(".weight") for layer in shape.moe_layers for t in layer.tensors)
    assert shape.quant_types()["expert"] == {"MXFP4": shape.expert_bytes}


def test_expert_slices_are_the_bytes_an_independent_reader_sees(tiny_model, small_gptoss):
    for path in (tiny_model, small_gptoss):
        shape = load_model_shape(path)
        reader = GGUFReader(path)
        tensors = {t.name: t for t in reader.tensors}
        raw = np.fromfile(path, dtype=np.uint8)
        for layer in shape.moe_layers:
            for expert in (0, layer.n_expert - 1):
                for s in layer.slices(expert):
                    # GGUFReader's data is (n_expert, rows, row bytes) for quantised tensors.
                    expected = np.asarray(tensors[s.tensor].data[expert]).view(np.uint8).ravel()
                    assert np.array_equal(raw[s.offset:s.offset + s.nbytes], expected)


def test_upstream_tiny_model_matches_the_engines_own_numbers():
    # bmoe-cli's route trace says expert_bytes=196608 dense_bytes=201984 per layer, and its
    # summary token_demand_MiB=1.5 layer_demand_MiB=0.4 at top-2.
    shape = load_model_shape(UPSTREAM_HOST / "tiny-qwen3moe.gguf")
    assert [layer.expert_bytes for layer in shape.moe_layers] == [196608] * 4
    assert set(shape.layer_dense_bytes.values()) == {201984}
    assert round(shape.cycle_mib(2), 1) == 1.5
    assert round(shape.layer_demand_mib(2), 1) == 0.4


def test_gpt_oss_120b_shape_gives_the_seeds_figures(tmp_path):
    path = tmp_path / "gpt-oss-120b.gguf"
    write_model(path, synth_options("gpt-oss-120b", shape_only=True))
    shape = load_model_shape(path)
    assert {layer.expert_bytes for layer in shape.moe_layers} == {13_219_200}
    assert len(shape.moe_layers) == 36 and shape.n_expert == 128 and shape.top_k == 4
    assert f"{shape.cycle_mib(4):.1f}" == "1815.4"
    assert f"{shape.cycle_mib(2):.1f}" == "907.7"
    assert f"{shape.layer_demand_mib(4):.1f}" == "50.4"


def test_split_model_prices_like_the_single_file(tmp_path):
    dims = dict(layers=3, experts=8, top_k=2, hidden=64, expert_ffn=96, vocab=300, quant="Q4_0", seed=5)
    single = tmp_path / "one.gguf"
    write_model(single, synth_options("qwen3moe", **dims))
    split = tmp_path / "many.gguf"
    result = write_model(split, synth_options("qwen3moe", split_count=3, **dims))
    assert [p.rsplit("/", 1)[1] for p in result.paths] == [f"many-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    a = load_model_shape(single)
    for any_shard in result.paths:
        b = load_model_shape(any_shard)
        assert len(b.paths) == 3
        assert b.cycle_bytes(2) == a.cycle_bytes(2)
        assert b.expert_bytes == a.expert_bytes and b.dense_bytes == a.dense_bytes
        assert b.layer_dense_bytes == a.layer_dense_bytes
    # Slices point into whichever shard holds the tensor, with the same bytes as the single file.
    b = load_model_shape(result.paths[0])
    for la, lb in zip(a.moe_layers, b.moe_layers):
        for sa, sb in zip(la.slices(3), lb.slices(3)):
            with open(sa.path, "rb") as fa, open(sb.path, "rb") as fb:
                fa.seek(sa.offset)
                fb.seek(sb.offset)
                assert fa.read(sa.nbytes) == fb.read(sb.nbytes)
    assert len({s.path for layer in b.moe_layers for s in layer.slices(0)}) > 1


def test_split_model_with_a_missing_shard(tmp_path):
    result = write_model(tmp_path / "m.gguf", synth_options("qwen3moe", split_count=2, layers=2, hidden=64,
                                                            expert_ffn=64, experts=4, top_k=2, vocab=260))
    (tmp_path / "m-00002-of-00002.gguf").unlink()
    with pytest.raises(ModelError, match=r"split model is missing 1 of 2 shards"):
        load_model_shape(result.paths[0])


def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_not_gguf(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("hello, this is not a model\n")
    with pytest.raises(ModelError) as e:
        load_model_shape(path)
    assert "not a GGUF file" in _one_line(e)


def test_missing_file(tmp_path):
    with pytest.raises(ModelError, match="cannot open model"):
        load_model_shape(tmp_path / "absent.gguf")


@pytest.mark.parametrize("keep_bytes", [6, 30, 200, 3000])
def test_truncated_header(tiny_model, tmp_path, keep_bytes):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_model.read_bytes()[:keep_bytes])
    with pytest.raises(ModelError) as e:
        load_model_shape(cut)
    assert "truncated GGUF header" in _one_line(e)


def test_truncated_tensor_data(tiny_model, tmp_path):
    cut = tmp_path / "cut.gguf"
    data = tiny_model.read_bytes()
    cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelError) as e:
        load_model_shape(cut)
    assert "truncated GGUF: tensor" in _one_line(e)


def test_non_moe_gguf(tmp_path):
    path = tmp_path / "dense.gguf"
    w = GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((16, 32), dtype=np.float32))
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((64, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError) as e:
        load_model_shape(path)
    assert "not a MoE model" in _one_line(e) and "arch llama" in str(e.value)


@pytest.mark.parametrize("top_k, message", [(9, "top-k 9 is above this model's n_expert of 8"),
                                            (0, "top-k must be at least 1")])
def test_top_k_out_of_range(tiny_model, top_k, message):
    shape = load_model_shape(tiny_model)
    with pytest.raises(ModelError, match=message):
        shape.cycle_mib(top_k)


def test_nextn_blocks_are_not_priced(tiny_model, tmp_path):
    """A trailing next-token-prediction block names expert tensors but is never bound."""
    path = tmp_path / "mtp.gguf"
    shutil.copy(tiny_model, path)
    shape = load_model_shape(path)
    assert len(shape.moe_layers) == 3
    w = GGUFWriter(tmp_path / "with-mtp.gguf", "qwen3moe")
    w.add_block_count(2)
    w.add_uint32("qwen3moe.nextn_predict_layers", 1)
    w.add_expert_count(2)
    for i in range(2):
        w.add_tensor(f"blk.{i}.ffn_up_exps.weight", np.zeros((2, 8, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    mtp = load_model_shape(tmp_path / "with-mtp.gguf")
    assert [layer.layer for layer in mtp.moe_layers] == [0]
    assert mtp.layer_dense_bytes == {1: 2 * 8 * 32 * 4}
