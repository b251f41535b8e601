"""`--ppl FILE`, `--ppl-list FILE`, `--ppl-step`, `--ppl-choices A,B,…` (bmoe-cli 0.24; `--ppl-skip N`
after it): score fixed texts under teacher forcing instead of generating, with the routing policies
armed as they run in decode, and say what the policies did.

Read from Helldez/BigMoeOnEdge's stored sources (no 0.24 build is stored, nor a 0.24-dated copy of
the scoring code): CHANGELOG.md at 006783f9 (the 0.24.0 `--ppl` entry); the store's newest
cli/main.cpp (after 0.24: the flags, the `--ppl-list` file's reading, the `ppl-file:`, `ppl:`,
`ppl-choices:` and `ppl-policy:` lines and their exit statuses); core/include/bmoe/session.h's
`PplRequest` / `PplResult` (skip 8, the pass labelled decode, stepping, choices); and the store's
`Session::perplexity` (a later tree of the same code): a one-token warm-up decode, discarded, so
the drop policy has learned every layer before the scored pass (engine.stream.drop); then either
the whole text as one decode-labelled batch with a logit at every position, or (`--ppl-step`) the
first `skip` tokens as a prefill and every later position as its own one-token decode. Position p
scores token p + 1 from p = skip on; the NLL is the mean of -log softmax (float64), the perplexity
its exp, a hit is the first argmax being the next token. With choices the last token is fed too,
and each choice's first token (tokenized without BOS) gets its log-probability after the text. The
KV is cleared before and after, the expert cache stays warm. docs/decisions/expert-substitute-and-ppl.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.contract.config import RunConfig
from engine.contract.telemetry import RouteTraceSink
from engine.errors import BmoeError
from engine.safetext import printable


class PplError(BmoeError):
    """A text that cannot be scored (bmoe-cli: `bmoe: perplexity failed on 'PATH': …`, exit 1)."""


@dataclass(frozen=True)
class PplResult:
    nll: float                  # mean negative log-likelihood of the scored tokens (nats)
    n_scored: int
    n_top1: int                 # scored positions whose argmax was the next token
    n_tokens: int
    seconds: float
    choice_logp: tuple[float, ...]
    routed: int                 # what the routing policies did during the scored pass
    dropped: int
    reranked: int
    substituted: int

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)

    def lines(self, choices: Sequence[str]) -> list[str]:
        """bmoe-cli's stdout lines for one text (`ppl-file:` aside)."""
        hit_pct = 100.0 * self.n_top1 / self.n_scored if self.n_scored else 0.0
        out = [f"ppl: {self.ppl:.4f}  nll: {self.nll:.5f}  next-token hits: {self.n_top1}/{self.n_scored} "
               f"({hit_pct:.1f}%)  {self.seconds:.2f} s"]
        if self.choice_logp:
            out.append("ppl-choices:" + "".join(f" {c}={lp:.4f}" for c, lp in zip(choices, self.choice_logp)))
        out.append(f"ppl-policy: {self.dropped}/{self.routed} routed experts dropped, "
                   f"{self.substituted}/{self.reranked} reranked slots substituted")
        return out


def _log_softmax_at(logits: np.ndarray, tokens: Sequence[int]) -> list[float]:
    lg = logits.astype(np.float64)
    top = lg.max()
    lse = top + math.log(float(np.exp(lg - top).sum()))
    return [float(lg[t]) - lse for t in tokens]


