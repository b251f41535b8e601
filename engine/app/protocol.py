"""`bmoe-py --session`: bmoe-cli 0.19.0's line protocol over one loaded Session.

The model is loaded once (the same flags, validation and stderr lines as a one-shot run), then
`BMOE_READY {json}` goes to stdout and stdin is read line by line. Requests, as bmoe-cli reads
them (upstream's docs/telemetry.md, "Session mode"; cli/main.cpp of that era):

    {"cmd":"generate","id":N,"prompt":"...","n_predict":N,"think":B,"clear_kv":B}
    {"cmd":"cancel"}     stop the generation in flight at its next token; the session stays
    {"cmd":"close"}      end the session (EOF on stdin does the same); exit 0

Each generate answers `BMOE_BEGIN {"id"}`, then per token the one-shot `--progress` lines
(`BMOE_LOAD` when experts were read, `BMOE_PROGRESS` carrying the new text as `delta_text`),
then `BMOE_DONE {...}`; a refused request (empty prompt, prompt + n_predict over n_ctx) answers
`BMOE_ERROR {"id","fatal":false,"msg"}` and the session goes on; a failure that leaves the KV
unusable answers `"fatal":true` and the process exits 1, as does a failed load (`BMOE_ERROR` with
id 0, nothing on stderr). Between requests the Session, so its expert cache, stays warm; the
CSV gets its preamble at the first request and one block of rows plus a `# summary` per turn,
its `turn` column counting them, as the route trace's does.

Lines are read with bmoe-cli's flat extractor, not a JSON parser, because what it accepts is the
contract: the first `"key"` anywhere in the line, the value after the next colon; a string runs
to the next unescaped quote (or the line's end), `\\uXXXX` gives one byte (its low 8 bits), an
integer is C's atoi of what follows (junk reads 0), a bool is true only when it reads `true`.
A line without a string `"cmd"`, or with another command, is ignored without a word. `cancel`
is applied by the reader thread at once, like upstream's; a cancel with nothing in flight is
lost (upstream re-arms its latch at each generation). `think` is read and has no effect: bmoe-py
renders no chat template (nor does bmoe-cli without --chatml), so `think_ctl` is `template`.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from engine.app.session import GenerationResult, PrefillCancelled, Session
from engine.contract.config import RunConfig, _atoi
from engine.contract.telemetry import CsvSink, RouteTraceSink, TokenRow, json_escape_bytes, progress_lines
from engine.errors import BmoeError
from engine.safetext import printable
from engine.stream.budget import ConfigError

# bmoe-py renders no chat template: a think=false request has nothing to suppress (upstream's
# `template`: "the model does not reason and there is nothing to suppress")
THINK_CTL = "template"
# upstream's errors that leave the session usable (cli/main.cpp: anything else ends the loop);
# bmoe-py's tokenizer refusal touches no state either
RECOVERABLE = ("exceeds the session n_ctx", "empty prompt", "is not SentencePiece byte-fallback")
READ_CHUNK_BYTES = 1 << 16
# the kinds of line a session writes to stdout, each `KIND {json}` (readers match on these)
READY, BEGIN, DONE, ERROR = "BMOE_READY", "BMOE_BEGIN", "BMOE_DONE", "BMOE_ERROR"

Writer = Callable[[bytes], None]


@dataclass(frozen=True)
class Request:
    """One queued request: a generation, or the end of the session (close or EOF)."""

    close: bool = False
    id: int = 0
    prompt: bytes = b""
    n_predict: int = 128
    think: bool = True
    clear_kv: bool = True


CLOSE = Request(close=True)


# ---- bmoe-cli's flat request reading ---------------------------------------------------------
def _value_at(line: bytes, key: bytes) -> int | None:
    """Where the value of the first `"key"` starts: just past the colon that follows it."""
    k = line.find(b'"' + key + b'"')
    if k < 0:
        return None
    colon = line.find(b":", k + len(key) + 2)
    return None if colon < 0 else colon + 1


def _strtol16(text: bytes) -> int:
    """strtol(text, NULL, 16) of up to four characters: space, a sign, an optional 0x, hex digits."""
    s = text.decode("latin-1").lstrip(" \t\n\v\f\r")
    sign = -1 if s[:1] == "-" else 1
    s = s[1:] if s[:1] in ("-", "+") else s
    if s[:2].lower() == "0x" and s[2:3] and s[2:3] in "0123456789abcdefABCDEF":
        s = s[2:]
    digits = ""
    for c in s:
        if c not in "0123456789abcdefABCDEF":
            break
        digits += c
    return sign * int(digits, 16) if digits else 0


_ESCAPES = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord('"'): b'"', ord("\\"): b"\\", ord("/"): b"/"}


def _unescape(raw: bytes) -> bytes:
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i] != 0x5C or i + 1 >= len(raw):      # not a backslash, or a trailing one: as is
            out.append(raw[i])
            i += 1
            continue
        i += 1
        c = raw[i]
        if c == ord("u"):
            if i + 4 < len(raw):
                out.append(_strtol16(raw[i + 1:i + 5]) & 0xFF)
                i += 4
            # too short: the `\u` is dropped and what follows is read as plain text
        else:
            out += _ESCAPES.get(c, bytes([c]))      # an unknown escape is its character
        i += 1
    return bytes(out)


def _get_string(line: bytes, key: bytes) -> bytes | None:
    p = _value_at(line, key)
    if p is None:
        return None
    while p < len(line) and line[p] in b" \t":
        p += 1
    if p >= len(line) or line[p] != 0x22:
        return None
    p += 1
    raw = bytearray()
    while p < len(line):
        if line[p] == 0x5C and p + 1 < len(line):
            raw += line[p:p + 2]
            p += 2
            continue
        if line[p] == 0x22:
            break
        raw.append(line[p])
        p += 1
    return _unescape(bytes(raw))


def _get_int(line: bytes, key: bytes, default: int) -> int:
    p = _value_at(line, key)
    return default if p is None else _atoi(line[p:].decode("latin-1"))


def _get_bool(line: bytes, key: bytes, default: bool) -> bool:
    p = _value_at(line, key)
    if p is None:
        return default
    while p < len(line) and line[p] in b" \t":
        p += 1
    return line.startswith(b"true", p)


def parse_request(line: bytes, default_n_predict: int) -> Request | str | None:
    """A request, "cancel", or None for a line bmoe-cli ignores."""
    cmd = _get_string(line, b"cmd")
    if cmd == b"cancel":
        return "cancel"
    if cmd == b"close":
        return CLOSE
    if cmd != b"generate":
        return None
    return Request(id=_get_int(line, b"id", 0), prompt=_get_string(line, b"prompt") or b"",
                   n_predict=_get_int(line, b"n_predict", default_n_predict), think=_get_bool(line, b"think", True),
                   clear_kv=_get_bool(line, b"clear_kv", True))


def _reader(fd: int, requests: queue.Queue[Request], cancel: threading.Event, default_n_predict: int) -> None:
    """stdin, as std::getline splits it ('\\n' only; a last line without one still counts); EOF,
    or a stdin that cannot be read, ends the session like a close."""
    def take(line: bytes) -> None:
        got = parse_request(line, default_n_predict)
        if got == "cancel":
            cancel.set()
        elif isinstance(got, Request):
            requests.put(got)

    pending = b""
    while True:
        try:
            chunk = os.read(fd, READ_CHUNK_BYTES)
        except OSError:
            chunk = b""
        if not chunk:
            if pending:
                take(pending)
            requests.put(CLOSE)
            return
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            take(line)


# ---- the lines written ---------------------------------------------------------------------
def ready_line(session: Session) -> bytes:
    arch = json_escape_bytes(session.shape.arch.encode("utf-8", "surrogateescape"))
    return (f'BMOE_READY {{"load_s":{session.load_s:.3f},"arch":"'.encode() + arch
            + f'","n_ctx":{session.cfg.n_ctx},"think_ctl":"{THINK_CTL}","n_expert_used":{session.top_k}}}'.encode())


def error_line(request_id: int, fatal: bool, msg: str) -> bytes:
    escaped = json_escape_bytes(printable(msg).encode("utf-8", "surrogateescape"))
    return f'BMOE_ERROR {{"id":{request_id},"fatal":{"true" if fatal else "false"},"msg":"'.encode() + escaped + b'"}'


def done_line(request_id: int, result: GenerationResult | None, streaming: bool) -> bytes:
    """BMOE_DONE in 0.19.0's key order and formats. result None: cancelled in the prefill, where
    upstream's summary is left at its defaults (zeros, hit % -1). Without --moe-stream the
    streaming figures stay 0 and the hit % -1, as upstream leaves them."""
    cancelled = True
    n = n_prompt = n_past = 0
    tok_s = prefill_s = prefill_tps = load_s = majflt = cpu = overhead = 0.0
    compute = io = resident = budget = read = mgmt = demand = 0.0
    hit = -1.0
    text = b""
    if result is not None:
        s = result.summary
        cancelled, n, n_prompt, n_past, text = result.cancelled, s.tokens, s.n_prompt, result.n_past, result.text
        tok_s, prefill_s, prefill_tps, load_s = s.tok_per_s, s.prefill_s, s.prefill_tps, s.load_s
        majflt, cpu, overhead = s.majflt_per_tok, s.cpu_s_per_tok, s.loop_overhead_s_per_tok
        if streaming:
            compute, io, mgmt, read = s.compute_s_per_tok, s.io_s_per_tok, s.mgmt_s_per_tok, s.read_mib
            resident, budget, demand, hit = s.cache_resident_mib, s.cache_budget_mib, s.token_demand_mib, s.cache_hit_pct
    head = (
        f'BMOE_DONE {{"id":{request_id},"cancelled":{"true" if cancelled else "false"},"tokens":{n},'
        f'"tok_s":{tok_s:.3f},"prefill_s":{prefill_s:.3f},"prefill_tps":{prefill_tps:.2f},"load_s":{load_s:.3f},'
        f'"cache_hit_pct":{hit:.1f},"n_prompt":{n_prompt},"n_past":{n_past},"compute_s_tok":{compute:.4f},'
        f'"io_s_tok":{io:.4f},"cache_resident_mib":{resident:.0f},"cache_budget_mib":{budget:.0f},'
        f'"read_mib":{read:.1f},"stall_s_tok":{0.0:.4f},"mgmt_s_tok":{mgmt:.4f},"majflt_tok":{majflt:.2f},'
        f'"cpu_s_tok":{cpu:.4f},"token_demand_mib":{demand:.1f},"mtp_drafted":0,"mtp_accepted":0,'
        f'"mtp_decodes":{n},"mtp_draft_s_tok":{0.0:.4f},"drafted_steps":0,"loop_overhead_s_tok":{overhead:.4f},'
        f'"reasoning":"","text":"'
    )
    return head.encode() + json_escape_bytes(text) + b'"}'


# ---- the session ---------------------------------------------------------------------------
def serve(cfg: RunConfig, out: Writer, err: Callable[[str], None], csv: CsvSink | None,
          route_trace: RouteTraceSink | None, preamble: Callable[[Session], str], stdin_fd: int = 0) -> int:
    """Load, answer requests until close or EOF; the exit status. The sinks are the caller's to
    close; a ConfigError at load propagates (the one-shot's `config error:` line, exit 1)."""
    try:
        session = Session(cfg, route_trace=route_trace, on_message=err)
    except ConfigError:
        raise
    except BmoeError as e:          # upstream: the reason on stdout, nothing on stderr, exit 1
        out(error_line(0, True, str(e)) + b"\n")
        return 1
    try:
        out(ready_line(session) + b"\n")
        requests: queue.Queue[Request] = queue.Queue()
        cancel = threading.Event()
        threading.Thread(target=_reader, args=(stdin_fd, requests, cancel, cfg.n_predict), name="bmoe-session-stdin",
                         daemon=True).start()
        return _loop(session, requests, cancel, out, csv, preamble)
    finally:
        session.close()


def _loop(session: Session, requests: queue.Queue[Request], cancel: threading.Event, out: Writer,
          csv: CsvSink | None, preamble: Callable[[Session], str]) -> int:
    preamble_written = False
    streaming = session.stream is not None
    while True:
        req = requests.get()
        if req.close:
            return 0
        out(f'BMOE_BEGIN {{"id":{req.id}}}'.encode() + b"\n")
        cancel.clear()              # upstream's latch, re-armed as its generate() starts
        if csv and not preamble_written:
            csv.preamble(preamble(session))     # upstream: once, at the first generate
            preamble_written = True

        def on_token(token: int, piece: bytes, row: TokenRow) -> None:
            if csv:
                csv.token(row)
            out(b"".join(line + b"\n" for line in progress_lines(row, piece)))

        try:
            prompt = session.tokenize(req.prompt.decode("utf-8", "surrogateescape"))
            result = session.generate(prompt, req.n_predict, on_token, clear_kv=req.clear_kv, cancel=cancel)
        except PrefillCancelled:
            out(done_line(req.id, None, streaming) + b"\n")
            continue
        except BmoeError as e:
            fatal = not any(mark in str(e) for mark in RECOVERABLE)
            out(error_line(req.id, fatal, str(e)) + b"\n")
            if fatal:
                return 1
            continue
        if csv:
            csv.summary(result.summary)
        out(done_line(req.id, result, streaming) + b"\n")
