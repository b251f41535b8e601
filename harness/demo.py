"""`bmoe-fleet demo`: the main job on an embedded default, start to finish on this machine.

1. Synthesise a qwen3moe whose expert bank is larger than the smaller virtual phone's RAM.
2. Start two virtual phones (640 MiB and 2 GiB of RAM, one core and a 300 MiB/s flash of their own
   each where the host has two cores) on a private adb server — or, where virtual
   phones cannot start (no root for cgroups and namespaces, say), use this host alone and say why.
3. Sweep the cache budget around the model's token cycle, at the knee of the LRU curve replayed
   from a route-traced probe on each device, and past the small phone's RAM; and let the engine's
   own planner pick one (`--auto`: bmoe-py claims bmoe-cli 0.25, the release with the planner).
4. Run every recommended command line once on its phone (`recommend --verify`), while the phones
   are still up.
5. On each phone, price upstream's Android app's default dropping (`--drop-cold-experts 0.75`):
   two budgets with it and without it, each answer set against its lossless twin's.
6. Render the site, print the recommendations (per phone and load: what the runs showed over adb,
   where lmkd never kills the engine, beside the app's verdict replayed from them), what the app's
   dropping costs and buys on each phone, and the path of index.html.

Everything it starts it stops; the campaign directory and the site stay in --out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from devices.adb.server import free_server_port
from engine.errors import BmoeError
from engine.gguf.inspect import inspect_model
from engine.gguf.synth import synth_options, write_model
from engine.units import GIB, MIB
from store.campaign_dir import CampaignDir

if TYPE_CHECKING:
    from harness.campaign.model import Campaign
    from harness.run.status import CampaignStatus

Echo = Callable[[str], None]

TOP_K = 4                        # the demo model's own top-k
PHONES = {"small": (640 * MIB, "Demo 640MB", "sm6375"), "large": (2 * GIB, "Demo 2GB", "sm8550")}
# each phone's own flash (MiB/s, virtual up --storage-mbps): a phone reads its own storage, where
# unpaced phones share this host's disk and one phone's reads slow the other's
STORAGE_MBPS = 300
# the other apps open beside the engine, one load per value (axes.apps): two installed apps opened
# through ActivityManager (the browser behind, at 700, then the maps in front, at 0: registered with
# lmkd, which kills them before a foreground app), and 160 MiB of ballast in use (a shell allocator at
# a perceptible adj, which lmkd never considers: memory other apps hold)
APPS = ("open:com.bmoe.app.browser+open:com.bmoe.app.maps", "perceptible:160MiB:active")
# a session cell as the app runs the engine: turns with an idle gap, another app allocating in it
TURNS, IDLE_S, GAP_APP = 3, 5.0, "cached:160MiB:active"
# Long enough that prefill routes through most experts (~640 MiB of the 1032 MiB bank).
PROMPT = ("In the early morning the fishermen of the northern coast pushed their boats into the grey water, "
          "counting the gulls, the clouds and the long swell that promised either a good catch or a storm "
          "before the evening bells.")


@dataclass(frozen=True)
class DemoResult:
    """Where the demo left its campaign directory and site."""

    out_dir: str
    campaign_dir: str
    index_html: str
    devices: tuple[str, ...]


def _model(out: Path, echo: Echo) -> Path:
    path = out / "demo-qwen3moe.gguf"
    # 8 layers x 72 experts of hidden 768: a 1.01 GiB expert bank (past the small phone's RAM)
    # while a token costs only what 4 experts cost. Uniform routing
    # (skew 0), so a long prompt reads nearly the whole bank.
    options = synth_options("qwen3moe", layers=8, experts=72, top_k=TOP_K, hidden=768, expert_ffn=768, vocab=512,
                            seed=1, router_skew=0.0)
    if not path.exists():
        write_model(path, options)
    echo(inspect_model(str(path)).text)
    return path


def _start_phones(home: Path, port: int, env: dict, echo: Echo,
                  phones: dict[str, tuple[int, str, str]] = PHONES, storage_mbps: int = STORAGE_MBPS) -> list[str]:
    from devices.adb.server import adb_binary
    from devices.virtual import manager

    done = subprocess.run([adb_binary(), "-P", str(port), "start-server"], env=env, capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise BmoeError(f"cannot start an adb server: {done.stderr.strip()}")
    names = []
    # a core of its own per phone where the host has one for each, so no run is oversubscribed
    cpus = 1 if len(os.sched_getaffinity(0)) >= len(phones) else 0
    # zram of half the RAM, as `virtual up` gives by default, where this host can make zram devices
    from devices.virtual import zram

    no_zram = zram.available()
    if no_zram is not None:
        echo(f"virtual phones without zram here ({no_zram})")
    for name, (ram_bytes, model, soc) in phones.items():
        zram_bytes = ram_bytes // 2 if no_zram is None else 0
        serial = manager.up(name, ram_bytes, model=model, soc=soc, home=home, adb_host="127.0.0.1", adb_port=port,
                            cpus=cpus, zram_bytes=zram_bytes, storage_mbps=storage_mbps)
        echo(f"virtual phone {name}: {serial}, {ram_bytes // MIB} MiB RAM"
             + (f", {zram_bytes // MIB} MiB zram" if zram_bytes else "")
             + (f", flash {storage_mbps} MiB/s" if storage_mbps else "")
             + (f", core {','.join(map(str, manager.info(name, home).cpus))}" if cpus else ""))
        names.append(name)
    return names


def _campaign(model: Path, devices: list[str], port: int, home: Path):
    """The demo's sweep, built the way `bmoe-fleet sweep` builds one."""
    from harness.campaign.options import campaign_from_options

    return campaign_from_options(
        devices, [str(model)], ["0", "cycle*0.9", "cycle*1.2", "cycle*4", "knee", "auto", "1400"],
        # auto capped at 384 (fills on both phones; beside its app the small one swaps the cache out
        # and back in each token: fought), 480 (past the small one's RAM left beside its app: fought
        # or killed) and 600 (fills the large one: this prompt routes
        # to ~640 MiB of experts, so an uncapped or 1400 MiB cache survives there without filling, which
        # proves nothing over what it held)
        cache_ceil_mb=[0, 384, 480, 600], repeats=1, n_predict=12, adb=[f"127.0.0.1:{port}"], name="demo", timeout_s=600,
        # on the phones, beside other apps: two the user opened (lmkd's to kill: the run's collateral
        # over adb) and a load of ballast (memory lmkd cannot take back)
        apps=list(APPS) if any(d.startswith("virtual:") for d in devices) else [],
        extra={"fleet": {"virtual_home": str(home)}, "axes": {"cache_floor_mb": 256}, "run": {"prompt": PROMPT},
               "gate": {"cpu_temp_max_c": 95.0, "max_wait_s": 10}},
        # and the engine's own planner on each phone, beside the boundary the sweep measures (sweep --plan)
        planner=True)


