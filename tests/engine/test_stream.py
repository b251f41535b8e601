"""StreamingExpertSource over a real MoE GGUF: exact bytes, the LRU, prefetch, and the page cache."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

import engine.stream.io as eio
from engine.gguf.model import ModelShape, load_model_shape
from engine.stream.io import IoError, memory_filesystem
from engine.stream.pagecache import drop_page_cache, page_cache_residency
from engine.stream.source import PREFETCH_NEEDS_CACHE, Residency, StreamError, StreamingExpertSource

N_LAYER, N_EXPERT, N_EMBD, N_FF = 3, 8, 64, 100


def write_moe_gguf(path: Path) -> None:
    """A small qwen3moe: F16 gate/up and Q8_0 down experts, expert as the outermost dimension.

    n_ff = 100 makes a gate/up slice 12800 B, so slices start at offsets no block size divides.
    """
    rng = np.random.default_rng(11)
    w = GGUFWriter(str(path), "qwen3moe")
    w.add_block_count(N_LAYER)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(2)
    w.add_embedding_length(N_EMBD)
    w.add_tensor("token_embd.weight", rng.standard_normal((300, N_EMBD)).astype(np.float32))
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", rng.standard_normal((N_EXPERT, N_EMBD)).astype(np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", rng.standard_normal((N_EXPERT, N_FF, N_EMBD)).astype(np.float16))
        w.add_tensor(f"blk.{i}.ffn_up_exps.weight", rng.standard_normal((N_EXPERT, N_FF, N_EMBD)).astype(np.float16))
        down = quantize(rng.standard_normal((N_EXPERT, N_EMBD, 96)).astype(np.float32), GGMLQuantizationType.Q8_0)
        w.add_tensor(f"blk.{i}.ffn_down_exps.weight", down, raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def model(tmp_path: Path) -> tuple[ModelShape, bytes]:
    path = tmp_path / "moe.gguf"
    write_moe_gguf(path)
    assert memory_filesystem(str(tmp_path)) is None, f"{tmp_path} is on a memory filesystem; these tests need a disk"
    return load_model_shape(path), path.read_bytes()


def expected(shape: ModelShape, raw: bytes, layer: int, expert: int) -> list[bytes]:
    spec = next(layer_ for layer_ in shape.moe_layers if layer_.layer == layer)
    return [raw[s.offset : s.offset + s.nbytes] for s in spec.slices(expert)]


def entry_bytes(shape: ModelShape) -> int:
    return shape.moe_layers[0].expert_bytes


def test_the_model_has_unaligned_mixed_type_expert_slices(model):
    shape, _ = model
    layer = shape.moe_layers[0]
    assert [t.name.split(".")[2] for t in layer.tensors] == ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
    assert [s.nbytes for s in layer.slices(1)] == [12800, 12800, 6528]
    assert any(s.offset % 512 for s in layer.slices(1))


@pytest.mark.parametrize("lanes", [1, 4, 8])
@pytest.mark.parametrize("cached", [False, True])
def test_fetch_returns_each_experts_exact_slices(model, lanes, cached):
    shape, raw = model
    budget = 64 * entry_bytes(shape) if cached else 0
    with StreamingExpertSource(shape, budget, io_threads=lanes) as src:
        assert src.o_direct
        for _ in range(2):  # second round: hits when cached, fresh reads when not
            for layer in range(N_LAYER):
                got = src.fetch(layer, [6, 0, 3, 3])
                assert list(got) == [6, 0, 3]
                for e, slices in got.items():
                    assert [a.tobytes() for a in slices] == expected(shape, raw, layer, e)
                    assert all(a.dtype == np.uint8 and a.ndim == 1 and not a.flags.writeable for a in slices)
        st = src.stats()
    per_round = N_LAYER * 3
    assert st.cache.lookups == 2 * per_round
    assert st.cache.hits == (per_round if cached else 0)
    assert st.io.reads == 3 * (per_round if cached else 2 * per_round)  # three slices per miss
    assert st.io.read_bytes == st.cache.miss_bytes
    assert st.fetches == 2 * N_LAYER and st.mgmt_s >= 0


def test_misses_of_one_batch_are_read_concurrently(model, monkeypatch):
    shape, raw = model
    in_flight, peak = 0, 0
    lock = threading.Lock()
    real = eio._direct_preadv

    def slow(fd, view, offset):
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        time.sleep(0.02)
        try:
            return real(fd, view, offset)
        finally:
            with lock:
                in_flight -= 1

    with StreamingExpertSource(shape, 0, io_threads=4) as src:
        monkeypatch.setattr(eio, "_direct_preadv", slow)
        got = src.fetch(1, [1, 2, 5, 7])  # 4 misses × 3 slices = 12 reads over 4 lanes
    assert peak == 4
    assert [a.tobytes() for a in got[5]] == expected(shape, raw, 1, 5)


def test_below_the_cycle_the_lru_hits_exactly_zero_and_above_it_everything(model):
    shape, _ = model
    e = entry_bytes(shape)
    route = {0: [0, 1], 1: [2, 3], 2: [4, 5]}  # the same two experts per layer, every token
    cycle = shape.cycle_bytes(2)
    assert cycle == 6 * e
    # A layer batch is evicted for only after it is staged (upstream's order), so a budget one
    # entry short of the cycle still keeps one expert per layer; one layer short, nothing survives.
    for budget, hits in ((cycle - 2 * e, 0), (cycle - 1, 12), (cycle, 6 * 4)):
        with StreamingExpertSource(shape, budget, io_threads=2) as src:
            for _token in range(5):
                for layer in range(N_LAYER):
                    src.fetch(layer, route[layer])
            st = src.stats()
        assert st.cache.hits == hits, budget
        assert st.token_demand_bytes == cycle and st.layer_demand_bytes == 2 * entry_bytes(shape)


def test_on_access_reports_residency_and_prefetch_turns_the_cliff_into_hits(model):
    shape, raw = model
    e = entry_bytes(shape)
    route = {0: [0, 1], 1: [2, 3], 2: [4, 5]}
    seen: list[tuple[int, int, Residency]] = []
    with StreamingExpertSource(
        shape, 4 * e, io_threads=2, prefetch=1, prefetch_sync=True, on_access=lambda *a: seen.append(a)
    ) as src:
        for _token in range(5):
            for layer in range(N_LAYER):
                got = src.fetch(layer, route[layer])
                assert [a.tobytes() for a in got[route[layer][1]]] == expected(shape, raw, layer, route[layer][1])
        st = src.stats()
    residency = [int(r) for _, _, r in seen]
    # Token 0 reads everything. From token 1 on, layer l's fetch prefetches what the previous token
    # used at l+1; those land before l+1 is fetched and hit (2). Layer 0 has nothing before it.
    assert residency[:6] == [0] * 6
    assert residency[6:] == [0, 0, 2, 2, 2, 2] * 4
    assert [(layer, expert) for layer, expert, _ in seen[:2]] == [(0, 0), (0, 1)]
    assert bool(Residency.MISS) is False and bool(Residency.PREFETCH_HIT) is True  # usable as `hit`
    assert (st.cache.hits, st.cache.spec_useful, st.spec_issued) == (16, 16, 16)
    assert st.spec_read_bytes == 16 * e
    assert st.io.read_bytes == 14 * e  # demand reads: the 6 of token 0 and layer 0's 2 per token


def test_prefetch_bets_on_the_last_tokens_row_not_the_whole_previous_pass(model):
    """Upstream's RouterHook keeps, per layer, the LAST token's routing of the previous pass
    (prev_ids_): after a two-token prefill only the second token's experts are guessed."""
    shape, _ = model
    e = entry_bytes(shape)
    with StreamingExpertSource(shape, 2 * e, io_threads=2, prefetch=1, prefetch_sync=True, top_k=2) as src:
        src.fetch(0, [0, 1, 2, 3])   # prefill: token A routes 0,1; token B routes 2,3
        src.fetch(1, [4, 5, 6, 7])   # at layer 1, A routes 4,5 and B routes 6,7
        src.fetch(2, [0, 1])
        src.fetch(0, [0, 1])         # the next token: guesses layer 1 = B's row only
        st = src.stats()
        assert st.spec_issued == 2 and st.spec_experts == 0  # landed, not yet taken in
        src.fetch(1, [6, 2])
        st = src.stats()
    assert st.spec_experts == 2 and st.cache.spec_useful == 1  # 6 was right, 7 was not
    assert st.spec_read_bytes == 2 * e
    # Speculative reads are storage reads too: read_bytes (window_bytes) counts them.
    assert st.spec_window_bytes >= 2 * e and st.window_bytes == st.io.window_bytes + st.spec_window_bytes


