"""The checks a community report passes before it counts (docs/decisions/community-import.md).

The first reports upstream received show what goes wrong (Helldez/BigMoeOnEdge issues):
#192's storage probe read 110,752 MiB/s, the page cache and not the drive, and its split model
was reported as 0.0 GiB; #147's first GB10 numbers were plain llama.cpp on mmap, reported as the
engine (#186 says why: without `--moe-stream` the engine does not stream and said nothing;
#187 added the `mode:` line, #190 the rule that such a run is a baseline). Each rule below
rejects with one line naming the value, the bound and where the bound comes from:

- storage: a probe rate above what the device class's flash can read. The bound is the class's
  interface line rate, which no drive of that class exceeds (STORAGE_BOUNDS, each with its source);
- streaming: the engine's own word that the run did not stream: a `mode: mmap` line, the CSV's
  `moe_stream=0`, an end-of-run block with no `moe-stream:` line (#186: it prints only when
  streaming is on), or `o_direct=0` (the expert reads went through the page cache) — unless the
  report labels itself a baseline (#190);
- model-size: a model of 0.0 GiB, or smaller than the expert cache its own run filled or sized
  (bench-report.sh's auto budget is capped at the model's expert bytes: `cap N MiB`);
- tokens: fewer generated tokens than the protocol's (results.analysis.community.COMMUNITY_TOKENS,
  repeated here as PROTOCOL_TOKENS: results.read may not import results.analysis);
- engine: a version upstream never released (RELEASED, from its CHANGELOG.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from engine.units import MIB
from results.read.community_report import CommunityReport
from results.read.parse_console import not_streamed

STORAGE, STREAMING, MODEL_SIZE, TOKENS, ENGINE, UNREADABLE = (
    "storage", "streaming", "model-size", "tokens", "engine", "unreadable")
RULES = (STORAGE, STREAMING, MODEL_SIZE, TOKENS, ENGINE, UNREADABLE)

# upstream's protocol: bench-report.sh's N_PREDICT default and docs/community-benchmarks.md; the same
# number as results.analysis.community.COMMUNITY_TOKENS (tests/results/test_community_checks.py holds them equal)
PROTOCOL_TOKENS = 256

# Releases dated in upstream's CHANGELOG.md: 0.1.0 to 0.20.0 at 2d4f2b1, 0.21.0 to 0.23.0 at 006783f9,
# where 0.24.0 is still "[0.24.0] - unreleased". There was never a 0.2.0.
RELEASED = ("0.1.0", "0.1.1", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "0.8.1", "0.8.2", "0.8.3",
            "0.9.0", "0.9.1", "0.9.2", "0.10.0", "0.11.0", "0.11.1", "0.12.0", "0.13.0", "0.13.1", "0.13.2",
            "0.13.3", "0.13.4", "0.13.5", "0.14.0", "0.15.0", "0.15.1", "0.16.0", "0.17.0", "0.18.0", "0.18.1",
            "0.19.0", "0.20.0", "0.21.0", "0.22.0", "0.23.0")
CHANGELOG_AT = "006783f9"
UNRELEASED = {"0.24.0": "listed as unreleased"}


@dataclass(frozen=True)
class StorageBound:
    device_class: str
    mb_per_s: float            # decimal MB/s, as interfaces and drives are specified
    source: str

    @property
    def mib_per_s(self) -> float:
        return self.mb_per_s * 1e6 / MIB


# The interface's raw line rate, encoding overhead not deducted: a ceiling no drive of the class
# reaches (the fastest parts quote less, given beside it). A 512 KiB O_DIRECT read above it was
# served from RAM.
STORAGE_BOUNDS = {
    "phone": StorageBound("phone (UFS)", 5800.0,
                          "UFS 4.0 (JEDEC JESD220F): 2 lanes x HS-Gear5 23.2 Gb/s = 46.4 Gb/s; the fastest UFS 4.x "
                          "parts quote about 4,200 MB/s sequential read (Samsung UFS 4.0, 2022)"),
    "sata": StorageBound("SATA drive", 750.0,
                         "SATA III: 6 Gb/s; SATA SSDs quote about 560 MB/s"),
    "host": StorageBound("NVMe or other host drive", 16000.0,
                         "PCIe 5.0 x4 (PCI-SIG): 4 lanes x 32 GT/s = 128 Gb/s; the fastest NVMe drives quote about "
                         "14,800 MB/s and laptop PCIe 4.0 drives about 7,000 MB/s"),
}
_PHONE_WORDS = ("phone", "android", "ufs", "snapdragon", "dimensity", "exynos", "tensor g", "pixel")
_RATE_RE = re.compile(r"^~?\s*([0-9][0-9,]*(?:\.[0-9]+)?)\s*MiB/s$")
_VERSION_RE = re.compile(r"(?<![0-9.])v?([0-9]+\.[0-9]+\.[0-9]+)(?![0-9.])")
_SHARD_RE = re.compile(r"-([0-9]+)-of-([0-9]+)\.gguf$")
_MIB_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*MiB$")
_GIB_ROUNDING = 0.05       # bench-report.sh prints the size to 0.1 GiB


@dataclass(frozen=True)
class Rejection:
    rule: str
    reason: str                # one line

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "reason": self.reason}


@dataclass(frozen=True)
class Verdict:
    rejections: tuple[Rejection, ...]
    facts: dict[str, Any]      # what each check read (the provenance keeps it)

    @property
    def accepted(self) -> bool:
        return not self.rejections


def check_report(report: CommunityReport) -> Verdict:
    """Every rule over one report: its rejections (empty: it counts) and the values they read."""
    facts: dict[str, Any] = {}
    out = [Rejection(UNREADABLE, f"unreadable: {p}") for p in report.problems]
    for rule in (_storage, _streaming, _model_size, _tokens, _engine):
        found = rule(report, facts)
        if found is not None:
            out.append(found)
    return Verdict(tuple(out), facts)


def device_class(report: CommunityReport) -> str:
    """phone, sata or host, from what the report says of its machine."""
    said = " ".join([report.field("hardware"), report.field("os"), *report.machine.values()]).lower()
    if any(word in said for word in _PHONE_WORDS):
        return "phone"
    storage = (report.machine.get("Storage") or report.field("hardware")).lower()
    return "sata" if "sata" in storage else "host"


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _storage(report: CommunityReport, facts: dict[str, Any]) -> Rejection | None:
    shown = report.machine.get("Storage read (512 KiB, O_DIRECT)", "").strip()
    m = _RATE_RE.match(shown)
    if not m:
        facts["storage_mib_s"] = None          # n/a: the script's own probe gave up, or no machine table
        return None
    rate = _number(m[1])
    cls = device_class(report)
    bound = STORAGE_BOUNDS[cls]
    facts.update(storage_mib_s=rate, device_class=cls, storage_bound_mib_s=round(bound.mib_per_s))
    if rate is not None and rate > bound.mib_per_s:
        return Rejection(STORAGE, f"storage probe {rate:,.0f} MiB/s is above what a drive of its class ({bound.device_class}) can read "
                                  f"({bound.mib_per_s:,.0f} MiB/s = {bound.mb_per_s:,.0f} MB/s, {bound.source}): "
                                  f"the page cache answered, not the drive")
    return None


def _baseline_label(report: CommunityReport) -> bool:
    said = " ".join([report.field("notes"), report.field("model"), report.field("hardware"),
                     report.run.get("Cache", "")]).lower()
    return "baseline" in said


def _streaming(report: CommunityReport, facts: dict[str, Any]) -> Rejection | None:
    console = report.console
    evidence = None
    if str(report.csv_preamble.get("moe_stream", "")) == "0":      # the CSV's explicit word first
        evidence = "its CSV says moe_stream=0: the run did not stream experts (plain llama.cpp on mmap)"
    elif console is not None:
        evidence = not_streamed(console)
    if evidence is None and str(report.csv_preamble.get("o_direct", "")) == "0":
        evidence = "its CSV says o_direct=0: the expert reads went through the page cache"
    facts["streamed"] = evidence is None
    if evidence is None:
        return None
    if _baseline_label(report):
        facts["baseline"] = True
        return None
    return Rejection(STREAMING, f"reported as the engine, but {evidence}; a baseline is welcome labelled as one "
                                "(upstream #190)")


def _size_floor_mib(report: CommunityReport) -> tuple[float, str] | None:
    """The least the model can weigh, from its own run: the expert cache it sized or filled."""
    floors = []
    if m := _MIB_RE.match(report.run.get("Cache", "").strip()):
        floors.append((float(m[1]), "its run's expert cache held"))
    console = report.console
    if console is not None and console.cache_auto is not None and console.cache_auto.cap_mib:
        floors.append((float(console.cache_auto.cap_mib), "its auto cache was capped at the model's expert bytes,"))
    budget = report.csv_summary.get("cache_budget_MiB")
    if isinstance(budget, (int, float)) and budget > 0:
        floors.append((float(budget), "its CSV's cache budget is"))
    return max(floors) if floors else None


def _mib(value: float) -> str:
    return f"{value:,.1f}".removesuffix(".0")


def _model_size(report: CommunityReport, facts: dict[str, Any]) -> Rejection | None:
    gib_text = report.run_line.get("model_gib")
    if gib_text is None:
        return None
    gib = float(gib_text)
    name = report.run_line.get("model_file", "")
    facts["model_gib"] = gib
    shard = _SHARD_RE.search(name)
    split = f", one of a model split in {int(shard[2])} shards" if shard and int(shard[2]) > 1 else ""
    floor = _size_floor_mib(report)
    if gib == 0:
        why = f" ({floor[1]} {_mib(floor[0])} MiB)" if floor else ""
        return Rejection(MODEL_SIZE, f"model size 0.0 GiB for `{name}`{split}: a size that counts no weights{why}")
    if floor is not None and (gib + _GIB_ROUNDING) * 1024 < floor[0]:
        return Rejection(MODEL_SIZE, f"model size {gib:g} GiB for `{name}`{split}{',' if split else ''} is less "
                                     f"than {floor[1]} {_mib(floor[0])} MiB: the size does not count all its shards")
    return None


def _tokens(report: CommunityReport, facts: dict[str, Any]) -> Rejection | None:
    console = report.console
    said: list[tuple[float, str]] = []
    if console is not None and console.generation is not None:
        said.append((float(console.generation.tokens), "generated (its end-of-run lines)"))
    tokens = report.csv_summary.get("tokens")
    if isinstance(tokens, (int, float)):
        said.append((float(tokens), "generated (its CSV summary)"))
    if "tokens" in report.run_line:
        said.append((float(report.run_line["tokens"]), "asked (its Run line)"))
    if not said:
        facts["tokens"] = None
        return Rejection(TOKENS, f"states no token count: the protocol's {PROTOCOL_TOKENS} cannot be checked")
    count, where = said[0]
    facts["tokens"] = int(count)
    if count < PROTOCOL_TOKENS:
        return Rejection(TOKENS, f"{count:.0f} tokens {where}, under the protocol's {PROTOCOL_TOKENS}")
    return None


def _engine(report: CommunityReport, facts: dict[str, Any]) -> Rejection | None:
    said = [report.run_line.get("engine", ""), str(report.csv_preamble.get("engine", "")), report.field("engine")]
    versions = list(dict.fromkeys(m[1] for text in said for m in _VERSION_RE.finditer(text)))
    facts["engine"] = versions[0] if len(versions) == 1 else versions or None
    if not versions:
        named = report.field("engine") or report.run_line.get("engine", "")
        return Rejection(ENGINE, f"names no engine release{f' ({named!r})' if named else ''}: a commit or a build "
                                 f"of one's own is not a release upstream's CHANGELOG.md lists")
    if len(versions) > 1:
        return Rejection(ENGINE, f"names {len(versions)} engine versions ({', '.join(versions)}): which one ran is "
                                 "not known")
    version = versions[0]
    if version not in RELEASED:
        why = UNRELEASED.get(version, "not among its releases")
        return Rejection(ENGINE, f"engine {version}: upstream's CHANGELOG.md (at {CHANGELOG_AT}) has it {why}; "
                                 f"released: {RELEASED[0]} to {RELEASED[-1]}")
    return None
