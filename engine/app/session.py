"""A loaded model ready to generate: budget, dense policy, expert source, telemetry per token.

`Session(config)` does what bmoe-cli's load does, in its order: price the model, size the
cache (fixed, or `auto` once at load), open the expert streamer's files, apply the dense-weights
policy, say the streamer is on, warn when the budget is under the token cycle (bmoe-py's own
line). Each stderr line goes to `on_message` as it happens, so the lines before a failed load are
still printed, as bmoe-cli prints them. Without --moe-stream no streaming flag is looked at: the
model is mapped as llama.cpp maps it, whatever --dense-weights says. `generate()` runs bmoe-cli's
loop (sample, emit, decode the emitted token) and measures every token the way the engine's CSV
reports it. Successive generate() calls share the warm expert cache and count turns, as upstream's
Session does for `--session` (engine/app/protocol.py): `clear_kv=False` continues the KV of the
previous turn, `cancel` stops a generation at the next token boundary. `set_cache_budget_mb()` is
the embedders' resize: between generations only. The lossy routing policies (engine.stream.drop,
engine.stream.substitute) are built here and told each batch's phase (`set_phase`).

Long because: it is upstream's Session, load then generation loop, in its order; every part (the
budget, the dense policy, the routing policies, the per-token row) reads the same loaded state,
and the route trace's writer, the one piece that stands alone, is the small class at the top.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.contract import claim
from engine.contract.config import RunConfig, cache_flags
from engine.contract.telemetry import RouteTraceSink, RunSummary, TokenRow
from engine.errors import BmoeError, ModelError
from engine.forward.experts import ResidentExpertSource
from engine.forward.graph import Model, Sampler
from engine.gguf.model import ModelShape, engine_refusal, load_model_shape
from engine.gguf.tokenizer import SpmTokenizer, eog_ids_from_metadata
from engine.interface.outputs import SUMMARY
from engine.procfs import KbFile
from engine.stream import drop, substitute
from engine.stream.budget import CacheBudget, resolve_budget
from engine.stream.io import DirectReader, Slice
from engine.stream.source import Residency, StreamingExpertSource
from engine.units import MIB

SEED_RANDOM = 0xFFFFFFFF
WARM_CHUNK_BYTES = 8 * MIB
# bmoe-cli refuses a run whose prompt + n_predict + this margin exceed -c (Session::generate).
CTX_MARGIN_TOKENS = 8
# llama.cpp pads the context it allocates to a multiple of this (-c 40 makes a 256-cell KV cache).
KV_CTX_PAD = 256
# What bmoe-cli prints when --dense-weights ahwb meets a platform without reclaim-exempt memory.
AHWB_LINES = ("bmoe: --dense-weights ahwb needs reclaim-exempt memory, which this platform does not provide "
              "(Android only)", "bmoe: dense-weights init failed")


class SessionError(BmoeError):
    """A Session was used in a way it does not allow (e.g. resized during a generation)."""


class PrefillCancelled(BmoeError):
    """generate() was cancelled before its prompt was in the KV: upstream rolls the turn back and
    reports nothing measured (its RunSummary stays default), so there is no result to return."""


@dataclass(frozen=True)
class GenerationResult:
    tokens: tuple[int, ...]
    text: bytes
    n_prompt: int
    rows: tuple[TokenRow, ...]
    summary: RunSummary
    cancelled: bool = False     # stopped by `cancel` at a token boundary; tokens are those emitted
    n_past: int = 0             # upstream's n_past outside chat mode: n_prompt + tokens emitted


TokenCallback = Callable[[int, bytes, TokenRow], None]


def _rusage() -> tuple[int, float]:
    """Major faults and CPU seconds of this process so far (resource is Unix-only: imported here,
    so the harness imports engine on Windows, where `status` runs)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_majflt, r.ru_utime + r.ru_stime


