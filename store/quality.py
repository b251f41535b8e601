"""Which settings of a cell change what the model writes (the lossy levers), and what a cell is
without them: what a campaign's quality runs compare (docs/decisions/quality-runs.md).

A lever is lossy when it is set to act: `--drop-cold-experts F` with F > 0, `--expert-substitute L`
with L > 0, `--route-ahead N` with N > 0 (the flag table marks each LOSSY: engine/interface/flags.py),
and a top-k (`n_expert_used`) under the model's own (more experts than it was trained with is
slower, not a lever anyone pulls to go faster). `--drop-no-renorm` and `--drop-in-prefill`
change only how a drop acts, so they go with the drop flag: a cell without the levers has neither.
A lever may be set by an `[axes.flags]` axis (`engine_flags`) or in `run.engine_args`.

Both sides read it: the planner (harness.plan.grid) to resolve `run.quality = "auto"` and to add a
group's lossless reference cell, the results to find, for a lossy cell, the lossless cells of its
group (`quality_group`: the settings that change the text, the levers left out).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from engine.interface.flags import (
    DROP_COLD_EXPERTS,
    DROP_IN_PREFILL,
    DROP_NO_RENORM,
    EXPERT_SUBSTITUTE,
    ROUTE_AHEAD,
    spellings,
)
from store.cells import CellConfig

LEVERS = (DROP_COLD_EXPERTS, EXPERT_SUBSTITUTE, ROUTE_AHEAD)    # each lossy with a value above 0
COMPANIONS = (DROP_NO_RENORM, DROP_IN_PREFILL)                 # how a drop acts: nothing alone
TOP_K = "n_expert_used"                                        # the lever that is an axis, as lossy_levers names it
_LEVER = {s: f for f in LEVERS for s in f.spellings}
_ALL = frozenset(spellings(LEVERS + COMPANIONS))


def acts(value: Any) -> bool:
    """Whether a lever's value (an `[axes.flags]` value, or the argv word after it) sets it to act.
    False leaves the flag out; a value that is no finite number (the flag alone, `nan`, a word) is
    not known to be lossless, so it counts as lossy."""
    if value is False or value is None:
        return False
    if value is True:
        return True
    try:
        number = float(value)
    except (TypeError, ValueError):
        return True
    return not math.isfinite(number) or number > 0


def _args_levers(args: Sequence[str]) -> list[tuple[str, Any]]:
    """(lever, its value) for every lever in an argv fragment (run.engine_args), in order."""
    out = []
    for i, word in enumerate(args):
        lever = _LEVER.get(word)
        if lever is not None:
            out.append((lever.name, args[i + 1] if i + 1 < len(args) else True))
    return out


def lossy_levers(config: CellConfig, own_top_k: int | None) -> tuple[str, ...]:
    """The lossy levers a cell sets to act: flag names, and TOP_K when its top-k is under the model's
    own (`own_top_k`; None: the model has none to compare with). Empty: the cell is lossless."""
    found = [name for name, value in _args_levers(config.engine_args) if acts(value)]
    found += [name for name, value in config.engine_flags.items() if name in _LEVER and acts(value)]
    if own_top_k and config.n_expert_used and config.n_expert_used < own_top_k:
        found.append(TOP_K)
    return tuple(dict.fromkeys(found))


def args_without_levers(args: Sequence[str]) -> tuple[str, ...]:
    """run.engine_args without the levers (each with its value) and the drop's companions."""
    out: list[str] = []
    skip = False
    for word in args:
        if skip:
            skip = False
        elif word in _LEVER:
            skip = True
        elif word not in _ALL:
            out.append(word)
    return tuple(out)


def flags_without_levers(flags: Mapping[str, Any]) -> dict[str, Any]:
    """An `[axes.flags]` setting without the levers and the drop's companions."""
    return {name: value for name, value in flags.items() if name not in _ALL}


def quality_group(config: CellConfig) -> str:
    """What, besides the device, model and engine, decides the text a lossless run writes: the
    prompt, the tokens, the turns, the other apps' setting and every flag that is no lever. Cells
    with the same group and no lossy lever write the same text; a lossy cell is scored against them."""
    return json.dumps({"prompt": config.prompt, "n_predict": config.n_predict, "turns": config.turns,
                       "apps": config.apps, "engine_args": list(args_without_levers(config.engine_args)),
                       "engine_flags": flags_without_levers(config.engine_flags)}, sort_keys=True)
