"""Native (bmoe-cli) campaigns on this host and models already on a device, without phones:
engine.native builds (libraries beside the binary, the `host` entry, which entry serves which
device), `device:` model paths, headers pulled alone from a device (this host here; the adb
phone path is tests/harness/test_native_virtual.py), and `sweep --engine PATH` with the real
bmoe-cli through the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from devices.base import DeviceIdentity
from devices.local import LocalDevice
from engine.errors import ModelError
from engine.gguf.model import load_model_shape
from engine.gguf.synth import synth_options, write_model
from harness.campaign.device_models import load_device_model
from harness.campaign.file import parse_campaign
from harness.campaign.model import CampaignError, ModelSpec, remote_model_path
from harness.campaign.options import campaign_from_options
from harness.run.runner import prepare
from tests.conftest import TINY_MODEL


def base(tmp_path, model, **sections):
    data = {"version": 1, "name": "n", "fleet": {"devices": ["local"]}, "models": {"m": str(model)}}
    data.update(sections)
    return parse_campaign(data, source="n.toml", base_dir=tmp_path)


def identity(abi: str, host_abi: str = "") -> DeviceIdentity:
    return DeviceIdentity(serial="s", backend="adb", model="m", manufacturer="x", soc="y", abi=abi,
                          android_release="14", sdk=34, ram_total_kb=1, swap_total_kb=0, host_abi=host_abi)


def build_folder(tmp_path) -> Path:
    folder = tmp_path / "build"
    folder.mkdir()
    for name in ("bmoe-cli", "libllama.so.0", "libggml.so", "libc++_shared.so", "README.md", "notalib.so.0.txt"):
        (folder / name).write_text(name)
    (folder / "libdir.so").mkdir()                        # not a file: not a library to push
    os.chmod(folder / "bmoe-cli", 0o755)
    return folder


def test_a_native_build_takes_the_libraries_beside_its_binary_unless_listed(tmp_path, tiny_model):
    folder = build_folder(tmp_path)
    c = base(tmp_path, tiny_model, engine={"kind": "native", "native": {"host": {"cli": "build/bmoe-cli"}}})
    (build,) = c.engine.native
    assert build.abi == "host" and build.cli == str(folder / "bmoe-cli")
    assert [Path(p).name for p in build.libs] == ["libc++_shared.so", "libggml.so", "libllama.so.0"]
    # the resolved file lists them, so the campaign directory says exactly what was pushed
    again = parse_campaign(json.loads(json.dumps(c.to_dict())), source="again")
    assert again.engine == c.engine
    assert tomllib.loads(c.to_toml())["engine"]["native"]["host"]["libs"] == list(build.libs)

    listed = base(tmp_path, tiny_model, engine={"kind": "native", "native": {
        "host": {"cli": "build/bmoe-cli", "libs": ["build/libggml.so"]},
        "arm64-v8a": {"cli": "build/bmoe-cli", "libs": []}}})
    assert [b.libs for b in listed.engine.native] == [(str(folder / "libggml.so"),), ()]

    other = tmp_path / "other"
    other.mkdir()
    (other / "libggml.so").write_text("x")
    with pytest.raises(CampaignError, match=r"^n.toml: engine.native.host.libs: two libraries named libggml.so: "
                                            "they are pushed into one folder$"):
        base(tmp_path, tiny_model, engine={"kind": "native", "native": {"host": {
            "cli": "build/bmoe-cli", "libs": ["build/libggml.so", "other/libggml.so"]}}})


def test_this_host_and_virtual_phones_run_the_host_build_and_real_phones_their_abi(tmp_path, tiny_model):
    build_folder(tmp_path)
    cli = {"cli": "build/bmoe-cli"}
    both = base(tmp_path, tiny_model, engine={"kind": "native", "native": {"host": cli, "arm64-v8a": cli}}).engine
    here = LocalDevice().identity()                          # this host: host_abi is its machine
    virtual = identity("arm64-v8a", host_abi="x86_64")        # a virtual phone: ro.bmoe.host_abi
    phone = identity("arm64-v8a")                             # a real phone
    assert here.host_abi == os.uname().machine
    assert [both.build_for_device(i).abi for i in (here, virtual, phone)] == ["host", "host", "arm64-v8a"]

    # an entry named by the host's own ABI serves this host and virtual phones too (older campaigns)
    by_machine = base(tmp_path, tiny_model, engine={"kind": "native", "native": {"x86_64": cli}}).engine
    assert by_machine.build_for_device(virtual).abi == "x86_64"
    assert by_machine.build_for_device(phone) is None
    assert by_machine.missing_build(phone, "R58N") == (
        'engine.native: no build for device R58N (ABI arm64-v8a); have x86_64: add [engine.native.arm64-v8a] '
        'cli = "…"')
    phone_only = base(tmp_path, tiny_model, engine={"kind": "native", "native": {"arm64-v8a": cli}}).engine
    assert phone_only.build_for_device(virtual) is None        # it cannot execute an arm64 build
    assert phone_only.missing_build(virtual, "virtual:a") == (
        "engine.native: no build for device virtual:a (ABI arm64-v8a, runs this host's x86_64 binaries); have "
        'arm64-v8a: add [engine.native.host] cli = "…"')

    # prepare refuses before anything is written, naming the device
    c = base(tmp_path, tiny_model, engine={"kind": "native", "native": {"arm64-v8a": cli}})
    with pytest.raises(CampaignError, match=r"^n.toml: engine.native: no build for device local \(ABI "):
        prepare(c)


def test_device_model_paths_are_absolute_and_never_staged(tmp_path, tiny_model):
    c = base(tmp_path, tiny_model, models={"big": "device:/sdcard/Download/../Download/x.gguf",
                                           "same": "device:/data/local/tmp/x.gguf", "here": str(tiny_model)})
    big = c.model("big")
    assert big == ModelSpec("big", "/sdcard/Download/x.gguf", on_device=True)
    # no file-name clash: device models are not staged by name
    assert c.model("same").on_device and not c.model("here").on_device
    assert remote_model_path("virtual:a", big) == "/sdcard/Download/x.gguf" == remote_model_path("local", big)
    assert remote_model_path("virtual:a", c.model("here")).endswith("/" + tiny_model.name)
    assert c.to_dict()["models"] == {"big": "device:/sdcard/Download/x.gguf",
                                     "same": "device:/data/local/tmp/x.gguf", "here": str(tiny_model)}
    assert parse_campaign(json.loads(json.dumps(c.to_dict())), source="again").models == c.models
    for bad, problem in (("device:sdcard/x.gguf", "a device path is absolute"),
                         ("device:/sd\ncard/x.gguf", "cannot hold control characters"),
                         ("device:/", "names no file")):
        with pytest.raises(CampaignError, match=rf"^n.toml: models.big: .*{problem}"):
            base(tmp_path, tiny_model, models={"big": bad})


class CountingHost(LocalDevice):
    """This host as the device, counting the bytes read through read_range."""

    def __init__(self):
        super().__init__()
        self.pieces: list[tuple[int, int]] = []

    def read_range(self, remote_path, offset, nbytes):
        data = super().read_range(remote_path, offset, nbytes)
        self.pieces.append((offset, len(data)))
        return data


def test_a_header_is_pulled_alone_in_doubling_pieces(tmp_path, gptoss_120b_shape, tiny_model):
    host = CountingHost()
    found = load_device_model(host, ModelSpec("big", str(gptoss_120b_shape), on_device=True))
    here = load_model_shape(gptoss_120b_shape)
    assert found.shape.cycle_bytes(4) == here.cycle_bytes(4) and found.shape.paths == here.paths
    assert [n for _, n in host.pieces] == [256 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20]
    assert [o for o, _ in host.pieces] == [0, 256 << 10, 512 << 10, 1 << 20, 2 << 20]
    assert found.pulled_bytes == 4 << 20 < here.file_bytes // 10_000
    with open(gptoss_120b_shape, "rb") as fh:
        assert found.header_sha256 == (hashlib.sha256(fh.read(here.header_bytes)).hexdigest(),)

    # a small header comes in one piece, cut at the header's end
    small = CountingHost()
    found = load_device_model(small, ModelSpec("s", str(tiny_model), on_device=True))
    assert len(small.pieces) == 1 and found.shard_bytes == (tiny_model.stat().st_size,)

    # a file cut inside its header: the engine's one-line reason, naming the device path
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_model.read_bytes()[:3000])
    with pytest.raises(ModelError, match=rf"^{cut}: truncated GGUF header: "):
        load_device_model(LocalDevice(), ModelSpec("c", str(cut), on_device=True))
    # not a GGUF file at all: refused after the first piece
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"\0" * (1 << 20))
    host = CountingHost()
    with pytest.raises(ModelError, match=rf"^{junk}: not a GGUF file"):
        load_device_model(host, ModelSpec("j", str(junk), on_device=True))
    assert host.pieces == [(0, 256 << 10)]


def test_a_split_model_on_a_device_is_named_by_its_first_shard(tmp_path):
    folder = tmp_path / "split"
    folder.mkdir()
    write_model(folder / "sp.gguf", synth_options(**TINY_MODEL, split_count=3))
    first = folder / "sp-00001-of-00003.gguf"
    found = load_device_model(LocalDevice(), ModelSpec("sp", str(first), on_device=True))
    here = load_model_shape(first)
    assert found.shape.paths == here.paths and len(found.shard_bytes) == len(found.header_sha256) == 3
    assert found.shape.cycle_bytes(2) == here.cycle_bytes(2)
    second = f"device:{folder}/sp-00002-of-00003.gguf"
    c = parse_campaign({"version": 1, "fleet": {"devices": ["local"]}, "models": {"sp": second}}, source="s.toml")
    with pytest.raises(CampaignError, match=r"^s.toml: models.sp: device:.*sp-00002-of-00003.gguf on local: .* is "
                                            r"shard 2 of a split model: name its first shard "
                                            r"\(sp-00001-of-00003.gguf\), which bmoe-cli loads it from$"):
        prepare(c)
    (folder / "sp-00003-of-00003.gguf").unlink()
    c = parse_campaign({"version": 1, "fleet": {"devices": ["local"]}, "models": {"sp": f"device:{first}"}},
                       source="s.toml")
    with pytest.raises(CampaignError, match=r"sp-00003-of-00003.gguf: no such file on the device$"):
        prepare(c)


def test_sweep_engine_path_runs_the_real_bmoe_cli(tmp_path, bmoe_cli, tiny_model, cli):
    out = tmp_path / "out"
    args = ["sweep", "--device", "local", "--model", f"device:{tiny_model}", "--engine", str(bmoe_cli),
            "--cache-mb", "0,cycle*1.2", "-n", "8", "-t", "1", "-o", str(out)]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    recs = [json.loads(p.read_text()) for p in out.glob("runs/*/*/run.json")]
    assert sorted(r["outcome"] for r in recs) == ["ok", "ok"]
    beside = sorted(p for p in bmoe_cli.parent.iterdir() if p.name.startswith("lib") and ".so" in p.name)
    for r in recs:
        assert r["engine"]["version"] == "0.19.0" and r["engine"]["build"] == "host"
        assert r["engine"]["sha256"] == hashlib.sha256(bmoe_cli.read_bytes()).hexdigest()
        assert [lib["name"] for lib in r["engine"]["libs"]] == [p.name for p in beside]
        assert r["argv"][1:3] == ["-m", str(tiny_model)]           # device: on local is a path on this host
        assert r["result"]["tokens"] == 8
        assert (out / "runs" / r["cell_id"] / "1" / "metrics.csv").read_text().startswith("# bmoe_metrics v2\n")
    # the resolved campaign names the binary as the host build, with the libraries it took along
    toml = (out / "campaign.toml").read_text()
    assert "[engine.native.host]" in toml and f'cli = "{bmoe_cli}"' in toml
    assert json.loads((out / "models" / f"{tiny_model.stem}.json").read_text())["on_device"] is True

    missing = CliRunner().invoke(cli, args[:6] + [str(tmp_path / "no-cli")] + args[7:-1] + [str(tmp_path / "o2")])
    assert missing.exit_code == 1
    assert missing.output == (f'Error: --engine: "{tmp_path / "no-cli"}" is neither bmoe-py nor a file (give the '
                              "path of a bmoe-cli binary)\n")
    assert not (tmp_path / "o2").exists()


def test_sweep_engine_python_is_the_default(tmp_path, tiny_model):
    c = campaign_from_options(["local"], [str(tiny_model)], ["0"])
    assert c.engine.kind == "python" and c.engine.native == ()
    script = tmp_path / "bmoe-cli"
    shutil.copy(__file__, script)
    with pytest.raises(CampaignError, match=r"is not executable$"):
        campaign_from_options(["local"], [str(tiny_model)], ["0"], engine=str(script))
    script.chmod(0o755)
    c = campaign_from_options(["local"], [str(tiny_model)], ["0"], engine=str(script))
    assert c.engine.kind == "native" and [(b.abi, b.cli) for b in c.engine.native] == [("host", str(script))]


@pytest.mark.root("mounts a ramfs")
def test_bmoe_cli_falling_back_to_buffered_reads_is_invalid_though_its_preamble_says_o_direct_1(
        tmp_path, bmoe_cli, tiny_model, cli):
    """bmoe-cli's CSV preamble records the o_direct it was asked for; its stderr line says what happened.
    On ramfs (no O_DIRECT at all) it falls back to buffered reads: the run must be `invalid`."""
    import subprocess

    mnt = tmp_path / "ramfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "ramfs", str(mnt)], check=True)
    try:
        model = mnt / "tiny.gguf"
        shutil.copy(tiny_model, model)
        out = tmp_path / "out"
        result = CliRunner().invoke(cli, ["sweep", "--device", "local", "--model", str(model), "--engine",
                                          str(bmoe_cli), "--cache-mb", "0", "-n", "2", "-t", "1", "-o", str(out)],
                                    catch_exceptions=False)
        (path,) = out.glob("runs/*/*/run.json")
        rec = json.loads(path.read_text())
        metrics = (path.parent / "metrics.csv").read_text()
        assert " o_direct=1 " in metrics.split("\nstep,")[0].replace("\n", " ")  # the preamble: what was asked
        assert "o_direct=0" in (path.parent / "stderr.txt").read_text()          # stderr: what happened
        assert rec["exit_status"] == 0 and rec["outcome"] == "invalid" and rec["o_direct"] == 0
        assert rec["evidence"][0].startswith("o_direct=0: O_DIRECT was asked for but the engine fell back")
        assert result.exit_code == 0, result.output
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
