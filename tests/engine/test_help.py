"""bmoe-py's `--help` against the flag table (engine.interface.flags), at every release it can
claim (BMOE_PY_RELEASE, engine.contract.claim): it names every flag the parser takes there and no
other, and the bmoe-cli flags of that release it refuses."""

from __future__ import annotations

import re

import pytest

from engine.app.cli import run
from engine.contract import claim
from engine.contract.config import UsageExit, parse_args
from engine.interface import flags as table
from engine.interface.releases import NEXT, RELEASES

CLAIMABLE = [r for r in RELEASES if claim.DEFAULT <= r <= NEXT]
# an option line: `  -m, --model PATH  …` or `      --plan, --plan-only  …`
_OPTION = re.compile(r"^  (?:(-\w), |    )(--[a-z][\w-]*(?:, --[a-z][\w-]*)*)", re.MULTILINE)
_VALUE = {table.INT: "1", table.U32: "1", table.FLOAT: "0.5", table.TEXT: "hi", table.PATH: "/nonexistent/x",
          table.MIB_OR_AUTO: "auto", table.TOKENS: "1,2", table.LIST: "a,b"}


def help_text(release, capsys) -> str:
    assert run(["--help"], {claim.CLAIM_ENV: str(release)}) == 0
    return capsys.readouterr().out


def listed(text: str) -> tuple[set[str], set[str]]:
    """(the flags the option lines name, the flags the help says are refused)."""
    options = {s for short, longs in _OPTION.findall(text) for s in ([short] if short else []) + longs.split(", ")}
    refused = " ".join(text.split("refused as unknown:", 1)[1].split()) if "refused as unknown:" in text else ""
    return options, {s for s in refused.split(", ") if s}


def parses(spelling: str, release) -> bool:
    """Whether bmoe-py at `release` takes `spelling` (anything but `unknown arg`)."""
    f = table.flag(spelling)
    argv = ["-m", "x.gguf", spelling] + ([f.choices[0] if f.choices else _VALUE[f.value]] if f.takes_value else [])
    try:
        parse_args(argv, {claim.CLAIM_ENV: str(release)})
    except UsageExit as e:
        return not str(e).startswith("unknown arg:")
    return True


@pytest.mark.parametrize("release", CLAIMABLE, ids=str)
def test_help_names_every_flag_bmoe_py_takes_at_the_claimed_release(release, capsys):
    text = help_text(release, capsys)
    options, refused = listed(text)
    declared = set(table.spellings(table.taken_by(table.BMOE_PY, release)))
    assert options == declared, (f"at {release}: not in --help {sorted(declared - options)}, "
                                 f"in --help but not taken {sorted(options - declared)}")
    assert refused == set(table.refused_by_bmoe_py(release))
    assert f"Speaks bmoe-cli {release}'s flags" in text
    # the parser takes exactly what the help lists: every bmoe-py flag of a later release is unknown
    for spelling in table.spellings(f for f in table.FLAGS if f.bmoe_py):
        assert parses(spelling, release) == (spelling in options), f"{spelling} at {release}"


def test_the_planners_flags_are_in_the_help_only_where_claimed(capsys):
    """The planner (after 0.24) shows at NEXT with its aliases, and not at the default claim."""
    planner = {"--auto", "--plan-run", "--plan", "--plan-only", "--plan-explain", "--probe-io", "--no-probe-io"}
    assert planner <= listed(help_text(NEXT, capsys))[0]
    assert not planner & listed(help_text(claim.DEFAULT, capsys))[0]


def test_an_unknown_flag_prints_the_claimed_releases_usage(capsys):
    assert run(["-m", "x.gguf", "--frobnicate"], {claim.CLAIM_ENV: str(NEXT)}) == 1
    out, err = capsys.readouterr()
    assert err == "unknown arg: --frobnicate\n" and "--plan-explain" in listed(out)[0]
