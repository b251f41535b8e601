"""bmoe-cli 0.19.0's telemetry formats, written byte-for-byte the way the C++ engine writes them.

Formats were read off real bmoe-cli 0.19.0 output (tests/fixtures/upstream/host-v2-0.19.0):
the `--csv` metrics file (`# bmoe_metrics v2` preamble, 29 columns, `# summary` trailer), the
end-of-run stdout lines, the `--progress` JSON lines and the `--route-trace` v1 file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import IO, Any

from engine.units import MIB

CSV_VERSION_LINE = "# bmoe_metrics v2"
ROUTE_TRACE_VERSION_LINE = "# route_trace v1"

# (column, printf-style format) in the engine's order; read by name, written in this order.
_COLUMNS: tuple[tuple[str, str], ...] = (
    ("step", "d"), ("steps", "d"), ("wall_ms", ".3f"), ("io_ms", ".3f"), ("compute_ms", ".3f"),
    ("read_bytes", "d"), ("cache_hit_pct", ".2f"), ("stall_ms", ".3f"), ("mgmt_ms", ".3f"), ("majflt", "d"),
    ("cpu_ms", ".3f"), ("dense_resident_frac", ".3f"), ("turn", "d"), ("majflt_mib", ".2f"),
    ("cache_budget_mib", ".1f"), ("rss_mib", ".1f"), ("rss_anon_mib", ".1f"), ("rss_file_mib", ".1f"),
    ("swap_mib", ".1f"), ("mem_available_mib", ".1f"), ("mem_free_mib", ".1f"), ("swap_free_mib", ".1f"),
    ("loop_overhead_ms", ".3f"), ("mtp_batch", "d"), ("mtp_draft_ms", ".3f"), ("drain_ms", ".3f"),
    ("adopt_ms", ".3f"), ("ra_issue_ms", ".3f"), ("ra_wd_ms", ".3f"),
)
CSV_COLUMNS = tuple(name for name, _ in _COLUMNS)


@dataclass(frozen=True)
class TokenRow:
    """One generated token's metrics row. -1 in cache_hit_pct / dense_resident_frac = not measured."""

    step: int
    steps: int
    wall_ms: float
    io_ms: float
    compute_ms: float
    read_bytes: int
    cache_hit_pct: float
    mgmt_ms: float
    majflt: int
    cpu_ms: float
    cache_budget_mib: float
    rss_mib: float
    rss_anon_mib: float
    rss_file_mib: float
    swap_mib: float
    mem_available_mib: float
    mem_free_mib: float
    swap_free_mib: float
    loop_overhead_ms: float
    dense_resident_frac: float = -1.0
    stall_ms: float = 0.0
    turn: int = 0
    majflt_mib: float = 0.0
    mtp_batch: int = 1
    mtp_draft_ms: float = 0.0
    drain_ms: float = 0.0
    adopt_ms: float = 0.0
    ra_issue_ms: float = 0.0
    ra_wd_ms: float = 0.0

    def csv_line(self) -> str:
        return ",".join(format(getattr(self, name), fmt) for name, fmt in _COLUMNS)


