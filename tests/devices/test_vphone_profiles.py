"""`virtual up --profile NAME` through the CLI: the phone has the profile's published figures scaled
to this host (devices/virtual/profiles.py), the read rate converted from the maker's MB/s to the
MiB/s --storage-mbps takes, and a flag given beside the profile wins."""

from __future__ import annotations

from click.testing import CliRunner

from devices.virtual import manager, profiles
from harness.cli import main
from tests.devices.conftest import needs_zram

MIB = 1 << 20


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
    serial = up.output.strip().splitlines()[-1]
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
