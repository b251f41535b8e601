"""bmoe-py claiming 0.24: `--expert-substitute L` and the `--ppl` family (engine/stream/substitute.py,
engine/app/ppl.py, docs/decisions/expert-substitute-and-ppl.md). No 0.24 build exists to compare
with, so these hold bmoe-py to upstream's text (its lines read by the project's readers of
upstream's formats, results/read/parse_console.py) and to invariants: L = 0 is the run without the
flag, a margin far below any gap reranks and changes nothing (upstream's gate G8d), the full
margin fires (G8e), the substituted count never exceeds the reranked one."""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

from engine.stream.budget import ConfigError
from engine.stream.substitute import SubstitutePolicy, validate
from results.read.parse import read_metrics_csv
from results.read.parse_console import parse_console
from tests.engine.test_engine_cli import TINY, bmoe_py, generated

STREAM = ("-m", TINY, "-t", 1, "--moe-stream", "--cache-mb", 2, "--force-cache")
CLAIM = {"BMOE_PY_RELEASE": "0.24"}
TEXT = (b"The capital of Japan is Tokyo, and the capital of France is Paris. Both are large cities "
        b"with long histories, many museums and busy railway stations.\n")


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("BMOE_")}, **extra}


def _run(*args, claim: bool = True, **kw):
    return bmoe_py(*args, env=_env(**(CLAIM if claim else {})), **kw)


# ---- the policy on hand-made scores ------------------------------------------------------------------
def _policy(lam: float, resident: list[bool]) -> SubstitutePolicy:
    policy = SubstitutePolicy(lam, lambda layer, experts: [resident[e] for e in experts])
    policy.decoding = True
    return policy


def test_a_resident_expert_within_the_margin_takes_the_slot_and_counts_once():
    logits = np.array([[3.0, 2.0, 1.9, 0.0]], dtype=np.float32)     # range 3; margin 0.1 x 3 = 0.3
    ids = np.array([[0, 1]])
    policy = _policy(0.1, [False, False, True, False])
    assert policy(0, logits, ids, False).tolist() == [[0, 2]]       # 1.9 + 0.3 passes 2.0
    assert (policy.reranked, policy.substituted) == (2, 1)
    ids = np.array([[0, 1]])
    policy = _policy(0.01, [False, False, True, False])               # 0.03 does not reach
    assert policy(0, logits, ids, False).tolist() == [[0, 1]] and (policy.reranked, policy.substituted) == (2, 0)


def test_probabilities_are_ranked_as_logs_and_a_new_order_of_the_same_set_is_no_substitution():
    probs = np.array([[0.5, 0.3, 0.15, 0.05]], dtype=np.float32)
    ids = np.array([[0, 1]])
    policy = _policy(0.1, [False, True, False, False])              # slot 1 resident: lifted above slot 0
    assert policy(0, probs, ids, True).tolist() == [[0, 1]]           # log range 2.3: 0.23 < log(0.5/0.3)
    policy = _policy(0.5, [False, True, False, False])
    out = policy(0, probs, np.array([[0, 1]]), True)
    assert sorted(out[0].tolist()) == [0, 1] and policy.substituted == 0 and policy.reranked == 2


def test_decode_only_and_nothing_to_choose_from_is_left_alone():
    logits = np.array([[3.0, 2.0, 1.0]], dtype=np.float32)
    policy = _policy(1.0, [False, False, True])
    policy.decoding = False
    assert policy(0, logits, np.array([[0, 1]]), False).tolist() == [[0, 1]] and policy.reranked == 0
    policy.decoding = True
    assert policy(0, logits, np.array([[0, 1, 2]]), False).tolist() == [[0, 1, 2]] and policy.reranked == 0
    flat = np.array([[1.0, 1.0, 1.0]], dtype=np.float32)            # no range: no margin
    assert policy(0, flat, np.array([[0, 1]]), False).tolist() == [[0, 1]] and policy.reranked == 0


def test_refusals_are_upstreams():
    validate(0.0, cache_on=False)
    validate(1.0, cache_on=True)
    for lam, cache_on, starts in ((0.5, False, "moe.substitute_lambda requires the LRU cache"),
                                  (1.5, True, "moe.substitute_lambda must be in [0, 1]"),
                                  (float("nan"), True, "moe.substitute_lambda must be in [0, 1]")):
        with pytest.raises(ConfigError, match="^" + re.escape(starts)):
            validate(lam, cache_on)
    # after the drop threshold's own, as validate() orders them
    r = _run(*STREAM[:5], "--drop-cold-experts", "0.5", "--expert-substitute", "0.5", "-n", 4)
    assert r.returncode == 1 and r.stderr.decode().startswith("config error: moe.drop_cold_frac requires")