class _RouteTracer:
    """Wraps the streaming source to write the route trace: the routing arrives just before the
    layer's fetch, the residency of each expert during it; rows are written after the fetch."""

    def __init__(self, sink: RouteTraceSink, source: StreamingExpertSource, n_prompt_fn: Callable[[], int]):
        self.sink = sink
        self.source = source
        self.n_prompt_fn = n_prompt_fn
        self.pending: tuple[int, np.ndarray, np.ndarray, np.ndarray] | None = None
        self.access: dict[int, Residency] = {}
        self.dropped: np.ndarray | None = None   # the pending layer's dropped slots (--drop-cold-experts)
        self.turn = 0
        # KV cells before this turn's prompt (a continued turn): upstream's trace numbers steps
        # from the turn's own prompt, so positions are written relative to it
        self.base = 0
        source.on_access = self.on_access

    def on_route(self, layer: int, positions: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> None:
        self.pending = (layer, positions, ids, weights)
        self.access = {}
        self.dropped = None

    def on_drop(self, layer: int, dropped: np.ndarray) -> None:
        """The drop policy's decision on the pending layer (engine.stream.drop): a dropped slot was
        a miss that is never read, so it neither pays the read nor claims its charge."""
        if self.pending is not None and self.pending[0] == layer:
            self.dropped = dropped

    def on_access(self, layer: int, expert: int, residency: Residency) -> None:
        self.access[expert] = residency

    def fetch(self, layer: int, experts: Sequence[int]):
        out = self.source.fetch(layer, experts)
        if self.pending is not None and self.pending[0] == layer:
            _, positions, ids, weights = self.pending
            expert_bytes = self.source.shape.moe_layers[0].expert_bytes
            for moe in self.source.shape.moe_layers:
                if moe.layer == layer:
                    expert_bytes = moe.expert_bytes
            n_prompt = self.n_prompt_fn()
            read_done: set[int] = set()
            for row, abs_pos in enumerate(positions):
                pos = abs_pos - self.base
                phase = 0 if pos < n_prompt else 1
                for slot in range(ids.shape[1]):
                    e = int(ids[row, slot])
                    dropped = self.dropped is not None and bool(self.dropped[row, slot])
                    residency = Residency.MISS if dropped else self.access.get(e, Residency.HIT)
                    nbytes = 0
                    if residency == Residency.MISS and not dropped and e not in read_done:
                        read_done.add(e)
                        nbytes = expert_bytes
                    self.sink.row(self.turn, phase, int(pos), layer, slot, e, float(weights[row, slot]),
                                  int(residency), nbytes, dropped)
            self.pending = None
        return out


class Session:
    def __init__(self, cfg: RunConfig, route_trace: RouteTraceSink | None = None,
                 on_message: Callable[[str], None] | None = None):
        """route_trace: an opened --route-trace file (ignored without --moe-stream); the Session
        writes its preamble and rows, whoever opened it closes it. on_message: each load-time
        stderr line, as it happens (they are also kept in .messages)."""
        t0 = time.perf_counter()
        self.cfg = cfg
        self.messages: list[str] = []
        self._on_message = on_message
        self.stream: StreamingExpertSource | None = None
        self.tracer: _RouteTracer | None = None
        self.drop: drop.DropPolicy | None = None     # --drop-cold-experts on a streamed run
        self.substitute: substitute.SubstitutePolicy | None = None   # --expert-substitute (0.24)
        self._route_trace = route_trace if cfg.moe_stream else None
        try:
            self.shape: ModelShape = load_model_shape(cfg.model_path)
        except ModelError as e:
            # bmoe-cli's line, then what exactly is wrong with the file.
            raise ModelError(f"failed to load model: {e}") from None
        if (refusal := engine_refusal(self.shape)) is not None:      # llama.cpp's loader, after the header
            raise ModelError(f"failed to load model: {cfg.model_path}: {refusal}")
        self.top_k = cfg.n_expert_used or self.shape.top_k or 0
        if not self.top_k:
            raise SessionError(f"{cfg.model_path}: no {self.shape.arch}.expert_used_count; pass --n-expert-used")
        if self.top_k > self.shape.n_expert:
            raise SessionError(f"n_expert_used={self.top_k} exceeds the model's expert count ({self.shape.n_expert})")
        self.budget: CacheBudget = resolve_budget(cache_flags(cfg), self.shape, self.top_k,
                                                  one_line_warning=claim.cycle_warning_one_line(cfg.release))
        self._n_prompt = 0
        source: object
        if cfg.moe_stream:
            for line in self.budget.auto_messages:
                self._message(line)
            self.stream = StreamingExpertSource(self.shape, self.budget.budget_bytes, io_threads=cfg.io_threads,
                                                o_direct=cfg.o_direct, prefetch=cfg.prefetch,
                                                prefetch_sync=cfg.prefetch_sync, top_k=self.top_k)
            try:
                for line in self.stream.open_messages():
                    self._message(line)
                weights = self._dense_weights()
            except BaseException:
                self.stream.close()
                raise
            self.stream.dense_probe = weights.residency().sample
            self._message(self.stream.streaming_on_line())
            source = self.stream
            if self._route_trace is not None:
                self._route_trace.write_static(cfg.model_path, self.shape.arch, self.shape.n_layer, self.shape.n_expert,
                                               self.top_k, self._route_layers())
                self.tracer = _RouteTracer(self._route_trace, self.stream, lambda: self._n_prompt)
                source = self.tracer
            if self.budget.warning:
                self._message(self.budget.warning)
            if cfg.drop_cold_frac > 0:      # validated: a cache is on
                self.drop = drop.DropPolicy(cfg.drop_cold_frac, self.shape.n_layer, self.stream.resident_before_read,
                                            renorm=cfg.drop_renorm, in_prefill=cfg.drop_prefill,
                                            traced=self.tracer is not None,
                                            on_drop=self.tracer.on_drop if self.tracer else None)
                if line := drop.warning(cfg.drop_cold_frac, self.top_k):
                    self._message(line)
            if cfg.substitute_lambda > 0:   # validated: a cache is on
                self.substitute = substitute.SubstitutePolicy(cfg.substitute_lambda, self.stream.resident)
        else:
            from engine.forward.weights import DenseWeights

            weights = DenseWeights(self.shape)  # resident: the file mapped, every streaming flag ignored
            source = ResidentExpertSource(self.shape, anonymous=cfg.no_mmap)
        # llama.cpp allocates the KV cache padded to 256 cells; the -c limit itself is checked
        # (with bmoe-cli's margin) in generate().
        kv_ctx = -(-cfg.n_ctx // KV_CTX_PAD) * KV_CTX_PAD
        self.model = Model(self.shape, source, weights=weights, n_ctx=kv_ctx,
                           on_route=self.tracer.on_route if self.tracer else None, route_hook=self.drop,
                           rerank=self.substitute,
                           upstream_threads=cfg.n_threads,
                           threads=cfg.n_threads)
        if self.top_k != self.model.hp.n_expert_used:
            from dataclasses import replace

            self.model.hp = replace(self.model.hp, n_expert_used=self.top_k)
        self.tokenizer = SpmTokenizer.from_metadata(self.shape.metadata) if self._spm() else None
        self.eog_ids = eog_ids_from_metadata(self.shape.metadata)
        self.load_s = time.perf_counter() - t0
        self._generating = False
        self.turn = 0               # generations finished so far: the CSV's and route trace's `turn`
        self._sampler: Sampler | None = None
        # the per-token memory columns' two files, kept open (bmoe-cli reads the same two per token)
        self._status = KbFile("/proc/self/status", ("VmRSS", "RssAnon", "RssFile", "VmSwap"))
        self._meminfo = KbFile("/proc/meminfo", ("MemAvailable", "MemFree", "SwapFree"))

    def _message(self, line: str) -> None:
        self.messages.append(line)
        if self._on_message is not None:
            self._on_message(line)

    # ---- load ---------------------------------------------------------------------------------
    def _spm(self) -> bool:
        return self.shape.metadata.get("tokenizer.ggml.model") == "llama"

    def _route_layers(self) -> list[tuple[int, int, int]]:
        """(layer, expert_bytes, dense_bytes) for every layer, 0 expert bytes where none are bound."""
        expert = {m.layer: m.expert_bytes for m in self.shape.moe_layers}
        return [(il, expert.get(il, 0), self.shape.layer_dense_bytes.get(il, 0)) for il in range(self.shape.n_layer)]

    def _dense_weights(self):
        """The --dense-weights policy (streaming runs only), with bmoe-cli's stderr lines."""
        from engine.forward.weights import DenseWeights

        mode = self.cfg.dense_weights
        if mode == "ahwb":
            # dma-buf memory the kernel may not reclaim: Android only, so this load fails here as
            # bmoe-cli's does off Android (at load, exit 1), not at parse.
            for line in AHWB_LINES:
                self._message(line)
            raise SessionError("expert stream source init failed")
        if mode == "warm":
            self._message(self._warm())
            return DenseWeights(self.shape)
        if mode == "anon":
            dense = sorted(self.shape.bound_dense_tensors, key=lambda t: (t.path, t.offset))
            t0 = time.perf_counter()
            reader = DirectReader(self.cfg.io_threads, self.cfg.o_direct, reuse_buffers=False)
            try:
                for path in self.shape.paths:
                    reader.open(path)
                # Copies: a view would pin each tensor's whole aligned window.
                arrays = [np.array(a) for a in reader.read_slices([Slice(t.path, t.offset, t.nbytes) for t in dense])]
            finally:
                reader.close()
            total = sum(t.nbytes for t in dense)
            # bmoe-py never maps what it reads into anon buffers, so unlike bmoe-cli it has no
            # "dropped N MiB of now-unused mmap pages" line to print (docs/decisions/bmoe-py-differences.md).
            self._message(f"bmoe: dense-weights=anon — {total // MIB} MiB in {len(dense)} anon buffers")
            self.dense_read_s = time.perf_counter() - t0
            return DenseWeights(self.shape, buffers={t.name: a for t, a in zip(dense, arrays)})
        return DenseWeights(self.shape)

    def _warm(self) -> str:
        """One sequential buffered sweep of everything that is not a bound expert tensor (header,
        dense tensors, padding, tail) into the page cache, as upstream's warm-up sweeps it."""
        t0 = time.perf_counter()
        total = 0
        buf = bytearray(WARM_CHUNK_BYTES)
        for path, ranges in self.shape.dense_ranges().items():
            with open(path, "rb", buffering=0) as fh:
                for lo, hi in ranges:
                    fh.seek(lo)
                    left = hi - lo
                    while left > 0:
                        n = fh.readinto(memoryview(buf)[:min(left, len(buf))])
                        if not n:
                            break
                        left -= n
                        total += n
        return f"bmoe: dense warm-up — {total // MIB} MiB in {time.perf_counter() - t0:.1f} s"

    # ---- generation ---------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        if self.tokenizer is None:
            model = self.shape.metadata.get("tokenizer.ggml.model", "none")
            raise SessionError(f"this model's tokenizer ({model}) is not SentencePiece byte-fallback: "
                               "pass the prompt as --prompt-tokens 1,2,3")
        return self.tokenizer.tokenize(self.cfg_prompt_bytes(text))

    @staticmethod
    def cfg_prompt_bytes(text: str) -> bytes:
        return text.encode("utf-8", "surrogateescape")

    def piece(self, token: int) -> bytes:
        if self.tokenizer is not None:
            return self.tokenizer.token_to_piece(token)
        return b""

    def _snapshot(self) -> dict[str, float]:
        majflt, cpu_s = _rusage()
        snap = {"majflt": majflt, "cpu_s": cpu_s, "io_s": 0.0, "mgmt_s": 0.0, "window_bytes": 0}
        if self.stream is not None:
            st = self.stream.stats()
            snap.update(io_s=st.io.read_s, mgmt_s=st.mgmt_s, window_bytes=st.window_bytes)
        return snap

    def _hit_pct(self) -> float:
        if self.stream is None or self.stream.budget_bytes == 0:
            return -1.0
        return self.stream.stats().cache.hit_pct

    def generate(self, prompt_tokens: Sequence[int], n_predict: int, on_token: TokenCallback | None = None,
                 *, clear_kv: bool = True, cancel: threading.Event | None = None) -> GenerationResult:
        """One turn. clear_kv=False appends the prompt to the KV the previous turn left (upstream's
        non-chat continuation: the sampler's stream goes on too). `cancel`, once set, stops the
        generation before the next token's decode (that token is not emitted), and the turn's KV is
        dropped, as upstream rolls a cancelled non-chat turn back; set during the prefill, it
        raises PrefillCancelled. The caller clears it: upstream re-arms its latch per generation."""
        if self._generating:
            raise SessionError("a generation is already running on this session")
        self._generating = True
        try:
            result = self._generate(list(prompt_tokens), n_predict, on_token, clear_kv, cancel)
        finally:
            self._generating = False
        # upstream counts a turn once its decode loop ran (a refused or prefill-cancelled one is not)
        self.turn += 1
        if self.tracer is not None:
            self.tracer.turn = self.turn
        return result

    def _generate(self, prompt: list[int], n_predict: int, on_token: TokenCallback | None, clear_kv: bool,
                  cancel: threading.Event | None) -> GenerationResult:
        cfg = self.cfg
        # A new chat is dropped first, as upstream drops it, so even a refused request has done it.
        if clear_kv or self._sampler is None:
            seed = None if cfg.seed == SEED_RANDOM else cfg.seed
            # bmoe-cli's chain when sampling: top-k -> top-p -> temp -> dist (no min-p stage). It
            # samples only when `temp > 0` holds in C, so `--temp nan` is greedy there and here.
            temp = cfg.temp if cfg.temp > 0 else 0.0
            self._sampler = Sampler(temp=temp, seed=seed, top_k=cfg.top_k, top_p=cfg.top_p, min_p=0.0)
            self.model.reset()
        sampler = self._sampler
        if self.tracer is not None:
            self.tracer.base = self.model.state.n_past
        if not prompt:
            raise SessionError("empty prompt after tokenization")
        if len(prompt) + n_predict + CTX_MARGIN_TOKENS > cfg.n_ctx:
            raise SessionError(f"prompt + n_predict exceeds the session n_ctx ({cfg.n_ctx}); open the session with a "
                               "larger n_ctx")
        self._n_prompt = len(prompt)
        self.set_phase(decoding=False)
        t_prefill = time.perf_counter()
        try:
            logits = self.model.prefill(prompt)
        except BaseException:
            self.model.reset()      # a half-written KV is no state to continue from
            raise
        prefill_s = time.perf_counter() - t_prefill
        if self.tracer is not None:
            self.tracer.sink.flush()
        if cancel is not None and cancel.is_set():
            self.model.reset()
            raise PrefillCancelled("cancelled during the prefill")
        # the policies' counters describe the decode loop: taken after the prefill, as upstream takes them
        counts_before = self.policy_counts()
        self.set_phase(decoding=True)
        cancelled = False
        rows: list[TokenRow] = []
        tokens: list[int] = []
        text = bytearray()
        totals = {"wall_s": 0.0, "io_s": 0.0, "mgmt_s": 0.0, "window_bytes": 0, "majflt": 0, "cpu_s": 0.0,
                  "overhead_s": 0.0}
        loop_start = time.perf_counter()
        for step in range(1, n_predict + 1):
            token = sampler.sample(logits)
            if token in self.eog_ids:
                break
            if cancel is not None and cancel.is_set():
                cancelled = True    # upstream's abort lands in this token's decode: not emitted
                break
            piece = self.piece(token)
            tokens.append(token)
            text += piece
            before = self._snapshot()
            t0 = time.perf_counter()
            overhead_s = t0 - loop_start
            logits = self.model.decode(token)
            t1 = time.perf_counter()
            wall_s = t1 - t0
            after = self._snapshot()
            io_s = after["io_s"] - before["io_s"]
            mgmt_s = after["mgmt_s"] - before["mgmt_s"]
            window = int(after["window_bytes"] - before["window_bytes"])
            majflt = int(after["majflt"] - before["majflt"])
            cpu_s = after["cpu_s"] - before["cpu_s"]
            status = self._status.values()
            mem = self._meminfo.values()
            row = TokenRow(
                step=step, steps=n_predict, wall_ms=wall_s * 1e3, io_ms=io_s * 1e3,
                compute_ms=max(0.0, wall_s - io_s - mgmt_s) * 1e3, read_bytes=window,
                cache_hit_pct=self._hit_pct(), mgmt_ms=mgmt_s * 1e3, majflt=majflt, cpu_ms=cpu_s * 1e3,
                cache_budget_mib=(self.stream.budget_bytes if self.stream else 0) / MIB,
                rss_mib=status.get("VmRSS", 0) / 1024, rss_anon_mib=status.get("RssAnon", 0) / 1024,
                rss_file_mib=status.get("RssFile", 0) / 1024, swap_mib=status.get("VmSwap", 0) / 1024,
                mem_available_mib=mem.get("MemAvailable", 0) / 1024, mem_free_mib=mem.get("MemFree", 0) / 1024,
                swap_free_mib=mem.get("SwapFree", 0) / 1024, loop_overhead_ms=overhead_s * 1e3,
                majflt_mib=majflt * 4096 / MIB, turn=self.turn,
                dense_resident_frac=self.stream.stats().dense_resident_frac if self.stream else -1.0,
            )
            rows.append(row)
            if self.tracer is not None:
                self.tracer.sink.flush()
            for key, value in (("wall_s", wall_s), ("io_s", io_s), ("mgmt_s", mgmt_s), ("window_bytes", window),
                               ("majflt", majflt), ("cpu_s", cpu_s), ("overhead_s", overhead_s)):
                totals[key] += value
            if on_token is not None:
                on_token(token, piece, row)
            # bmoe-cli's loop_overhead_ms: everything since the previous decode returned (this
            # token's telemetry, its row's writers, the next sampling), so it is marked there
            loop_start = t1
        # and, as bmoe-cli closes it, the tail after the last decode belongs to the summary's total
        totals["overhead_s"] += time.perf_counter() - loop_start
        if cancelled:
            self.model.reset()
        counts = tuple(now - before for now, before in zip(self.policy_counts(), counts_before))
        return GenerationResult(tuple(tokens), bytes(text), len(prompt), tuple(rows),
                                self._summary(len(tokens), len(prompt), prefill_s, totals, counts),
                                cancelled=cancelled, n_past=len(prompt) + len(tokens))

    def _summary(self, n: int, n_prompt: int, prefill_s: float, t: dict[str, float],
                 counts: tuple[int, ...]) -> RunSummary:
        per = (lambda v: v / n) if n else (lambda v: 0.0)
        cache = self.stream.stats().cache if self.stream else None
        stream_stats = self.stream.stats() if self.stream else None
        return RunSummary(
            tokens=n, s_per_tok=per(t["wall_s"]), read_mib=t["window_bytes"] / MIB, io_s=t["io_s"],
            compute_s_per_tok=per(max(0.0, t["wall_s"] - t["io_s"] - t["mgmt_s"])), io_s_per_tok=per(t["io_s"]),
            cache_hit_pct=self._hit_pct(), n_prompt=n_prompt, load_s=self.load_s, prefill_s=prefill_s,
            mgmt_s_per_tok=per(t["mgmt_s"]),
            cache_resident_mib=(cache.resident_bytes / MIB) if cache else 0.0,
            cache_budget_mib=(self.stream.budget_bytes / MIB) if self.stream else 0.0,
            majflt_per_tok=per(t["majflt"]), cpu_s_per_tok=per(t["cpu_s"]),
            token_demand_mib=(stream_stats.token_demand_bytes / MIB) if stream_stats else 0.0,
            layer_demand_mib=(stream_stats.layer_demand_bytes / MIB) if stream_stats else 0.0,
            loop_overhead_s_per_tok=per(t["overhead_s"]),
            evictions=cache.evictions if cache else 0, rereads=cache.rereads if cache else 0,
            threads=self.cfg.n_threads, moe_stream=self.cfg.moe_stream, cache_auto=self.budget.cache_auto,
            prefetch_layers=self.cfg.prefetch if self.stream else 0,
            spec_read_mib=(stream_stats.spec_read_bytes / MIB) if stream_stats else 0.0,
            spec_experts=stream_stats.spec_experts if stream_stats else 0,
            spec_useful=cache.spec_useful if cache else 0,
            mode=claim.mode_line(self.cfg.release, self.cfg.moe_stream, self.budget.cache_auto, self.cfg.cache_mb,
                                 self.cfg.dense_weights, self.shape.arch),
            drop_cold_frac=self.cfg.drop_cold_frac if self.drop is not None else 0.0,
            experts_routed=counts[0], experts_dropped=counts[1],
            substitute_lambda=self.cfg.substitute_lambda if self.substitute is not None else 0.0,
            experts_reranked=counts[2] if claim.written(SUMMARY, "experts_reranked", self.cfg.release) else None,
            experts_substituted=counts[3],
        )

    # ---- the lossy routing policies ------------------------------------------------------------
    def set_phase(self, decoding: bool) -> None:
        """The phase of the batches that follow (upstream's set_batch_phase): the drop policy acts
        in decode (in prefill too when asked), substitution in decode only."""
        for policy in (self.drop, self.substitute):
            if policy is not None:
                policy.decoding = decoding

    def policy_counts(self) -> tuple[int, int, int, int]:
        """(routed, dropped, reranked, substituted) so far: a turn reports its own deltas."""
        d, s = self.drop, self.substitute
        return (d.routed if d else 0, d.dropped if d else 0, s.reranked if s else 0, s.substituted if s else 0)

    # ---- embedders' API -------------------------------------------------------------------------
    def set_cache_budget_mb(self, mb: int) -> int:
        """Resize the expert cache between generations; evicts to the new budget at once.

        Returns the budget now in force (MiB). Produced tokens never change: only residency does.
        """
        if self._generating:
            raise SessionError("set_cache_budget_mb must be called between generations, not during one")
        if self.stream is None:
            raise SessionError("set_cache_budget_mb needs --moe-stream (a resident model has no expert cache)")
        if mb < 0:
            raise SessionError(f"cache budget must be >= 0 MiB, got {mb}")
        return self.stream.set_cache_budget(mb * MIB) // MIB

    def close(self) -> None:
        """Stop the streamer. The route-trace file belongs to whoever opened it."""
        self._status.close()
        self._meminfo.close()
        if self.stream is not None:
            self.stream.close()
