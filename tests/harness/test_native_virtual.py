"""The real bmoe-cli (fixture `bmoe_cli`, with the five lib*.so.0 beside it) in campaigns on a
virtual phone reached through the real adb server (docs/decisions/native-builds.md).

The phone (84 MiB) reports arm64-v8a but runs this host's binaries, so the campaign's `host` build
serves it; the binary and its libraries are pushed once into /data/local/tmp/bmoe and run with
LD_LIBRARY_PATH pointing at their folder. The model is a ~96 MiB synthetic qwen3moe with uniform
routing (5 layers x 16 experts, top-4; its expert bank is ~90 MiB): a streamed run without a cache
needs ~40 MiB of the phone and one with a cycle*1.2 cache ~70 MiB, while a cache that keeps the
whole bank (4000 MiB, or `auto`) needs ~105 MiB and is killed by the phone's memory cgroup.

`auto` there: the phone has less RAM than the 1536 MiB floor, so bmoe-cli clamps the budget up to
its minimum, min(cache_min_mb = 1500 MiB, the model's expert bank) — the bank, for a model of
tens of MiB — exactly the kill a 1.5 GiB cache is on a real phone with less than floor + 1500 MiB.

Every engine runs with -t 1: two engines never spin on this host's two cores.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path

import pytest

from devices.adb.link import WORK_DIR
from devices.adb.phone import AdbPhone
from devices.adb.server import AdbServer
from engine.gguf.model import load_model_shape
from engine.gguf.synth import synth_options, write_model
from harness.campaign.device_models import load_device_model
from harness.campaign.file import libs_beside, parse_campaign
from harness.campaign.model import CampaignError, ModelSpec
from harness.run.errors import RunnerError
from harness.run.runner import prepare, run_campaign
from tests.conftest import TINY_MODEL
from tests.harness.conftest import one_phone, the_phone

PHONE = "nsmall"
PHONE_RAM = 84 << 20
# a long prompt makes prefill route most of the bank, so a cache that keeps it really fills
PROMPT = ("The expert cache of a mixture-of-experts model holds the weights that the router picked for recent "
          "tokens; below one token cycle it evicts what it needs next, and above the phone's memory the "
          "low-memory killer takes the process.")
MODELS_DIR = "/data/local/tmp/models"


@pytest.fixture(scope="module")
def phone(adb_port, phone_home):
    with one_phone(PHONE, PHONE_RAM, adb_port, phone_home, model="Galaxy A15") as info:
        yield info


@pytest.fixture(scope="module")
def uniform_model(harness_models) -> Path:
    path = harness_models / "uniform96.gguf"
    if not path.exists():
        write_model(path, synth_options("qwen3moe", size_bytes=96 << 20, seed=1, router_skew=0))
    return path


def campaign(name, model_table, adb_port, phone_home, bmoe_cli, axes, run=None):
    data = {"version": 1, "name": name,
            "fleet": {"devices": [f"virtual:{PHONE}"], "virtual_home": str(phone_home),
                      "adb": [{"host": "127.0.0.1", "port": adb_port}]},
            "models": model_table,
            "engine": {"kind": "native", "native": {"host": {"cli": str(bmoe_cli)}}},
            "axes": axes, "run": {"n_predict": 16, "threads": 1, "prompt": PROMPT, **(run or {})},
            "gate": {"max_wait_s": 2}}
    return parse_campaign(data, source=f"{name}.toml")


def records(out: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in out.glob("runs/*/*/run.json")), key=lambda r: r["order"])


def sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_native_campaign_on_a_virtual_phone(tmp_path, phone, adb_port, phone_home, bmoe_cli, uniform_model):
    c = campaign("native", {"uniform": str(uniform_model)}, adb_port, phone_home, bmoe_cli,
                 {"cache_mb": [0, "cycle*1.2", 4000, "auto"]})
    # no `libs` given: the five lib*.so.0 beside the binary go along
    (build,) = c.engine.native
    assert build.abi == "host" and [Path(p).name for p in build.libs] == [
        "libggml-base.so.0", "libggml-cpu.so.0", "libggml.so.0", "libllama-common.so.0", "libllama.so.0"]
    out = tmp_path / "out"
    status = run_campaign(c, out, progress_stream=io.StringIO())
    assert status.complete
    recs = records(out)
    by_budget = {r["config"]["budget_spec"]: r for r in recs}
    # past RAM the kernel's OOM killer takes bmoe-cli: over adb lmkd never considers the engine
    assert {b: r["outcome"] for b, r in by_budget.items()} == {
        "0": "ok", "cycle*1.2": "ok", "4000": "killed", "auto": "killed"}
    assert not [e for r in recs for e in r["evidence"] if "lowmemorykiller" in e]

    # the phone's own identity: a phone ABI, this host's binaries
    dev = json.loads((out / "devices" / f"virtual-{PHONE}.json").read_text())
    assert dev["abi"] == "arm64-v8a" and dev["host_abi"] == "x86_64"

    libs = {Path(p).name: sha(p) for p in libs_beside(str(bmoe_cli))}
    for r in recs:
        # the engine's own --version and the bytes that ran, in every run
        assert r["engine"] == {"kind": "native", "version": "0.19.0", "sha256": sha(bmoe_cli),
                               "path": f"{WORK_DIR}/bmoe-cli", "build": "host",
                               "libs": [{"name": n, "sha256": h} for n, h in libs.items()]}
        assert r["argv"][:3] == [f"{WORK_DIR}/bmoe-cli", "-m", f"{WORK_DIR}/uniform96.gguf"]
        assert r["argv"][r["argv"].index("-t") + 1] == "1"
        # pushed once: binary, libraries and model with the first cell, nothing after
        assert sorted(p["path"] for p in r["pushed"]) == (sorted(
            [f"{WORK_DIR}/bmoe-cli", f"{WORK_DIR}/uniform96.gguf"] + [f"{WORK_DIR}/lib/{n}" for n in libs])
            if r["order"] == 0 else [])
    staged = phone.root / "data/local/tmp/bmoe"
    assert sha(staged / "bmoe-cli") == sha(bmoe_cli)
    assert {p.name: sha(p) for p in (staged / "lib").iterdir()} == libs

    for budget in ("0", "cycle*1.2"):
        r = by_budget[budget]
        text = (out / "runs" / r["cell_id"] / "1" / "metrics.csv").read_text()
        lines = text.splitlines()
        assert lines[0] == "# bmoe_metrics v2" and "# engine=0.19.0" in lines
        header = next(line for line in lines if line.startswith("step,"))
        assert len(header.split(",")) == 29
        assert r["result"]["tokens"] == 16 and r["o_direct"] == 1 and r["exit_status"] == 0
        assert "threads=1" in text
        assert r["summary"]["tokens"] == 16 and r["summary"]["n_prompt"] > 100
    cycle = by_budget["cycle*1.2"]
    assert cycle["config"]["force_cache"] is True and "--force-cache" in cycle["argv"]
    assert cycle["summary"]["cache_budget_MiB"] == cycle["config"]["cache_mb"] == 27
    assert cycle["result"]["cache_hit_pct"] > 0
    assert by_budget["0"]["summary"]["cache_hit_pct"] == -1            # no cache: "not measured"

    for budget in ("4000", "auto"):
        r = by_budget[budget]
        assert r["exit_status"] == 137 and r["pid"]
        # the kernel's kill, which a user build's shell cannot read: a bare SIGKILL of that pid
        assert r["evidence"] == [f"exit status 137 (SIGKILL) with no lmkd or kernel kill line for pid {r['pid']}"]
        assert not any(e["pid"] == r["pid"] for e in r["lmk_events"])
    # auto on a phone with less RAM than floor + 1500 MiB: less available than the floor, so bmoe-cli
    # clamps up to min(cache_min 1500 MiB, the bank) -- the whole bank here, more than the phone holds
    stderr = (out / "runs" / by_budget["auto"]["cell_id"] / "1" / "stderr.txt").read_text()
    m = re.search(r"bmoe: cache auto — (\d+) MiB available, leaving (\d+) MiB free → (\d+) MiB budget "
                  r"\(cap (\d+) MiB\)", stderr)
    assert m, stderr[-2000:]
    available, floor, budget, cap = map(int, m.groups())
    assert available < PHONE_RAM >> 20 < floor == 1536
    assert budget == cap and abs(cap - load_model_shape(uniform_model).expert_bytes / (1 << 20)) < 1

    # a flag bmoe-cli does not know: config_error, and nothing pushed again (same bytes on the phone)
    bad = campaign("badflag", {"uniform": str(uniform_model)}, adb_port, phone_home, bmoe_cli, {"cache_mb": [0]},
                   run={"engine_args": ["--no-such-flag"]})
    run_campaign(bad, tmp_path / "bad", progress_stream=io.StringIO())
    (r,) = records(tmp_path / "bad")
    assert r["outcome"] == "config_error" and r["exit_status"] == 1
    assert r["evidence"] == ["exit status 1", "unknown arg: --no-such-flag"]
    assert r["pushed"] == []


def test_models_already_on_the_phone_are_priced_from_their_headers(tmp_path, phone, adb_port, phone_home,
                                                                   bmoe_cli, harness_models, gptoss_120b_shape):
    """`device:` models: nothing pushed, the cycle priced from headers pulled alone (a split model
    from every shard's header), cells run the model where it is."""
    device = the_phone(adb_port, phone)
    split_local = harness_models / "onphone" / "sp-00001-of-00003.gguf"
    if not split_local.exists():
        split_local.parent.mkdir(exist_ok=True)
        write_model(split_local.parent / "sp.gguf", synth_options(**TINY_MODEL, split_count=3))
    shards = sorted(split_local.parent.glob("sp-*.gguf"))
    assert len(shards) == 3
    for shard in shards:
        device.push(str(shard), f"{MODELS_DIR}/{shard.name}")
    # a 61 GiB model (a sparse file: gpt-oss-120b's real header) is on the phone already
    big_on_phone = phone.root / "data/local/tmp/models/gpt-oss-120b.gguf"
    write_model(big_on_phone, synth_options("gpt-oss-120b", shape_only=True))

    # only the header comes over: 4 MiB of a 61 GiB file, read in doubling pieces
    pulled = []

    class Counting(AdbPhone):
        def read_range(self, remote_path, offset, nbytes):
            data = super().read_range(remote_path, offset, nbytes)
            pulled.append((offset, len(data)))
            return data

    counted = Counting(phone.serial, AdbServer("127.0.0.1", adb_port))
    big = load_device_model(counted, ModelSpec("big", f"{MODELS_DIR}/gpt-oss-120b.gguf", on_device=True))
    local_big = load_model_shape(gptoss_120b_shape)
    assert round(big.shape.cycle_mib(4), 1) == 1815.4 == round(local_big.cycle_mib(4), 1)
    assert big.shape.paths == (f"{MODELS_DIR}/gpt-oss-120b.gguf",)
    assert big.shard_bytes == (local_big.file_bytes,) and local_big.file_bytes > 60 << 30
    assert sum(n for _, n in pulled) == big.pulled_bytes < 2 * local_big.header_bytes + (256 << 10)
    assert [o for o, _ in pulled] == sorted({o for o, _ in pulled})          # each byte pulled once
    with open(gptoss_120b_shape, "rb") as fh:
        assert big.header_sha256 == (hashlib.sha256(fh.read(local_big.header_bytes)).hexdigest(),)

    tiny_spec = f"device:{MODELS_DIR}/{shards[0].name}"
    c = campaign("ondevice", {"sp": tiny_spec}, adb_port, phone_home, bmoe_cli, {"cache_mb": [0, "cycle*1.2"]},
                 run={"n_predict": 8, "prompt": "The capital of Japan is"})
    # the plan's cycle is the header's: the same as pricing the shards on this host
    shape = load_model_shape(split_local)
    plan = prepare(c).plan
    assert {cell.config.cycle_mb for cell in plan.cells} == {round(shape.cycle_mib(2), 3)}
    assert plan.models["sp"].paths == tuple(f"{MODELS_DIR}/{s.name}" for s in shards)

    out = tmp_path / "out"
    status = run_campaign(c, out, progress_stream=io.StringIO())
    assert status.complete and status.outcomes == {"ok": 2}
    for r in records(out):
        assert r["argv"][1:3] == ["-m", f"{MODELS_DIR}/{shards[0].name}"]
        assert all(not p["path"].endswith(".gguf") for p in r["pushed"])   # the model never moved
        assert r["result"]["tokens"] == 8 and r["o_direct"] == 1
        metrics = (out / "runs" / r["cell_id"] / "1" / "metrics.csv").read_text()
        assert f"model={shards[0].name}" in metrics
    record = json.loads((out / "models" / "sp.json").read_text())
    assert record["path"] == tiny_spec and record["on_device"] is True and record["sha256"] is None
    assert record["shard_bytes"] == [s.stat().st_size for s in shards]
    assert record["paths"] == [f"{MODELS_DIR}/{s.name}" for s in shards]
    assert record["prices"][0]["cycle_mib"] == round(shape.cycle_mib(2), 3)
    assert not list((phone.root / "data/local/tmp/bmoe").glob("sp-*"))

    # the model changed on the phone since the campaign started (same shape, other weights: another
    # header): refused, nothing run
    other = harness_models / "onphone-other"
    other.mkdir(exist_ok=True)
    write_model(other / "sp.gguf", synth_options(**{**TINY_MODEL, "seed": 8}, split_count=3))
    device.push(str(other / shards[0].name), f"{MODELS_DIR}/{shards[0].name}")
    with pytest.raises(RunnerError, match=r"^model sp \(device:/data/local/tmp/models/sp-00001-of-00003.gguf\) "
                                          r"changed since this campaign started"):
        run_campaign(c, out, progress_stream=io.StringIO())
    assert len(records(out)) == 2

    # a model the phone does not have: one line naming the key, the path and the phone
    missing = campaign("missing", {"gone": f"device:{MODELS_DIR}/gone.gguf"}, adb_port, phone_home, bmoe_cli,
                       {"cache_mb": [0]})
    with pytest.raises(CampaignError, match=rf"^missing.toml: models.gone: device:{MODELS_DIR}/gone.gguf on "
                                            rf"virtual:{PHONE}: {MODELS_DIR}/gone.gguf: no such file on the device$"):
        prepare(missing)
