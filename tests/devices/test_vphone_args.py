"""`virtual up` refuses, in one `Error:` line with a non-zero exit and before anything is made, every
argument its help excludes (devices/virtual/checks.py); the strings it accepts for properties
(--model, --manufacturer, --soc) reach getprop, the getprop table the phone's shell serves and
adbd's banner exactly as given.

No phone is started here: the daemon's launch is replaced by one that fails the test, so an
argument wrongly accepted costs a failed assertion, never a phone.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from click.testing import CliRunner

from devices.base import parse_getprop
from devices.virtual import checks, manager, tools
from devices.virtual.adbd import Banner
from devices.virtual.phone import PhoneSpec
from engine.units import MIB
from harness.cli.main import main


class _Launch:
    """manager's subprocess module while these tests run: starting the daemon fails the test."""

    @staticmethod
    def run(*args, **kwargs):
        raise AssertionError(f"a phone was started: {args}")


@pytest.fixture
def up(tmp_path, monkeypatch):
    monkeypatch.setattr(manager, "subprocess", _Launch)
    home = tmp_path / "phones"

    def invoke(*args: str):
        result = CliRunner().invoke(main, ["virtual", "up", "--name", "argphone", "--ram", "256MiB",
                                           "--home", str(home), *args])
        assert not home.exists(), f"{args} made {sorted(p.name for p in home.rglob('*'))}"
        return result
    return invoke


REFUSED = [
    (["--android", "8"], "Error: --android 8: give a release from 9 to 16"),
    (["--android", "17"], "Error: --android 17: give a release from 9 to 16"),
    (["--cpus", "\u0663"], "'\u0663' is not an ASCII decimal number"),          # ARABIC-INDIC THREE
    (["--storage-mbps", "\uff13"], "'\uff13' is not an ASCII decimal number"),  # FULLWIDTH THREE
    (["--swappiness", "\u0967\u0966"], "is not an ASCII decimal number"),     # DEVANAGARI 10
    (["--port", "\u0665\u0665\u0665\u0665"], "is not an ASCII decimal number"),
    (["--android", "\u0661\u0664"], "is not an ASCII decimal number"),
    (["--apps", "cached:\u0663\u0660\u0660MiB"], "Error: --apps item 'cached:\u0663\u0660\u0660MiB': ASCII only"),
    (["--storage-mbps", "1e23"], "'1e23' is not an ASCII decimal number"),
    (["--storage-mbps", str(10 ** 23)], f"Error: --storage-mbps {10 ** 23}: at most 100000 MiB/s"),
    (["--zram", "1TiB"], "Error: --zram 1048576MiB: at most 2 times the RAM (512 MiB for 256 MiB)"),
    (["--apps", "cached:1GiB"], "Error: --apps cached:1024MiB: larger than the phone's RAM (256 MiB)"),
    (["--ram", "64TiB"], "Error: --ram 67108864MiB refused: this host has"),
    (["--soc", "../../etc"], "Error: --soc '../../etc': no '/': it is ro.hardware"),
    (["--model", "a;b=c"], "Error: --model 'a;b=c': no ';' or '=': adbd's banner splits at"),
    (["--model", "a:b"], "Error: --model 'a:b': no ':'"),
    (["--model", "x\nro.debuggable=1"], "Error: --model 'x\\nro.debuggable=1': a control character"),
    (["--model", "\x1b]0;owned\x07"], "a control character"),
    (["--model", " padded"], "Error: --model ' padded': no space at either end"),
    (["--model", ""], "Error: --model '': give 1 to 91 bytes"),
    (["--model", "m" * 92], "give 1 to 91 bytes (Android's PROP_VALUE_MAX), not 92"),
    (["--manufacturer", "a/b"], "Error: --manufacturer 'a/b': no '/': it is Build.FINGERPRINT's first field"),
    (["--abi", "mips"], "Error: --abi 'mips': give one of Android's ABIs"),
    (["--zram-algorithm", "lz4;reboot"], "Error: --zram-algorithm 'lz4;reboot': give a kernel compressor's name"),
    (["--swappiness", "300"], "Error: swappiness 300 out of range (0-200)"),
    (["--port", "70000"], "Error: bad port 70000: give 1 to 65535"),
    (["--cpus", "-1"], "take sizes and counts of 0 or more"),
]


