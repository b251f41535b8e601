"""`bmoe-py`: the reference engine behind bmoe-cli's contract (flags in; CSV, stdout, stderr and
exit status out). Parsing and validation are engine.contract.config's (engine.stream.budget's for the cache flags),
the run engine.app.session's; this module only wires them to the process's streams and exit codes."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
from threadpoolctl import threadpool_limits

from engine import __version__
from engine.app import ppl
from engine.app.protocol import serve
from engine.app.session import Session
from engine.contract import claim
from engine.contract.config import RunConfig, UsageExit, parse_args, print_usage_exit, validate_run
from engine.contract.telemetry import CsvSink, RouteTraceSink, csv_preamble, progress_lines
from engine.errors import BmoeError
from engine.interface.outputs import PREAMBLE
from engine.plan.planner import check_line
from engine.plan.probe import plan_for
from engine.safetext import printable
from engine.stream.budget import ConfigError


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _out(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def _g4(value: float) -> str:
    """printf's %.4g of a float32, as bmoe-cli writes temp and top_p (glibc keeps a nan's sign)."""
    if math.isnan(value):
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    return f"{float(np.float32(value)):.4g}"


def _preamble(session: Session) -> str:
    """The CSV preamble as bmoe-cli writes it: the flags as given (cache_auto, floor, ceiling,
    force_cache, dense_weights even without --moe-stream), the streaming values only when streaming
    (cache_mb, io_threads, prefetch, predict_spec_max). Two differences, both docs/decisions/bmoe-py-differences.md:
    o_direct is what happened (bmoe-cli writes what was asked), and cache_cycle_mb is added."""
    cfg, shape, budget = session.cfg, session.shape, session.budget
    stream = session.stream
    model = {"model": os.path.basename(cfg.model_path), "arch": shape.arch, "n_layer": shape.n_layer,
             "n_expert": shape.n_expert, "n_expert_used": session.top_k, "threads": cfg.n_threads,
             "n_ctx": cfg.n_ctx, "n_ubatch": 0, "chatml": 0}
    streaming = {
        "moe_stream": int(cfg.moe_stream), "cache_mb": budget.cache_mb if stream else 0,
        "cache_cycle_mb": claim.cycle_text(budget.cycle_bytes, cfg.release), "cache_auto": int(cfg.cache_auto),
        "cache_floor_mb": cfg.cache_floor_mb, "cache_ceil_mb": cfg.cache_ceil_mb,
        "force_cache": int(cfg.force_cache), "load_all": 0,
        "io_threads": stream.io_threads if stream else 0, "o_direct": int(stream.o_direct) if stream else 0,
        "overlap": 0, "io_two_wave": 0, "prefetch": cfg.prefetch if stream else 0, "route_ahead": 0,
        "predict_prefetch": 0, "predict_log": 0, "predict_spec_max": 2 if stream else 0,
        "prefetch_sync": int(cfg.prefetch_sync), "dense_weights": cfg.dense_weights,
        "drop_cold_frac": _g4(cfg.drop_cold_frac if stream else 0.0), "drop_renorm": int(cfg.drop_renorm),
        "drop_prefill": int(cfg.drop_prefill),
    }
    if claim.written(PREAMBLE, "substitute_lambda", cfg.release):
        streaming["substitute_lambda"] = _g4(cfg.substitute_lambda if stream else 0.0)
    sampling = {"temp": _g4(cfg.temp), "top_k": cfg.top_k, "top_p": _g4(cfg.top_p), "seed": cfg.seed,
                "compute_trace_layers": 0, "spec": "off", "spec_draft_max": 0, "mtp_p_min": 0, "ngram_min_match": 0}
    return csv_preamble(claim.engine_name(__version__, cfg.release), model, streaming, sampling)


def run(argv: list[str], environ: dict[str, str]) -> int:
    try:
        cfg = parse_args(argv, environ)
    except UsageExit as e:
        return print_usage_exit(e)
    plan = None
    if cfg.auto_plan:           # after the flags and env overrides, which pin what they set (cli/main.cpp)
        plan, explained = plan_for(cfg, environ)
        if cfg.plan_explain:
            for line in explained:
                _err(printable(line))
        if cfg.plan_only:
            return 0
        cfg = plan.config
    try:
        validate_run(cfg)
    except ConfigError as e:
        _err(f"config error: {e}")
        return 1

    # Both sinks are opened (truncated) before the load, and an unwritable path is a warning, as
    # in bmoe-cli: the run goes on without that file.
    csv = None
    if cfg.csv_path:
        try:
            csv = CsvSink(cfg.csv_path)  # a kill during load leaves 0 bytes, as the engine's does
        except OSError:
            _err(f"warning: could not open csv {cfg.csv_path}")
    route_trace = None
    if cfg.route_trace_path:
        if not cfg.moe_stream:
            _err("warning: --route-trace needs --moe-stream; no trace will be written")
        else:
            try:
                route_trace = RouteTraceSink(cfg.route_trace_path)
            except OSError:
                _err(f"warning: could not open route trace {cfg.route_trace_path}")
    if cfg.session:
        return _serve(cfg, csv, route_trace)
    if cfg.ppl_path or cfg.ppl_list:    # 0.24: score texts instead of generating (the CSV stays empty)
        try:
            return ppl.run(cfg, route_trace, _out, _err)
        finally:
            if route_trace is not None:
                route_trace.close()
            if csv:
                csv.close()
    if cfg.prompt_tokens is None and not cfg.progress:
        _out(cfg.prompt.encode("utf-8", "surrogateescape"))

    session = None
    try:
        session = Session(cfg, route_trace=route_trace, on_message=_err)
        prompt = list(cfg.prompt_tokens) if cfg.prompt_tokens is not None else session.tokenize(cfg.prompt)
        if cfg.prompt_tokens is not None and not cfg.progress:
            _out(b"".join(session.piece(t) for t in prompt))
        if csv:
            csv.preamble(_preamble(session))
        text_so_far = bytearray()

        def on_token(token: int, piece: bytes, row) -> None:
            if csv:
                csv.token(row)
            if cfg.progress:
                for line in progress_lines(row, piece):
                    _out(line + b"\n")
            else:
                _out(piece)
            text_so_far.extend(piece)

        result = session.generate(prompt, cfg.n_predict, on_token)
        if csv:
            csv.summary(result.summary)
    except ConfigError as e:
        _err(f"config error: {e}")
        return 1
    except BmoeError as e:
        _err(f"\nerror: {printable(str(e))}")   # it may quote the model file's own strings
        return 1
    finally:
        if session is not None:
            session.close()
        if route_trace is not None:
            route_trace.close()
        if csv:
            csv.close()
    if cfg.progress:
        _out(b"=== answer ===\n" + result.text + b"\n=== perf ===\n")
    else:
        _out(b"\n\n")
    lines = result.summary.stdout_lines()
    checked = check_line(plan, result.summary.s_per_tok, result.summary.cache_hit_pct) if plan else ""
    if checked:
        lines.insert(1, checked)     # right after `generation:`, as bmoe-cli prints it
    _out(("\n".join(lines) + "\n").encode())
    return 0


def _serve(cfg: RunConfig, csv: CsvSink | None, route_trace: RouteTraceSink | None) -> int:
    """--session: the line protocol (engine.app.protocol) on this process's stdin and stdout."""
    try:
        return serve(cfg, _out, _err, csv, route_trace, _preamble)
    except ConfigError as e:
        _err(f"config error: {e}")
        return 1
    finally:
        if route_trace is not None:
            route_trace.close()
        if csv:
            csv.close()


def main() -> None:
    # One BLAS thread: bmoe-py's matrices are one expert wide, and OpenBLAS's extra threads spin
    # against the I/O lanes and against other engines on the same cores (docs/decisions/compute-threads.md).
    with threadpool_limits(limits=1, user_api="blas"):
        code = run(sys.argv[1:], dict(os.environ))
    sys.exit(code)