def test_with_one_lane_no_guess_is_ever_read_but_its_reread_is_charged(model):
    """Upstream's lane 0 is the eval thread: with --io-threads 1 no idle lane picks a guess up,
    yet issuing it already charged the re-read (measured on bmoe-cli: rereads 250 -> 442, reads
    unchanged). --prefetch-sync reads each guess when it is issued."""
    shape, _ = model
    e = entry_bytes(shape)
    route = {0: [0, 1], 1: [2, 3], 2: [4, 5]}
    counts = {}
    for prefetch, sync in ((0, False), (1, False), (1, True)):
        with StreamingExpertSource(shape, 2 * e, io_threads=1, prefetch=prefetch, prefetch_sync=sync) as src:
            for _token in range(4):
                for layer in range(N_LAYER):
                    src.fetch(layer, route[layer])
            counts[prefetch, sync] = src.stats()
    plain, lazy, eager = counts[0, False], counts[1, False], counts[1, True]
    assert lazy.spec_issued == 2 * 2 * 3 and lazy.spec_experts == 0 and lazy.spec_window_bytes == 0
    assert lazy.window_bytes == plain.window_bytes and lazy.cache.hits == plain.cache.hits
    assert lazy.cache.rereads == plain.cache.rereads + lazy.spec_issued  # each guess was of an evicted entry
    assert eager.spec_experts == eager.spec_issued > 0 and eager.spec_window_bytes > 0


