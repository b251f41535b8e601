"""One command line outside a campaign's records (`recommend --verify`): the campaign's engine
staged on one of its devices exactly as its runs stage it, under the device's lock, and the
engine's answer judged (harness.run.classify.judge_single_run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

from devices.base import Device, DeviceError
from harness.campaign.device_resolution import resolve_devices
from harness.campaign.model import Campaign, fleet_home, remote_model_path
from harness.plan.grid import Cell, engine_path
from harness.run.classify import judge_single_run
from harness.run.errors import RunnerError
from harness.run.progress import Progress
from harness.run.staging import Stager, engine_env, open_device
from store.cells import CellConfig
from store.locks import device_lock, holding


@dataclass(frozen=True)
class SingleRun:
    """How the engine answered one command line run outside the campaign's records."""

    argv: tuple[str, ...]
    status: str                  # "accepted" (exit 0), "refused" (its config/argument error), "failed"
    exit_status: int | None
    line: str                    # the engine's own line that says so
    engine: str                  # the first line of its --version


class DeviceSession:
    """A campaign's engine staged on one of its devices exactly as its runs stage it (bytes the
    device already holds are not pushed again; a native build's libraries and LD_LIBRARY_PATH go
    along), under the device's lock, for single command lines: `recommend --verify` runs each
    recommended argv once here. Use as a context manager."""

    def __init__(self, campaign: Campaign, device: str, progress_stream=None):
        self.campaign = dataclasses.replace(campaign, devices=(device,))
        self.spec = device
        self._stream = progress_stream if progress_stream is not None else io.StringIO()
        self._stager: Stager | None = None
        self._device: Device | None = None
        self._locks: contextlib.ExitStack | None = None

    def __enter__(self) -> DeviceSession:
        (ref,) = resolve_devices(self.campaign)
        progress = Progress({ref.spec: 0}, self._stream)
        self._locks = contextlib.ExitStack()
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "dir": "recommend --verify", "since": time.time()}
        self._locks.enter_context(holding([device_lock(fleet_home(), ref)], self.campaign.run.lock_wait_s, owner))
        self._ref = ref
        self._stager = Stager(self.campaign, ref, lambda msg: progress.note(ref.spec, msg))
        return self

    def __exit__(self, *exc) -> None:
        if self._locks is not None:
            self._locks.close()

    def run(self, model: str, settings: Sequence[str], n_predict: int = 1,
            timeout_s: float | None = None) -> SingleRun:
        """The engine on `model` with these settings (every flag but model, prompt and length),
        the campaign's prompt, `n_predict` tokens."""
        if self._stager is None:
            raise RunnerError("DeviceSession.run outside its `with` block")
        cell = Cell("verify", self.spec, model, self.campaign.engine.kind, CellConfig(), 0, 0, 0, ())
        try:
            if self._device is None:
                self._device = open_device(self._ref)
            device = self._device
            engine, _ = self._stager.stage(device, cell)
        except (DeviceError, OSError) as e:
            raise RunnerError(f"{self.spec}: cannot stage the engine or {model}: {e}") from None
        argv = (engine_path(self.campaign, self.spec), "-m", remote_model_path(self.spec, self.campaign.model(model)),
                "-p", self.campaign.run.prompt, "-n", str(n_predict), *settings)
        try:
            outcome = device.run(list(argv), env=engine_env(device, engine.env),
                                 timeout_s=timeout_s or self.campaign.run.timeout_s, sample_period_s=60.0)
        except DeviceError as e:
            raise RunnerError(f"{self.spec}: the engine could not start: {e}") from None
        status, line = judge_single_run(outcome)
        return SingleRun(argv, status, outcome.exit_status, line, engine.version)