def _turns_campaign(model: Path, devices: list[str], port: int, home: Path):
    """The app's way of running the engine on each phone: one session of TURNS turns at the
    cycle*4 budget, IDLE_S between them, a cached app allocating in each gap."""
    from harness.campaign.options import campaign_from_options

    return campaign_from_options(
        devices, [str(model)], ["cycle*4"], repeats=1, n_predict=12, adb=[f"127.0.0.1:{port}"], name="demo-turns",
        timeout_s=600, turns=TURNS, idle_s=IDLE_S, gap_apps=GAP_APP,
        extra={"fleet": {"virtual_home": str(home)}, "run": {"prompt": PROMPT},
               "gate": {"cpu_temp_max_c": 95.0, "max_wait_s": 10}})


def _drop_campaign(model: Path, devices: list[str], port: int, home: Path):
    """The app's default dropping on each phone: two budgets (just over the token cycle, where a miss
    is common, and four cycles) with `--drop-cold-experts 0.75` and without it, at the model's own
    top-k and at half of it (the other lossy lever), no other app open: every answer is set against
    the lossless run's of the same question (results.read.quality)."""
    from engine.interface.flags import DROP_COLD_EXPERTS
    from harness.campaign.options import campaign_from_options
    from results.analysis.android_app import APP_DROP_COLD

    return campaign_from_options(
        devices, [str(model)], ["cycle*1.2", "cycle*4"], n_expert_used=[0, TOP_K // 2], repeats=1, n_predict=12,
        adb=[f"127.0.0.1:{port}"], name="demo-drop", timeout_s=600,
        flags=[f"{DROP_COLD_EXPERTS.name}=false,{APP_DROP_COLD:g}"],
        extra={"fleet": {"virtual_home": str(home)}, "run": {"prompt": PROMPT},
               "gate": {"cpu_temp_max_c": 95.0, "max_wait_s": 10}})


def run_demo(out_dir: str, echo: Echo = print, use_phones: bool = True) -> DemoResult:
    """The whole demo (module doc), into out_dir."""
    from harness.run.verify import verifier
    from results.analysis.recommend import recommend
    from results.site.report import build_site

    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = _model(out, echo)
    home = out / "phones"
    port = free_server_port()
    # the private server's log (adb.UID.log in $TMPDIR: GetLogFilePath in AOSP's adb) stays in the
    # demo's folder, not in the host's /tmp
    env = dict(os.environ, ANDROID_ADB_SERVER_PORT=str(port), ADB_MDNS="0", TMPDIR=str(out))
    devices = ["local"]
    phones: list[str] = []
    try:
        if use_phones:
            try:
                phones = _start_phones(home, port, env, echo)
                devices = [f"virtual:{n}" for n in phones]
            except (BmoeError, OSError) as e:
                echo(f"virtual phones cannot start here ({e}); running the demo on this host alone")
        campaign = _campaign(model, devices, port, home)
        (out / "demo.toml").write_text(campaign.to_toml())  # to rerun or edit by hand
        campaign_dir = out / "campaign"
        echo(run_into(campaign, campaign_dir, echo).text())
        dirs = [campaign_dir]
        if phones:
            turns_dir = out / "turns"
            echo(run_into(_turns_campaign(model, devices, port, home), turns_dir, echo).text())
            dirs.append(turns_dir)
        drop_dir = out / "drop"
        echo(run_into(_drop_campaign(model, devices, port, home), drop_dir, echo).text())
        dirs.append(drop_dir)
        # while the phones are up: every recommended command line, once, on its own device
        recs = recommend([campaign_dir], verify=verifier(echo))
    finally:
        if phones:
            from devices.adb.server import adb_binary
            from devices.virtual import manager

            manager.down(all_phones=True, home=home, adb_host="127.0.0.1", adb_port=port)
            subprocess.run([adb_binary(), "-P", str(port), "kill-server"], env=env, capture_output=True, timeout=60)
    site = build_site(dirs, out / "site", recommendations=recs)
    if phones:
        echo("")
        echo(_turns_text(out / "turns"))
    echo("")
    echo(recs.text())
    echo("")
    echo(_drop_text(drop_dir))
    echo("")
    echo(site.text())
    return DemoResult(str(out), str(campaign_dir), str(Path(site.out_dir) / "index.html"), tuple(devices))


def run_into(campaign: Campaign, campaign_dir: Path, echo: Echo = print) -> CampaignStatus:
    """Run (or resume) one of the demo's campaigns in its folder. A folder without a plan (a run cut
    before its first write) is started again; one that holds another campaign (an older release's
    demo, whose plan differs) is kept beside it under a free name, said in one line, and the
    demo starts afresh: a rerun of the demo never stops on its own earlier output, nor deletes it."""
    from harness.run.errors import OtherCampaignError
    from harness.run.runner import run_campaign

    if campaign_dir.exists() and not CampaignDir(campaign_dir).has_plan():
        shutil.rmtree(campaign_dir)
    try:
        return run_campaign(campaign, campaign_dir)
    except OtherCampaignError:
        n = 1
        while (kept := campaign_dir.with_name(f"{campaign_dir.name}.previous-{n}")).exists():
            n += 1
        campaign_dir.rename(kept)
        echo(f"{campaign_dir} held another demo's campaign (an earlier release's plan): kept as {kept.name}")
        return run_campaign(campaign, campaign_dir)


def _drop_text(drop_dir: Path) -> str:
    """What the app's default dropping costs and buys on each device (results.analysis.app_drop)."""
    from results.analysis.app_drop import APP_NAME, app_costs
    from results.read.rundir import read_campaigns
    from results.read.table import build_table

    table = build_table(read_campaigns([drop_dir]))
    costs = app_costs(table)
    lines = [f"{APP_NAME} on each device, beside the same budget without it (upstream's app sends it whenever "
             "its cache is on):"]
    lines += [f"  {c.device}: {c.text}" for c in costs] or ["  not measured: no run of it finished"]
    return "\n".join(lines)


def _turns_text(turns_dir: Path) -> str:
    """Each phone's session cell, turn by turn (the run table's turn columns)."""
    from results.read.columns import C
    from results.read.rundir import read_campaigns
    from results.read.table import build_table

    table = build_table(read_campaigns([turns_dir]))
    lines = [f"session cells ({TURNS} turns, {IDLE_S:g} s idle, {GAP_APP} allocating in each gap):"]
    for row in table.to_dict("records"):
        lines.append(f"  {row[C.device]} {row[C.outcome]}: hit % by turn {row.get(C.turn_demand_hit_pct)}, MiB read "
                     f"{row.get(C.turn_read_mib)}, re-read after the gap {row.get(C.gap_reread_mib)} MiB"
                     + (f", taken in the gap ({row.get(C.gap_taken)})" if row.get(C.gap_taken) else ""))
    return "\n".join(lines)