@pytest.mark.parametrize("flag", ["--expert-substitute", "--ppl", "--ppl-list", "--ppl-choices"])
def test_below_0_24_the_flags_are_unknown(flag):
    r = _run(*STREAM, flag, "0.5", "-n", 4, claim=False)
    assert r.returncode == 1 and r.stderr.decode() == f"unknown arg: {flag}\n"


# ---- generation -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def generations(tmp_path_factory):
    d = tmp_path_factory.mktemp("substitute")
    out = {}
    for name, extra in (("off", ()), ("zero", ("--expert-substitute", "0")), ("tiny", ("--expert-substitute", "1e-6")),
                        ("0.1", ("--expert-substitute", "0.1")), ("0.5", ("--expert-substitute", "0.5")),
                        ("full", ("--expert-substitute", "1")),
                        ("full-drop", ("--expert-substitute", "1", "--drop-cold-experts", "1"))):
        r = _run(*STREAM, "-n", 24, *extra, "--csv", d / f"{name}.csv", "--route-trace", d / f"{name}.route.csv")
        assert r.returncode == 0, r.stderr
        out[name] = (r, read_metrics_csv(d / f"{name}.csv"), (d / f"{name}.route.csv").read_text())
    return out


def test_lambda_zero_is_the_run_without_the_flag_and_a_vanishing_margin_changes_nothing(generations):
    off_r, off, off_trace = generations["off"]
    for name in ("zero", "tiny"):
        r, csv, trace = generations[name]
        assert generated(r.stdout) == generated(off_r.stdout), name
        assert csv.summary["read_MiB"] == off.summary["read_MiB"] and csv.summary["cache_hit_pct"] == off.summary[
            "cache_hit_pct"], name
        assert [line for line in trace.splitlines() if line[0].isdigit()] == \
            [line for line in off_trace.splitlines() if line[0].isdigit()], name
    assert generations["zero"][1].summary["experts_reranked"] == 0 and b"moe-substitute:" not in generations["zero"][0].stdout
    tiny = generations["tiny"][1].summary
    assert tiny["experts_reranked"] == 24 * 4 * 2 and tiny["experts_substituted"] == 0   # examined, none changed


def test_the_full_margin_fires_and_never_substitutes_more_than_it_reranked(generations):
    substituted = []
    for name in ("0.1", "0.5", "full", "full-drop"):
        r, csv, trace = generations[name]
        run = parse_console(r.stdout.decode("utf-8", "replace").split("\n\n", 1)[1].splitlines())
        n_sub, n_re = run.value("moe-substitute", "experts_substituted"), run.value("moe-substitute", "experts_reranked")
        assert (n_sub, n_re) == (csv.summary["experts_substituted"], csv.summary["experts_reranked"]), name
        assert 0 <= n_sub <= n_re == 24 * 4 * 2, name
        substituted.append(n_sub)
        rows = [line.split(",") for line in trace.splitlines() if line[0].isdigit()]
        by_cell: dict[tuple[str, ...], list[str]] = {}
        for row in rows:
            by_cell.setdefault(tuple(row[:4]), []).append(row[5])
        assert all(len(set(e)) == len(e) == 2 for e in by_cell.values()), "k distinct experts a routing"
    assert substituted[0] <= substituted[1] <= substituted[2] and substituted[2] > 0
    off = generations["off"][1].summary
    assert generations["full"][1].summary["read_MiB"] < off["read_MiB"]     # fewer of the experts cost a read
    assert generations["full-drop"][1].summary["experts_dropped"] > 0


def test_the_csv_records_the_margin_from_0_24_only(generations, tmp_path):
    _, csv, _ = generations["0.5"]
    assert csv.preamble["substitute_lambda"] == "0.5" and generations["off"][1].preamble["substitute_lambda"] == "0"
    r = _run(*STREAM, "-n", 4, "--csv", tmp_path / "old.csv", claim=False)
    assert r.returncode == 0
    old = read_metrics_csv(tmp_path / "old.csv")
    assert "substitute_lambda" not in old.preamble and "experts_reranked" not in old.summary


# ---- --ppl ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    d = tmp_path_factory.mktemp("ppl")
    (d / "a.txt").write_bytes(TEXT)
    (d / "b.txt").write_bytes(b"Q: which is larger, 2 or 3? A) 2 B) 3\nAnswer:")
    (d / "short.txt").write_bytes(b"x")
    (d / "list.txt").write_bytes(f"{d / 'a.txt'}\n# a comment\n\n{d / 'b.txt'}  \r\n".encode())
    return d


