"""Upstream's community protocol from a whole fleet (docs/decisions/community-report.md): `sweep --preset
community` on two
virtual phones and this host with the real bmoe-cli, then `report --format community` prints one filled
row per device, in the column order of BigMoeOnEdge's docs/community-benchmarks.md; presets refuse what
they fix, and `--preset publish` asks what a published number needs."""

from __future__ import annotations

import json
import tomllib

import pytest
from click.testing import CliRunner

from results.analysis.community import COLUMNS, COMMUNITY_PROMPT, MACHINE_COLUMNS, hardware_class, soc_family
from tests.conftest import UPSTREAM_HOST, running_adb_server
from tests.results.test_outputs import md_table

PHONES = {"pa": ("Pixel 42 Ultra", "sm8650", 2 << 30), "pb": ("Galaxy Z 9", "MT6989", 3 << 30)}


@pytest.fixture(scope="module")
def community(tmp_path_factory, bmoe_cli):
    from devices.virtual import manager
    from harness.cli.main import main as cli

    out = tmp_path_factory.mktemp("community") / "camp"
    with running_adb_server(tmp_path_factory.mktemp("community-adb")) as (port, _env):
        try:
            for name, (model, soc, ram) in PHONES.items():     # in the fleet home's default phone folder
                manager.up(name, ram, model=model, soc=soc, adb_host="127.0.0.1", adb_port=port)
            campaign = CliRunner().invoke(cli, [
                "sweep", "--preset", "community", "--device", "local,virtual:pa,virtual:pb",
                "--model", str(UPSTREAM_HOST / "tiny-qwen3moe.gguf"), "--engine", str(bmoe_cli),
                "-t", "1",                       # ggml's pool spins past the free cores: the protocol's 4 is -t 1 here
                "--adb", f"127.0.0.1:{port}", "-o", str(out), "--json"], catch_exceptions=False)
        finally:
            for name in PHONES:
                manager.down(name, adb_host="127.0.0.1", adb_port=port)
    return out, campaign


@pytest.mark.phone
def test_the_community_preset_runs_the_protocol_on_every_device(community):
    out, result = community
    assert result.exit_code == 0, result.output
    plan = json.loads((out / "plan.json").read_text())
    assert len(plan["cells"]) == 3 * 2                           # each device, twice
    # upstream's protocol: "auto" threads are min(8, cores) on this host, 4 on a phone (-t 1 here overrides)
    assert tomllib.loads((out / "campaign.toml").read_text())["run"]["host_threads_max"] == 8
    for cell in plan["cells"]:
        c, argv = cell["config"], cell["argv"]
        assert (c["cache_auto"], c["dense_weights"], c["io_threads"], c["n_predict"]) == (True, "anon", 4, 256)
        assert c["prompt"] == COMMUNITY_PROMPT and argv[argv.index("-t") + 1] == "1"
        assert argv[argv.index("--ubatch") + 1] == "512" and "--chatml" in argv
        assert "--overlap" not in argv                        # bmoe-cli 0.19.0 lists it, its build refuses it
    meta = json.loads((out / "community.json").read_text())
    (note,) = meta["notes"]
    assert note.startswith("--overlap left out: the engine refuses it at load") and "fork" in note
    storage = {p.stem: json.loads(p.read_text()) for p in (out / "storage").glob("*.json")}
    assert set(storage) == {"local", "virtual-pa", "virtual-pb"}
    model_bytes = (UPSTREAM_HOST / "tiny-qwen3moe.gguf").stat().st_size
    for probe in storage.values():                            # O_DIRECT from the model file, a quarter in
        assert probe["offset_bytes"] == model_bytes // 4 // (512 * 1024) * (512 * 1024) > 0
        assert probe["bytes_read"] == model_bytes - probe["offset_bytes"]
        assert probe["mib_per_s"] > 0 and probe["o_direct"] and probe["note"] == "", probe
        assert probe["drive"] and "/" not in probe["drive"], probe          # a drive's name, not a path