@dataclass(frozen=True)
class RunSummary:
    """The run-level numbers behind the `# summary` trailer and the end-of-run stdout lines."""

    tokens: int
    s_per_tok: float
    read_mib: float
    io_s: float
    compute_s_per_tok: float
    io_s_per_tok: float
    cache_hit_pct: float          # cumulative incl. prefill; -1 when no cache is used
    n_prompt: int
    load_s: float
    prefill_s: float
    mgmt_s_per_tok: float
    cache_resident_mib: float
    cache_budget_mib: float
    majflt_per_tok: float
    cpu_s_per_tok: float
    token_demand_mib: float
    layer_demand_mib: float
    loop_overhead_s_per_tok: float
    evictions: int
    rereads: int
    threads: int
    moe_stream: bool
    cache_auto: bool
    stall_s_per_tok: float = 0.0
    prefetch_layers: int = 0      # --prefetch K: the run prints the moe-prefetch line
    spec_read_mib: float = 0.0    # payload of the speculative reads that landed before their layer
    spec_experts: int = 0         # prefetched experts that entered the cache
    spec_useful: int = 0          # of those, the ones a later lookup hit
    mode: str = ""                # the `mode:` line of a claimed release after 0.24 (engine.claim), else ""
    drop_cold_frac: float = 0.0   # --drop-cold-experts F of a streamed run (engine.stream.drop): the moe-drop line
    experts_routed: int = 0       # routed slots while the policy was on, and the ones it dropped (decode loop)
    experts_dropped: int = 0
    substitute_lambda: float = 0.0    # --expert-substitute L of a streamed run (engine.stream.substitute)
    experts_reranked: int | None = None   # slots it examined; None: the claimed release writes no such keys
    experts_substituted: int = 0

    @property
    def tok_per_s(self) -> float:
        return 1.0 / self.s_per_tok if self.s_per_tok > 0 else 0.0

    @property
    def prefill_tps(self) -> float:
        return self.n_prompt / self.prefill_s if self.prefill_s > 0 else 0.0

    def csv_line(self) -> str:
        s = self
        return (
            f"# summary tokens={s.tokens} s/tok={s.s_per_tok:.3f} tok/s={s.tok_per_s:.3f} read_MiB={s.read_mib:.1f} "
            f"io_s={s.io_s:.2f} compute_s/tok={s.compute_s_per_tok:.3f} io_s/tok={s.io_s_per_tok:.3f} "
            f"cache_hit_pct={s.cache_hit_pct:.1f} n_prompt={s.n_prompt} load_s={s.load_s:.3f} "
            f"prefill_s={s.prefill_s:.3f} prefill_tps={s.prefill_tps:.2f} stall_s/tok={s.stall_s_per_tok:.3f} "
            f"mgmt_s/tok={s.mgmt_s_per_tok:.3f} cache_resident_MiB={s.cache_resident_mib:.1f} "
            f"cache_budget_MiB={s.cache_budget_mib:.1f} cache_resizes=0 spec_read_MiB={s.spec_read_mib:.1f} "
            f"spec_experts={s.spec_experts} spec_useful={s.spec_useful} majflt/tok={s.majflt_per_tok:.2f} "
            f"cpu_s/tok={s.cpu_s_per_tok:.4f} "
            f"token_demand_MiB={s.token_demand_mib:.1f} layer_demand_MiB={s.layer_demand_mib:.1f} "
            f"experts_routed={s.experts_routed} experts_dropped={s.experts_dropped} "
            + (f"experts_reranked={s.experts_reranked} experts_substituted={s.experts_substituted} "
               if s.experts_reranked is not None else "")
            + f"loop_overhead_s/tok={s.loop_overhead_s_per_tok:.4f} "
            f"mtp_drafted=0 mtp_accepted=0 mtp_decodes={s.tokens} mtp_draft_s/tok=0.0000 drafted_steps=0 "
            f"ra_committed=0 ra_passthrough=0 ra_agree_pct=0.0 ra_gemv_ms/tok=0.00 ra_issue_ms/tok=0.00 "
            f"ra_wd_ms/tok=0.00 drain_s/tok=0.000 adopt_s/tok=0.000 evictions={s.evictions} rereads={s.rereads}"
        )

    def stdout_lines(self) -> list[str]:
        """The end-of-run lines bmoe-cli prints on stdout (after the streamed text and a blank line)."""
        s = self
        occupancy = 100.0 * s.cpu_s_per_tok / (s.s_per_tok * s.threads) if s.s_per_tok > 0 and s.threads else 0.0
        lines = [f"generation: {s.tokens} tokens, {s.s_per_tok:.3f} s/token ({s.tok_per_s:.3f} tok/s)"]
        if s.cpu_s_per_tok > 0 or s.majflt_per_tok > 0:
            lines.append(f"compute: {occupancy:.1f}% CPU occupancy ({s.cpu_s_per_tok:.4f} cpu-s/token over "
                         f"{s.threads} threads), {s.majflt_per_tok:.2f} major faults/token")
        if s.n_prompt > 0:
            lines.append(f"prefill: {s.n_prompt} tokens, {s.prefill_s:.3f} s ({s.prefill_tps:.1f} tok/s) | model load "
                         f"{s.load_s:.3f} s | TTFT {s.load_s + s.prefill_s:.3f} s")
        if s.mode:
            lines.append(s.mode)
        if s.moe_stream:
            per_tok = s.read_mib / s.tokens if s.tokens else 0.0
            bandwidth = s.read_mib / s.io_s if s.io_s > 0 else 0.0
            lines.append(
                f"moe-stream: read {s.read_mib:.1f} MiB ({per_tok:.2f} MiB/token), decode {s.s_per_tok:.3f} s/token "
                f"(compute {s.compute_s_per_tok:.3f} + cache mgmt {s.mgmt_s_per_tok:.3f} + flash I/O "
                f"{s.io_s_per_tok:.3f} s/token, {bandwidth:.0f} MiB/s)"
            )
            if s.cache_hit_pct >= 0:
                line = f"moe-cache: {s.cache_hit_pct:.1f}% hit, resident {s.cache_resident_mib:.1f} MiB"
                if s.cache_auto:
                    line += f", budget {s.cache_budget_mib:.0f} MiB (auto)"
                lines.append(line)
                if s.evictions or s.rereads:
                    rereads_per_tok = s.rereads / s.tokens if s.tokens else 0.0
                    lines.append(f"moe-cache: {s.evictions} evictions, {s.rereads} re-reads ({rereads_per_tok:.1f}/token)"
                                 " — bytes the cache had already paid for once")
            if s.prefetch_layers > 0:
                useful_pct = 100.0 * s.spec_useful / s.spec_experts if s.spec_experts else 0.0
                lines.append(f"moe-prefetch: {s.spec_read_mib:.1f} MiB speculative, {s.spec_useful}/{s.spec_experts} "
                             f"experts useful ({useful_pct:.0f}%)")
            if s.drop_cold_frac > 0:
                drop_pct = 100.0 * s.experts_dropped / s.experts_routed if s.experts_routed else 0.0
                lines.append(f"moe-drop: {s.experts_dropped}/{s.experts_routed} routed experts dropped ({drop_pct:.1f}%), "
                             f"threshold {s.drop_cold_frac:.2f} x uniform")
            if s.substitute_lambda > 0 and s.experts_reranked is not None:
                sub_pct = 100.0 * s.experts_substituted / s.experts_reranked if s.experts_reranked else 0.0
                lines.append(f"moe-substitute: {s.experts_substituted}/{s.experts_reranked} reranked slots went to a "
                             f"resident expert ({sub_pct:.1f}%), margin {s.substitute_lambda:.2f} x score range")
        return lines


