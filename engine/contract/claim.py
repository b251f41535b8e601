"""The bmoe-cli release bmoe-py speaks, and what changes with it (docs/decisions/release-claim.md).

bmoe-py is held byte for byte to the real 0.19.0 build (the 0.20.0 source) on everything that build
defines, so that is the release it claims by default. `BMOE_PY_RELEASE=0.21` (… `0.25`, NEXT: what
upstream has after 0.24.0) makes it speak a newer contract where the two agree:

- from 0.21, `cache_cycle_mb` in the CSV preamble is an integer rounded up, as upstream writes it
  (bmoe-py wrote it with one decimal before upstream had it), and the cycle warning is upstream's
  own line (the seed's words on one line, not two);
- from 0.24, `--expert-substitute` and the `--ppl` family are taken (engine.interface.flags), and the
  CSV records the substitution (`substitute_lambda`, `experts_reranked`, `experts_substituted`:
  `written`);
- after 0.24 (NEXT), every run prints a `mode:` line after `prefill:` (cli/main.cpp, the store's
  newest version: "mode: expert streaming, cache 230 MiB, dense anon" or "mode: mmap. Expert
  streaming is OFF …"), and `--moe-stream` without `--cache-mb` (nor BMOE_CACHE_MB) sizes the cache
  automatically, as `--cache-mb auto` does (upstream #186).

A claim shows in `--version` (`bmoe-py 0.1.0 (bmoe-cli 0.25.0)`) and in the preamble's `# engine=`
(`bmoe-py-0.1.0+bmoe-cli-0.25.0`); at the default both stay exactly as they were. An env variable,
not a flag: a flag would be one more thing bmoe-cli says `unknown arg` to.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from engine.interface import outputs
from engine.interface.releases import NEXT, V0_19, V0_21, Release
from engine.stream.budget import cycle_mb_of
from engine.units import MIB

CLAIM_ENV = "BMOE_PY_RELEASE"
DEFAULT = V0_19
_CLAIMED_IN = re.compile(r"\(bmoe-cli ([0-9]+\.[0-9]+(?:\.[0-9]+)?)\)|\+bmoe-cli-([0-9]+\.[0-9]+(?:\.[0-9]+)?)")


def claimed(environ: Mapping[str, str]) -> Release:
    """The release bmoe-py claims (BMOE_PY_RELEASE, else 0.19.0). ValueError names a bad value."""
    text = environ.get(CLAIM_ENV, "")
    if not text:
        return DEFAULT
    try:
        release = Release.parse(text)
    except ValueError:
        raise ValueError(f"{CLAIM_ENV}={text!r} is not a bmoe-cli release (e.g. 0.21 or 0.25)") from None
    if release < DEFAULT or release > NEXT:
        raise ValueError(f"{CLAIM_ENV}={text!r}: bmoe-py speaks bmoe-cli {DEFAULT} to {NEXT} (NEXT: after 0.24)")
    return release


def version_line(version: str, release: Release) -> str:
    return f"bmoe-py {version}" if release == DEFAULT else f"bmoe-py {version} (bmoe-cli {release})"


def engine_name(version: str, release: Release) -> str:
    """The preamble's `# engine=` value."""
    return f"bmoe-py-{version}" if release == DEFAULT else f"bmoe-py-{version}+bmoe-cli-{release}"


def release_of(engine: str) -> Release | None:
    """The release a bmoe-py version line or engine name claims (None: none claimed)."""
    m = _CLAIMED_IN.search(engine)
    return Release.parse(m[1] or m[2]) if m else None


def written(place: str, name: str, release: Release) -> bool:
    """Whether the claimed release writes that output (engine.interface.outputs: from 0.24 the
    preamble's `substitute_lambda`, the summary's `experts_reranked` and `experts_substituted`)."""
    return any(o.name == name for o in outputs.outputs(place, release))


def cycle_text(cycle_bytes: int, release: Release) -> str:
    """`cache_cycle_mb` as the claimed release writes it."""
    return str(cycle_mb_of(cycle_bytes)) if release >= V0_21 else f"{cycle_bytes / MIB:.1f}"


def cycle_warning_one_line(release: Release) -> bool:
    """The cycle warning on one line, upstream's own from 0.21 (bmoe-py's before: the seed's two)."""
    return release >= V0_21


def auto_when_alone(release: Release) -> bool:
    """`--moe-stream` without a budget means auto (after 0.24)."""
    return release >= NEXT


def mode_line(release: Release, moe_stream: bool, cache_auto: bool, cache_mb: int, dense_weights: str,
              arch: str) -> str:
    """The `mode:` line (after 0.24), "" for an older release. bmoe-py has no overlap and loads
    only MoE architectures it streams, so its mmap line is always the baseline one."""
    if release < NEXT:
        return ""
    if moe_stream:
        cache = "cache auto" if cache_auto else f"cache {cache_mb} MiB" if cache_mb > 0 else "cache off"
        return f"mode: expert streaming, {cache}, dense {dense_weights}"
    return (f"mode: mmap. Expert streaming is OFF on a MoE model ({arch}), so this run is a baseline, not this "
            "engine: add --moe-stream --overlap to stream the routed experts from flash.")
