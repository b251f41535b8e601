"""`bmoe-fleet virtual up|down|list`: parse options, call one devices.virtual.manager function.

Registered by harness/cli/main.py; library errors are engine.errors.BmoeError subclasses, which the
main group prints as `Error: ...` with exit status 1.
"""

from __future__ import annotations

import json

import click

from engine.safetext import printable
from engine.units import KIB, MIB
from harness.cli.numbers import INT


@click.group("virtual")
def virtual() -> None:
    """Virtual phones: a local adbd per phone with its own RAM limit, reached through adb."""


@virtual.command("up")
@click.option("--name", required=True, help="Phone name (letters, digits, '_', '.', '-'; at most 63).")
@click.option("--ram", "ram_text", help="RAM, e.g. 3GiB or 512MiB (a memory cgroup limit), at least 32MiB and at "
                                        "most this host's; required without --profile.")
@click.option("--model", help="ro.product.model (default vphone; no ':', ';' or '=', which adb's banner splits at).")
@click.option("--manufacturer", help="ro.product.manufacturer (default bmoe; no '/' or ':', the fingerprint's "
                                     "separators).")
@click.option("--soc", help="ro.soc.model; picks the cpufreq layout (sm8650, sm8550 the default, sm8450, "
                            "tensor-g3, mt6989; others get a generic one; no '/'). --model, --manufacturer and "
                            "--soc: 1-91 bytes, no control characters.")
@click.option("--android", type=INT, help="Android release (9-16, default 14).")
@click.option("--zram", "zram_text", help="The phone's own zram swap, e.g. 512MiB, at most twice the RAM; 0 for "
                                          "none (default: half the RAM, refused where the host has no zram).")
@click.option("--zram-algorithm", help="zram's compressor (default lz4, as on Android).")
@click.option("--swappiness", type=INT, help="The phone's swappiness, 0-200 (default 100, Android's).")
@click.option("--cpus", type=INT, help="Cores of its own, a cpuset (default: the host's, shared).")
@click.option("--storage-mbps", type=INT,
              help="Read rate of its /data in MiB/s, every read paced, at most 100000 (default: none).")
@click.option("--profile", help="A real phone's figures scaled to this host (devices/virtual/profiles.py): "
                                "pixel8, galaxy-s24, redmi-note12, galaxy-a05, or celsius-zones (a vendor whose "
                                "CPU zones count °C); flags given override them.")
@click.option("--build", type=click.Choice(["user", "userdebug"]), default="user", show_default=True,
              help="ro.build.type; a userdebug build's logd keeps the kernel's log (logcat -b kernel).")
@click.option("--page-size", "page_size", type=click.Choice(["4k", "16k"]),
              help="The page size its shell sees (getconf PAGESIZE, /proc/vmstat's page counters); 16k from "
                   "Android 15 (default 4k).")
@click.option("--data-quota", "data_quota_text",
              help="The size of its /data and /sdcard, e.g. 8GiB: a write past it fails with ENOSPC (default: "
                   "the host's disk, no quota).")
@click.option("--abi", default="arm64-v8a", show_default=True,
              help="ro.product.cpu.abi: arm64-v8a, armeabi-v7a, riscv64, x86 or x86_64.")
@click.option("--port", type=INT, help="TCP port on 127.0.0.1 (default: any free port).")
@click.option("--no-isolation", is_flag=True,
              help="No memory cgroup or mount namespace: an RSS watchdog enforces the RAM instead.")
@click.option("--apps", "apps", default="",
              help="Other open apps: STATE:SIZE[:compressible][:active],... with STATE foreground, visible, perceptible, "
                   "previous or cached (e.g. cached:300MiB,perceptible:200MiB).")