def _kv(items: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in items.items())


def csv_preamble(engine_version: str, model: dict[str, Any], stream: dict[str, Any], sampling: dict[str, Any]) -> str:
    """The `#` preamble: version line, engine, then model / stream / sampling key=value lines."""
    lines = [CSV_VERSION_LINE, f"# engine={engine_version}", "# " + _kv(model), "# " + _kv(stream),
             "# " + _kv(sampling), ",".join(CSV_COLUMNS)]
    return "\n".join(lines) + "\n"


class _CFile:
    """A telemetry file written the way the engine's C stream writes it: opening can fail (the
    caller warns), but once open a failed write (a full disk, /dev/full, a procfs file) only puts
    the stream in error; later writes do nothing and the run goes on (bmoe-cli exits 0 and says
    nothing). Bytes the argv carried that are not UTF-8 are written back as they came."""

    def __init__(self, path: str | os.PathLike[str]):
        # open for the sink's life (one run), closed by close()
        self._fh: IO[str] = open(path, "w", encoding="utf-8", errors="surrogateescape", newline="\n")  # noqa: SIM115
        self.failed = False

    def _write(self, text: str, flush: bool = True) -> None:
        if self.failed:
            return
        try:
            self._fh.write(text)
            if flush:
                self._fh.flush()
        except OSError:
            self.failed = True

    def close(self) -> None:
        try:
            self._fh.close()
        except OSError:
            self.failed = True


