"""What staging checks before a cell runs, on a virtual phone through the real adb server: an
engine Android's linker refuses stops the campaign with the linker's line before any model is
pushed; a push the phone refuses for good is recorded once, not retried; and `sweep --engine
ABI=PATH` gives real phones their build without a campaign file."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from devices.base import DeviceIdentity
from harness.campaign.file import parse_campaign
from harness.campaign.model import CampaignError
from harness.campaign.options import campaign_from_options, sweep_engines
from harness.run.errors import RunnerError
from harness.run.runner import run_campaign
from tests.harness.conftest import one_phone, the_phone

PHONE = "stagechk"
WORK = "data/local/tmp/bmoe"
# bionic linker/linker_main.cpp __linker_cannot_link: "CANNOT LINK EXECUTABLE \"%s\": %s", then
# _exit(EXIT_FAILURE); the reason as linker/linker.cpp words a missing DT_NEEDED library
LINKER_SAYS = 'CANNOT LINK EXECUTABLE "$0": library "libc++_shared.so" not found: needed by main executable'


@pytest.fixture(scope="module")
def phone(adb_port, phone_home):
    with one_phone(PHONE, 128 << 20, adb_port, phone_home) as info:
        yield info


def campaign(name, model: Path, adb_port, phone_home, engine=None, run=None, cache_mb=(0,)):
    data = {"version": 1, "name": name,
            "fleet": {"devices": [f"virtual:{PHONE}"], "virtual_home": str(phone_home),
                      "adb": [{"host": "127.0.0.1", "port": adb_port}]},
            "models": {"m": str(model)}, "axes": {"cache_mb": list(cache_mb)},
            "run": {"n_predict": 2, "threads": 1, **(run or {})}, "gate": {"max_wait_s": 1}}
    if engine:
        data["engine"] = engine
    return parse_campaign(data, source=f"{name}.toml")


def test_an_engine_the_linker_refuses_stops_the_campaign_before_any_model_is_pushed(tmp_path, phone, adb_port,
                                                                                   phone_home, tiny_model):
    build = tmp_path / "build"
    build.mkdir()
    cli = build / "bmoe-cli"
    cli.write_text(f"#!/system/bin/sh\necho '{LINKER_SAYS}' >&2\nexit 1\n")
    cli.chmod(0o755)
    model = shutil.copy(tiny_model, tmp_path / "linkfail.gguf")
    c = campaign("linkfail", Path(model), adb_port, phone_home,
                 engine={"kind": "native", "native": {"host": {"cli": str(cli)}}})
    with pytest.raises(RunnerError) as refused:
        run_campaign(c, tmp_path / "out", progress_stream=io.StringIO())
    said = str(refused.value)
    assert said.startswith(f"virtual:{PHONE}: the engine cannot start there (exit status 1): CANNOT LINK EXECUTABLE ")
    assert 'library "libc++_shared.so" not found: needed by main executable' in said and "\n" not in said
    assert not (phone.root / WORK / "linkfail.gguf").exists()          # the model never went
    assert not list((tmp_path / "out").glob("runs/*/*/run.json"))      # no cell ran


def test_a_push_the_phone_refuses_for_good_is_not_retried(tmp_path, phone, adb_port, phone_home, tiny_model):
    """A directory stands where the model's copy goes: adbd answers `couldn't create file: Is a
    directory` (EISDIR) every time. Each cell is push_failed after one attempt (run.retries would
    have made it three more), the second cell without asking the phone again."""
    model = Path(shutil.copy(tiny_model, tmp_path / "refused.gguf"))
    blocker = phone.root / WORK / "refused.gguf.partial"
    # made by the phone's shell user, as a push's folders are: a folder this host's root made on the
    # way would refuse the campaign's own mkdir (EACCES) before any push, in whichever worker runs
    # this test first on its phone
    shell = the_phone(adb_port, phone).shell
    assert shell(f"mkdir -p /{WORK}/refused.gguf.partial && echo x > /{WORK}/refused.gguf.partial/keep")[0] == 0
    try:
        c = campaign("refused", model, adb_port, phone_home, run={"retries": 2, "retry_backoff_s": 0.1},
                     cache_mb=(0, 8))
        run_campaign(c, tmp_path / "out", progress_stream=io.StringIO())
    finally:
        shutil.rmtree(blocker)
    lines = [json.loads(line) for line in (tmp_path / "out" / "ledger.jsonl").read_text().splitlines()]
    assert [(line["outcome"], line["attempt"]) for line in lines] == [("push_failed", 1), ("push_failed", 1)]
    runs = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("runs/*/*/run.json"))]
    assert all("refused: couldn't create file: Is a directory (not retried" in r["evidence"][0] for r in runs)


# ---- sweep --engine ABI=PATH -------------------------------------------------------------------

def executable(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_sweep_engine_abi_builds_serve_real_phones(tmp_path, tiny_model):
    host = executable(tmp_path / "host", "bmoe-cli")
    arm = executable(tmp_path / "arm64", "bmoe-cli")
    (tmp_path / "arm64" / "libc++_shared.so").write_text("x")
    engine, builds = sweep_engines([str(host), f"arm64-v8a={arm}"])
    assert (engine, builds) == (str(host), {"arm64-v8a": str(arm)})
    c = campaign_from_options(["local"], [str(tiny_model)], ["0"], engine=engine, engine_builds=builds)
    phone = DeviceIdentity(serial="R58N", backend="adb", model="m", manufacturer="x", soc="y", abi="arm64-v8a",
                           android_release="14", sdk=34, ram_total_kb=1, swap_total_kb=0)
    served = c.engine.build_for_device(phone)
    assert served is not None and served.cli == str(arm) and [Path(p).name for p in served.libs] == ["libc++_shared.so"]
    assert c.to_dict()["engine"]["native"]["arm64-v8a"]["cli"] == str(arm)    # campaign.toml keeps it for `run`
    only_arm = campaign_from_options(["local"], [str(tiny_model)], ["0"], engine_builds={"arm64-v8a": str(arm)})
    assert only_arm.engine.kind == "native" and [b.abi for b in only_arm.engine.native] == ["arm64-v8a"]
    # a device no build serves: the sweep's own option named, not a campaign file's table
    assert only_arm.engine.missing_build(dataclasses.replace(phone, abi="x86_64"), "R58N", sweep=True) == (
        "engine.native: no build for device R58N (ABI x86_64); have arm64-v8a: give --engine x86_64=PATH "
        "(a bmoe-cli built for it)")


@pytest.mark.parametrize(("values", "problem"), [
    (["arm64-v8a=/nowhere/bmoe-cli"], r"^--engine arm64-v8a=: \"/nowhere/bmoe-cli\" is no file"),
    (["arm64-v8a={arm}", "arm64-v8a={arm}"], r"^--engine: two builds for ABI arm64-v8a; give one"),
    (["bmoe-py", "arm64-v8a={arm}"], r"^--engine bmoe-py cannot go with ABI=PATH builds"),
    (["{arm}", "{arm}"], r"^--engine: .* and .*: give one engine for this host"),
    (["arm 64=x"], r"^--engine \"arm 64=x\": expected bmoe-py, PATH or ABI=PATH"),
])
def test_sweep_engine_values_that_cannot_be_meant(tmp_path, tiny_model, values, problem):
    arm = executable(tmp_path / "arm64", "bmoe-cli")
    values = [v.format(arm=arm) for v in values]
    with pytest.raises(CampaignError, match=problem):
        engine, builds = sweep_engines(values)
        campaign_from_options(["local"], [str(tiny_model)], ["0"], engine=engine, engine_builds=builds)


def test_sweep_cli_takes_abi_builds_and_names_the_option_a_device_lacks(tmp_path, tiny_model):
    from harness.cli.main import main

    arm = executable(tmp_path / "arm64", "bmoe-cli")
    out = CliRunner().invoke(main, ["sweep", "--device", "local", "--model", str(tiny_model), "--engine",
                                    f"arm64-v8a={arm}", "--dry-run", "-o", str(tmp_path / "o")])
    assert out.exit_code == 1
    assert out.output.strip().splitlines()[-1] == (
        f"Error: sweep: engine.native: no build for device local (ABI {os.uname().machine}, runs this host's "
        f"{os.uname().machine} binaries); have arm64-v8a: give --engine PATH (a bmoe-cli built for it)")
    host = executable(tmp_path / "host", "bmoe-cli")
    out = CliRunner().invoke(main, ["sweep", "--device", "local", "--model", str(tiny_model), "--engine", str(host),
                                    "--engine", f"arm64-v8a={arm}", "--dry-run", "--json", "-o", str(tmp_path / "o")])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["cells"] and not (tmp_path / "o").exists()
    out = CliRunner().invoke(main, ["sweep", "--device", "local", "--model", str(tiny_model), "--engine",
                                    f"arm64-v8a={arm}", "--preset", "community", "-o", str(tmp_path / "o")])
    assert out.exit_code == 1 and "give its host build too (--engine PATH)" in out.output
