"""From a campaign's device strings to things the runner can open, asking the network.

resolve_devices() asks each `[[fleet.adb]]` server what it has attached (starting a local server
only where none answers, devices.adb.ensure_server), `adb connect`s the `fleet.connect` endpoints
and virtual phones not yet attached, and looks virtual phones up through their manager. An absent
device is a CampaignError naming its key; nothing is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from devices.adb import server as adbmod
from devices.adb.server import AdbServer
from devices.base import Device
from engine.errors import BmoeError
from harness.campaign.model import LOCAL, VIRTUAL_PREFIX, Campaign, CampaignError, device_work_dir
from store.names import device_id


@dataclass(frozen=True)
class DeviceRef:
    """A campaign device, resolved: how to reach it. Opening it gives a devices.base.Device."""

    spec: str                       # as the campaign names it
    kind: str                       # local | adb | virtual
    serial: str                     # the adb serial ("local" for this host)
    server: AdbServer | None = None
    phone_name: str | None = None   # virtual phones

    @property
    def device_id(self) -> str:
        """The device as one path component of the campaign directory."""
        return device_id(self.spec)

    @property
    def lock_key(self) -> str:
        """Two campaigns naming one phone differently (virtual:x, 127.0.0.1:PORT) share its serial."""
        return device_id(self.serial)

    @property
    def work_dir(self) -> str:
        """Where engine, models and outputs are staged on the device."""
        return device_work_dir(self.spec)

    def open(self) -> Device:
        """The device itself (this host, or a phone over adb): connects nothing until used."""
        if self.kind == "local":
            from devices.local import LocalDevice

            return LocalDevice(work_dir=self.work_dir)
        from devices.adb.phone import AdbPhone

        return AdbPhone(self.serial, self.server, work_dir=self.work_dir)


def _device_key(campaign: Campaign, spec: str) -> str:
    if spec in campaign.connect:
        return f"fleet.connect[{campaign.connect.index(spec)}]"
    listed = [d for d in campaign.devices if d not in campaign.connect]
    return f"fleet.devices[{listed.index(spec)}]" if spec in listed else "fleet.devices"


def resolve_devices(campaign: Campaign) -> list[DeviceRef]:
    """Find every device of the campaign (adb servers asked, endpoints connected, virtual phones
    looked up). An absent device is a CampaignError naming its key; nothing is written."""
    listings: dict[AdbServer, dict[str, str]] = {}

    def listing(server: AdbServer, key: str, spec: str) -> dict[str, str]:
        if server not in listings:
            try:
                adbmod.ensure_server(server)
                listings[server] = {d.serial: d.state for d in server.client().list()}
            except (BmoeError, *adbmod.TRANSPORT_ERRORS) as e:
                raise CampaignError(f"{campaign.where}{key}: unknown device {json.dumps(spec)}: adb server "
                                    f"{server.host}:{server.port} does not answer ({e})") from None
        return listings[server]

    def find(serial: str, key: str, spec: str) -> AdbServer | None:
        for server in campaign.adb:
            if listing(server, key, spec).get(serial) == "device":
                return server
        return None

    refs = []
    for spec in campaign.devices:
        key = _device_key(campaign, spec)
        if spec == LOCAL:
            refs.append(DeviceRef(spec, "local", LOCAL))
            continue
        if spec.startswith(VIRTUAL_PREFIX):
            from devices.virtual import manager

            name = spec[len(VIRTUAL_PREFIX):]
            try:
                info = manager.info(name, campaign.virtual_home)
            except BmoeError as e:
                raise CampaignError(f"{campaign.where}{key}: unknown device {json.dumps(spec)}: {e}") from None
            if not info.running or not info.serial:
                raise CampaignError(f"{campaign.where}{key}: virtual phone {name!r} is down; start it with "
                                    f"`bmoe-fleet virtual up --name {name} --ram …`")
            server = find(info.serial, key, spec)
            if server is None:
                server = campaign.adb[0]
                _connect(server, info.serial, campaign, key, spec)
                listings.pop(server, None)
            refs.append(DeviceRef(spec, "virtual", info.serial, server, name))
            continue
        if spec in campaign.connect:
            server = find(spec, key, spec)
            if server is None:
                server = campaign.adb[0]
                listing(server, key, spec)
                _connect(server, spec, campaign, key, spec)
                listings.pop(server, None)
            refs.append(DeviceRef(spec, "adb", spec, server))
            continue
        server = find(spec, key, spec)
        if server is None:
            seen = {s: st for srv in campaign.adb for s, st in listing(srv, key, spec).items()}
            where = ", ".join(f"{s.host}:{s.port}" for s in campaign.adb)
            if spec in seen:
                raise CampaignError(f"{campaign.where}{key}: device {json.dumps(spec)} is {seen[spec]} on adb "
                                    f"server {where} (not ready to run commands)")
            attached = ", ".join(sorted(seen)) or "none"
            raise CampaignError(f"{campaign.where}{key}: unknown device {json.dumps(spec)}: not attached to adb "
                                f"server {where} (attached: {attached})")
        refs.append(DeviceRef(spec, "adb", spec, server))
    return refs


def _connect(server: AdbServer, address: str, campaign: Campaign, key: str, spec: str) -> None:
    try:
        adbmod.connect(server, address)
    except BmoeError as e:
        raise CampaignError(f"{campaign.where}{key}: unknown device {json.dumps(spec)}: {e}") from None
