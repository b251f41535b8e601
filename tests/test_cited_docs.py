"""The code cites its measurement rules and habits by file and number ("docs/method.md rule 4"):
every cited file is in the repository and every cited rule is one of its numbered rules. Docs and
comments cite code, tests, sources and lab notes, never a tracker's numbers; every repository path
they name exists; every decision page is indexed (docs/decisions/doc-citations.md)."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
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


# ── docs cite the code, tests and sources, never a tracker; every path they name exists ─────────

_TEXT_SUFFIXES = (".md", ".py", ".c", ".h", ".html", ".js", ".css", ".toml", ".sh", ".yaml", ".yml", ".json")
_SKIP_DIRS = ("tests/fixtures/",)        # inputs copied from upstream and earlier releases, kept as they were


def _repo_files() -> list[str]:
    """The repository's files: tracked ones that still exist and new ones git does not ignore
    (`git ls-files -co --exclude-standard`), or, where there is no git, a walk that skips hidden
    folders (but .ci), caches and build folders."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                             capture_output=True, check=True).stdout.decode()
        names = [n for n in out.split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = []
        for path in ROOT.rglob("*"):
            rel = path.relative_to(ROOT).as_posix()
            parts = rel.split("/")
            if any((p.startswith(".") and p != ".ci") or p == "__pycache__" or p.endswith(".egg-info")
                   for p in parts[:-1]) or not path.is_file():
                continue
            names.append(rel)
    return sorted(n for n in names if (ROOT / n).is_file() and not n.startswith(_SKIP_DIRS))


def _text_files() -> list[str]:
    return [n for n in _repo_files() if n.endswith(_TEXT_SUFFIXES) or n.startswith(".ci/")]


# A tracker's numbers: the words issue, session or item (or their plurals) before a number (a space,
# a hyphen or a hash between), the tracker's acceptance points ("done" and "when" hyphenated), and a
# helper's tag in brackets (an H and a digit). The samples below are split so this file does not match.
_TRACKER = re.compile(r"\b(?:issues?|sessions?|items?)(?:\s+|-)#?\d+|\bissue\s*#\d+|\bdone-when\b", re.I)
_HELPER_TAG = re.compile(r"[(;,]\s*H[1-9]\s*[);,]")


def tracker_citations(text: str) -> list[tuple[int, str]]:
    """(line, what) for every tracker citation in `text`."""
    found = []
    for pattern in (_TRACKER, _HELPER_TAG):
        for m in pattern.finditer(text):
            found.append((text.count("\n", 0, m.start()) + 1, m[0]))
    return sorted(found)


def test_no_file_cites_a_tracker_number():
    """No text file of the repository (Markdown, Python, C, templates, scripts, configuration;
    tests/fixtures/ excepted) cites an issue, session or item number, an acceptance ("done when")
    point or a helper's tag (`_TRACKER`, `_HELPER_TAG`): the tracker they number is not in the
    repository, so a reader cannot follow them. Cite the code, the test, the upstream source or the
    lab note (docs/lab-notes/) instead."""
    files = _text_files()
    assert "README.md" in files and "tests/test_cited_docs.py" in files and len(files) > 200
    bad = [f"{name}:{line}: {what!r}" for name in files
           for line, what in tracker_citations((ROOT / name).read_text(encoding="utf-8", errors="replace"))]
    assert not bad, f"{len(bad)} tracker citations:\n" + "\n".join(bad)


def test_the_tracker_rule_catches_what_it_says():
    issue, session, item, done, tag = "iss" "ue 24", "sess" "ion 17", "it" "em 4", "done-" "when", "; H" "3)"
    assert [w for _, w in tracker_citations(f"as {issue} {item} found ({session}{tag}, {done} 1")] == \
        sorted([tag, done, issue, item, session])
    for cited in ("Sess" "ions 14-16", "Iss" "ue #5", "the iss" "ue-5 demonstration", "(H" "2)"):
        assert tracker_citations(cited), cited
    assert not tracker_citations("a session cell's turns; the issue's sizes; bmoe-cli --session; H100 GPUs")


def _prose(name: str, text: str) -> str:
    """What of a file is prose, the rest blanked (newlines kept, so offsets are the file's): all of a
    Markdown file; a Python file's comments and docstrings (its other strings are data: site paths,
    test ids relative to tests/)."""
    if name.endswith(".md"):
        return text
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    docstrings = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    keep = bytearray(len(text))
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and tok.start[0] in docstrings):
            a, b = starts[tok.start[0] - 1] + tok.start[1], starts[tok.end[0] - 1] + tok.end[1]
            keep[a:b] = b"\1" * (b - a)
    return "".join(c if k or c == "\n" else " " for c, k in zip(text, keep))


