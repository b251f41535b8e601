"""`bmoe-fleet report --format community`: upstream's community-benchmark rows, ready to paste.

BigMoeOnEdge's docs/community-benchmarks.md collects one Markdown row per machine, in this column
order: Hardware | Storage (512 KiB rate) | Model, quant | k | Cache | Decode tok/s | Prefill tok/s
| Stall s/tok | Flash/token | Cache hit | Engine | By. One row here per (device, model, top-k),
from the campaign directories given (a `sweep --preset community` run is the protocol itself):

- the run reported is the second of the protocol's two (upstream: "run twice, report the
  second"); a note says when the two differ by more than DIFFER_PCT;
- Hardware names a phone by its class (RAM, SoC family), never its model: upstream publishes no
  identifying name; this host by architecture, cores and RAM;
- Storage is the device's storage probe (`storage/<device>.json`, written by harness.campaign.presets),
  else n/a;
- o_direct and the engine's mode are checked: a run whose expert reads fell back to buffered I/O
  is marked, and one that did not stream (no `bmoe: expert streaming ON` line: mmap) is labelled
  a baseline in the Cache column;
- protocol deviations (fewer than 256 tokens, a fixed cache, other lanes or dense mode, flags the
  engine lacked) are listed under the table.

Above the rows, bench-report.sh's machine table (MACHINE_COLUMNS): one row per device.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from engine.interface.flags import CHATML, OVERLAP, UBATCH
from engine.interface.outputs import STALL_UNION
from engine.units import GIB, KIB
from results import formats
from results.errors import ResultsError
from results.numbers import to_float
from results.publish import Redactor
from results.read.columns import C
from results.read.parse_console import streamed
from results.read.run_keys import AUTO_BUDGET, MMAP, budget_label
from results.read.rundir import read_campaigns
from results.read.table import build_table
from store.errors import StoreError
from store.names import COMMUNITY_JSON, STDERR_TXT, STORAGE_DIR
from store.outcomes import OK
from store.versioned import STORAGE, read_json

# ── the protocol (upstream's docs/community-benchmarks.md and scripts/bench-report.sh): the
# sweep runs it (harness.campaign.presets), the rows say where a run departs from it ──────────────────
COMMUNITY_PROMPT = ("Write a long detailed essay about the history of computing including its origins its key "
                    "milestones the people involved and the future directions of the field")
COMMUNITY_TOKENS = 256
COMMUNITY_RUNS = 2
COMMUNITY_LANES = 4
# in the order bench-report.sh passes them; each is kept only where the engine has it
COMMUNITY_FLAGS = ((CHATML.typed,), (UBATCH.typed, "512"), (OVERLAP.typed,))

COLUMNS = ("Hardware", "Storage (512 KiB rate)", "Model, quant", "k", "Cache", "Decode tok/s", "Prefill tok/s",
           "Stall s/tok", "Flash/token", "Cache hit", "Engine", "By")
NUMERIC = ("k", "Cache", "Decode tok/s", "Prefill tok/s", "Stall s/tok", "Flash/token", "Cache hit")
# bench-report.sh's first table: the machine, one row per device
MACHINE_COLUMNS = ("CPU", "Cores / threads used", "RAM", "Storage", "Storage read (512 KiB, O_DIRECT)", "OS")
MACHINE_NUMERIC = ("Cores / threads used", "RAM", "Storage read (512 KiB, O_DIRECT)")
DIFFER_PCT = 5.0
PHONE_SIZES_GIB = (1, 1.5, 2, 3, 4, 6, 8, 10, 12, 16, 18, 20, 24, 32)
_SOC_FAMILIES = (("snapdragon", "Snapdragon"), ("qcom", "Snapdragon"), ("sm", "Snapdragon"), ("sdm", "Snapdragon"),
                 ("msm", "Snapdragon"), ("dimensity", "Dimensity"), ("mediatek", "Dimensity"), ("mt", "Dimensity"),
                 ("tensor", "Tensor"), ("gs", "Tensor"), ("zuma", "Tensor"), ("exynos", "Exynos"), ("s5e", "Exynos"),
                 ("kirin", "Kirin"), ("unisoc", "Unisoc"), ("ums", "Unisoc"), ("sc9", "Unisoc"))


@dataclass(frozen=True)
class CommunityRow:
    device: str                          # ours, for the notes; never printed in the row
    cells: Mapping[str, str]             # column -> text, in COLUMNS order
    run_id: str
    notes: tuple[str, ...]
    machine: Mapping[str, str]           # MACHINE_COLUMNS -> text: the device the run ran on


def soc_family(soc: str, abi: str = "") -> str:
    """A SoC string as its family ("sm8650" -> Snapdragon); the ABI's when no family is known."""
    s = (soc or "").lower()
    for prefix, family in _SOC_FAMILIES:
        if s.startswith(prefix) or prefix in s.split():
            return family
    return "ARM" if abi.startswith("arm") else (abi or "unknown")


