"""Group the files of one engine run so an importer can turn each group into one run.

Upstream writes one run as `<stem>.csv` + `<stem>.metrics` + `<stem>.log` (bench-run.sh),
`<stem>.out`/`.err` (shell redirection), `<stem>.route.csv`, `<stem>.state`. Two irregularities
are handled here rather than in every importer:

- a `.metrics` file is usually the pressure sidecar, but 2026-07-15 used the name for the
  per-token CSV: the content decides;
- a multi-run capture (`gptoss-matrix.out`, the 2026-07-17 driver logs) holds several runs behind
  `==== TAG ====` separators. It is not a run itself: each of its sections joins the group whose
  stem is the tag (or ends with `_TAG`, as `gptoss_mmap_k2.csv` for section `mmap_k2`), or forms a
  group of its own when no file shares the tag.

A bmoe-fleet campaign directory inside the folder (one of store.names.CAMPAIGN_MARKERS — its
plan, ledger or campaign file — beside its files: an import's own output, a sweep kept with the
data) holds this project's runs, not upstream's: discover() skips it whole, and campaign_dirs()
lists them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from results.read.parse_config import run_stem
from results.read.parse_console import END_TAGS, SEPARATOR_RE, read_console_runs, run_starts
from results.read.parse_csv import looks_like_metrics_csv
from results.read.parse_text import ParseError, read_lines
from store.names import CAMPAIGN_MARKERS, is_campaign_dir

_KIND_BY_SUFFIX = ((".route.csv", "route_trace"), (".csv", "csv"), (".metrics", "metrics"), (".log", "log"),
                   (".out", "out"), (".err", "err"), (".state", "state"))


@dataclass(frozen=True)
class RunFiles:
    """The files of one upstream engine run."""

    folder: Path
    stem: str
    csv: Path | None = None  # the per-token metrics CSV (whatever its suffix)
    sidecar: Path | None = None  # bench-run.sh pressure key=value file
    log: Path | None = None
    out: Path | None = None
    err: Path | None = None
    route_trace: Path | None = None
    state: Path | None = None
    capture: Path | None = None  # a multi-run capture holding this run's console output
    section: str | None = None  # the separator tag of that section in `capture`


def campaign_dirs(folder: str | Path) -> list[Path]:
    """The campaign directories at or under `folder` (outermost only), sorted."""
    root = Path(folder)
    found = [root] if is_campaign_dir(root) else []
    found += [p.parent for marker in CAMPAIGN_MARKERS for p in root.rglob(marker) if p.is_file()]
    found = sorted(set(found))
    return [d for d in found if not any(other in d.parents for other in found)]


def source_files(folder: str | Path, exclude: Iterable[str | Path] = ()) -> list[Path]:
    """The files under `folder` (subfolders included), sorted, but those under the `exclude`
    folders and under campaign directories: those are not upstream runs."""
    root = Path(folder)
    if not root.is_dir():
        raise ParseError(f"{root}: not a folder")
    skipped = {Path(p) for p in exclude} | set(campaign_dirs(root))
    return [p for p in sorted(root.rglob("*")) if p.is_file() and (not skipped or skipped.isdisjoint(p.parents))]


def discover(folder: str | Path, exclude: Iterable[str | Path] = (), skip: Iterable[Path] = ()) -> list[RunFiles]:
    """Every run under `folder` (source_files), sorted by folder then stem. `skip`: files another
    reader took (results.read.parse_session's session captures), not one-shot runs."""
    taken = set(skip)
    groups: dict[tuple[Path, str], RunFiles] = {}
    captures: list[Path] = []
    for path in source_files(folder, exclude):
        if path in taken:
            continue
        kind = _kind(path)
        if kind is None:
            continue
        if kind in ("log", "out", "err") and _is_multi_run(path):
            captures.append(path)
            continue
        key = (path.parent, run_stem(path))
        group = groups.get(key) or RunFiles(folder=path.parent, stem=key[1])
        if getattr(group, kind) is not None:
            raise ParseError(f"{path}: run {key[1]} already has a {kind} file ({getattr(group, kind).name})")
        found: dict[str, Any] = {kind: path}
        groups[key] = replace(group, **found)
    suffixed: dict[tuple[Path, str], list[tuple[Path, str]]] = {}   # (folder, tag) -> the keys ending in _tag
    for key in groups:
        _index_suffixes(suffixed, key)
    for capture in captures:
        for run in read_console_runs(capture):
            if run.tag is None:
                continue
            key = _owner(groups, suffixed, capture.parent, run.tag)
            group = groups.get(key) or RunFiles(folder=capture.parent, stem=run.tag)
            if group.capture is not None:
                raise ParseError(f"{capture}: run {run.tag} is also in {group.capture.name}")
            if key not in groups:
                _index_suffixes(suffixed, key)
            groups[key] = replace(group, capture=capture, section=run.tag)
    return [groups[key] for key in sorted(groups, key=lambda k: (str(k[0]), k[1]))]


def _kind(path: Path) -> str | None:
    for suffix, kind in _KIND_BY_SUFFIX:
        if path.name.endswith(suffix):
            if kind == "metrics":
                return "csv" if looks_like_metrics_csv(read_lines(path)[0]) else "sidecar"
            return kind
    return None


def _is_multi_run(path: Path) -> bool:
    """Separators, or several runs printed one after the other (results.read.parse_console.run_starts)."""
    lines = read_lines(path)[0]
    return any((m := SEPARATOR_RE.match(line)) and m[1] not in END_TAGS for line in lines) or \
        len(run_starts(lines)) > 1


def _index_suffixes(suffixed: dict[tuple[Path, str], list[tuple[Path, str]]], key: tuple[Path, str]) -> None:
    """Index a group under every tail of its stem after an underscore (a_b_c: b_c and c), so a
    section finds its owner in one look-up, not a scan of every group (linear import)."""
    folder, stem = key
    at = stem.find("_")
    while at >= 0:
        suffixed.setdefault((folder, stem[at + 1:]), []).append(key)
        at = stem.find("_", at + 1)


def _owner(groups: dict[tuple[Path, str], RunFiles], suffixed: dict[tuple[Path, str], list[tuple[Path, str]]],
           folder: Path, tag: str) -> tuple[Path, str]:
    """The group a section belongs to: the stem equal to its tag, else the one stem ending in
    `_<tag>` (a driver that prefixed the model to its file names), else a group of its own."""
    if (folder, tag) in groups:
        return folder, tag
    owners = suffixed.get((folder, tag), [])
    return owners[0] if len(owners) == 1 else (folder, tag)