def perplexity(session, text: bytes, *, skip: int, step: bool = False, choices: Sequence[str] = ()) -> PplResult:
    """Score `text` on a loaded engine.app.session.Session (its KV is cleared before and after);
    `skip`: leading tokens evaluated, not scored (RunConfig.ppl_skip)."""
    t0 = time.perf_counter()
    tokenizer = session.tokenizer
    if tokenizer is None:
        raise PplError("this model's tokenizer is not SentencePiece byte-fallback: bmoe-py cannot tokenize a text")
    tokens = tokenizer.tokenize(text, add_special=True, parse_special=False)
    n = len(tokens)
    if n < 2:
        raise PplError("text too short to score")
    if n > session.cfg.n_ctx:
        raise PplError(f"text of {n} tokens exceeds the session n_ctx ({session.cfg.n_ctx})")
    model = session.model
    model.reset()
    try:
        # a one-token decode, discarded: the routing policies learn their layers on it
        session.set_phase(decoding=True)
        model.decode(tokens[0])
        model.reset()
        before = session.policy_counts()
        nll, scored, top1 = 0.0, 0, 0
        last: np.ndarray | None = None

        def score(logits: np.ndarray, pos: int) -> None:
            nonlocal nll, scored, top1
            nll -= _log_softmax_at(logits, [tokens[pos + 1]])[0]
            scored += 1
            top1 += int(np.argmax(logits)) == tokens[pos + 1]

        if step:
            prefix = max(1, min(skip, n - 1))
            session.set_phase(decoding=False)
            model.prefill(tokens[:prefix])
            for pos in range(prefix, n if choices else n - 1):   # with choices the last token is fed too
                session.set_phase(decoding=True)
                last = model.decode(tokens[pos])
                if skip <= pos < n - 1:
                    score(last, pos)
        else:
            session.set_phase(decoding=True)    # one wide pass, labelled decode so the policies act
            rows = model.logits_all(tokens)
            for pos in range(skip, n - 1):
                score(rows[pos], pos)
            last = rows[-1]
        choice_logp: list[float] = []
        for choice in choices:
            first = tokenizer.tokenize(choice.encode("utf-8", "surrogateescape"), add_special=False,
                                       parse_special=False)
            if not first:
                raise PplError(f"choice '{choice}' does not tokenize")
            assert last is not None
            choice_logp.append(_log_softmax_at(last, first[:1])[0])
        if scored == 0 and not choices:
            raise PplError("nothing scored — text shorter than skip + 1")
        routed, dropped, reranked, substituted = (a - b for a, b in zip(session.policy_counts(), before))
        return PplResult(nll / scored if scored else 0.0, scored, top1, n, time.perf_counter() - t0,
                         tuple(choice_logp), routed, dropped, reranked, substituted)
    finally:
        model.reset()


def _list_paths(list_path: str) -> list[str]:
    """The texts a `--ppl-list` file names: a path a line, trailing CR and spaces cut, blank lines
    and `#` lines skipped. OSError when it cannot be read."""
    with open(list_path, "rb") as fh:
        raw = fh.read().decode("utf-8", "surrogateescape")
    paths = []
    for line in raw.split("\n"):
        line = line.rstrip("\r ")
        if line and not line.startswith("#"):
            paths.append(line)
    return paths


def run(cfg: RunConfig, route_trace: RouteTraceSink | None, out: Callable[[bytes], None],
        err: Callable[[str], None]) -> int:
    """The `--ppl`/`--ppl-list` run: bmoe-cli's lines on `out`, its errors on `err`; the exit status."""
    from engine.app.session import Session

    paths = [cfg.ppl_path] if cfg.ppl_path else []
    if cfg.ppl_list:
        try:
            paths += _list_paths(cfg.ppl_list)
        except OSError:
            err(f"bmoe: cannot open --ppl-list file '{printable(cfg.ppl_list)}'")
            return 2
    try:
        session = Session(cfg, route_trace=route_trace, on_message=err)
    except BmoeError as e:
        err(f"bmoe: {printable(str(e))}")
        return 1
    # The route trace keeps its header and no rows: the scoring pass frames no trace batch upstream
    session.model.on_route = None
    try:
        for path in paths:
            try:
                with open(path, "rb") as fh:
                    text = fh.read()
            except OSError:
                err(f"bmoe: cannot open --ppl file '{printable(path)}'")
                return 2
            try:
                result = perplexity(session, text, skip=cfg.ppl_skip, step=cfg.ppl_step, choices=cfg.ppl_choices)
            except BmoeError as e:
                err(f"bmoe: perplexity failed on '{printable(path)}': {printable(str(e))}")
                return 1
            lines = ([f"ppl-file: {path}"] if len(paths) > 1 else []) + result.lines(cfg.ppl_choices)
            out(("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
    finally:
        session.close()
    return 0