def _phone_ram(mem_kb: float | None) -> str:
    if not mem_kb:
        return "RAM unknown"
    gib = mem_kb * KIB / GIB
    if gib < 1:
        return f"{mem_kb / 1024:,.0f} MiB RAM"
    size = next((s for s in PHONE_SIZES_GIB if s >= gib - 0.01), math.ceil(gib))
    return f"{size:g} GB RAM"


def hardware_class(identity: Mapping[str, Any], cores: float | None) -> str:
    """A phone by class ("Phone, 12 GB RAM, Snapdragon class"), never by model; this host by
    architecture, cores and RAM."""
    kind = str(identity.get("kind") or "")
    mem = identity.get("ram_total_kb")
    if kind in ("adb", "virtual"):
        what = "Virtual phone" if kind == "virtual" else "Phone"
        return f"{what}, {_phone_ram(mem)}, {soc_family(str(identity.get('soc') or ''), str(identity.get('abi') or ''))} class"
    if kind == "local":
        arch = str(identity.get("abi") or identity.get("host_abi") or "host")
        core = f" {int(cores)} cores" if cores and not math.isnan(cores) else ""
        ram = f", {mem * KIB / GIB:.0f} GB RAM" if mem else ""
        return f"Linux host, {arch}{core}{ram}"
    return "unknown hardware"


def machine_cells(identity: Mapping[str, Any], probe: Mapping[str, Any], cores: float,
                  threads: Any) -> dict[str, str]:
    """bench-report.sh's machine row for a device: its CPU (a phone by SoC class only, as the
    Hardware column names it), cores / threads the run used, RAM (whole GiB as the script prints
    it; a phone by its class size), the drive the model sat on and its probed rate, the OS."""
    kind = str(identity.get("kind") or "")
    phone = kind in ("adb", "virtual")
    mem = identity.get("ram_total_kb")
    soc = str(identity.get("soc") or "")
    cpu = f"{soc_family(soc, str(identity.get('abi') or ''))} class" if phone else (soc or "unknown")
    used = to_float(threads)
    rate = probe.get("mib_per_s")
    kernel = str(identity.get("kernel") or "")
    android = str(identity.get("android_release") or "")
    os_text = (f"Android {android}" if android else "Android") + (f" (Linux {kernel})" if kernel else "") if phone \
        else (f"Linux {kernel}" if kernel else "unknown")
    return {
        "CPU": cpu,
        "Cores / threads used": (f"{cores:.0f}" if not math.isnan(cores) else "n/a") + " / "
                                + (f"{used:.0f}" if not math.isnan(used) else "n/a"),
        "RAM": (_phone_ram(mem).removesuffix(" RAM") if phone else f"{int(mem) * KIB // GIB} GiB") if mem else "n/a",
        "Storage": str(probe.get("drive") or "") or "n/a",
        "Storage read (512 KiB, O_DIRECT)": f"{rate:.0f} MiB/s" if rate else "n/a",
        "OS": os_text,
    }


def _num(x: Any, fmt: str, suffix: str = "") -> str:
    v = to_float(x)
    return "n/a" if math.isnan(v) else f"{v:{fmt}}{suffix}"


def _streamed(run_dir: str) -> bool | None:
    """The engine's own word on its mode: its `bmoe: expert streaming ON` stderr line."""
    path = Path(run_dir) / STDERR_TXT
    if not path.is_file():
        return None
    return streamed(path.read_text(encoding="utf-8", errors="replace"))


