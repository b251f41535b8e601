"""`virtual up --profile NAME` through the CLI: the phone has the profile's published figures scaled
to this host (devices/virtual/profiles.py), the read rate converted from the maker's MB/s to the
MiB/s --storage-mbps takes, and a flag given beside the profile wins."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from devices.virtual import manager, profiles
from engine.units import MIB
from harness.cli.main import main
from tests.devices.conftest import needs_zram


def test_profiles_scale_ram_zram_and_cores_and_convert_the_read_rate():
    a05 = profiles.get("galaxy-a05").scaled()
    assert a05["ram_bytes"] == 512 * MIB and a05["zram_bytes"] == 256 * MIB and a05["cpus"] == 1
    assert a05["storage_mbps"] == 238                       # 250 MB/s
    assert profiles.get("galaxy-s24").scaled()["storage_mbps"] == 4005      # 4200 MB/s


@needs_zram
def test_a_profile_phone_through_the_cli(adb_server, phone_home):
    env = {"ANDROID_ADB_SERVER_PORT": str(adb_server.port), "ADB_SERVER_SOCKET": None}
    up = CliRunner().invoke(main, ["virtual", "up", "--name", "a05", "--profile", "galaxy-a05", "--android", "14",
                                   "--home", str(phone_home)], env=env)
    assert up.exit_code == 0, up.output
    serial = up.stdout.strip().splitlines()[-1]      # what this host cannot give is said on stderr
    try:
        out = adb_server.run("-s", serial, "shell", "getprop ro.product.model; getprop ro.build.version.release; "
                             "nproc; grep -E '^(MemTotal|SwapTotal):' /proc/meminfo").stdout.decode().split()
        assert out == ["Galaxy", "A05", "14", "1", "MemTotal:", str(512 * 1024), "kB", "SwapTotal:", str(256 * 1024),
                       "kB"], out
        info = manager.info("a05", phone_home)
        assert info.storage_mbps == 238 and len(info.cpus) == 1, info
    finally:
        down = CliRunner().invoke(main, ["virtual", "down", "a05", "--home", str(phone_home)], env=env)
        assert down.exit_code == 0, down.output


def test_a_phones_settings_are_the_defaults_then_the_profile_then_the_flags():
    """`virtual up`'s merge (profiles.settings): a flag beats the profile, the profile the defaults;
    RAM given without zram drops the profile's zram; no RAM at all is refused."""
    from devices.virtual import profiles

    def half(ram: int) -> int:
        return ram // 2

    ram, s = profiles.settings("pixel8", {"cpus": None, "soc": "mine"}, None, None, half)
    scaled = profiles.get("pixel8").scaled()
    assert ram == scaled["ram_bytes"] and s["zram_bytes"] == scaled["zram_bytes"] and s["cpus"] == scaled["cpus"]
    assert s["soc"] == "mine" and s["model"] == "Pixel 8" and "ram_bytes" not in s
    ram, s = profiles.settings("pixel8", {}, 300 << 20, None, half)
    assert ram == 300 << 20 and s["zram_bytes"] == 150 << 20              # the profile's zram was for its RAM
    ram, s = profiles.settings("pixel8", {}, 300 << 20, 0, half)
    assert s["zram_bytes"] == 0
    ram, s = profiles.settings(None, {}, 64 << 20, None, half)
    assert (ram, s["model"], s["zram_bytes"], s["storage_mbps"]) == (64 << 20, "vphone", 32 << 20, 0)
    with pytest.raises(profiles.ProfileError, match="give --ram or --profile"):
        profiles.settings(None, {}, None, None, half)
    with pytest.raises(profiles.ProfileError, match="no phone profile 'x'"):
        profiles.settings("x", {}, 1 << 30, None, half)
