"""`bmoe-fleet virtual up|down|list`: parse options, call one devices.virtual.manager function.

Registered by harness/cli.py; library errors are engine.errors.BmoeError subclasses, which the
main group prints as `Error: ...` with exit status 1.
"""

from __future__ import annotations

import json

import click


@click.group("virtual")
def virtual() -> None:
    """Virtual phones: a local adbd per phone with its own RAM limit, reached through adb."""


@virtual.command("up")
@click.option("--name", required=True, help="Phone name (letters, digits, '_', '.', '-').")
@click.option("--ram", "ram_text", required=True, help="RAM, e.g. 3GiB or 512MiB (a memory cgroup limit).")
@click.option("--model", default="vphone", show_default=True, help="ro.product.model.")
@click.option("--manufacturer", default="bmoe", show_default=True, help="ro.product.manufacturer.")
@click.option("--soc", default="sm8550", show_default=True,
              help="ro.soc.model; picks the cpufreq layout (sm8650, sm8550, sm8450, tensor-g3, mt6989).")
@click.option("--android", type=int, default=14, show_default=True, help="Android release (9-16).")
@click.option("--abi", default="arm64-v8a", show_default=True, help="ro.product.cpu.abi.")
@click.option("--port", type=int, help="TCP port on 127.0.0.1 (default: any free port).")
@click.option("--no-isolation", is_flag=True,
              help="No memory cgroup or mount namespace: an RSS watchdog enforces the RAM instead.")
@click.option("--apps", "apps", default="",
              help="Other open apps: STATE:SIZE[:compressible],... with STATE foreground, visible, perceptible, "
                   "previous or cached (e.g. cached:300MiB,perceptible:200MiB).")
@click.option("--home", type=click.Path(file_okay=False), help="Folder of phones (default ~/.bmoe-fleet/virtual).")
def up(name: str, ram_text: str, model: str, manufacturer: str, soc: str, android: int, abi: str,
       port: int | None, no_isolation: bool, apps: str, home: str | None) -> None:
    """Start a virtual phone and `adb connect` it; prints its serial."""
    from devices.virtual.manager import up as start
    from engine.units import parse_bytes

    serial = start(name, parse_bytes(ram_text), model=model, soc=soc, android=android, port=port,
                   manufacturer=manufacturer, abi=abi, home=home, isolated=not no_isolation, apps=apps)
    click.echo(serial)


@virtual.command("down")
@click.argument("name", required=False)
@click.option("--all", "all_phones", is_flag=True, help="Stop every virtual phone.")
@click.option("--purge", is_flag=True, help="Also delete the phone's folder (its /data, logcat buffers).")
@click.option("--home", type=click.Path(file_okay=False), help="Folder of phones (default ~/.bmoe-fleet/virtual).")
def down(name: str | None, all_phones: bool, purge: bool, home: str | None) -> None:
    """Disconnect and stop NAME (or --all); its folder is kept unless --purge."""
    from devices.virtual.manager import down as stop

    for stopped in stop(name, all_phones=all_phones, purge=purge, home=home):
        click.echo(f"stopped {stopped}")


@virtual.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--home", type=click.Path(file_okay=False), help="Folder of phones (default ~/.bmoe-fleet/virtual).")
def list_(as_json: bool, home: str | None) -> None:
    """List virtual phones, running or not."""
    from devices.virtual.manager import list_phones

    phones = list_phones(home)
    if as_json:
        click.echo(json.dumps([p.to_dict() for p in phones], indent=2))
        return
    for p in phones:
        status = p.serial if p.running else "stopped"
        click.echo(f"{p.name:<16} {status:<22} {p.ram_bytes / (1 << 20):>8.0f} MiB  {p.model} ({p.soc}, "
                   f"Android {p.android})")
        for app in p.apps:
            click.echo(f"{'':<16} app {app}")
