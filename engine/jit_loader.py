"""Loading the compiled loops (`engine._kernels_jit`, numba) and choosing where numba caches them.

Compiled code is cached in the first usable of $NUMBA_CACHE_DIR, a folder beside the engine
(`engine/__pycache__/numba` in a source tree; `.bmoe-py-cache/` next to a zipapp, e.g. the one
staged in /data/local/tmp), and `$TMPDIR/bmoe-py-cache-UID` (a folder this user owns); with none
usable it compiles every run (docs/decisions.md "Where compiled kernels are cached"). numba is
imported on first use only, so a refused command line, `--help` or a model of small matrices
never pays for it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import stat
import sys
import tempfile
import threading
from types import ModuleType

from .fsutil import atomic_write

CACHE_SUBDIR = ".bmoe-py-cache"

_jit_module: ModuleType | None = None
_jit_lock = threading.Lock()


def load() -> ModuleType:
    """The compiled module, imported (and its cache folder chosen) on the first call."""
    global _jit_module
    if _jit_module is None:
        with _jit_lock:
            if _jit_module is None:
                _jit_module = _load_jit()
    return _jit_module


def compiled_loops() -> ModuleType | None:
    """The compiled module if a product has loaded it already, else None (never loads it)."""
    return _jit_module


def cache_dir() -> str | None:
    """Where compiled kernels are cached, or None (compiled each run); see the module docstring."""
    candidates = []
    if os.environ.get("NUMBA_CACHE_DIR"):
        candidates.append(os.environ["NUMBA_CACHE_DIR"])
    container = _zip_container()
    if container is not None:
        candidates.append(os.path.join(os.path.dirname(container), CACHE_SUBDIR))
    else:
        candidates.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__", "numba"))
    tmp = os.environ.get("TMPDIR") or "/tmp"
    candidates.append(os.path.join(tmp, f"bmoe-py-cache-{os.getuid()}"))
    for path in candidates:
        if _usable_dir(path):
            return path
    return None


def _usable_dir(path: str) -> bool:
    """A folder this user owns (created 0700 if missing), not writable by others, that takes a file:
    compiled code loaded from a folder someone else can write would run their code."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
        if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
        tempfile.TemporaryFile(dir=path).close()
        return True
    except OSError:
        return False


def _zip_container() -> str | None:
    """The zipapp this package was imported from (bmoe-py staged as one file), else None."""
    here = os.path.abspath(__file__)
    if os.path.isfile(here):
        return None
    path = here
    while path and path != os.path.dirname(path):
        path = os.path.dirname(path)
        if os.path.isfile(path):
            return path
    return None


def _set_numba_cache(folder: str | None) -> None:
    """Point numba's cache at `folder` (None: cache nothing) and choose the threading layer of
    its parallel loops (`_threading_layers`). numba reads both from the environment at its
    import; they are set on its config too in case it was imported before."""
    if folder is None:
        os.environ.pop("NUMBA_CACHE_DIR", None)
    else:
        os.environ["NUMBA_CACHE_DIR"] = folder
    layers = _threading_layers()
    if layers[0] == "omp":
        os.environ["OMP_WAIT_POLICY"] = "passive"
    os.environ["NUMBA_THREADING_LAYER"] = "default"
    os.environ["NUMBA_THREADING_LAYER_PRIORITY"] = " ".join(layers)
    import numba

    # numba's config attributes are made from the environment at run time: its stubs list none
    numba.config.CACHE_DIR = folder or ""  # type: ignore[attr-defined]
    numba.config.THREADING_LAYER = "default"  # type: ignore[attr-defined]
    numba.config.THREADING_LAYER_PRIORITY = list(layers)  # type: ignore[attr-defined]


def _threading_layers() -> tuple[str, str, str]:
    """numba's threading layers in the order to try: GNU OpenMP with OMP_WAIT_POLICY=passive (its
    idle threads sleep at once, and the calling thread computes a lane itself), else workqueue
    (idle threads wait on a condition variable; the caller only waits), which always loads, so
    TBB (it spins) is never reached. Not OpenMP when another library loaded its runtime first:
    it read its wait policy then, and by default it spins (the 2-core trap of
    docs/decisions.md "One BLAS thread in bmoe-py")."""
    try:
        with open("/proc/self/maps") as fh:
            if "libgomp" in fh.read():
                return ("workqueue", "omp", "tbb")
    except OSError:
        pass
    return ("omp", "workqueue", "tbb")


def _load_jit() -> ModuleType:
    cache = cache_dir()
    _set_numba_cache(cache)
    if cache is None or _zip_container() is None:
        from . import _kernels_jit

        return _kernels_jit
    # Inside a zipapp numba cannot cache (its locators need the source as a file): the module's
    # source is written beside the cache, named by its hash, and loaded from there.
    import pkgutil

    source = pkgutil.get_data(__package__ or "engine", "_kernels_jit.py")
    if source is None:
        from . import _kernels_jit

        return _kernels_jit
    name = "bmoe_kernels_" + hashlib.sha256(source).hexdigest()[:16]
    path = os.path.join(cache, name + ".py")
    try:
        if not os.path.isfile(path):
            atomic_write(path, source)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise OSError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    except OSError:
        sys.modules.pop(name, None)
        _set_numba_cache(None)
        from . import _kernels_jit

        return _kernels_jit