def test_dense_residency_is_sampled_every_128_layer_loads(model):
    shape, _ = model
    samples = []
    with StreamingExpertSource(shape, 0, io_threads=1, dense_probe=lambda: samples.append(1) or 0.75) as src:
        fracs = []
        for _ in range(130):
            src.fetch(0, [0, 1])
            fracs.append(src.stats().dense_resident_frac)
    assert len(samples) == 1 and fracs[126] == -1.0 and fracs[127:] == [0.75] * 3


def test_prefetch_needs_a_cache(model):
    shape, _ = model
    with pytest.raises(StreamError) as info:
        StreamingExpertSource(shape, 0, prefetch=1)
    assert str(info.value) == PREFETCH_NEEDS_CACHE
    with pytest.raises(StreamError, match=r"\[0, 8\]"):
        StreamingExpertSource(shape, 10 * entry_bytes(shape), prefetch=9)


def test_expert_bytes_never_enter_the_page_cache_under_o_direct(model):
    shape, raw = model
    ranges = [(t.offset, t.nbytes) for layer in shape.moe_layers for t in layer.tensors]
    path = shape.paths[0]
    with StreamingExpertSource(shape, 0, io_threads=4) as src:
        drop_page_cache(path)  # after the header parse and the open-time verify
        for layer in range(N_LAYER):
            got = src.fetch(layer, list(range(N_EXPERT)))
            assert [a.tobytes() for a in got[7]] == expected(shape, raw, layer, 7)
        assert sum(page_cache_residency(path, o, n).resident_pages for o, n in ranges) == 0
        assert src.stats().io.read_bytes == sum(n for _, n in ranges)
    with StreamingExpertSource(shape, 0, io_threads=4, o_direct=False) as src:  # --no-odirect
        for layer in range(N_LAYER):
            src.fetch(layer, list(range(N_EXPERT)))
        assert not src.o_direct
    for o, n in ranges:
        r = page_cache_residency(path, o, n)
        assert r.resident_pages == r.total_pages


def test_a_model_on_tmpfs_streams_buffered_and_reports_o_direct_0(model, tmp_path):
    shape, raw = model
    shm = Path(f"/dev/shm/bmoe-stream-test-{tmp_path.name}.gguf")
    shutil.copyfile(shape.paths[0], shm)
    try:
        tmpfs_shape = load_model_shape(shm)
        with StreamingExpertSource(tmpfs_shape, 0, io_threads=4) as src:
            got = src.fetch(2, [3])
            assert not src.o_direct and not src.stats().io.o_direct
            assert src.messages() == [
                "bmoe: expert streaming ON  n_expert=8 o_direct=0 io_threads=4 cache=0 MiB shards=1"
            ]
        assert [a.tobytes() for a in got[3]] == expected(shape, raw, 2, 3)
    finally:
        shm.unlink()


def test_streaming_on_line_matches_bmoe_cli(model):
    shape, _ = model
    with StreamingExpertSource(shape, 3 * (1 << 20) + 5, io_threads=8) as src:
        assert src.messages() == ["bmoe: expert streaming ON  n_expert=8 o_direct=1 io_threads=8 cache=3 MiB shards=1"]


