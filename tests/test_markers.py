"""What a test needs of this host is in its markers (pyproject.toml, tests/conftest.py), so that
`run.sh test --quick` (not root, phone or browser) runs as any user and a test that needs root skips,
saying why, rather than failing.

A test that uses a phone fixture is marked by it; one that starts a virtual phone or makes a memory
cgroup itself must say so with `pytest.mark.phone` or `pytest.mark.root`: this test reads each module for such calls."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import AFTER_SERIAL, PHONE_FIXTURES, SERIAL

TESTS = Path(__file__).resolve().parent
MARKS = ("phone", "root")


def _root_calls(tree: ast.AST) -> list[str]:
    """What only root does right, called in this module (not in a string: a script run elsewhere):
    a virtual phone started without a fixture (manager.up; `virtual up` through the CLI gives
    phone_home as --home, which marks it, or is refused before a phone starts), a memory cgroup
    (tests.conftest.memory_cgroup), a device node (os.mknod), a mount."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
            if (owner, name) in (("manager", "up"), ("os", "mknod")) or "memory_cgroup" in name or name == "tmpfs":
                found.append(f"{owner + '.' if owner else ''}{name}() at line {node.lineno}")
        elif isinstance(node, (ast.List, ast.Tuple)):
            words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if words[:1] in (["mount"], ["unshare"]):
                found.append(f"{' '.join(words[:3])} at line {node.lineno}")
    return found


def _marks(node: ast.AST) -> bool:
    """Whether `node` names pytest.mark.phone or pytest.mark.root (a decorator, a pytestmark)."""
    return any(isinstance(n, ast.Attribute) and n.attr in MARKS and isinstance(n.value, ast.Attribute)
               and n.value.attr == "mark" for n in ast.walk(node))


def _unmarked(tree: ast.Module) -> list[str]:
    """The root calls of a module that no marker covers. A call is covered when its function is
    marked, takes a phone fixture (so pytest marks it: tests/conftest.py), or is only ever used (called,
    or taken as a fixture) by covered functions; a module-wide pytestmark covers everything."""
    if any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)
           and _marks(n.value) for n in tree.body):
        return []
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}

    def params(fn: ast.FunctionDef) -> set[str]:
        return {a.arg for a in fn.args.args}

    def covered(fn: ast.FunctionDef, seen: frozenset[str]) -> bool:
        if any(_marks(d) for d in fn.decorator_list) or params(fn) & set(PHONE_FIXTURES):
            return True
        users = [d for d in defs.values() if d.name not in seen | {fn.name}
                 and (fn.name in params(d) or any(isinstance(n, ast.Name) and n.id == fn.name for n in ast.walk(d)))]
        return bool(users) and all(covered(u, seen | {fn.name}) for u in users)

    return [call for fn in defs.values() for call in _root_calls(fn) if not covered(fn, frozenset())]


def test_a_test_that_starts_phones_or_makes_cgroups_itself_is_marked():
    unmarked = {}
    for path in sorted(set(TESTS.rglob("test_*.py")) - {Path(__file__).resolve()}):
        calls = _unmarked(ast.parse(path.read_text(encoding="utf-8")))
        if calls:
            unmarked[path.relative_to(TESTS).as_posix()] = calls
    assert not unmarked, ("these need root, use no phone fixture and are not marked pytest.mark.phone or "
                          f"pytest.mark.root(why): {unmarked}")


@pytest.mark.root("maps itself to another user in a user namespace")
def test_as_another_user_root_and_phone_tests_skip_saying_why_and_the_rest_run(tmp_path):
    """A run as uid 65534 (a user namespace: the same files, another uid): a test needing root and
    one using a phone fixture are skipped, each with its reason on the summary line (-ra), and one
    needing neither runs."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare(1) (util-linux) to run as another user")
    nodes = ["tests/engine/test_larger_than_ram.py", "tests/devices/test_vphone_confinement.py",
             "tests/engine/test_help.py"]
    done = subprocess.run(["unshare", "--user", "--map-user=65534", "--map-group=65534", sys.executable, "-m",
                           "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'b'}", *nodes],
                          cwd=TESTS.parent, capture_output=True, text=True, timeout=300)
    out = done.stdout
    assert done.returncode == 0, (out + done.stderr)[-3000:]
    assert re.search(r"SKIPPED \[\d+\] tests/engine/test_larger_than_ram.py(?::\d+)?: needs root \(this is uid 65534\): "
                     r"makes a memory cgroup", out), out[-3000:]
    assert re.search(r"SKIPPED \[\d+\] tests/devices/test_vphone_confinement.py(?::\d+)?: needs root \(this is uid "
                     r"65534\): a virtual phone's memory cgroup", out), out[-3000:]
    assert re.search(r"\b\d+ passed", out) and " failed" not in out, out[-3000:]


def test_the_lists_that_place_tests_in_run_sh_parts_name_tests_that_exist():
    """SERIAL and AFTER_SERIAL name a file, or one test in it: a name that matches nothing would
    leave its tests at nice 19 beside the serial part (run.sh), unnoticed."""
    missing = []
    for entry in SERIAL + AFTER_SERIAL:
        file, _, name = entry.partition("::")
        path = TESTS / file
        if not path.is_file() or (name and f"def {name}(" not in path.read_text(encoding="utf-8")):
            missing.append(entry)
    assert not missing, missing


def test_the_serial_parts_collect_the_modules_serial_names_and_no_other(monkeypatch):
    """run.sh's serial parts set BMOE_TEST_SERIAL_ONLY: a module SERIAL names (whole or one test of
    it) is collected, any other test module is not; without the variable, every one is."""
    from tests import conftest

    named = {TESTS / file for file in conftest.SERIAL_FILES}
    others = sorted(set(TESTS.rglob("test_*.py")) - named)
    assert named and others
    for env, ignored in (("", None), ("1", True)):
        monkeypatch.setenv(conftest.SERIAL_ONLY, env)
        assert {conftest.pytest_ignore_collect(path, None) for path in named} == {None}
        assert {conftest.pytest_ignore_collect(path, None) for path in others} == {ignored}
        assert conftest.pytest_ignore_collect(TESTS / "results" / "conftest.py", None) is None


def test_a_fixture_a_parametrized_test_takes_by_name_marks_it():
    """`request.getfixturevalue(which)` with `which` a parameter: the fixture it names marks the test as
    taking it would (a quality campaign built at nice 19 beside the serial part had its rates starved)."""
    from types import SimpleNamespace

    from tests import conftest

    class Item(SimpleNamespace):
        def add_marker(self, marker):
            self.marks.append(marker.name if hasattr(marker, "name") else marker)

        def get_closest_marker(self, name):
            return name if name in self.marks else None

    by_name = Item(nodeid="tests/results/test_x.py::test_y[quality_campaign]", fixturenames=["which", "request"],
                   callspec=SimpleNamespace(params={"which": "quality_campaign"}), marks=[])
    plain = Item(nodeid="tests/results/test_x.py::test_y[imported]", fixturenames=["which", "request"],
                 callspec=SimpleNamespace(params={"which": "imported"}), marks=[])
    conftest.pytest_collection_modifyitems(None, [by_name, plain])
    assert "after_serial" in by_name.marks and "after_serial" not in plain.marks
