"""A model about twice its memory cgroup: streamed it runs, resident it is killed, and the
expert bytes it streamed never entered the page cache (O_DIRECT)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.gguf.model import load_model_shape
from engine.gguf.synth import synth_options, write_model
from engine.stream.pagecache import drop_page_cache, page_cache_residency
from engine.units import MIB
from tests.conftest import in_cgroup, memory_cgroup

pytestmark = pytest.mark.root("makes a memory cgroup")

LIMIT_BYTES = 320 * MIB


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "big.gguf"
    # Experts dominate (as in the models bmoe-cli targets): 4 layers x 52 experts of 1024x1024 Q8_0.
    write_model(path, synth_options("qwen3moe", layers=4, experts=52, top_k=4, hidden=1024, expert_ffn=1024,
                                    vocab=512, seed=5))
    return path


def _run(argv, cgroup):
    return subprocess.run(in_cgroup(cgroup, [sys.executable, "-m", "engine", *map(str, argv)]),
                          capture_output=True, timeout=600)


def test_streamed_run_completes_in_half_the_memory_and_resident_is_killed(big_model):
    shape = load_model_shape(big_model)
    assert shape.file_bytes > 2 * LIMIT_BYTES
    drop_page_cache(str(big_model))
    with memory_cgroup(LIMIT_BYTES) as cg:
        streamed = _run(["-m", big_model, "-n", 6, "--moe-stream", "--cache-mb", "auto", "--cache-floor-mb", 64], cg)
        assert streamed.returncode == 0, streamed.stderr.decode()[-2000:]
        assert b"generation: 6 tokens" in streamed.stdout
        err = streamed.stderr.decode()
        assert "o_direct=1" in err
        # auto sized from the cgroup's headroom, not from the host's free memory
        auto_line = next(line for line in err.splitlines() if "MiB available, leaving" in line)
        assert int(auto_line.split("—")[1].split()[0]) < LIMIT_BYTES // MIB
    # Expert slices were read with O_DIRECT: none of the expert bank is in the page cache.
    resident = sum(page_cache_residency(t.path, t.offset, t.nbytes).resident_pages
                   for layer in shape.moe_layers for t in layer.tensors)
    total = sum(page_cache_residency(t.path, t.offset, t.nbytes).total_pages
                for layer in shape.moe_layers for t in layer.tensors)
    assert resident / total < 0.01, (resident, total)
    with memory_cgroup(LIMIT_BYTES) as cg:
        killed = _run(["-m", big_model, "-n", 6, "--no-mmap"], cg)
    assert killed.returncode in (-9, 137), killed.returncode
    assert b"generation:" not in killed.stdout


def test_buffered_reads_do_fill_the_page_cache(big_model):
    """The check above can fail: without O_DIRECT the same run leaves expert pages cached."""
    shape = load_model_shape(big_model)
    drop_page_cache(str(big_model))
    r = subprocess.run([sys.executable, "-m", "engine", "-m", str(big_model), "-n", "2", "--moe-stream",
                        "--cache-mb", "0", "--no-odirect"], capture_output=True, timeout=600)
    assert r.returncode == 0 and b"o_direct=0" in r.stderr
    resident = sum(page_cache_residency(t.path, t.offset, t.nbytes).resident_pages
                   for layer in shape.moe_layers for t in layer.tensors)
    assert resident > 0