@pytest.mark.phone
def test_report_community_prints_one_filled_row_per_device_in_upstreams_order(community, cli):
    out, _ = community
    result = CliRunner().invoke(cli, ["report", str(out), "--format", "community", "--by", "@fleet"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    machine_text, _, run_text = result.stdout.partition("**Run**")
    # bench-report.sh's machine table first: one row per device
    machines = md_table(machine_text)
    assert machine_text.startswith("**Machine**") and tuple(machines[0]) == MACHINE_COLUMNS
    assert len(machines) == 1 + 3 and all(len(r) == len(MACHINE_COLUMNS) and all(r) for r in machines[1:])
    (host,) = [r for r in machines[1:] if not r[5].startswith("Android")]
    phones_m = [r for r in machines[1:] if r is not host]
    assert host[5].startswith("Linux ") and host[1].endswith(" / 1") and host[2].endswith(" GiB")
    assert sorted((r[0], r[2]) for r in phones_m) == [("Dimensity class", "3 GB"), ("Snapdragon class", "2 GB")]
    assert all(r[5].startswith("Android 14 (Linux ") and r[4].endswith(" MiB/s") for r in phones_m)
    assert all(r[3] != "n/a" for r in machines[1:])                  # the drive under the model, as df names it
    rows = md_table(run_text)
    assert tuple(rows[0]) == COLUMNS == (
        "Hardware", "Storage (512 KiB rate)", "Model, quant", "k", "Cache", "Decode tok/s", "Prefill tok/s",
        "Stall s/tok", "Flash/token", "Cache hit", "Engine", "By")
    body = rows[1:]
    assert len(body) == 3
    assert all(len(r) == len(COLUMNS) and all(cell for cell in r) for r in body)
    for r in body:
        assert r[2] == "tiny-qwen3moe F32" and r[3] == "2" and r[4].startswith("auto (")
        assert float(r[5]) > 0 and float(r[6]) > 0 and r[9].endswith("%") and r[10] == "0.19.0" and r[11] == "@fleet"
    for model, _, _ in PHONES.values():                      # a phone is named by class, never by model
        assert model not in result.stdout
    phones = [r for r in body if r[0].startswith("Virtual phone")]
    assert sorted(r[0] for r in phones) == ["Virtual phone, 2 GB RAM, Snapdragon class",
                                            "Virtual phone, 3 GB RAM, Dimensity class"]
    assert all(r[1].startswith("~") and r[1].endswith(" MiB/s") for r in body)     # every device's storage probe
    # the reported run is the second of each device's two
    as_json = json.loads(CliRunner().invoke(cli, ["report", str(out), "--format", "community", "--json"]).stdout)
    assert all(row["run_id"] for row in as_json["rows"]) and len(as_json["rows"]) == 3
    plan = {c["cell_id"]: c for c in json.loads((out / "plan.json").read_text())["cells"]}
    assert all(plan[row["run_id"].split("/")[1]]["repeat"] == 1 for row in as_json["rows"])
    # bmoe-cli 0.19.0 (the 0.20 source) reports stall as a per-thread mean: every row says it is not
    # comparable with upstream's 0.22+ rows, whose stall is a union of stalled intervals
    assert all(any(n.startswith("stall is a per-thread mean (before 0.22)") for n in row["notes"])
               for row in as_json["rows"]), as_json["rows"]


def test_hardware_is_named_by_class():
    assert soc_family("sm8650") == "Snapdragon" and soc_family("MT6989") == "Dimensity"
    assert soc_family("gs201") == "Tensor" and soc_family("s5e9945") == "Exynos" and soc_family("", "arm64-v8a") == "ARM"
    phone = {"kind": "adb", "model": "SM-S928B", "soc": "sm8650", "ram_total_kb": 11_534_336}   # 11 GiB reported
    assert hardware_class(phone, 8) == "Phone, 12 GB RAM, Snapdragon class"


def test_presets_refuse_what_they_fix_and_publish_asks_for_a_published_number(cli, tiny_model, tmp_path):
    runner = CliRunner()
    fixed = runner.invoke(cli, ["sweep", "--preset", "community", "--model", str(tiny_model), "--cache-mb", "0",
                                "--device", "local", "-o", str(tmp_path / "c")])
    assert fixed.exit_code == 1 and "--preset community fixes --cache-mb (upstream's protocol)" in fixed.output
    short = runner.invoke(cli, ["sweep", "--preset", "publish", "--model", str(tiny_model), "--device", "local",
                                "-n", "64", "-o", str(tmp_path / "p")])
    assert short.exit_code == 1 and "-n 64 is under the 256 tokens" in short.output
    plan = runner.invoke(cli, ["sweep", "--preset", "publish", "--model", str(tiny_model), "--device", "local",
                               "--cache-mb", "0", "-o", str(tmp_path / "p"), "--dry-run", "--json"])
    assert plan.exit_code == 0, plan.output
    cells = json.loads(plan.stdout)["cells"]
    assert {c["config"]["n_predict"] for c in cells} == {256} and sorted({c["repeat"] for c in cells}) == [0, 1, 2]
    assert {c["pass"] for c in cells} == {0, 1} and not (tmp_path / "p").exists()
    none = runner.invoke(cli, ["sweep", "--model", str(tiny_model), "-o", str(tmp_path / "n")])
    assert none.exit_code == 1 and "--device: name at least one device" in none.output
