"""What a run generated, set against a lossless run of the same question: the quality columns of the
run table (docs/results.md, "Quality"; docs/decisions/quality-measure.md).

The lossy levers change the output: `--drop-cold-experts F`, `--expert-substitute L`,
`--route-ahead N`, and a top-k (`n_expert_used`) under the model's own. A run's **reference** is an
ok run without any of them (`lossy_levers` empty) that asked the same question: same device, model,
engine version, prompt, n_predict, turns, other apps, and the same flags once the lossy ones are
left out (reference_key). Among several, one marked `quality_reference: true` in its config wins,
else the lowest attempt, then the earliest start. The other lossless runs of that key are held to
the chosen one: each whose output differs is named in `quality_ref_conflict`, a finding (greedy
decoding should repeat itself), never dropped.

Outputs are compared token by token, a token being one `--progress` decode step's `delta_text`
bytes (results.read.parse_console.progress_deltas). bmoe-cli prints no token ids, so two tokens
with the same bytes count as the same token. Without `--progress` lines only the answer's bytes can
be compared: `agree_identical` is still known, `agree_tokens` is not (NaN).

The perplexity a run's flags give a fixed text is read from its `ppl:` line: the run's own output,
else `ppl.txt` beside it (the stdout of a `--ppl TEXT` scoring run with the run's flags, which a
quality campaign keeps at a release of 0.24 or later); `ppl_loss_pct` = 100 × (ppl / the
reference's ppl − 1).
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from engine.contract.flags import flags_text
from engine.interface.flags import flag as flag_of
from results.numbers import to_float
from results.read.frames import row_views
from results.read.run_keys import text_of
from results.read.rundir import RunFolder
from store import names, outcomes
from store.cells import CellConfig
from store.names import PPL_TXT
from store.quality import LEVERS, args_without_levers, flags_without_levers, quality_group

# each lever's run-table column (the CSV preamble's key: bmoe-py's field, else the flag's name) by flag,
# and the word a person reads for it
_LEVER_COLUMNS = {f.name: f.field or f.name.lstrip("-").replace("-", "_") for f in LEVERS}
_LEVER_WORDS = {"drop_cold_frac": "drop", "substitute_lambda": "substitute", "route_ahead": "route-ahead"}

# the quality columns, each name written here once (docs/results.md lists them)
LOSSY_LEVERS = "lossy_levers"              # the levers a run pulled, in words ("" lossless)
OUTPUT_TOKENS = "output_tokens"            # its --progress decode steps (NaN without --progress)
QUALITY_REF_CELL = "quality_ref_cell"      # the reference's cell id ("" none)
QUALITY_REF_RUN = "quality_ref_run"        # the reference's run id ("" none)
QUALITY_REF_CONFLICT = "quality_ref_conflict"   # lossless runs of the same question whose output differs
AGREE_TOKENS = "agree_tokens"              # tokens equal to the reference's before the first that differs
AGREE_FRAC = "agree_frac"                  # agree_tokens / the longer of the two outputs' token counts
AGREE_IDENTICAL = "agree_identical"        # the whole output identical (None: not comparable)
PPL_LOSS_PCT = "ppl_loss_pct"              # 100 × (ppl / the reference's − 1)
COLUMNS = (LOSSY_LEVERS, OUTPUT_TOKENS, QUALITY_REF_CELL, QUALITY_REF_RUN, QUALITY_REF_CONFLICT, AGREE_TOKENS,
           AGREE_FRAC, AGREE_IDENTICAL, PPL_LOSS_PCT)


@dataclass(frozen=True)
class RunOutput:
    """What one run generated: each decode step's bytes (None without --progress lines) and the
    answer section's bytes (None when not printed)."""

    tokens: tuple[bytes, ...] | None
    text: bytes | None

    @property
    def known(self) -> bool:
        """Something to compare."""
        return self.tokens is not None or self.text is not None

    def to_json(self) -> str:
        """As JSON text, each byte string as latin-1 (one code point per byte: lossless)."""
        return json.dumps({"tokens": None if self.tokens is None else [t.decode("latin-1") for t in self.tokens],
                           "text": None if self.text is None else self.text.decode("latin-1")})

    @classmethod
    def from_json(cls, text: str | None) -> RunOutput:
        """to_json's text back (NO_OUTPUT for none or a text that does not read)."""
        try:
            doc = json.loads(text) if text else None
        except ValueError:
            return cls(None, None)
        if not isinstance(doc, dict):
            return cls(None, None)
        tokens, answer = doc.get("tokens"), doc.get("text")
        return cls(None if not isinstance(tokens, list) else tuple(str(t).encode("latin-1") for t in tokens),
                   answer.encode("latin-1") if isinstance(answer, str) else None)


