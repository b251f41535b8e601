"""bmoe-py's compiled loops (engine/kernels/_kernels.c), built with a C compiler and called through ctypes.

The library is found, in order: in the cache folder (the first usable of $BMOE_PY_CACHE_DIR, a
folder beside the engine — the engine package's `__pycache__/` in a source tree, `.bmoe-py-cache/` next to a
zipapp such as the one staged in a phone's /data/local/tmp — and `$TMPDIR/bmoe-py-cache-UID`);
prebuilt inside the zipapp (harness staging builds it on the host: a phone has no compiler);
else built now by `$CC` / cc / gcc into the cache folder (~1 s, once per source), or into a
temporary file when no folder is usable. A library's name carries the hash of its source and
build flags, so an edited source is never served a stale build. None of these (no compiler, a
read-only everything): `load()` returns None and every product takes numpy's path (slower; the
same numbers but for K-quants, which gguf rounds to float32 once), saying so once on stderr.
docs/decisions/kernels-in-c.md says why.

ctypes releases the GIL for the call; the library makes its own threads per batch (`lanes`).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import zipfile

import numpy as np

from engine.fsutil import atomic_write

SOURCE = "_kernels.c"
ZIP_DIR = "engine/kernels"   # where the source and a prebuilt library sit inside the zipapp
CACHE_SUBDIR = ".bmoe-py-cache"
CFLAGS = ("-O3", "-std=c11", "-D_GNU_SOURCE", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared", "-pthread")
LIBS = ("-lm",)
COMPILE_TIMEOUT_S = 300

# family of a batch (the activation form its kernel reads), as _kernels.c numbers them
FAMILY_Q8_0, FAMILY_Q8_K, FAMILY_FLOAT = range(3)
ITEM_FIELDS = 7

_lib: Kernels | None = None
_tried = False
_why: str | None = None       # why there are none (load() said it once: _said)
_said = False
_lock = threading.Lock()


def source_bytes() -> bytes:
    """The C source, from the package (a folder or a zipapp)."""
    import pkgutil

    data = pkgutil.get_data(__package__ or "engine.kernels", SOURCE)
    if data is None:
        raise OSError(f"{SOURCE} is missing from the engine package")
    return data


def library_name(source: bytes | None = None) -> str:
    """The file name of the library built from `source` (default: this package's) on this machine."""
    src = source_bytes() if source is None else source
    key = hashlib.sha256(src + " ".join(CFLAGS + LIBS).encode() + platform.machine().encode()).hexdigest()[:16]
    return f"bmoe-kernels-{key}.so"


def load(quiet: bool = False) -> Kernels | None:
    """The compiled loops, loaded (or built) on the first call; None when there can be none,
    said once on stderr unless `quiet` (a caller whose numpy path is as exact, such as the f16
    attention's cell loop: its output stays the same bytes either way)."""
    global _lib, _tried, _said
    if not _tried:
        with _lock:
            if not _tried:
                _lib = _find_or_build()
                _tried = True
    if _lib is None and not quiet and not _said and _why is not None:
        _said = True
        print(f"bmoe-py: no compiled kernels ({_why}); products run in numpy (slower)", file=sys.stderr, flush=True)
    return _lib


def compiled_loops() -> Kernels | None:
    """The compiled loops if a product has loaded them already, else None (never loads them)."""
    return _lib


def built_library() -> str | None:
    """This source's library for this machine, built into the cache folder if it is not there yet
    (what harness staging ships inside bmoe-py); None when it cannot be had here."""
    folder = cache_dir()
    if folder is None:
        return None
    path = os.path.join(folder, library_name())
    if os.path.isfile(path):
        return path
    try:
        return build(folder)
    except OSError:
        return None


def build(dest_dir: str, source: bytes | None = None) -> str:
    """Build the library into `dest_dir` (atomically) and return its path; OSError (one line) when
    there is no compiler or it fails."""
    src = source_bytes() if source is None else source
    dest = os.path.join(dest_dir, library_name(src))
    cc = compiler()
    if cc is None:
        raise OSError("no C compiler (set CC, or install gcc)")
    with tempfile.TemporaryDirectory(prefix="bmoe-kernels-") as tmp:
        c_path = os.path.join(tmp, SOURCE)
        with open(c_path, "wb") as f:
            f.write(src)
        out = os.path.join(tmp, "lib.so")
        try:
            r = subprocess.run([cc, *CFLAGS, "-o", out, c_path, *LIBS], capture_output=True,
                               timeout=COMPILE_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise OSError(f"{cc} could not build the kernels: {e}") from None
        if r.returncode != 0:
            first = (r.stderr.decode("utf-8", "replace").strip().splitlines() or ["?"])[0]
            raise OSError(f"{cc} could not build the kernels (exit {r.returncode}): {first[:200]}")
        with open(out, "rb") as f:
            atomic_write(dest, f.read(), mode=0o755)
    return dest


def compiler() -> str | None:
    """$CC, else cc, else gcc, else clang, as found on PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name:
            path = shutil.which(name)
            if path:
                return path
    return None


def cache_dir() -> str | None:
    """Where the built library is kept, or None; see the module docstring."""
    candidates = []
    if os.environ.get("BMOE_PY_CACHE_DIR"):
        candidates.append(os.environ["BMOE_PY_CACHE_DIR"])
    container = zip_container()
    if container is not None:
        candidates.append(os.path.join(os.path.dirname(container), CACHE_SUBDIR))
    else:
        candidates.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__"))
    tmp = os.environ.get("TMPDIR") or "/tmp"
    candidates.append(os.path.join(tmp, f"bmoe-py-cache-{os.getuid()}"))
    for path in candidates:
        if _usable_dir(path):
            return path
    return None


def _usable_dir(path: str) -> bool:
    """A folder this user owns (created 0700 if missing), not writable by others, that takes a file:
    a library loaded from a folder someone else can write would run their code."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
        if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
        tempfile.TemporaryFile(dir=path).close()
        return True
    except OSError:
        return False


def zip_container() -> str | None:
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


def _prebuilt(name: str) -> bytes | None:
    """The library `name` shipped inside this zipapp (ZIP_DIR/NAME), if any."""
    container = zip_container()
    if container is None:
        return None
    try:
        with zipfile.ZipFile(container) as z:
            return z.read(f"{ZIP_DIR}/{name}")
    except (KeyError, OSError, zipfile.BadZipFile):
        return None


def _find_or_build() -> Kernels | None:
    try:
        name = library_name()
    except OSError as e:
        _unavailable(str(e))
        return None
    folder = cache_dir()
    if folder is not None:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            shipped = _prebuilt(name)
            try:
                if shipped is not None:
                    atomic_write(path, shipped, mode=0o755)
                else:
                    build(folder)
            except OSError as e:
                _unavailable(str(e))
                return None
        return _open(path)
    # no folder to keep it in: an anonymous file for this run
    shipped = _prebuilt(name)
    if shipped is None:
        with tempfile.TemporaryDirectory(prefix="bmoe-kernels-") as tmp:
            try:
                with open(build(tmp), "rb") as f:
                    shipped = f.read()
            except OSError as e:
                _unavailable(str(e))
                return None
    fd = os.memfd_create("bmoe-kernels")
    try:
        os.write(fd, shipped)
        return _open(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def _open(path: str) -> Kernels | None:
    try:
        return Kernels(ctypes.CDLL(path))
    except OSError as e:
        _unavailable(f"cannot load {path}: {e}")
        return None


def _unavailable(why: str) -> None:
    global _why
    _why = why          # load() says it, once, to a caller that is not quiet
    return None


_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


def _ptr(a: np.ndarray | None, dtype: type | None = None) -> int | None:
    """The address of a C-contiguous array's data (None for None); a wrong array is a bug here."""
    if a is None:
        return None
    if not a.flags.c_contiguous or (dtype is not None and a.dtype != dtype):
        raise ValueError(f"compiled loops need C-contiguous {dtype} arrays, got {a.dtype} {a.strides}")
    return int(a.ctypes.data)


class Kernels:
    """The library's functions, taking numpy arrays."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        lib.bmoe_run_batch.argtypes = [_P, _I64, _I64, _P, _P, _P, _P, _P, _P, _I64, _INT, _INT]
        lib.bmoe_run_batch.restype = _INT
        lib.bmoe_dequant_rows.argtypes = [_INT, _P, _I64, _I64, _I64, _I64, _P, _P]
        lib.bmoe_dequant_rows.restype = _INT
        lib.bmoe_quantize_q8_0.argtypes = [_P, _I64, _I64, _P, _P, _P, _P]
        lib.bmoe_quantize_q8_0.restype = None
        lib.bmoe_f16acc_cells.argtypes = [_P, _P, _I64, _I64, _P, _P, _I64, _P, _P, _P]
        lib.bmoe_f16acc_cells.restype = None
        lib.bmoe_round_f16.argtypes = [_P, _P, _I64]
        lib.bmoe_round_f16.restype = None
        lib.bmoe_set_generic.argtypes = [_INT]
        lib.bmoe_set_generic.restype = _INT

    def set_generic(self, generic: bool) -> bool:
        """Force the generic code (True) or let the CPU choose (False); whether AVX2 is in use."""
        return bool(self.lib.bmoe_set_generic(int(generic)))

    def run_batch(self, items: np.ndarray, k: int, x8: np.ndarray | None, xq: np.ndarray | None,
                  xd: np.ndarray | None, xsum: np.ndarray | None, out: np.ndarray, lut: np.ndarray,
                  chunk_rows: int, lanes: int = 1) -> None:
        """A batch of products (rows of items: qtype id, address, row stride, rows, first activation
        row, tokens, output offset) on `lanes` threads; the family follows the forms given."""
        family = FAMILY_Q8_0 if x8 is not None else FAMILY_Q8_K if xsum is not None else FAMILY_FLOAT
        if items.ndim != 2 or items.shape[1] != ITEM_FIELDS:
            raise ValueError(f"a batch is [products, {ITEM_FIELDS}] int64, not {items.shape}")
        ok = self.lib.bmoe_run_batch(_ptr(items, np.int64), items.shape[0], k, _ptr(x8, np.int8),
                                     _ptr(xq, np.float32), _ptr(xd, np.float32), _ptr(xsum, np.float32),
                                     _ptr(out, np.float32), _ptr(lut, np.float32), chunk_rows, family,
                                     max(1, lanes))
        if not ok:
            raise MemoryError("the compiled products could not allocate their scratch rows")

    def dequant_rows(self, kid: int, raw: np.ndarray, k: int, r0: int, r1: int, out: np.ndarray,
                     lut: np.ndarray) -> None:
        """out[:r1-r0, :k] = the exact float64 values of rows r0..r1-1 of `raw` (rows contiguous)."""
        if raw.strides[1] != 1 or out.shape != (r1 - r0, k):
            raise ValueError("dequant_rows: rows must be contiguous and out [r1-r0, k]")
        if not self.lib.bmoe_dequant_rows(kid, int(raw.ctypes.data), raw.strides[0], k, r0, r1,
                                          _ptr(out, np.float64), _ptr(lut, np.float32)):
            raise MemoryError("dequant_rows could not allocate its scratch row")

    def round_f16(self, x: np.ndarray) -> np.ndarray:
        """Each float32 rounded to the nearest half as the attention and the quantizer round it."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty_like(x)
        self.lib.bmoe_round_f16(_ptr(x), _ptr(out), x.size)
        return out

    def quantize_q8_0(self, x: np.ndarray, xq: np.ndarray, x8: np.ndarray, d: np.ndarray, sums: np.ndarray) -> None:
        x = np.ascontiguousarray(x, dtype=np.float32)
        n, k = x.shape
        self.lib.bmoe_quantize_q8_0(_ptr(x, np.float32), n, k, _ptr(xq, np.float32), _ptr(x8, np.int8),
                                    _ptr(d, np.float32), _ptr(sums, np.float32))

    def f16acc_cells(self, s: np.ndarray, active: np.ndarray, rows_kv: np.ndarray, v64: np.ndarray,
                     M: np.ndarray, S: np.ndarray, acc: np.ndarray) -> None:
        s = np.ascontiguousarray(s, dtype=np.float32)
        active = np.ascontiguousarray(active, dtype=np.bool_).view(np.uint8)
        rows_kv = np.ascontiguousarray(rows_kv, dtype=np.int64)
        v64 = np.ascontiguousarray(v64, dtype=np.float64)
        R, cells = s.shape
        self.lib.bmoe_f16acc_cells(_ptr(s), _ptr(active), R, cells, _ptr(rows_kv), _ptr(v64), acc.shape[1],
                                   _ptr(M, np.float32), _ptr(S, np.float32), _ptr(acc, np.float32))