def _quant(record: Mapping[str, Any] | None) -> str:
    types: Mapping[str, float] = ((record or {}).get("quant_types") or {}).get("expert") or {}
    return max(types, key=lambda t: types[t]) if types else ""


def read_storage(root: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """The storage probes of a community campaign directory, by device (a file of another format
    or a newer version is left out)."""
    out = {}
    folder = Path(root) / STORAGE_DIR
    for p in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            data = read_json(p, STORAGE.name)
        except StoreError:
            continue
        out[str(data.get("device"))] = data
    return out


def community_rows(dirs: Sequence[str | Path], by: str = "bmoe-fleet",
                   model_files: Mapping[str, str] | None = None, table: pd.DataFrame | None = None) -> list[CommunityRow]:
    """One row per (device, model, top-k) of these campaign directories, with its notes (`table`:
    their run table as the results database gave it)."""
    camps = read_campaigns(list(dirs))
    table = build_table(camps, model_files) if table is None else table
    table = table[(table[C.latest]) & (~table[C.probe].astype(bool))]
    storage: dict[str, dict[str, Any]] = {}
    protocol_notes: list[str] = []
    identities: dict[str, Mapping[str, Any]] = {}
    models: dict[str, Mapping[str, Any]] = {}
    for c in camps:
        storage.update(read_storage(c.root))
        for name, rec in c.devices.items():
            identities.setdefault(name, rec)
        for name, rec in c.models.items():
            models.setdefault(name, rec)
        meta = c.root / COMMUNITY_JSON
        if meta.is_file():
            with contextlib.suppress(OSError, ValueError):
                protocol_notes += list(json.loads(meta.read_text(encoding="utf-8")).get("notes") or ())
    rows = []
    keys = table.assign(_k=[to_float(k) for k in table[C.n_expert_used]])
    for (device, model, k), runs in keys.groupby([C.device, C.model, "_k"], sort=True, dropna=False):
        runs = runs.sort_values([C.pass_, C.repeat, C.order])
        done = runs[runs[C.outcome] == OK]
        pick = done.iloc[1] if len(done) > 1 else (done.iloc[0] if len(done) else runs.iloc[-1])
        notes = list(dict.fromkeys(protocol_notes))
        if len(done) < 2:
            notes.append(f"{len(done)} finished run(s), not the protocol's two: this row is "
                         + ("its only run" if len(done) == 1 else f"a {pick[C.outcome]} run"))
        elif len(done) >= 2:
            a, b = to_float(done.iloc[0][C.tok_s_summary]), to_float(done.iloc[1][C.tok_s_summary])
            if a and b and not math.isnan(a) and not math.isnan(b) and abs(b / a - 1) * 100 > DIFFER_PCT:
                notes.append(f"the two runs differ by {abs(b / a - 1) * 100:.0f}% in decode tok/s "
                             f"({a:.1f} then {b:.1f}): the device was not in the same state")
        if pick[C.outcome] != OK:
            notes.append(f"the reported run ended {pick[C.outcome]}")
        streamed = _streamed(pick[C.run_dir])
        stream_flag = pick[C.moe_stream]
        mode_mmap = (stream_flag is not None and stream_flag == stream_flag and not bool(stream_flag)) \
            or streamed is False
        if to_float(pick[C.o_direct]) != 1 and not mode_mmap:
            notes.append("o_direct is not 1: the expert reads went through the page cache, not comparable")
        tokens = to_float(pick[C.tokens])
        if not math.isnan(tokens) and tokens < COMMUNITY_TOKENS:
            notes.append(f"{tokens:.0f} tokens, under the protocol's {COMMUNITY_TOKENS}")
        if not pick[C.cache_auto] and not mode_mmap:
            notes.append("a fixed cache budget, not the protocol's --cache-mb auto")
        if str(pick[C.dense_weights]) not in ("anon", ""):
            notes.append(f"--dense-weights {pick[C.dense_weights]}, not the protocol's anon")
        io = to_float(pick.get("io_threads"))
        if not math.isnan(io) and io and io != COMMUNITY_LANES and not mode_mmap:
            notes.append(f"{io:.0f} read lanes, not the protocol's {COMMUNITY_LANES}")
        basis = str(pick.get(C.stall_basis) or "")
        if basis != STALL_UNION and not mode_mmap:
            # upstream's table holds 0.22+ rows, whose stall is a union of stalled intervals (CHANGELOG 0.22.0)
            notes.append(f"stall is {'a per-thread mean (before 0.22)' if basis else 'of an unknown basis'}, "
                         "not comparable with the union of stalled intervals 0.22 and later report")
        budget = to_float(pick[C.cache_mb])
        asked = MMAP if mode_mmap else AUTO_BUDGET if pick[C.cache_auto] else budget
        cache = budget_label(asked, ceil_mb=pick[C.cache_ceil_mb], chose=budget, upstream=True)
        probe = storage.get(str(device)) or {}
        rate = probe.get("mib_per_s")
        store = f"~{rate:,.0f} MiB/s" if rate else "n/a"
        if not rate and probe.get("note"):
            notes.append(f"storage probe {probe['note']}")
        prefill_s = to_float(pick[C.prefill_s])
        prefill = to_float(pick[C.n_prompt]) / prefill_s if prefill_s > 0 else math.nan
        flash = to_float(pick[C.read_mib_per_tok])
        model_rec = models.get(str(model))
        quant = _quant(model_rec)
        hit = to_float(pick[C.cache_hit_pct])
        engine = str(pick[C.engine] or "")
        cells = {
            "Hardware": hardware_class({**dict(identities.get(str(device)) or {}), "kind": pick[C.device_kind]},
                                       to_float(pick.get(C.cores))),
            "Storage (512 KiB rate)": store,
            "Model, quant": f"{model} {quant}".strip(),
            "k": "n/a" if math.isnan(to_float(k)) else f"{to_float(k):.0f}",
            "Cache": cache,
            "Decode tok/s": _num(pick[C.tok_s_summary] if not math.isnan(to_float(pick[C.tok_s_summary]))
                                 else pick[C.tok_s], ".1f"),
            "Prefill tok/s": _num(prefill, ".1f"),
            "Stall s/tok": _num(pick[C.stall_s_per_tok], ".3f"),
            "Flash/token": "n/a" if math.isnan(flash) else (f"{flash:.0f} MiB" if flash >= 10 else f"{flash:.2f} MiB"),
            "Cache hit": "n/a" if math.isnan(hit) else f"{hit:.0f}%",
            "Engine": engine.removeprefix("bmoe-cli ") or "n/a",
            "By": by,
        }
        identity = {**dict(identities.get(str(device)) or {}), "kind": pick[C.device_kind]}
        rows.append(CommunityRow(str(device), cells, str(pick[C.run_id]), tuple(dict.fromkeys(notes)),
                                 machine_cells(identity, probe, to_float(pick.get(C.cores)), pick.get(C.cpu_threads))))
    if not rows:
        raise ResultsError("no runs to report")
    return rows


def community_markdown(rows: Sequence[CommunityRow]) -> str:
    """bench-report.sh's two tables: the machines (one row per device), then upstream's results
    rows; the notes listed under them."""
    machines = {r.device: dict(r.machine) for r in rows}
    text = ("**Machine**\n\n" + formats.to_md(list(machines.values()), MACHINE_COLUMNS, numeric=MACHINE_NUMERIC)
            + "\n**Run**\n\n" + formats.to_md([dict(r.cells) for r in rows], COLUMNS, numeric=NUMERIC))
    notes = [f"- row {i + 1} ({formats.md_text(r.device)}, run {formats.md_text(r.run_id)}): {formats.md_text(n)}"
             for i, r in enumerate(rows) for n in r.notes]
    return text + ("\nNotes:\n" + "\n".join(notes) + "\n" if notes else "")


def render_community(rows: Sequence[CommunityRow], as_json: bool = False) -> str:
    """`report --format community`: the rows as Markdown (or JSON), this host's paths redacted;
    the CLI writes it."""
    redactor = Redactor()
    if as_json:
        data = formats.to_json({"format": "bmoe-fleet.community-rows", "version": 1, "columns": list(COLUMNS),
                                "machine_columns": list(MACHINE_COLUMNS),
                                "rows": [redactor.value(asdict(r)) for r in rows]})
    else:     # redacted before the Markdown escapes: a path is found as written, `<campaign …>` then escaped
        data = community_markdown([CommunityRow(**redactor.value(asdict(r))) for r in rows])
    return data