@pytest.mark.parametrize("args, message", REFUSED, ids=[" ".join(a)[:40] for a, _ in REFUSED])
def test_virtual_up_refuses_what_its_help_excludes_before_anything_starts(up, args, message):
    result = up(*args)
    assert result.exit_code != 0 and message in result.output, result.output
    assert result.output.strip().splitlines()[-1].startswith("Error: "), result.output


@pytest.mark.parametrize("name", ["ok\n", "../up", "a b", "x" * 64, ""])
def test_a_phone_name_is_one_folder_name_whole(tmp_path, monkeypatch, name):
    monkeypatch.setattr(manager, "subprocess", _Launch)
    result = CliRunner().invoke(main, ["virtual", "up", "--name", name, "--ram", "256MiB", "--home",
                                       str(tmp_path / "phones")])
    assert result.exit_code == 1 and result.output.startswith("Error: bad phone name "), result.output
    assert not (tmp_path / "phones").exists()


ACCEPTED_MODELS = ["Galaxy \"S24\" Ultra's <b>&</b> $(id) `x` # 5G", "小米 13 Pro", "SM-G998B/DS", "x]",
                   "tab-free [brackets] and \\ backslash"]


@pytest.mark.parametrize("model", ACCEPTED_MODELS)
def test_an_accepted_model_reaches_getprop_and_adbs_banner_as_given(tmp_path, model):
    checks.check_property("model", model)
    spec = PhoneSpec(name="rt", ram_bytes=256 * MIB, model=model, manufacturer="Vendor Co", soc="Tensor G3")
    for flag, value in (("manufacturer", spec.manufacturer), ("soc", spec.soc)):
        checks.check_property(flag, value)
    props = spec.props()
    (tmp_path / "system").mkdir()
    (tmp_path / tools.BUILD_PROP).write_text(tools.build_prop_text(props), encoding="utf-8")
    assert tools.read_props(tmp_path) == props
    assert parse_getprop(tools.getprop_text(tools.read_props(tmp_path), [])) == props
    # the table the phone's shell serves, through the shell that serves it
    table = tmp_path / "getprop.table"
    table.write_text(tools.props_table(tmp_path) or "", encoding="utf-8")
    script = tmp_path / "getprop"
    script.write_text(tools.getprop_script(str(table), str(tmp_path / tools.BUILD_PROP), "exit 9"))
    mksh = shutil.which("mksh")
    if mksh is not None:
        listed = subprocess.run([mksh, str(script)], capture_output=True, timeout=30)
        assert listed.returncode == 0 and parse_getprop(listed.stdout.decode("utf-8")) == props
        one = subprocess.run([mksh, str(script), "ro.product.model"], capture_output=True, timeout=30)
        assert one.stdout.decode("utf-8") == model + "\n"
    # adb.cpp parse_banner: the banner split at ':', its third piece at ';', each property at '='
    pieces = Banner(product_name=spec.device, model=model, device=spec.device).text().split(":")
    fields = dict(p.split("=") for p in pieces[2].split(";") if p.count("=") == 1)
    assert fields["ro.product.model"] == model


def test_the_library_refuses_as_the_cli_does():
    """manager.up's first step (check_args): the demo and the tests call it without the CLI."""
    good = dict(name="lib", ram_bytes=256 * MIB, model="vphone", manufacturer="bmoe", soc="sm8550", android=14,
                abi="arm64-v8a", port=None, apps=(), zram_bytes=128 * MIB, zram_algorithm="lz4", swappiness=100,
                cpus=0, storage_mbps=0, profile="", build="user", page_size_bytes=4096, data_quota_bytes=0,
                thermal_unit="mC")
    checks.check_args(**good)
    for bad, message in (({"android": 8}, "--android 8"), ({"soc": "a/b"}, "--soc 'a/b'"),
                         ({"zram_bytes": 513 * MIB}, "--zram 513MiB"), ({"profile": "nokia"}, "no phone profile"),
                         ({"apps": ("open:com.android.chrome",)}, "open:PACKAGE"),
                         ({"ram_bytes": 16 * MIB}, "too small")):
        with pytest.raises(manager.VirtualPhoneError, match=message):
            checks.check_args(**{**good, **bad})
