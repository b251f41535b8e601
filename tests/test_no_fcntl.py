"""Every module imports on a Python without `fcntl` (Windows has none): `status`, `run` and
`sweep` must at least load there, and a virtual phone must say it needs Linux instead of
failing on an import.

Simulated: a child interpreter whose first meta-path finder refuses `fcntl` the way a Python
without the module does (ModuleNotFoundError), then imports each module of the packages."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "devices", "store", "harness", "results")

_REFUSE_FCNTL = textwrap.dedent("""
    import importlib.abc, json, sys, traceback

    class NoFcntl(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "fcntl":
                raise ModuleNotFoundError("No module named 'fcntl'", name="fcntl")
            return None

    sys.modules.pop("fcntl", None)
    sys.meta_path.insert(0, NoFcntl())
""")


def _modules() -> list[str]:
    """Every module of the packages, by file (nothing imported to find them); __main__ skipped."""
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _run_without_fcntl(body: str) -> dict:
    """Run `body` in a child Python that has no fcntl; it prints one JSON object last."""
    proc = subprocess.run([sys.executable, "-c", _REFUSE_FCNTL + textwrap.dedent(body)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_simulation_refuses_fcntl_as_a_python_without_it_would():
    out = _run_without_fcntl("""
        try:
            import fcntl
            print(json.dumps({"imported": True}))
        except ModuleNotFoundError as e:
            print(json.dumps({"imported": False, "name": e.name}))
    """)
    assert out == {"imported": False, "name": "fcntl"}


def test_every_module_imports_without_fcntl():
    modules = _modules()
    assert len(modules) > 80 and "harness.run.status" in modules and "devices.virtual.phone" in modules
    failed = _run_without_fcntl(f"""
        import importlib
        failed = {{}}
        for name in {modules!r}:
            try:
                importlib.import_module(name)
            except BaseException as e:
                # the project's line that imported it, not the refusing finder's
                where = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith({str(ROOT)!r})]
                at = f" ({{where[-1].filename}}:{{where[-1].lineno}})" if where else ""
                failed[name] = f"{{type(e).__name__}}: {{e}}{{at}}"
        print(json.dumps(failed))
    """)
    assert failed == {}, "\n".join(f"{name}: {why}" for name, why in failed.items())


def test_a_virtual_phone_without_fcntl_says_it_needs_linux(tmp_path):
    out = _run_without_fcntl(f"""
        from devices.virtual import manager
        try:
            manager.up("nofcntl", 256 << 20, home={str(tmp_path)!r})
            print(json.dumps({{"started": True}}))
        except manager.VirtualPhoneError as e:
            print(json.dumps({{"started": False, "error": str(e)}}))
    """)
    assert out["started"] is False
    assert out["error"].startswith("virtual phones need Linux") and "no fcntl module" in out["error"]
    assert "WSL" in out["error"] and not (tmp_path / "nofcntl").exists()      # nothing written


UNIX_ONLY = frozenset({"fcntl", "resource", "termios", "pwd", "grp"})


def test_no_module_imports_a_unix_only_module_when_it_is_imported():
    """resource, termios, pwd and grp are missing on Windows as fcntl is; psutil (a dependency)
    imports resource in its Linux backend only, so the child above cannot refuse it honestly:
    the project's own module-level imports are checked from the source instead."""
    import ast

    found = []
    for name in _modules():
        path = ROOT / (name.replace(".", "/") + ".py")
        if not path.exists():
            path = ROOT / name.replace(".", "/") / "__init__.py"
        for node in ast.parse(path.read_text()).body:   # module level only: a function's import is lazy
            imported = ([a.name for a in node.names] if isinstance(node, ast.Import)
                        else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{name}:{node.lineno} {m}" for m in imported if m.split(".")[0] in UNIX_ONLY]
    assert not found, found
