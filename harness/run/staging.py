"""The engine and the models as a device sees them: built (bmoe-py as one zipapp), pushed where
the device lacks the same bytes, and checked to start there; with them the text a quality scoring
run scores (harness.run.quality), when a cell has one.

A Stager keeps what one device has been given during a campaign run (its engine once per
connection, each model once), so a cell pushes only what is new; a lost device starts over.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devices import coapps
from devices.base import Device, DeviceError, DeviceLost, PushRefused, RunOutcome
from engine import fsutil
from engine.contract.claim import CLAIM_ENV
from engine.gguf.model import split_paths
from engine.interface.flags import VERSION
from engine.kernels import native
from harness.campaign.device_resolution import DeviceRef
from harness.campaign.model import RUN_AS_APP, Campaign, fleet_home, remote_model_path
from harness.plan.grid import Cell, engine_path
from harness.run import quality
from harness.run.errors import RunnerError

ENGINE_DIR = Path(__file__).resolve().parents[2] / "engine"


def build_bmoe_py(python: str) -> Path:
    """bmoe-py as one executable file: a zipapp of engine/ whose `#!` line is the interpreter the
    device runs it with, with its compiled kernels built here (a phone has no compiler; without
    one here either, bmoe-py runs its products in numpy). Deterministic (fixed timestamps), so the
    same source gives the same bytes and a device that has them is not pushed again. Its process
    name (comm) is `bmoe-py`."""
    entries = [("__main__.py", b"from engine.app.cli import main\nmain()\n")]
    # every module of the package, its sub-packages (engine/interface/) included
    entries += [(f"engine/{p.relative_to(ENGINE_DIR).as_posix()}", p.read_bytes())
                for p in sorted(ENGINE_DIR.rglob("*.py")) if "__pycache__" not in p.parts]
    entries.append((f"{native.ZIP_DIR}/{native.SOURCE}", (ENGINE_DIR / "kernels" / native.SOURCE).read_bytes()))
    library = native.built_library()
    if library is not None:
        entries.append((f"{native.ZIP_DIR}/{os.path.basename(library)}", Path(library).read_bytes()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    payload = b"#!" + python.encode() + b"\n" + buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest()[:16]
    path = fleet_home() / "engines" / digest / "bmoe-py"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fsutil.atomic_write(path, payload, mode=0o755)
    return path


@dataclass
class StagedEngine:
    """The engine as staged on one device."""

    kind: str
    path: str                          # on the device
    version: str = ""                  # the first line the engine's own --version prints
    sha256: str = ""
    env: dict[str, str] = field(default_factory=dict)
    build: str = ""                    # native: the engine.native key that served this device
    libs: list[dict[str, str]] = field(default_factory=list)   # native: name + sha256 of each pushed lib

    def to_dict(self) -> dict[str, Any]:
        """run.json's `engine`: what ran."""
        out: dict[str, Any] = {"kind": self.kind, "version": self.version, "sha256": self.sha256, "path": self.path}
        if self.kind == "native":
            out.update(build=self.build, libs=list(self.libs))
        return out


def engine_env(device: Device, extra: Mapping[str, str]) -> dict[str, str] | None:
    """The engine's environment: on this host the harness's own minus every BMOE_* variable (the
    engine reads BMOE_CACHE_MB and friends as flag overrides); phones scrub on the device side."""
    from devices.local import LocalDevice

    if isinstance(device, LocalDevice):
        env = {k: v for k, v in os.environ.items() if not k.startswith("BMOE_")}
        env.update(extra)
        return env
    return dict(extra)


def file_sha256(path: str) -> str:
    """A host file's sha256 (devices.local's, read in chunks)."""
    from devices.local import file_sha256 as sha256_of

    return sha256_of(path)