def _n_tokens(text: bytes) -> int:
    """The text's tokens as scored: BOS, then the text, specials not parsed."""
    from engine.gguf.model import load_model_shape
    from engine.gguf.tokenizer import SpmTokenizer

    tokenizer = SpmTokenizer.from_metadata(load_model_shape(TINY).metadata)
    return len(tokenizer.tokenize(text, add_special=True, parse_special=False))


def _ppl(out: bytes) -> dict[str, object]:
    lines = out.decode().splitlines()
    run = parse_console([line for line in lines if line.startswith(("ppl:", "ppl-policy:"))])
    assert run.unparsed == ()
    return {k: run.value(name, k) for name, keys in (("ppl", ("ppl", "ppl_nll", "ppl_hits", "ppl_scored")),
                                                     ("ppl-policy", ("experts_dropped", "experts_routed",
                                                                     "experts_substituted", "experts_reranked")))
            for k in keys}


def test_a_text_is_scored_from_the_ninth_token_and_the_lambda_zero_score_is_the_plain_one(texts, tmp_path):
    plain = _run(*STREAM, "--ppl", texts / "a.txt", "--csv", tmp_path / "p.csv", "--route-trace", tmp_path / "p.route")
    assert plain.returncode == 0, plain.stderr
    got = _ppl(plain.stdout)
    n_tokens = _n_tokens(TEXT)
    assert got["ppl_scored"] == n_tokens - 8 - 1 and 0 <= got["ppl_hits"] <= got["ppl_scored"]
    assert math.isclose(got["ppl"], math.exp(got["ppl_nll"]), rel_tol=1e-4)
    assert got["experts_routed"] == got["experts_reranked"] == 0
    assert (tmp_path / "p.csv").read_bytes() == b""                  # no generation: nothing measured
    assert not [line for line in (tmp_path / "p.route").read_text().splitlines() if line[:1].isdigit()]
    zero = _run(*STREAM, "--ppl", texts / "a.txt", "--expert-substitute", "0")
    assert _ppl(zero.stdout) == got


def test_stepping_arms_the_policies_and_reports_what_they_did(texts):
    step = _run(*STREAM, "--ppl", texts / "a.txt", "--ppl-step", "--expert-substitute", "1", "--drop-cold-experts", "1")
    assert step.returncode == 0, step.stderr
    got = _ppl(step.stdout)
    assert 0 < got["experts_substituted"] <= got["experts_reranked"]
    assert 0 < got["experts_dropped"] < got["experts_routed"]
    # one token a decode: every scored position, and the ones between the prefix and them, decoded
    assert got["experts_reranked"] == (_n_tokens(TEXT) - 8 - 1) * 4 * 2


def test_a_list_scores_each_text_and_choices_get_their_log_probability(texts):
    r = _run(*STREAM, "--ppl-list", texts / "list.txt", "--ppl-choices", "A,B")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    assert [line for line in lines if line.startswith("ppl-file: ")] == [f"ppl-file: {texts / 'a.txt'}",
                                                                        f"ppl-file: {texts / 'b.txt'}"]
    choices = [line for line in lines if line.startswith("ppl-choices:")]
    assert len(choices) == 2 and all(re.fullmatch(r"ppl-choices: A=-\d+\.\d{4} B=-\d+\.\d{4}", c) for c in choices)


@pytest.mark.parametrize(("args", "code", "message"), [
    (("--ppl", "/nonexistent-dir/t.txt"), 2, "bmoe: cannot open --ppl file '/nonexistent-dir/t.txt'"),
    (("--ppl-list", "/nonexistent-dir/l.txt"), 2, "bmoe: cannot open --ppl-list file '/nonexistent-dir/l.txt'"),
])
def test_an_unreadable_file_is_one_line_and_exit_2(args, code, message):
    r = _run(*STREAM, *args)
    assert r.returncode == code and r.stderr.decode().splitlines()[-1] == message and b"ppl:" not in r.stdout


def test_a_text_too_short_is_refused_in_one_line(texts):
    r = _run(*STREAM, "--ppl", texts / "short.txt")
    assert r.returncode == 1
    assert r.stderr.decode().splitlines()[-1] == (f"bmoe: perplexity failed on '{texts / 'short.txt'}': "
                                                  "nothing scored — text shorter than skip + 1")


def test_the_harness_still_makes_no_cell_of_a_ppl_run():
    """--ppl and --ppl-list stay NO_RUN although bmoe-py now takes them: a scoring run writes no
    generation (no CSV rows, no summary), so there is nothing a cell could record."""
    from harness.campaign import flags as rules

    for flag in ("--ppl", "--ppl-list"):
        assert rules.arg_problem(flag) == f"{flag} makes no measurement run"
