"""Models already on the devices (`device:PATH`): priced from their GGUF headers, nothing pushed.

A campaign model written `device:/sdcard/Download/x.gguf` is never pushed; its cells run it at
that path (on `local`, a path on this host). The plan still needs its token cycle, which the GGUF
header holds (metadata and tensor infos: KiB to a few MiB of a file that may be 60 GiB). So each
device's copy is read from the front in growing pieces, and only the header is kept:

- Every piece lands at its offset in a local sparse file as long as the device's file, which
  engine.gguf.header then reads as if it were the file. A parse whose header ends
  (`data_offset`) inside the bytes already pulled read nothing else, so it is the header;
  otherwise (it ran into the sparse hole, or failed there) the next piece doubles what is pulled.
- A split model is named by its first shard (bmoe-cli loads a split model from it); every
  shard's header is read, since pricing needs the tensor infos of each. Shards are found by
  llama.cpp's `NAME-00001-of-00003.gguf` naming, beside the first.
- Every device of the campaign must hold the same model (same header bytes and file sizes):
  otherwise one model name would measure different files.

This runs in `harness.run.runner.prepare`, once per campaign run (so also for `--dry-run`).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from devices.base import RANGE_ALIGN, Device, DeviceError
from engine.errors import ModelError
from engine.gguf.header import GGUF_MAGIC, read_header
from engine.gguf.model import ModelShape, load_model_shape
from engine.units import MIB
from harness.campaign.device_resolution import DeviceRef
from harness.campaign.model import Campaign, CampaignError, ModelSpec

FIRST_PIECE_BYTES = 4 * RANGE_ALIGN       # 256 KiB: most headers; a large vocabulary takes a few doublings
# Ten times the largest real header (a 150k-token vocabulary with its merges is ~6 MiB): a corrupt
# file, whose parse keeps failing however much is pulled, stops here.
HEADER_MAX_BYTES = 64 * MIB
_SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<no>[0-9]{5})-of-(?P<count>[0-9]{5})\.gguf$")


@dataclass(frozen=True)
class DeviceModel:
    """A `device:` model as one device holds it: its shape and what identifies its bytes."""

    name: str
    shape: ModelShape                  # priced from the pulled headers; its paths are the device's
    shard_bytes: tuple[int, ...]       # each shard's file size on the device
    header_sha256: tuple[str, ...]     # sha256 of each shard's header bytes
    pulled_bytes: int                  # what was read from the device for it (all shards)

    def identity(self) -> dict[str, Any]:
        """What models/<id>.json keeps instead of a whole-file sha256 (hashing 60 GiB on a phone
        would take minutes per campaign start): a changed header or size is a changed model."""
        return {"shard_bytes": list(self.shard_bytes), "header_sha256": list(self.header_sha256)}


def shard_paths(path: str) -> tuple[str, ...]:
    """Every shard of a split model on a device, from its first shard; a plain file is itself."""
    folder, base = posixpath.split(path)
    m = _SHARD_RE.match(base)
    if not m:
        return (path,)
    count = int(m["count"])
    if int(m["no"]) != 1:
        raise ModelError(f"{path} is shard {int(m['no'])} of a split model: name its first shard "
                         f"({m['stem']}-00001-of-{count:05d}.gguf), which bmoe-cli loads it from")
    return tuple(posixpath.join(folder, f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1))


def pull_header(device: Device, path: str, local: Path) -> tuple[bytes, int, int]:
    """(header bytes, file size, bytes pulled) of one GGUF file on a device. `local` is left as a
    sparse file of the device file's size holding what was pulled, for engine.gguf.model to read."""
    size = device.file_size(path)
    if size is None:
        raise ModelError(f"{path}: no such file on the device")
    data = bytearray()
    want = FIRST_PIECE_BYTES
    while True:
        want = min(want, size, HEADER_MAX_BYTES)
        if want > len(data):
            piece = device.read_range(path, len(data), want - len(data))
            if len(piece) != want - len(data):
                raise ModelError(f"{path}: read {len(piece)} of {want - len(data)} bytes at byte {len(data)} "
                                 f"(the file is {size} bytes; did it change?)")
            data += piece
            if data[:4] != GGUF_MAGIC:         # decided by real bytes: no need to pull more
                raise ModelError(f"{path}: not a GGUF file (no GGUF magic at byte 0)")
        with open(local, "wb") as fh:
            fh.write(data)
            fh.truncate(size)               # the rest is a hole: never pulled, never stored
        problem = None
        try:
            header = read_header(local)
            if header.data_offset <= len(data):
                return bytes(data[:header.data_offset]), size, len(data)
        except ModelError as e:             # maybe only the hole: decided once the bytes are real
            problem = e
        if len(data) >= min(size, HEADER_MAX_BYTES):
            if problem is not None:
                raise problem
            raise ModelError(f"{path}: no GGUF header ends in the first {len(data)} bytes")
        want = 2 * len(data)


def load_device_model(device: Device, model: ModelSpec) -> DeviceModel:
    """Price a `device:` model from the headers of its shards on one device."""
    paths = shard_paths(model.path)
    with tempfile.TemporaryDirectory(prefix="bmoe-header-") as scratch:
        local_of = {p: Path(scratch) / posixpath.basename(p) for p in paths}
        headers, sizes, pulled = [], [], 0
        try:
            for p in paths:
                header, size, n = pull_header(device, p, local_of[p])
                headers.append(header)
                sizes.append(size)
                pulled += n
            shape = load_model_shape(local_of[paths[0]])
        except ModelError as e:             # name the device's folder, not the scratch one
            raise ModelError(str(e).replace(scratch + "/", posixpath.dirname(paths[0]) + "/")) from None
        device_of = {str(local): p for p, local in local_of.items()}
    return DeviceModel(model.name, _with_paths(shape, device_of), tuple(sizes),
                       tuple(hashlib.sha256(h).hexdigest() for h in headers), pulled)


def _with_paths(shape: ModelShape, device_of: Mapping[str, str]) -> ModelShape:
    """The shape with every file path the device's (it was read from local sparse copies)."""
    def moved(t):
        return replace(t, path=device_of[t.path])

    return replace(shape, paths=tuple(device_of[p] for p in shape.paths),
                   moe_layers=tuple(replace(layer, tensors=tuple(moved(t) for t in layer.tensors))
                                    for layer in shape.moe_layers),
                   dense_tensors=tuple(moved(t) for t in shape.dense_tensors))


def price_device_models(campaign: Campaign, refs: Sequence[DeviceRef]) -> dict[str, DeviceModel]:
    """Every `device:` model of a campaign, priced from each device's copy (they must agree).
    Errors are CampaignErrors naming the model's key and the device."""
    where = f"{campaign.source}: " if campaign.source else ""
    out: dict[str, DeviceModel] = {}
    for model in (m for m in campaign.models if m.on_device):
        key = f"{where}models.{model.name}"
        first: tuple[str, DeviceModel] | None = None
        for ref in refs:
            try:
                found = load_device_model(ref.open(), model)
            except (ModelError, DeviceError) as e:
                raise CampaignError(f"{key}: {model.spec} on {ref.spec}: {e}") from None
            if first is None:
                first = (ref.spec, found)
            elif found.identity() != first[1].identity():
                raise CampaignError(f"{key}: {model.spec} differs between {first[0]} and {ref.spec} (header or "
                                    "size): one model name must be the same file on every device")
        if first is not None:
            out[model.name] = first[1]
    return out
