"""Route-trace parsing and cache replay: the one-pass LRU curve against direct simulation, and the
replay against what the upstream engine measured on the traces it recorded."""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from pathlib import Path

import click
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from engine.errors import BmoeError
from engine.units import MIB
from harness.cli.main import _Group
from harness.cli.replay import replay
from results.errors import ReplayError
from results.read.route_trace import TraceError, read_route_trace
from results.replay.lru_replay import (
    COLD,
    POLICIES,
    _nested_reuse_bytes,
    access_sequence,
    default_budgets_mib,
    knee_mib,
    lru_curve,
    lru_hits,
    mib_to_bytes,
    stack_distances,
)
from results.replay.policy_replay import simulate, simulated_point
from results.replay.replay import CSV_HEADER, FORMAT, FORMAT_VERSION, replay_trace, replay_traces

UPSTREAM = Path(__file__).parent.parent / "fixtures" / "upstream"
GPTOSS = UPSTREAM / "2026-07-15-route-trace" / "gptoss.route.csv"
GPTOSS_METRICS = UPSTREAM / "2026-07-15-route-trace" / "gptoss.metrics"
TINY = UPSTREAM / "host-v2-0.19.0" / "tiny_auto.route.csv"
TINY_METRICS = UPSTREAM / "host-v2-0.19.0" / "tiny_auto.csv"
GPTOSS_EXPERT_BYTES = 13_219_200
HEADER = "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes"


# ── helpers ─────────────────────────────────────────────────────────────────────────────────────