# Another tree's path: its sentence names that tree before the path, or "upstream" follows it.
_OTHER_TREE = re.compile(r"upstream|BigMoeOnEdge|AOSP|llama\.cpp|ggml|gguf-py", re.I)
_SENTENCE_END = re.compile(r"[.!?:]\s+(?=[A-Z(`*\[-])|\n\s*\n")
_MD_LINK = re.compile(r"\]\(([^)\s]+)\)")


def path_references(text: str, tops: set[str], root_files: set[str]) -> list[tuple[int, str]]:
    """(offset, path) for each reference to a path of this repository in prose `text`: a token that
    starts with a top-level folder (`docs/method.md`, `devices/adb/phone.py`, `tests/`) or is a root file
    (`run.sh`), not preceded by `/`, `.`, `$`, `~` or a word character (so `../shared/…`,
    `/data/local/tmp/…` and `$HOME/…` are not ours), unless the sentence before it names another
    tree (upstream, BigMoeOnEdge, AOSP, llama.cpp, ggml, gguf-py) and no bracket opened before that
    name closes between it and the path, or the next word after the path is "upstream"."""
    alternatives = "|".join(re.escape(t) + "/[\\w.*/-]*[\\w*/]|" + re.escape(t) + "/" for t in sorted(tops))
    files = "|".join(re.escape(f) for f in sorted(root_files))
    pattern = re.compile(rf"(?<![\w/.$~-])({alternatives}|{files})(?![\w-])")
    flat = text.replace("\n", " ")
    found = []
    for m in pattern.finditer(text):
        before = flat[max(0, m.start() - 200):m.start()]
        ends = list(_SENTENCE_END.finditer(before))
        sentence = before[ends[-1].end():] if ends else before
        named = list(_OTHER_TREE.finditer(sentence))
        if (named and _in_scope(sentence[named[-1].end():])) or re.match(r"[`'\"]?\)?\s+upstream\b", flat[m.end():]):
            continue
        found.append((m.start(), m[1]))
    return found


def _in_scope(between: str) -> bool:
    """Whether a name still qualifies a path after `between`: no bracket opened before the name
    closes in between ("(… upstream's bmoe-cli …) is refused (docs/method.md)" names no upstream path)."""
    depth = 0
    for c in between:
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth < 0:
            return False
    return True


def _exists(path: str) -> bool:
    if "*" in path:
        try:
            return any(ROOT.glob(path.rstrip("/")))
        except ValueError:
            return False
    return (ROOT / path.rstrip("/")).exists()


def test_every_repository_path_a_doc_or_comment_names_exists():
    """Every path of this repository that a Markdown file (tests/fixtures/ excepted) or a Python
    file's comment or docstring names exists: a folder, a file, or (with `*`) a pattern matching one.
    A reference is a token starting with one of the repository's top-level folders, or a root file
    (path_references says exactly which tokens count; a mention qualified as upstream's, AOSP's,
    llama.cpp's … is another tree's). Bare file names without a folder (`campaign.toml`,
    `rewarm-ab.sh`) are not checked: they name a campaign directory's files and upstream's scripts.
    Relative Markdown links must resolve from the linking file's folder."""
    names = _repo_files()
    tops = {n.split("/", 1)[0] for n in names if "/" in n}
    root_files = {n for n in names if "/" not in n and not n.startswith(".")}
    assert {"docs", "engine", "tests"} <= tops and {"README.md", "run.sh"} <= root_files
    bad, checked = [], 0
    for name in names:
        if not name.endswith((".md", ".py")):
            continue
        text = (ROOT / name).read_text(encoding="utf-8")
        prose = _prose(name, text)
        for offset, path in path_references(prose, tops, root_files):
            checked += 1
            if not _exists(path):
                bad.append(f"{name}:{prose.count(chr(10), 0, offset) + 1}: {path}")
        if name.endswith(".md"):
            for m in _MD_LINK.finditer(text):
                target = m[1].split("#", 1)[0]
                if not target or re.match(r"[a-z]+:", target):
                    continue
                checked += 1
                if not (ROOT / name).parent.joinpath(target).exists():
                    bad.append(f"{name}:{text.count(chr(10), 0, m.start()) + 1}: link {m[1]}")
    assert checked > 500
    assert not bad, f"{len(bad)} references to paths that do not exist:\n" + "\n".join(bad)