def open_device(ref: DeviceRef) -> Device:
    """Open a device, asking its adb server first whether it is attached (a phone that is gone
    would fail every command the slow way)."""
    if ref.server is not None:
        try:
            states = {d.serial: d.state for d in ref.server.client().list()}
        except Exception as e:  # adbutils raises its own errors and OSError
            raise DeviceLost(f"{ref.spec}: adb server {ref.server.host}:{ref.server.port} does not "
                             f"answer ({e})") from None
        if states.get(ref.serial) != "device":
            raise DeviceLost(f"{ref.spec}: device lost ({ref.serial} is "
                             f"{states.get(ref.serial, 'not attached')} on adb server "
                             f"{ref.server.host}:{ref.server.port})")
    return ref.open()


# bionic's linker, when it cannot link an executable, prints `CANNOT LINK EXECUTABLE "ARGV0": WHY`
# and exits 1 (bionic linker/linker_main.cpp __linker_cannot_link; WHY e.g. `library
# "libc++_shared.so" not found: needed by main executable`, linker/linker.cpp)
LINKER_REFUSAL = "CANNOT LINK EXECUTABLE"


def _linker_line(output: bytes) -> str | None:
    """The linker's refusal in a run's output (one line, printable), or None."""
    from engine.safetext import one_line

    for line in output.decode("utf-8", "replace").splitlines():
        if LINKER_REFUSAL in line:
            return one_line(line[line.index(LINKER_REFUSAL):], 300)
    return None


def _check(outcome: RunOutcome, what: str) -> None:
    if outcome.exit_status != 0:
        raise DeviceError(f"{what} failed (exit status {outcome.exit_status}): "
                          f"{outcome.stderr.decode('utf-8', 'replace').strip()[:200]}")