NO_OUTPUT = RunOutput(None, None)


def read_output(run: RunFolder) -> RunOutput:
    """A run's generated bytes, from its raw stdout.txt."""
    from results.read.parse_console import answer_bytes, progress_deltas

    path = run.file(names.STDOUT_TXT)
    if path is None:
        return NO_OUTPUT
    try:
        raw = path.read_bytes()
    except OSError:
        return NO_OUTPUT
    return RunOutput(progress_deltas(raw), answer_bytes(raw))


def read_ppl(run: RunFolder) -> dict[str, Any]:
    """The `ppl:` line's values of the run's scoring stdout (PPL_TXT), by field; {} when there is
    none or it does not read."""
    from results.read.parse_console import parse_console
    from results.read.parse_text import NumberError, ParseError, read_lines

    path = run.file(PPL_TXT)
    if path is None:
        return {}
    try:
        console = parse_console(read_lines(path)[0], (str(path),))
    except (ParseError, NumberError, ValueError):
        return {}
    return dict(console.values.get("ppl") or {})


# ── levers and the question a run asked ──────────────────────────────────────────────────────


def _config(row: Mapping[str, Any]) -> dict[str, Any]:
    """run.json's typed configuration as the run table keeps it (`config`, a CellConfig); {} without one."""
    config = row.get("config")
    return config.to_dict() if isinstance(config, CellConfig) else {}


def _takes_value(spelling: str) -> bool:
    try:
        return flag_of(spelling).takes_value
    except KeyError:
        return False


def _typed(row: Mapping[str, Any]) -> CellConfig:
    """The run's CellConfig (the table's `config`); without one, the config of no keys."""
    config = row.get("config")
    return config if isinstance(config, CellConfig) else CellConfig.from_dict({})


def _flag_values(row: Mapping[str, Any]) -> dict[str, Any]:
    """The flags a run's config passed (axes.flags values and engine_args), by spelling."""
    config = _typed(row)
    out: dict[str, Any] = {str(k): v for k, v in config.engine_flags.items() if v is not False}
    args = [str(a) for a in config.engine_args]
    for i, a in enumerate(args):
        if a.startswith("-"):
            out[a] = args[i + 1] if _takes_value(a) and i + 1 < len(args) else True
    return out


def lossy_levers(row: Mapping[str, Any], top_k: bool = True) -> str:
    """The lossy levers a run pulled, in words ("drop 0.75, top-k 1 of 2"); "" for a lossless run.
    A lever's value is the engine's own (the CSV preamble's), else the flag's as the config passed
    it; 0 is off. A top-k counts when it is under the model's own (`model_top_k`); `top_k=False`
    leaves it out (the analysis groups runs by top-k: there the flags alone set a setting apart)."""
    flags = _flag_values(row)
    parts = []
    for flag, column in _LEVER_COLUMNS.items():
        value = to_float(row.get(column))
        if math.isnan(value):
            value = to_float(flags.get(flag))
        if not math.isnan(value) and value != 0:
            parts.append(f"{_LEVER_WORDS.get(column, flag)} {value:g}")
    k, own = to_float(row.get("n_expert_used")), to_float(row.get("model_top_k"))
    if top_k and not math.isnan(k) and not math.isnan(own) and 0 < k < own:
        parts.append(f"top-k {k:g} of {own:g}")
    return ", ".join(parts)


def question_flags(row: Mapping[str, Any]) -> str:
    """A run's flags ([axes.flags] and engine_args) without the levers, in words: the same for a run
    and its reference (store.quality.flags_without_levers, args_without_levers)."""
    config = _typed(row)
    return f"{flags_text(flags_without_levers(config.engine_flags))} | {shlex.join(args_without_levers(config.engine_args))}"


def reference_key(row: Mapping[str, Any]) -> tuple[str, ...]:
    """What makes two runs the same question: device, model, engine, and the group a lossless cell
    shares with lossy ones (store.quality.quality_group: prompt, n_predict, turns, other apps and the
    flags that are no lever)."""
    try:
        group = quality_group(_typed(row))
    except (TypeError, ValueError):
        group = json.dumps(_config(row), sort_keys=True, default=str)
    return tuple(text_of(row.get(c)) for c in ("device", "model", "engine")) + (group,)


def is_reference_marked(row: Mapping[str, Any]) -> bool:
    """The campaign marked the run as its question's reference (`quality_reference: true`)."""
    value = row.get("quality_reference")
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return value is True