@click.option("--home", type=click.Path(file_okay=False), help="Folder of phones (default ~/.bmoe-fleet/virtual).")
def up(name: str, ram_text: str | None, model: str | None, manufacturer: str | None, soc: str | None,
       android: int | None, zram_text: str | None, zram_algorithm: str | None, swappiness: int | None,
       cpus: int | None, storage_mbps: int | None, profile: str | None, build: str, page_size: str | None,
       data_quota_text: str | None, abi: str, port: int | None, no_isolation: bool, apps: str,
       home: str | None) -> None:
    """Start a virtual phone and `adb connect` it; prints its serial."""
    from devices.virtual import profiles, variant
    from devices.virtual.manager import VirtualPhoneError
    from devices.virtual.manager import up as start
    from engine.units import parse_bytes

    def default_zram(ram_bytes: int) -> int:
        # half the RAM where the host has zram (docs/decisions/vphone-zram.md), else none
        from devices.virtual import zram
        has_zram = zram.available() is None and not no_isolation
        return (ram_bytes // 2) & ~(MIB - 1) if has_zram else 0

    given = {"model": model, "manufacturer": manufacturer, "soc": soc, "android": android, "cpus": cpus,
             "storage_mbps": storage_mbps}
    page_size_bytes = variant.PAGE_SIZES_BYTES[page_size or "4k"]
    data_quota_bytes = 0 if data_quota_text is None or data_quota_text.strip() == "0" else parse_bytes(data_quota_text)
    try:
        ram_bytes, base = profiles.settings(
            profile, given, None if ram_text is None else parse_bytes(ram_text),
            None if zram_text is None else 0 if zram_text.strip() == "0" else parse_bytes(zram_text), default_zram)
    except profiles.ProfileError as e:
        raise VirtualPhoneError(str(e)) from None
    serial = start(name, ram_bytes, port=port, abi=abi, home=home, isolated=not no_isolation, apps=apps,
                   zram_algorithm=zram_algorithm or "lz4", swappiness=100 if swappiness is None else swappiness,
                   profile=profile or "", build=build, page_size_bytes=page_size_bytes,
                   data_quota_bytes=data_quota_bytes, **base)
    click.echo(serial)


@virtual.command("down")
@click.argument("name", required=False)
@click.option("--name", "named", help="The phone's name, as `up` takes it (the same as NAME).")
@click.option("--all", "all_phones", is_flag=True, help="Stop every virtual phone.")
@click.option("--purge", is_flag=True, help="Also delete the phone's folder (its /data, logcat buffers).")
@click.option("--home", type=click.Path(file_okay=False), help="Folder of phones (default ~/.bmoe-fleet/virtual).")
def down(name: str | None, named: str | None, all_phones: bool, purge: bool, home: str | None) -> None:
    """Disconnect and stop NAME (or --name NAME, or --all); its folder is kept unless --purge."""
    from devices.virtual.manager import down as stop

    if name is not None and named is not None and name != named:
        raise click.UsageError(f"two names given ({name!r} and --name {named!r}): give one")
    for stopped in stop(name or named, all_phones=all_phones, purge=purge, home=home):
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
        # a phone's strings are what `virtual up` was given: shown escaped, never as raw control bytes
        status = printable(p.serial or "?") if p.running else "stopped"
        click.echo(f"{printable(p.name):<16} {status:<22} {p.ram_bytes / MIB:>8.0f} MiB  {printable(p.model)} "
                   f"({printable(p.soc)}, Android {printable(str(p.android))})")
        extras = [f"zram {p.zram_bytes // MIB} MiB" if p.zram_bytes else "",
                  f"cores {','.join(map(str, p.cpus))}" if p.cpus else "",
                  f"flash {p.storage_mbps} MiB/s" if p.storage_mbps else "",
                  p.build if p.build != "user" else "",
                  f"{p.page_size_bytes // KIB} KiB pages" if p.page_size_bytes != 4096 else "",
                  f"/data {p.data_quota_bytes // MIB} MiB" if p.data_quota_bytes else ""]
        if any(extras):
            click.echo(f"{'':<16} " + ", ".join(e for e in extras if e))
        for app in p.apps:
            click.echo(f"{'':<16} app {printable(str(app))}")