class CsvSink(_CFile):
    """The `--csv` file. Truncated at open (before load), flushed per row, like the engine."""

    def preamble(self, text: str) -> None:
        self._write(text)

    def token(self, row: TokenRow) -> None:
        self._write(row.csv_line() + "\n")

    def summary(self, summary: RunSummary) -> None:
        self._write(summary.csv_line() + "\n")


_JSON_ESCAPES = {ord('"'): b'\\"', ord("\\"): b"\\\\", ord("\n"): b"\\n", ord("\r"): b"\\r", ord("\t"): b"\\t"}


def json_escape_bytes(raw: bytes) -> bytes:
    """The engine's json_escape: quotes, backslash and control bytes escaped; other bytes raw.

    Bytes >= 0x80 pass through unchanged, so a token that is half a UTF-8 sequence is emitted as
    the engine emits it (not valid JSON text, but what consumers of bmoe-cli already parse).
    """
    out = bytearray()
    for b in raw:
        if b in _JSON_ESCAPES:
            out += _JSON_ESCAPES[b]
        elif b < 0x20:
            out += b"\\u%04x" % b
        else:
            out.append(b)
    return bytes(out)


def progress_lines(row: TokenRow, delta_text: bytes) -> list[bytes]:
    """`--progress` lines for one token: BMOE_LOAD (only when experts were read), BMOE_PROGRESS."""
    out = []
    if row.read_bytes or row.io_ms > 0:
        out.append(f'BMOE_LOAD {{"mb":{row.read_bytes / MIB:.2f},"ms":{row.io_ms:.1f}}}'.encode())
    body = (
        f'BMOE_PROGRESS {{"step":{row.step},"steps":{row.steps},"wall_ms":{row.wall_ms:.1f},"io_ms":{row.io_ms:.1f},'
        f'"compute_ms":{row.compute_ms:.1f},"mgmt_ms":{row.mgmt_ms:.1f},"stall_ms":{row.stall_ms:.1f},'
        f'"read_mb":{row.read_bytes / MIB:.2f},"cache_hit_pct":{row.cache_hit_pct:.1f},"majflt":{row.majflt},'
        f'"cpu_ms":{row.cpu_ms:.1f},"dense_resident_frac":{row.dense_resident_frac:.3f},"delta_reasoning":"",'
        f'"delta_text":"'
    )
    out.append(body.encode() + json_escape_bytes(delta_text) + b'"}')
    return out


class RouteTraceSink(_CFile):
    """`--route-trace` v1: one row per routed (token, layer, slot); expert_bytes only on reads.

    Opened (and truncated) before the model loads, as bmoe-cli opens it, so an unwritable path is
    a warning before anything else happens; the `#` preamble is written once the model is known.
    """

    HEADER = "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped"

    def write_static(self, model_path: str, arch: str, n_layer: int, n_expert: int, n_expert_used: int,
                     layer_bytes: list[tuple[int, int, int]]) -> None:
        """`model_path` as the user gave it to -m; one `# layer=` line per layer, dense ones too
        (expert_bytes=0), as upstream writes them."""
        lines = [f"{ROUTE_TRACE_VERSION_LINE}\n# model={model_path} arch={arch} n_layer={n_layer} "
                 f"n_expert={n_expert} n_expert_used={n_expert_used}\n"]
        lines += [f"# layer={layer} expert_bytes={expert_bytes} dense_bytes={dense_bytes}\n"
                  for layer, expert_bytes, dense_bytes in layer_bytes]
        self._write("".join(lines) + self.HEADER + "\n")

    def row(self, turn: int, phase: int, step: int, layer: int, slot: int, expert: int, weight: float,
            residency: int, expert_bytes: int, dropped: bool = False) -> None:
        """`expert` and `weight` as the router chose them; `dropped`: --drop-cold-experts discarded it."""
        # printf's %.6g of the float32 weight: "0.5", "0.0123457", "nan" for a weight never exposed.
        self._write(f"{turn},{phase},{step},{layer},{slot},{expert},{weight:.6g},{residency},"
                    f"{expert_bytes},{int(dropped)}\n", flush=False)

    def flush(self) -> None:
        """Once per forward pass (upstream flushes once per decode, not per row)."""
        self._write("")