# ── comparing ────────────────────────────────────────────────────────────────────────────────


def agreement(run: RunOutput, ref: RunOutput) -> tuple[float, float, bool | None]:
    """(agree_tokens, agree_frac, identical) of a run's output against its reference's. Tokens: the
    leading decode steps whose bytes are equal (all of them when identical); NaN when either side
    has no --progress lines. Identical: by tokens where both have them, else by the answer bytes;
    None when neither can say."""
    if run.tokens is not None and ref.tokens is not None:
        n = 0
        for a, b in zip(run.tokens, ref.tokens):
            if a != b:
                break
            n += 1
        longest = max(len(run.tokens), len(ref.tokens))
        identical = run.tokens == ref.tokens
        return float(n), (n / longest if longest else 1.0), identical
    if run.text is not None and ref.text is not None:
        return math.nan, math.nan, run.text == ref.text
    return math.nan, math.nan, None


def _same(a: RunOutput, b: RunOutput) -> bool | None:
    return agreement(a, b)[2]


def _ppl(row: Mapping[str, Any]) -> float:
    x = to_float(row.get("ppl"))
    return x if not math.isnan(x) and x > 0 else math.nan


def quality_columns(frame: pd.DataFrame, outputs: Mapping[str, RunOutput]) -> pd.DataFrame:
    """The run table with the quality columns (COLUMNS), each run set against its reference;
    `outputs` are the ok runs' outputs by run id (read_output)."""
    rows = row_views(frame)
    levers = [lossy_levers(r) for r in rows]
    keys = [reference_key(r) for r in rows]
    candidates: dict[tuple[str, ...], list[int]] = {}
    for i, r in enumerate(rows):
        if r.get("outcome") == outcomes.OK and not levers[i] and outputs.get(str(r["run_id"]), NO_OUTPUT).known:
            candidates.setdefault(keys[i], []).append(i)

    def order(i: int) -> tuple:
        r = rows[i]
        started = to_float(r.get("started_at"))
        return (not is_reference_marked(r), outputs[str(r["run_id"])].tokens is None,
                int(r.get("attempt") or 0), math.inf if math.isnan(started) else started, str(r["run_id"]))

    chosen: dict[tuple[str, ...], int] = {}
    conflicts: dict[tuple[str, ...], str] = {}
    for key, idx in candidates.items():
        ref = min(idx, key=order)
        chosen[key] = ref
        ref_out = outputs[str(rows[ref]["run_id"])]
        differ = [str(rows[i]["run_id"]) for i in idx if i != ref and _same(outputs[str(rows[i]["run_id"])], ref_out)
                  is False]
        if differ:
            conflicts[key] = f"{len(differ)} lossless run(s) differ from {rows[ref]['run_id']}: " + ", ".join(differ)

    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    for i, r in enumerate(rows):
        out = outputs.get(str(r["run_id"]), NO_OUTPUT)
        ref_i = chosen.get(keys[i]) if r.get("outcome") == outcomes.OK else None
        cols[LOSSY_LEVERS].append(levers[i])
        cols[OUTPUT_TOKENS].append(float(len(out.tokens)) if out.tokens is not None else math.nan)
        cols[QUALITY_REF_CONFLICT].append(conflicts.get(keys[i], ""))
        if ref_i is None or not out.known:
            for c in (QUALITY_REF_CELL, QUALITY_REF_RUN):
                cols[c].append("")
            for c in (AGREE_TOKENS, AGREE_FRAC, PPL_LOSS_PCT):
                cols[c].append(math.nan)
            cols[AGREE_IDENTICAL].append(None)
            continue
        ref_row = rows[ref_i]
        tokens, frac, identical = agreement(out, outputs[str(ref_row["run_id"])])
        cols[QUALITY_REF_CELL].append(str(ref_row.get("cell_id") or ""))
        cols[QUALITY_REF_RUN].append(str(ref_row["run_id"]))
        cols[AGREE_TOKENS].append(tokens)
        cols[AGREE_FRAC].append(frac)
        cols[AGREE_IDENTICAL].append(identical)
        mine, theirs = _ppl(r), _ppl(ref_row)
        cols[PPL_LOSS_PCT].append(100.0 * (mine / theirs - 1) if not math.isnan(mine) and not math.isnan(theirs)
                                  else math.nan)
    return frame.assign(**cols)


def outputs_of(runs: Sequence[tuple[RunFolder, str]]) -> dict[str, RunOutput]:
    """The outputs of the runs given as (folder, outcome): only ok runs are compared."""
    return {run.run_id: read_output(run) for run, outcome in runs if outcome == outcomes.OK}