def test_set_cache_budget_follows_session_rules(model):
    shape, _ = model
    e = entry_bytes(shape)
    with StreamingExpertSource(shape, 10 * e, io_threads=2) as src:
        for layer in range(N_LAYER):
            src.fetch(layer, [0, 1, 2])
        assert src.stats().cache.resident_bytes == 9 * e
        assert src.set_cache_budget(4 * e) == 4 * e  # shrinking evicts to the new budget now
        st = src.stats().cache
        assert st.resident_bytes == 4 * e and st.evictions == 5
        assert [src.is_resident(2, x) for x in (0, 1, 2)] == [True, True, True]  # the MRU ones stayed
        assert src.set_cache_budget(10 * shape.expert_bytes) == shape.expert_bytes  # capped at the bank
        assert src.set_cache_budget(0) == 1  # shrinks toward, never to, zero
        assert src.stats().cache.resident_bytes == 0
    with StreamingExpertSource(shape, 0) as src:
        assert src.set_cache_budget(10 * e) == 0  # started without a cache: it stays off


def test_a_failed_read_leaves_no_half_filled_slot(model, monkeypatch):
    shape, raw = model
    with StreamingExpertSource(shape, 64 * entry_bytes(shape), io_threads=2) as src:
        def broken(fd, view, offset):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(eio, "_direct_preadv", broken)
        with pytest.raises(IoError, match="Input/output error"):
            src.fetch(0, [4, 5])
        assert not src.is_resident(0, 4) and not src.is_resident(0, 5)
        assert src.stats().cache.resident_bytes == 0
        monkeypatch.undo()
        got = src.fetch(0, [4, 5])
        assert [a.tobytes() for a in got[4]] == expected(shape, raw, 0, 4)


def test_unknown_layers_and_experts_are_refused(model):
    shape, _ = model
    with StreamingExpertSource(shape, 0) as src:
        with pytest.raises(StreamError, match="layer 7"):
            src.fetch(7, [0])
        with pytest.raises(StreamError, match="expert 8 out of range"):
            src.fetch(0, [8])


def test_with_the_cache_off_bytes_the_caller_keeps_are_never_recycled(model):
    shape, raw = model
    with StreamingExpertSource(shape, 0, io_threads=3) as src:
        kept = src.fetch(0, [0, 1, 2])
        for _ in range(5):
            for layer in range(N_LAYER):
                src.fetch(layer, [0, 1, 2, 3, 4, 5, 6, 7])  # dropped at once: these buffers recycle
        for e in (0, 1, 2):
            assert [a.tobytes() for a in kept[e]] == expected(shape, raw, 0, e)


def test_residency_matches_upstreams_route_trace_on_its_own_model():
    """Replay bmoe-cli's routing of the tiny model (cache auto = 6 MiB) through the source: the
    residency it reports for every decode row is the one upstream's route trace recorded."""
    upstream = Path(__file__).parents[1] / "fixtures" / "upstream" / "host-v2-0.19.0"
    shape = load_model_shape(upstream / "tiny-qwen3moe.gguf")
    lines = [ln for ln in (upstream / "tiny_auto.route.csv").read_text().splitlines() if not ln.startswith("#")]
    header, rows = lines[0].split(","), [dict(zip(lines[0].split(","), ln.split(","))) for ln in lines[1:]]
    assert header[:9] == ["turn", "phase", "step", "layer", "slot", "expert", "weight", "residency", "expert_bytes"]
    batches: dict[tuple[int, int, int], list[int]] = {}
    for r in rows:
        phase = int(r["phase"])
        batches.setdefault((phase, 0 if phase == 0 else int(r["step"]), int(r["layer"])), []).append(int(r["expert"]))
    seen: dict[tuple[int, int, int], int] = {}
    current = [0]

    def on_access(layer: int, expert: int, residency: Residency) -> None:
        seen[(current[0], layer, expert)] = int(residency)

    with StreamingExpertSource(shape, 6 * (1 << 20), io_threads=4, on_access=on_access) as src:
        for (phase, step, layer), experts in sorted(batches.items()):
            current[0] = step if phase == 1 else -1
            src.fetch(layer, experts)
        st = src.stats()
    decode = [r for r in rows if r["phase"] == "1"]
    assert [seen[(int(r["step"]), int(r["layer"]), int(r["expert"]))] for r in decode] == [
        int(r["residency"]) for r in decode
    ]
    assert st.io.read_bytes == sum(int(r["expert_bytes"]) for r in rows)  # the rows that read
    assert f"{st.cache.hit_pct:.2f}" == "88.65"  # tiny_auto.csv's last cache_hit_pct
