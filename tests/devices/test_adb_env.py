"""adb's environment variables, read in one place (devices.adb.server): which server, which device.

The precedence is adb's own (client/commandline.cpp): ADB_SERVER_SOCKET wins over
ANDROID_ADB_SERVER_ADDRESS/ANDROID_ADB_SERVER_PORT; an explicit --adb or [[fleet.adb]] wins over
all of them. The end-to-end half (commands reaching a real server on a non-default port, nothing
on 5037) is tests/devices/test_adb_env_commands.py.
"""

from __future__ import annotations

import pytest

from devices.adb.server import AdbServer, default_serial, default_server, server_at
from devices.base import DeviceError
from harness.campaign.file import parse_campaign
from harness.campaign.model import CampaignError
from harness.campaign.options import campaign_from_options
from harness.campaign.presets import sweep_campaign

ADB_VARS = ("ADB_SERVER_SOCKET", "ANDROID_ADB_SERVER_ADDRESS", "ANDROID_ADB_SERVER_PORT", "ANDROID_SERIAL",
            "ANDROID_ADB_SERVER_HOST")


@pytest.fixture
def clean_env(monkeypatch):
    """No adb variable set (the test session's own adb server sets ANDROID_ADB_SERVER_PORT)."""
    for name in ADB_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("env, expected", [
    ({}, ("127.0.0.1", 5037)),
    ({"ANDROID_ADB_SERVER_PORT": "6001"}, ("127.0.0.1", 6001)),
    ({"ANDROID_ADB_SERVER_ADDRESS": "lab.example", "ANDROID_ADB_SERVER_PORT": "6001"}, ("lab.example", 6001)),
    ({"ANDROID_ADB_SERVER_ADDRESS": "lab.example"}, ("lab.example", 5037)),
    ({"ANDROID_ADB_SERVER_ADDRESS": "[::1]", "ANDROID_ADB_SERVER_PORT": "6001"}, ("::1", 6001)),
    ({"ADB_SERVER_SOCKET": "tcp:6002"}, ("127.0.0.1", 6002)),
    ({"ADB_SERVER_SOCKET": "tcp:farm.example:6003"}, ("farm.example", 6003)),
    ({"ADB_SERVER_SOCKET": "tcp:[::1]:6004"}, ("::1", 6004)),
    # the socket wins over the other two, as in adb
    ({"ADB_SERVER_SOCKET": "tcp:farm.example:6003", "ANDROID_ADB_SERVER_ADDRESS": "lab.example",
      "ANDROID_ADB_SERVER_PORT": "6001"}, ("farm.example", 6003)),
    # empty values are unset; the misnamed ANDROID_ADB_SERVER_HOST is no adb variable
    ({"ADB_SERVER_SOCKET": "", "ANDROID_ADB_SERVER_PORT": ""}, ("127.0.0.1", 5037)),
    ({"ANDROID_ADB_SERVER_HOST": "lab.example"}, ("127.0.0.1", 5037)),
])
def test_the_server_comes_from_adbs_variables_in_adbs_precedence(env, expected):
    server = default_server(env)
    assert (server.host, server.port) == expected


@pytest.mark.parametrize("env, message", [
    ({"ADB_SERVER_SOCKET": "localabstract:adb"}, "ADB_SERVER_SOCKET='localabstract:adb': expected tcp:PORT"),
    ({"ADB_SERVER_SOCKET": "tcp:host:"}, "ADB_SERVER_SOCKET='tcp:host:': the port must be a number from 1 to 65535"),
    ({"ADB_SERVER_SOCKET": "tcp:host:70000"}, "the port must be a number from 1 to 65535"),
    ({"ANDROID_ADB_SERVER_PORT": "adb"}, "ANDROID_ADB_SERVER_PORT='adb': the port must be a number"),
    ({"ANDROID_ADB_SERVER_PORT": "0"}, "ANDROID_ADB_SERVER_PORT='0': the port must be a number"),
    ({"ANDROID_ADB_SERVER_PORT": "٣٣"}, "ANDROID_ADB_SERVER_PORT='٣٣'"),     # digits int() takes, adb does not
])
def test_a_value_adb_would_refuse_is_one_line_naming_the_variable(env, message):
    with pytest.raises(DeviceError) as caught:
        default_server(env)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_what_is_given_wins_over_the_environment(clean_env):
    clean_env.setenv("ADB_SERVER_SOCKET", "tcp:farm.example:6003")
    assert server_at("127.0.0.1", 7000) == AdbServer("127.0.0.1", 7000)
    assert server_at(None, 7000) == AdbServer("farm.example", 7000)
    assert server_at() == AdbServer("farm.example", 6003)
    assert AdbServer.parse("[::1]:7001") == AdbServer("::1", 7001) and AdbServer.parse(":7002").host == "127.0.0.1"
    with pytest.raises(DeviceError, match="--adb expects HOST:PORT"):
        AdbServer.parse("host:99999")