def test_the_path_rule_tells_ours_from_another_trees():
    tops, root_files = {"docs", "engine", "tests"}, {"README.md"}
    refs = lambda text: [p for _, p in path_references(text, tops, root_files)]  # noqa: E731
    assert refs("See docs/x.md and engine/y.py, `tests/*/conftest.py`; README.md.") == \
        ["docs/x.md", "engine/y.py", "tests/*/conftest.py", "README.md"]
    assert refs("upstream's docs/cache-sizing.md; (docs/cache-sizing.md upstream)") == []
    assert refs("BigMoeOnEdge's community page (its docs/community-benchmarks.md). Ours: docs/y.md") == ["docs/y.md"]
    assert refs("../shared/design/a.md, /data/local/tmp/docs/x, $HOME/docs/z, my-engine/q") == []
    assert refs("(as upstream's bmoe-cli does) is refused (docs/ours.md)") == ["docs/ours.md"]
    assert refs("Reference: docs/a.md, upstream's docs/b.md") == ["docs/a.md"]
    assert _prose("x.py", 'x = "docs/gone.md"  # see docs/kept.md\n').strip() == "# see docs/kept.md"


def test_every_decision_page_is_indexed_and_every_lab_note_supports_a_page():
    """docs/decisions/README.md lists every topic page of docs/decisions/ (a page no index line
    names is a decision nobody finds by its topic), and every dated log in docs/lab-notes/ is linked
    from a doc outside that folder (the page whose choice it measured)."""
    decisions, notes = ROOT / "docs/decisions", ROOT / "docs/lab-notes"
    index = (decisions / "README.md").read_text(encoding="utf-8")
    pages = sorted(p.name for p in decisions.glob("*.md") if p.name != "README.md")
    assert len(pages) >= 40
    assert [p for p in pages if f"]({p})" not in index] == []
    docs = [p for p in (ROOT / "docs").rglob("*.md") if notes not in p.parents]
    linking = "\n".join(p.read_text(encoding="utf-8") for p in docs)
    logs = sorted(p.name for p in notes.glob("20*.md"))
    assert logs and all(re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md", n) for n in logs)
    assert [n for n in logs if f"lab-notes/{n}" not in linking] == []


# ── a long module says why it is one ─────────────────────────────────────────────────────────────

CODE_PACKAGES = ("engine", "devices", "store", "harness", "results")
LONG_MODULE_LINES = 500
_LONG_BECAUSE = re.compile(r"(?:\A|\n[ \t]*\n)Long because: ")


def unexplained_long_modules(root: Path = ROOT, most_lines: int = LONG_MODULE_LINES) -> list[str]:
    """The .py modules under CODE_PACKAGES over `most_lines` lines whose module docstring has no
    paragraph starting "Long because: ", each as "path (N lines)"."""
    found = []
    for package in CODE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            text = path.read_text(encoding="utf-8")
            lines = len(text.splitlines())
            if lines > most_lines and not _LONG_BECAUSE.search(ast.get_docstring(ast.parse(text)) or ""):
                found.append(f"{path.relative_to(root).as_posix()} ({lines} lines)")
    return found


def test_every_long_module_says_why_it_is_not_split():
    """CONTRIBUTING.md: a module over ~500 lines says in its docstring why it is not split. Every
    module of the five packages over LONG_MODULE_LINES lines has, in its module docstring, a
    paragraph starting "Long because: " (what keeps it one module, or what a split would take)."""
    bad = unexplained_long_modules()
    assert not bad, (f"{len(bad)} modules over {LONG_MODULE_LINES} lines without a \"Long because: \" paragraph "
                     "in their module docstring:\n" + "\n".join(bad))


def test_the_long_module_rule_reads_the_module_docstring(tmp_path):
    body = "x = 1\n" * LONG_MODULE_LINES
    for package in CODE_PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "engine/short.py").write_text('"""Short."""\n')
    (tmp_path / "engine/said.py").write_text('"""Long.\n\nLong because: one table.\n"""\n' + body)
    (tmp_path / "store/unsaid.py").write_text('"""Long.\n\nIt is long. Long because: mid-paragraph."""\n' + body)
    (tmp_path / "harness/comment.py").write_text("# Long because: a comment, not the docstring\n" + body)
    assert unexplained_long_modules(tmp_path) == [f"store/unsaid.py ({LONG_MODULE_LINES + 3} lines)",
                                                  f"harness/comment.py ({LONG_MODULE_LINES + 1} lines)"]