class Stager:
    """What one device holds of a campaign: its engine and the models pushed so far."""

    def __init__(self, campaign: Campaign, ref: DeviceRef, note: Callable[[str], None]):
        self.campaign, self.ref, self.note = campaign, ref, note
        self.engine: StagedEngine | None = None
        self.models: set[str] = set()
        self.apps: Path | None = None
        self.text = False                # the quality text is on the device (harness.run.quality)
        # pushes the device refused for good (devices.base.PushRefused), by source file: a later cell
        # is refused the same way without asking the device again (a rerun asks again)
        self.refused: dict[str, PushRefused] = {}

    def apps_binary(self, device: Device) -> Path:
        """The other-apps program (devices/coapp.c) built for this device's ABI (devices.coapps)."""
        if self.apps is None:
            identity = device.identity()
            self.apps = coapps.build(identity.host_abi or identity.abi, fleet_home() / "coapps")
        return self.apps

    def forget(self) -> None:
        """A lost device: check everything again on the next cell."""
        self.engine = None
        self.text = False
        self.models.clear()
        self.refused.clear()

    def _push(self, device: Device, src: str, dst: str) -> bool:
        """device.push, a refusal remembered (PushRefused: another try cannot change it)."""
        if src in self.refused:
            raise self.refused[src]
        try:
            return device.push(src, dst)
        except PushRefused as e:
            self.refused[src] = e
            raise

    def stage(self, device: Device, cell: Cell) -> tuple[StagedEngine, list[dict]]:
        """Push the engine and the cell's model unless the device has them (same bytes); the
        engine as staged, and what had to be pushed."""
        pushed: list[dict] = []
        engine = self.engine or self._stage_engine(device, cell, pushed)
        self.engine = engine
        model = self.campaign.model(cell.model)
        if cell.model not in self.models:
            if self.ref.kind != "local" and not model.on_device:     # a device: model is already there
                remote = remote_model_path(cell.device, model)
                folder = remote.rsplit("/", 1)[0]
                for shard in split_paths(model.path):
                    dst = f"{folder}/{os.path.basename(shard)}"
                    self.note(f"checking {os.path.basename(shard)}")
                    if self._push(device, shard, dst):
                        pushed.append({"path": dst, "bytes": os.path.getsize(shard)})
            self.models.add(cell.model)
        if cell.config.progress and not self.text and quality.scores(engine.kind, engine.version):
            # the text a scoring run scores goes where the models go, once (a few KiB)
            if self.ref.kind != "local":
                dst = quality.text_path(cell.device)
                self.note(f"checking {quality.QUALITY_TEXT.name}")
                if self._push(device, str(quality.QUALITY_TEXT), dst):
                    pushed.append({"path": dst, "bytes": quality.QUALITY_TEXT.stat().st_size})
            self.text = True
        return engine, pushed

    def _stage_engine(self, device: Device, cell: Cell, pushed: list[dict]) -> StagedEngine:
        c = self.campaign
        local = self.ref.kind == "local"
        work = self.ref.work_dir
        target = engine_path(c, cell.device)
        staged = StagedEngine(c.engine.kind, target)
        if local:
            os.makedirs(f"{work}/out", exist_ok=True)
        else:
            _check(device.run(["mkdir", "-p", f"{work}/out"], timeout_s=60), "mkdir")
            if any(how in RUN_AS_APP for how in c.axes.run_as):
                # an engine run as the app writes its outputs as the app's uid (a virtual phone only)
                _check(device.run(["chmod", "0777", f"{work}/out"], timeout_s=60), "chmod")
        if c.engine.kind == "python":
            source = str(build_bmoe_py(c.engine.python))
            files = [(source, target)]
            if c.engine.claim:                    # the bmoe-cli release bmoe-py speaks (engine.claim)
                staged.env = {CLAIM_ENV: c.engine.claim}
        else:
            identity = device.identity()
            build = c.engine.build_for_device(identity)
            if build is None:
                raise RunnerError(f"{self.ref.spec}: {c.engine.missing_build(identity, self.ref.spec, c.source == 'sweep')}")
            # the libraries go to one folder the loader is pointed at (LD_LIBRARY_PATH wins over the
            # binary's RUNPATH, which names its folder on the build host)
            files = [(build.cli, target)] + [(lib, f"{work}/lib/{os.path.basename(lib)}") for lib in build.libs]
            staged.env = {"LD_LIBRARY_PATH": f"{work}/lib"}
            staged.build = build.abi
            staged.libs = [{"name": os.path.basename(lib), "sha256": file_sha256(lib)} for lib in build.libs]
            source = build.cli
        for src, dst in files:
            self.note(f"checking {os.path.basename(dst)}")
            if self._push(device, src, dst):
                pushed.append({"path": dst, "bytes": os.path.getsize(src)})
        if not local:
            _check(device.run(["chmod", "755", target], timeout_s=60), "chmod")
        staged.sha256 = file_sha256(source)
        hint = (f"; engine.python ({c.engine.python}) must be an interpreter path this device has"
                if c.engine.kind == "python" else "")
        try:
            version = device.run([target, VERSION.typed], env=engine_env(device, staged.env), timeout_s=120)
        except DeviceLost:
            raise
        except DeviceError as e:  # not a push failure: retrying cannot help
            raise RunnerError(f"{self.ref.spec}: the engine cannot start there ({e}){hint}") from None
        text = (version.stdout or version.stderr).decode("utf-8", "replace").strip().splitlines()
        if version.exit_status in (126, 127):  # the device's shell could not execute it at all
            raise RunnerError(f"{self.ref.spec}: the engine cannot start there (exit status "
                              f"{version.exit_status}: {' '.join(text)[:200]}){hint}")
        if version.exit_status != 0 and (linker := _linker_line(version.stderr + version.stdout)):
            # Android's dynamic linker refused the binary (a library missing, a symbol not found):
            # every cell would end engine_error after its model's push
            raise RunnerError(f"{self.ref.spec}: the engine cannot start there (exit status {version.exit_status}): "
                              f"{linker}; push the missing library with it ([engine.native.ABI] libs)")
        staged.version = text[0] if text and version.exit_status == 0 else \
            f"unknown (--version exit status {version.exit_status})"
        return staged