def test_android_serial_is_the_default_device(clean_env):
    assert default_serial() is None and default_serial({"ANDROID_SERIAL": ""}) is None
    assert default_serial({"ANDROID_SERIAL": "R58M123"}) == "R58M123"


def test_a_campaign_takes_the_server_from_the_environment_unless_it_names_one(clean_env, tiny_model):
    clean_env.setenv("ADB_SERVER_SOCKET", "tcp:farm.example:6003")
    clean_env.setenv("ANDROID_ADB_SERVER_PORT", "6001")
    data = {"version": 1, "fleet": {"devices": ["R58M123"]}, "models": {"m": str(tiny_model)}}
    assert parse_campaign(data).adb == (AdbServer("farm.example", 6003),)
    named = dict(data, fleet={"devices": ["R58M123"], "adb": [{"host": "lab.example", "port": 6037}]})
    assert parse_campaign(named).adb == (AdbServer("lab.example", 6037),)
    assert campaign_from_options(["R58M123"], [str(tiny_model)], ["0"], adb=["lab.example:6037"]).adb == \
        (AdbServer("lab.example", 6037),)
    # this host alone needs no server: the environment is not even read
    clean_env.setenv("ADB_SERVER_SOCKET", "localabstract:adb")
    assert parse_campaign(dict(data, fleet={"devices": ["local"]})).adb == ()
    with pytest.raises(CampaignError) as caught:
        parse_campaign(data, source="c.toml")
    assert str(caught.value).startswith("c.toml: ADB_SERVER_SOCKET='localabstract:adb': expected tcp:PORT")


def test_android_serial_is_the_device_of_a_sweep_or_file_naming_none(clean_env, tiny_model):
    no_devices = {"version": 1, "models": {"m": str(tiny_model)}}
    with pytest.raises(CampaignError, match=r"fleet\.devices: missing: .* or set ANDROID_SERIAL"):
        parse_campaign(no_devices)
    with pytest.raises(CampaignError, match=r"--device: name at least one device .* or set ANDROID_SERIAL"):
        sweep_campaign(None, set(), dict(devices=[], models=[str(tiny_model)], cache_mb=["0"]))
    clean_env.setenv("ANDROID_SERIAL", "R58M123")
    assert parse_campaign(no_devices).devices == ("R58M123",)
    assert sweep_campaign(None, set(), dict(devices=[], models=[str(tiny_model)], cache_mb=["0"])).campaign.devices \
        == ("R58M123",)
    # a device named wins; the serial is checked as a device string is
    assert sweep_campaign(None, set(), dict(devices=["local"], models=[str(tiny_model)],
                                            cache_mb=["0"])).campaign.devices == ("local",)
    clean_env.setenv("ANDROID_SERIAL", "two words")
    with pytest.raises(CampaignError, match='ANDROID_SERIAL: "two words" is not a device'):
        parse_campaign(no_devices)


def test_a_port_for_an_adb_server_is_free_and_below_the_kernels_ephemeral_range():
    import socket
    from pathlib import Path

    from devices.adb.server import free_server_port

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_server_port() for _ in range(20)}
    assert all(10000 <= p < low for p in ports) and len(ports) > 1, ports      # random: concurrent callers differ
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))          # free