def write_trace(path: Path, expert_bytes: dict[int, int], rows: list[tuple], n_expert: int, top_k: int,
                n_layer: int | None = None) -> Path:
    """rows: (turn, phase, step, layer, slot, expert[, dropped]) in engine order."""
    lines = ["# route_trace v1",
             f"# model=/tmp/a model.gguf arch=test n_layer={n_layer or len(expert_bytes)} n_expert={n_expert} "
             f"n_expert_used={top_k} extra_key=kept"]
    lines += [f"# layer={il} expert_bytes={b} dense_bytes=100" for il, b in expert_bytes.items()]
    lines.append(HEADER + ",dropped")
    lines += [f"{t},{ph},{st},{il},{sl},{e},0.5,0,0,{dropped[0] if dropped else 0}" for t, ph, st, il, sl, e, *dropped in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def random_rows(rng: np.random.Generator, n_layers: int, n_expert: int, k: int) -> list[tuple]:
    """Two turns of a skewed router: a batched prefill (layer-major, token-major inside a layer, the
    last layer routing only the final token as llama.cpp does), then one-token decode steps."""
    popularity = rng.dirichlet(np.full(n_expert, 0.4))
    rows: list[tuple] = []
    pos = 0
    for turn in range(2):
        n_prompt = int(rng.integers(1, 9))
        for il in range(n_layers):
            tokens = [n_prompt - 1] if il == n_layers - 1 else range(n_prompt)
            for j in tokens:
                experts = rng.choice(n_expert, size=k, replace=False, p=popularity)
                rows += [(turn, 0, pos + j, il, s, int(e)) for s, e in enumerate(experts)]
        pos += n_prompt
        for _ in range(int(rng.integers(5, 25))):
            for il in range(n_layers):
                experts = rng.choice(n_expert, size=k, replace=False, p=popularity)
                rows += [(turn, 1, pos, il, s, int(e)) for s, e in enumerate(experts)]
            pos += 1
    return rows


def engine_row_sim(path: Path, budget: int) -> tuple[np.ndarray, int, int, int, int, int]:
    """An independent, row-level transcription of upstream's ExpertStreamSource::load_layer (serial
    path): per batch, unique experts looked up in raw order, duplicates promote, then evict the LRU
    tail while over budget unless it was touched this batch. Returns per-row hit (residency before
    the batch), lookups, hits, decode lookups, decode hits, read bytes."""
    trace = read_route_trace(path)
    r = trace.rows
    cache: OrderedDict = OrderedDict()
    used = lookups = hits = dec_lookups = dec_hits = read = 0
    row_hit = np.zeros(len(r), dtype=bool)
    i = 0
    while i < len(r):
        j = i
        batch = (r.turn[i], r.phase[i], r.layer[i], r.step[i] if r.phase[i] == 1 else None)
        while j < len(r) and (r.turn[j], r.phase[j], r.layer[j], r.step[j] if r.phase[j] == 1 else None) == batch:
            j += 1
        seen: dict = {}
        for row in range(i, j):
            key = (int(r.layer[row]), int(r.expert[row]))
            if key not in seen:
                seen[key] = hit = budget > 0 and key in cache
                lookups += 1
                hits += hit
                dec_lookups += r.phase[row] == 1
                dec_hits += hit and r.phase[row] == 1
                if not hit and budget > 0:
                    cache[key] = trace.expert_bytes_by_layer[key[0]]
                    used += cache[key]
                if not hit:
                    read += trace.expert_bytes_by_layer[key[0]]
            if budget > 0:
                cache.move_to_end(key)
            row_hit[row] = seen[key]
        while used > budget and cache and next(iter(cache)) not in seen:
            used -= cache.popitem(last=False)[1]
        i = j
    return row_hit, lookups, hits, dec_lookups, dec_hits, read


def metrics_value(path: Path, key: str) -> str:
    """A key=value from a bmoe metrics CSV's preamble or summary lines."""
    for line in path.read_text().splitlines():
        m = re.search(rf"(?:^|\s){re.escape(key)}=(\S+)", line)
        if line.startswith("#") and m:
            return m[1]
    raise AssertionError(f"{key} not in {path}")


def edge_budgets(distance: np.ndarray) -> list[int]:
    """Every finite stack distance, one byte below and above: where a stack rule could go wrong."""
    finite = np.unique(distance[distance != COLD])
    return sorted({max(0, int(d) + off) for d in finite for off in (-1, 0, 1)} | {0, 1})


# ── the one-pass curve is exactly the engine's LRU ──────────────────────────────────────────────


@pytest.mark.parametrize("seed", range(8))
def test_stack_distance_curve_equals_direct_lru_on_random_traces(tmp_path, seed):
    rng = np.random.default_rng(seed)
    n_layers = 1 if seed % 4 == 0 else int(rng.integers(2, 5))  # one layer: back-to-back batches
    n_expert, k = int(rng.integers(4, 12)), int(rng.integers(1, 4))
    sizes = {il: int(rng.choice([1000, 1500, 4096, 7000])) for il in range(n_layers)}  # variable sizes
    path = write_trace(tmp_path / "t.route.csv", sizes, random_rows(rng, n_layers, n_expert, k), n_expert, k)
    seq = access_sequence(read_route_trace(path))
    distance = stack_distances(seq)
    budgets = edge_budgets(distance)
    assert len(budgets) > 10
    for b in budgets:
        direct = simulate(seq, "lru", b)
        assert np.array_equal(lru_hits(distance, b), direct), f"seed {seed}, budget {b}"
        row_hit, lookups, hits, dec_lookups, dec_hits, read = engine_row_sim(path, b)
        assert (len(seq), int(direct.sum())) == (lookups, hits)
        assert int(direct[seq.decode].sum()) == dec_hits and int(seq.decode.sum()) == dec_lookups
        assert int(seq.entry_bytes[~direct].sum()) == read
        assert np.array_equal(direct[seq.row_access], row_hit)
    # a stack algorithm: more budget never loses a hit
    counts = [int(lru_hits(distance, b).sum()) for b in budgets]
    assert counts == sorted(counts) and counts[-1] > counts[0] == 0


@pytest.mark.parametrize("trace_path", [GPTOSS, TINY], ids=["gptoss", "tiny"])
def test_stack_distance_curve_equals_direct_lru_on_fixture_traces(trace_path):
    trace = read_route_trace(trace_path)
    seq = access_sequence(trace)
    distance = stack_distances(seq)
    total_mib = sum(trace.expert_bytes_by_layer.values()) * trace.n_expert / MIB
    budgets_mib = sorted(set(np.linspace(0, min(total_mib, 4000), 61).round(3)) |
                         {d / MIB for d in edge_budgets(distance)[:: max(1, len(distance) // 400)]})
    curve = lru_curve(seq, budgets_mib, trace.cycle_bytes)
    for point in curve:
        assert simulated_point(seq, "lru", point.budget_mib, trace.cycle_bytes) == point
    assert len({p.hit_pct_cum for p in curve}) > 5


def test_nested_reuse_sum_matches_brute_force():
    rng = np.random.default_rng(7)
    n = 300
    prev = np.array([int(rng.integers(-1, t)) if t else -1 for t in range(n)])
    weight = rng.integers(1, 50, size=n)
    q_end = rng.integers(0, n + 1, size=500)
    q_prev = rng.integers(-1, n, size=500)
    got = _nested_reuse_bytes(prev, weight, q_end, q_prev)
    want = [int(weight[:e][prev[:e] > p].sum()) for e, p in zip(q_end, q_prev)]
    assert got.tolist() == want


# ── the upstream traces: what the engine measured ───────────────────────────────────────────────


def test_gptoss_token_cycle_from_preamble():
    trace = read_route_trace(GPTOSS)
    assert (trace.n_layer, trace.n_expert, trace.n_expert_used) == (36, 128, 2)
    assert set(trace.expert_bytes_by_layer.values()) == {GPTOSS_EXPERT_BYTES}
    assert len(trace.expert_bytes_by_layer) == 36
    assert trace.cycle_bytes == 36 * GPTOSS_EXPERT_BYTES * 2
    report = replay_trace(trace, [500])
    assert round(report.cycle_mib, 1) == 907.7


def test_gptoss_decode_hit_is_zero_below_the_cliff_and_positive_above_t():
    report = replay_trace(read_route_trace(GPTOSS), [250, 500, 800, 900, 1000, 1500, 2000])
    decode = {p.budget_mib: p.hit_pct_decode for p in report.points}
    under = {p.budget_mib: p.under_cycle for p in report.points}
    for b in (250, 500, 800):
        assert decode[b] == 0.0 and under[b]
    for b in (1000, 1500, 2000):
        assert decode[b] > 0 and not under[b]
    # The cliff is one entry under T, not at T: the last expert a layer stages is touched after its
    # sibling, so a next-token reuse of it needs 71 of the cycle's 72 entries, not all 72.
    # 900 MiB is under T (907.7) and still hits.
    assert under[900] and decode[900] > 0
    cliff = (36 * 2 - 1) * GPTOSS_EXPERT_BYTES
    assert report.first_decode_hit_mib == pytest.approx(cliff / MIB, abs=1e-3)
    seq = access_sequence(read_route_trace(GPTOSS))
    distance = stack_distances(seq)
    assert not lru_hits(distance, cliff - 1)[seq.decode].any()
    assert lru_hits(distance, cliff)[seq.decode].any()


@pytest.mark.parametrize("trace_path", [GPTOSS, TINY])
def test_the_knee_is_where_the_decode_curve_stands_highest_above_its_chord(trace_path):
    trace = read_route_trace(trace_path)
    seq = access_sequence(trace)
    distance = stack_distances(seq)
    knee = knee_mib(seq, distance)
    reuse = distance[seq.decode][distance[seq.decode] != COLD]
    lo, hi = reuse.min() / MIB, reuse.max() / MIB               # first decode hit .. every reuse hits
    grid = list(np.linspace(lo, hi, 400)) + [float(knee)]
    points = lru_curve(seq, grid, trace.cycle_bytes, distance)
    top = points[-2].hit_pct_decode
    lift = [p.hit_pct_decode / top - (p.budget_mib - lo) / (hi - lo) for p in points]
    # no budget of the grid stands higher above the chord than the knee (up to its MiB rounding)
    assert max(lift[:-1]) <= lift[-1] + 1 / (hi - lo) + 1e-9
    assert lo <= knee <= hi + 1 and points[-1].hit_pct_decode > 0
    assert replay_trace(trace, [100]).knee_mib == knee
    if trace_path == GPTOSS:
        assert knee > 907.7                                   # past the cliff at T
    assert knee_mib(seq, np.full(len(seq), COLD, dtype=np.int64)) is None     # nothing reused: no knee


def test_prefill_is_one_batch_per_layer():
    trace = read_route_trace(GPTOSS)
    seq = access_sequence(trace)
    prefill = trace.rows.phase == 0
    assert np.unique(trace.rows.step[prefill & (trace.rows.layer == 0)]).size == 85  # 85 prompt tokens
    assert seq.n_batches - seq.n_decode_batches == 36
    distinct_prefill = np.unique(trace.rows.layer[prefill] * 128 + trace.rows.expert[prefill]).size
    assert int((~seq.decode).sum()) == distinct_prefill == 1767
    assert int(seq.decode.sum()) == 64 * 36 * 2


def test_tiny_replay_reproduces_the_engine_hit_rate():
    budget_mib = float(metrics_value(TINY_METRICS, "cache_mb"))
    measured = float(metrics_value(TINY_METRICS, "cache_hit_pct"))
    assert (budget_mib, measured) == (6.0, 88.7)
    report = replay_trace(read_route_trace(TINY), [budget_mib])
    assert round(report.points[0].hit_pct_cum, 1) == measured
    assert report.lookups == 282  # 468 rows: 26 prefill lookups (one batch per layer) + 256 decode
    # counting per row (or per prefill token) instead would claim 93.2 %


@pytest.mark.parametrize("trace_path,metrics_path,budget_mib", [
    (TINY, TINY_METRICS, 6.0), (GPTOSS, GPTOSS_METRICS, 3000.0)], ids=["tiny", "gptoss"])
def test_replay_reproduces_every_tokens_cumulative_hit_rate(trace_path, metrics_path, budget_mib):
    """The metrics CSV's cache_hit_pct is cumulative over prefill and decode, per generated token."""
    if metrics_path == GPTOSS_METRICS:
        assert float(metrics_value(metrics_path, "cache_budget_MiB")) == budget_mib
    trace = read_route_trace(trace_path)
    seq = access_sequence(trace)
    hits = lru_hits(stack_distances(seq), mib_to_bytes(budget_mib))
    step = np.empty(len(seq), dtype=np.int64)
    looked_up = seq.row_access >= 0
    step[seq.row_access[looked_up]] = trace.rows.step[looked_up]
    measured = pd.read_csv(metrics_path, comment="#")["cache_hit_pct"].to_numpy()
    replayed = []
    for s in np.unique(step[seq.decode]):
        upto = ~seq.decode | (step <= s)
        replayed.append(round(100 * hits[upto].sum() / upto.sum(), 2))
    assert len(replayed) == len(measured) > 30
    assert replayed == measured.tolist()


@pytest.mark.parametrize("trace_path,budget_mib", [(TINY, 6.0), (GPTOSS, 3000.0)], ids=["tiny", "gptoss"])
def test_residency_column_agrees_with_lru_simulation_row_by_row(trace_path, budget_mib):
    trace = read_route_trace(trace_path)
    seq = access_sequence(trace)
    assert (seq.row_access >= 0).all()
    for hits in (simulate(seq, "lru", mib_to_bytes(budget_mib)),
                 lru_hits(stack_distances(seq), mib_to_bytes(budget_mib))):
        assert np.array_equal(hits[seq.row_access], trace.rows.residency > 0)
    # and the replay knows which budget it is: a smaller one disagrees with the recording
    smaller = simulate(seq, "lru", mib_to_bytes(budget_mib / 2))
    assert not np.array_equal(smaller[seq.row_access], trace.rows.residency > 0)


def test_expert_bytes_column_marks_the_rows_that_read():
    """The engine charges a read on the first row of a missed expert in its batch."""
    trace = read_route_trace(GPTOSS)
    seq = access_sequence(trace)
    miss = ~simulate(seq, "lru", mib_to_bytes(3000))
    first_row_of_access = np.zeros(len(trace.rows), dtype=bool)
    _, first = np.unique(seq.row_access, return_index=True)
    first_row_of_access[first] = True
    charged = first_row_of_access & miss[seq.row_access]
    assert np.array_equal(trace.rows.expert_bytes > 0, charged)


# ── the other policies, on traces small enough to work out by hand ──────────────────────────────


def _decode_trace(tmp_path: Path, keys: list[tuple[int, int]], n_layers: int = 1) -> Path:
    """One decode step per (layer, expert): top-1 batches of 10-byte entries."""
    rows = [(0, 1, step, il, 0, e) for step, (il, e) in enumerate(keys)]
    return write_trace(tmp_path / "hand.route.csv", dict.fromkeys(range(n_layers), 10), rows, 4, 1)


@pytest.mark.parametrize("policy,keys,n_layers,expected", [
    # two entries fit. A B C A B C: LRU always evicts what comes next; Belady keeps A then C.
    ("lru", [(0, 0), (0, 1), (0, 2), (0, 0), (0, 1), (0, 2)], 1, [0, 0, 0, 0, 0, 0]),
    ("belady", [(0, 0), (0, 1), (0, 2), (0, 0), (0, 1), (0, 2)], 1, [0, 0, 0, 1, 0, 1]),
    # A A B C A: LRU evicts A after C; LFU evicts B (count 1) and keeps A (count 2).
    ("lru", [(0, 0), (0, 0), (0, 1), (0, 2), (0, 0)], 1, [0, 1, 0, 0, 0]),
    ("lfu", [(0, 0), (0, 0), (0, 1), (0, 2), (0, 0)], 1, [0, 1, 0, 0, 1]),
    # layer 1 churns through two experts; global LRU lets it push layer 0's A out, the partition not.
    ("lru", [(0, 0), (1, 0), (1, 1), (0, 0)], 2, [0, 0, 0, 0]),
    ("layer-lru", [(0, 0), (1, 0), (1, 1), (0, 0)], 2, [0, 0, 0, 1]),
])
def test_policies_on_hand_worked_traces(tmp_path, policy, keys, n_layers, expected):
    seq = access_sequence(read_route_trace(_decode_trace(tmp_path, keys, n_layers)))
    assert simulate(seq, policy, 20).astype(int).tolist() == expected


def test_belady_never_loses_to_lru_on_gptoss_and_all_policies_agree_when_everything_fits():
    trace = read_route_trace(GPTOSS)
    seq = access_sequence(trace)
    for mib in (500, 1000, 2000, 3000):
        assert simulate(seq, "belady", mib_to_bytes(mib)).sum() >= simulate(seq, "lru", mib_to_bytes(mib)).sum()
    everything = sum(trace.expert_bytes_by_layer.values()) * trace.n_expert
    cold_only = [simulate(seq, p, everything).sum() for p in POLICIES]
    assert cold_only == [len(seq) - np.unique(seq.key).size] * len(POLICIES)
    assert all(not simulate(seq, p, 0).any() for p in POLICIES)  # budget 0 is the cache-off mode


def test_unknown_policy_and_bad_budgets_are_replay_errors():
    trace = read_route_trace(TINY)
    with pytest.raises(ReplayError, match="unknown cache policy 'fifo'"):
        replay_trace(trace, [1], ["fifo"])
    with pytest.raises(ReplayError, match="budgets"):
        replay_trace(trace, [-1])


def test_default_budgets_cover_twice_the_cycle_and_include_it():
    budgets = default_budgets_mib(907.6904296875)
    assert budgets[0] == 0 and budgets[-1] >= 2 * 907.69 and 907.7 in budgets
    assert 15 <= len(budgets) <= 25 and budgets == sorted(budgets)
    tiny = default_budgets_mib(1.5)
    assert tiny[0] == 0 and tiny[-1] >= 3.0 and 1.5 in tiny


# ── parsing errors: one line, a BmoeError, naming the file ─────────────────────────────────────


def _expect_trace_error(path: Path, pattern: str) -> None:
    with pytest.raises(TraceError, match=pattern) as info:
        read_route_trace(path)
    assert isinstance(info.value, BmoeError)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def _tiny_lines() -> list[str]:
    return TINY.read_text().splitlines()


def test_not_a_route_trace(tmp_path):
    _expect_trace_error(TINY_METRICS, r"not a route trace \(first line is '# bmoe_metrics v2'")
    _expect_trace_error(UPSTREAM / "host-v2-0.19.0" / "tiny-qwen3moe.gguf", "not a route trace")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    _expect_trace_error(empty, "not a route trace")
    _expect_trace_error(tmp_path / "missing.csv", "cannot open")


def test_unknown_version(tmp_path):
    path = tmp_path / "v2.csv"
    path.write_text("\n".join(["# route_trace v2"] + _tiny_lines()[1:]) + "\n")
    _expect_trace_error(path, "route_trace v2 is not supported")


def test_truncated_row(tmp_path):
    lines = _tiny_lines()
    path = tmp_path / "cut.csv"
    path.write_text("\n".join(lines[:-1] + [lines[-1][:12]]))  # killed mid-row
    _expect_trace_error(path, rf"truncated or malformed route-trace row at line {len(lines)} \(no \w+ value\)")
    path.write_text("\n".join(lines[:6]) + "\n")  # killed inside the preamble
    _expect_trace_error(path, "no CSV header")


def test_missing_columns_and_extra_fields(tmp_path):
    lines = _tiny_lines()
    header = lines.index(HEADER + ",dropped")
    path = tmp_path / "cols.csv"
    path.write_text("\n".join(lines[:header] + ["turn,phase,step,layer,slot,expert,weight"]
                              + [",".join(r.split(",")[:7]) for r in lines[header + 1:]]) + "\n")
    _expect_trace_error(path, "lacks column.* residency, expert_bytes")
    path.write_text("\n".join(lines[: header + 3] + [lines[header + 3] + ",7"] + lines[header + 4:]) + "\n")
    _expect_trace_error(path, rf"line {header + 4}: row has 11 fields, header has 10")


def test_missing_shape_key(tmp_path):
    lines = _tiny_lines()
    path = tmp_path / "shape.csv"
    path.write_text("\n".join([lines[0], lines[1].replace(" n_expert_used=2", "")] + lines[2:]) + "\n")
    _expect_trace_error(path, "has no n_expert_used=")


def test_parser_keeps_unknown_keys_and_model_paths_with_spaces(tmp_path):
    path = write_trace(tmp_path / "t.csv", {0: 10}, [(0, 1, 0, 0, 0, 1)], 4, 1)
    trace = read_route_trace(path)
    assert trace.model == "/tmp/a model.gguf" and trace.meta["extra_key"] == "kept"
    assert trace.has_dropped_column and trace.rows.dropped.tolist() == [0]
    old = read_route_trace(GPTOSS)  # written before the dropped column existed
    assert not old.has_dropped_column and not old.rows.dropped.any()
    with pytest.raises(ValueError):
        old.rows.expert[0] = 1  # the record is immutable


def test_dropped_routings_are_replayed_as_reads(tmp_path):
    rows = [(0, 1, 0, 0, 0, 1), (0, 1, 0, 0, 1, 2, 1), (0, 1, 1, 0, 0, 2), (0, 1, 1, 0, 1, 3)]
    path = write_trace(tmp_path / "t.csv", {0: 10}, rows, 4, 2)
    report = replay_traces([path], [100])
    (t,) = report.traces
    assert (t.dropped_rows, t.lookups) == (1, 4)
    assert t.points[0].hit_pct_decode == 25.0  # expert 2, "dropped" at step 0, hits at step 1
    assert "1 dropped routings replayed as reads" in report.text


def test_trace_without_streamed_rows_is_a_replay_error(tmp_path):
    path = write_trace(tmp_path / "t.csv", {0: 10}, [(0, 1, 0, 3, 0, 1)], 4, 1, n_layer=4)  # layer 3 not streamed
    with pytest.raises(ReplayError, match="no expert lookups"):
        replay_traces([path])


# ── the command ─────────────────────────────────────────────────────────────────────────────────


def _group() -> click.Group:
    """The main group's error mapping (BmoeError -> `Error: …`, exit 1) around the command."""
    group = _Group("bmoe-fleet")
    group.add_command(replay)
    return group


def test_cli_text():
    result = CliRunner().invoke(_group(), ["replay", str(GPTOSS), "--budgets", "500,1000", "--policies", "lru,belady"])
    assert result.exit_code == 0, result.output
    assert "T       907.7 MiB token cycle (36 layers x 12.61 MiB x top-2)" in result.output
    rows = {line.split()[0]: line.split() for line in result.output.splitlines() if re.match(r"\s+\d+\.\d", line)}
    assert set(rows) == {"500.0", "1000.0"}
    assert rows["500.0"][1:3] == ["<T", "0.0"] and float(rows["1000.0"][1]) > 0
    assert float(rows["500.0"][4]) > 0  # belady hits where LRU cannot
    everything = CliRunner().invoke(replay, [str(TINY), "--budgets", "6", "--phase", "all"])
    assert "hit% (all)" in everything.output
    assert everything.output.splitlines()[-1].split() == ["6.0", "88.7", "6.0"]  # 32 entries, each read once


def test_cli_json_and_csv_agree(tmp_path):
    out = tmp_path / "curve.csv"
    out.write_text("stale\n")
    result = CliRunner().invoke(replay, [str(TINY), "--budgets", "1,2.5,6", "--policies", "lru,lfu",
                                         "--csv", str(out), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert (record["format"], record["version"]) == (FORMAT, FORMAT_VERSION)
    (trace,) = record["traces"]
    assert trace["cycle_mib"] == 1.5 and trace["budgets_mib"] == [1.0, 2.5, 6.0]
    lines = out.read_text().splitlines()
    assert lines[0] == CSV_HEADER and len(lines) == 1 + 6
    assert lines[1].startswith("1,lru,") and lines[2].startswith("2.5,lru,") and lines[4].startswith("1,lfu,")
    six = next(p for p in trace["points"] if p["budget_mib"] == 6.0 and p["policy"] == "lru")
    assert lines[3] == f"6,lru,{six['hit_pct_cum']:.3f},{six['hit_pct_decode']:.3f},{six['read_mib']:.1f}"
    assert round(six["hit_pct_cum"], 1) == 88.7
    assert [p.name for p in tmp_path.iterdir()] == ["curve.csv"]  # the temp file was renamed away


def test_cli_bad_file_is_a_one_line_error_with_exit_1(tmp_path):
    result = CliRunner().invoke(_group(), ["replay", str(TINY_METRICS)])
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and "not a route trace" in result.output
    assert result.output.count("\n") == 1
    alone = CliRunner().invoke(replay, [str(TINY_METRICS)])
    assert isinstance(alone.exception, TraceError)


def test_cli_option_errors():
    two = CliRunner().invoke(_group(), ["replay", str(TINY), str(GPTOSS), "--csv", "x.csv"])
    assert two.exit_code == 1 and "exactly one trace" in two.output
    bad_policy = CliRunner().invoke(_group(), ["replay", str(TINY), "--policies", "lru,fifo"])
    assert bad_policy.exit_code == 1 and "unknown cache policy 'fifo'" in bad_policy.output
    bad_budget = CliRunner().invoke(_group(), ["replay", str(TINY), "--budgets", "1,lots"])
    assert bad_budget.exit_code == 2 and "comma-separated list of MiB" in bad_budget.output
    assert replay.help and all(p.help for p in replay.params if isinstance(p, click.Option))


# ── impossible traces (docs/decisions/impossible-values.md) ──────────────────────────────────────────────────────


def _tiny_with(tmp_path: Path, line_no: int, edit) -> Path:
    """tiny_auto.route.csv with file line `line_no` (1-based) replaced by edit(line)."""
    lines = _tiny_lines()
    lines[line_no - 1] = edit(lines[line_no - 1])
    path = tmp_path / "bad.route.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _cell(column: int, value: str):
    def edit(line: str) -> str:
        cells = line.split(",")
        cells[column] = value
        return ",".join(cells)
    return edit


# (line, edit, what the one-line refusal says): header line 2, `# layer=` lines 3-6, header row 7, rows from 8
IMPOSSIBLE = [
    (2, lambda s: s.replace("n_layer=4", "n_layer=0"), r"n_layer=0 is impossible \(must be 1\.\.4096\)"),
    (2, lambda s: s.replace("n_expert=8", "n_expert=-8"), r"n_expert=-8 is impossible"),
    (2, lambda s: s.replace("n_expert_used=2", "n_expert_used=9"),
     r"n_expert_used=9 is impossible \(must be 1\.\.8\)"),
    (2, lambda s: s.replace("n_layer=4", f"n_layer={2 ** 64}"), r"non-integer n_layer=|n_layer=18446744073709551616 is"),
    (4, lambda s: s.replace("expert_bytes=196608", "expert_bytes=-196608"), r"line 4 .*expert_bytes=-196608 is"),
    (5, lambda s: s.replace("layer=2", "layer=7"), r"line 5 .*layer=7 is impossible \(must be 0\.\.3\)"),
    (6, lambda s: s.replace("layer=3", "layer=0"), r"line 6 .*layer 0 is described twice"),
    (9, _cell(2, str(2 ** 64)), r"line 9: step=18446744073709551616"),
    (9, _cell(2, str(2 ** 63)), r"line 9: step=9223372036854775808 \(must be 0\.\."),
    (10, _cell(3, "-1"), r"line 10: layer=-1 \(must be 0\.\.3 for the header's shape\)"),
    (10, _cell(3, "4"), r"line 10: layer=4 \(must be 0\.\.3 for the header's shape\)"),
    (11, _cell(5, "8"), r"line 11: expert=8 \(must be 0\.\.7 for the header's shape\)"),
    (11, _cell(5, "-3"), r"line 11: expert=-3"),
    (12, _cell(1, "2"), r"line 12: phase=2 \(must be 0\.\.1\)"),
    (12, _cell(7, "3"), r"line 12: residency=3"),
    (13, _cell(8, "-196608"), r"line 13: expert_bytes=-196608"),
    (13, _cell(2, "1" * 5000), r"line 13: step=111111111111111111111111… \(5000 digits\)"),
]


@pytest.mark.parametrize("line_no, edit, message", IMPOSSIBLE)
def test_an_impossible_trace_is_refused_naming_file_line_and_value(tmp_path, line_no, edit, message):
    path = _tiny_with(tmp_path, line_no, edit)
    _expect_trace_error(path, message)
    result = CliRunner().invoke(_group(), ["replay", str(path)])
    assert result.exit_code == 1 and result.output.count("\n") == 1 and str(path) in result.output


def test_a_layer_of_zero_expert_bytes_is_not_streamed(tmp_path):
    """The engine lists every layer; `expert_bytes=0` marks one it binds no experts in. Its rows are
    no cache lookups (at 0 bytes each they would be free hits that move the curve) and it adds
    nothing to the cycle or the MoE layer count."""
    path = _tiny_with(tmp_path, 3, lambda s: s.replace("expert_bytes=196608", "expert_bytes=0"))
    trace = read_route_trace(path)
    assert sorted(trace.expert_bytes_by_layer) == [1, 2, 3] and trace.dense_bytes_by_layer[0] == 201984
    (t,) = replay_traces([path], [6]).traces
    (full,) = replay_traces([TINY], [6]).traces
    assert t.n_moe_layers == 3 and t.cycle_bytes == full.cycle_bytes * 3 // 4
    layer0 = int(((read_route_trace(TINY).rows.layer == 0)).sum())
    assert t.lookups < full.lookups and layer0 > 0


def test_replay_text_escapes_the_traces_own_strings(tmp_path):
    path = _tiny_with(tmp_path, 2, lambda s: s.replace("model=tiny.gguf arch=qwen3moe",
                                                          "model=\x1b]0;pwned\x07.gguf arch=\x1b[2J"))
    result = CliRunner().invoke(replay, [str(path), "--budgets", "6"])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "model   \\x1b]0;pwned\\x07.gguf (\\x1b[2J)" in result.output


def test_huge_budgets_hit_like_an_unbounded_cache():
    (t,) = replay_traces([TINY], [6, 1e30], ("lru", "lfu")).traces
    by = {(p.budget_mib, p.policy): p for p in t.points}
    assert by[(1e30, "lru")].hit_pct_cum == by[(1e30, "lfu")].hit_pct_cum >= by[(6.0, "lru")].hit_pct_cum
