"""The code cites its measurement rules and habits by file and number ("docs/method.md rule 4"):
every cited file is in the repository and every cited rule is one of its numbered rules."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("engine", "devices", "store", "harness", "results", "benchmarks", "templates")
_CITATION = re.compile(r"\b((?:docs/)?(?:method|style)\.md)\b(?: rules? (\d+)(?:\s*(-|and)\s*(\d+))?)?")


def _citations() -> list[tuple[str, str, list[int]]]:
    found = []
    for package in SOURCES:
        for path in sorted((ROOT / package).rglob("*")):
            if path.suffix not in (".py", ".html", ".js"):
                continue
            text = " ".join(path.read_text(encoding="utf-8").split())     # a citation may wrap
            for m in _CITATION.finditer(text):
                rules = [int(n) for n in (m[2], m[4]) if n]
                if m[3] == "-":                                           # rules 1-2
                    rules = list(range(rules[0], rules[1] + 1))
                found.append((str(path.relative_to(ROOT)), m[1], rules))
    return found


def _numbered_rules(doc: Path) -> set[int]:
    return {int(n) for n in re.findall(r"^(\d+)\. \*\*", doc.read_text(encoding="utf-8"), re.M)}


def test_every_cited_rule_is_in_docs():
    citations = _citations()
    assert len(citations) >= 8                  # gate, classify, plan, analyze, tokens, pages, …
    rules = _numbered_rules(ROOT / "docs/method.md")
    assert rules == set(range(1, len(rules) + 1)) and len(rules) >= 10
    for where, doc, cited in citations:
        assert doc.startswith("docs/"), f"{where} cites {doc}: name it docs/{doc}"
        assert (ROOT / doc).is_file(), f"{where} cites {doc}, which is not in the repository"
        if doc == "docs/method.md":
            assert set(cited) <= rules, f"{where} cites rule {cited} of docs/method.md, which has {sorted(rules)}"
