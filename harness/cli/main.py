"""`bmoe-fleet`: parses options and calls one library function per command.

Library errors (engine.errors.BmoeError and subclasses) become one-line messages with exit 1
here, in one place; click's own usage errors exit 2.
"""

from __future__ import annotations

import errno
import json
from typing import TYPE_CHECKING

import click

from engine.errors import BmoeError
from engine.safetext import one_line, printable
from engine.units import MIB
from harness.cli.numbers import FLOAT, INT

if TYPE_CHECKING:
    from rich.console import Console

MESSAGE_CHARS = 2000   # an error is one line or a few: never a file's worth of quoted bytes


class _Group(click.Group):
    """Every command's errors, in one place: a library error is one `Error: …` line, exit 1; a
    write that failed on this host (a full disk) names the file, exit 1; Ctrl-C is `interrupted`,
    exit 130 (never click's `Aborted!`). Messages may quote files and devices: control characters
    are shown escaped."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BmoeError as e:
            raise click.ClickException(_safe(str(e))) from None
        except OSError as e:
            what = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or str(e))
            path = e.filename2 or e.filename          # a failed copy names its source first
            raise click.ClickException(_safe(f"{path}: {what}" if path else what)) from None
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


def _safe(message: str) -> str:
    text = printable(message)
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + "…"


def _emit_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False))


@click.group(cls=_Group)
@click.version_option(package_name="bmoe-fleet")
def main() -> None:
    """bmoe-fleet: size BigMoeOnEdge's expert cache per phone from measurements, not guesses."""


@main.group(cls=_Group)
def model() -> None:
    """Price MoE GGUF models and write synthetic ones."""


@model.command("inspect")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--top-k", "top_ks", type=INT, multiple=True,
              help="Price the token cycle at this top-k (repeatable). Default: the model's own, plus 2 and 4.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def model_inspect(path: str, top_ks: tuple[int, ...], as_json: bool) -> None:
    """Print a GGUF MoE model's shape, expert bytes and token-cycle prices (header only)."""
    from engine.gguf.inspect import inspect_model

    report = inspect_model(path, list(top_ks) or None)
    if as_json:
        _emit_json(report.data)
    else:
        click.echo(report.text)


@model.command("synth")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--preset", type=click.Choice(["qwen3moe", "gpt-oss", "gpt-oss-120b"]), default="qwen3moe",
              show_default=True, help="Architecture and default dimensions.")
@click.option("--layers", type=INT, help="Number of layers (block_count).")
@click.option("--experts", type=INT, help="Experts per MoE layer (expert_count).")
@click.option("--top-k", type=INT, help="Experts routed per token (expert_used_count).")
@click.option("--hidden", type=INT, help="Hidden size (embedding_length); a multiple of 32.")
@click.option("--expert-ffn", type=INT, help="Expert FFN size (expert_feed_forward_length); a multiple of 32.")
@click.option("--vocab", type=INT, help="Vocabulary size (at least 259: specials + 256 byte tokens).")
@click.option("--quant", type=click.Choice(["F32", "F16", "Q8_0", "Q4_0", "MXFP4"]),
              help="Expert weight type (qwen3moe: F32/F16/Q8_0/Q4_0; gpt-oss: MXFP4).")
@click.option("--seed", type=INT, default=0, show_default=True, help="Seed for every weight.")
@click.option("--router-skew", type=FLOAT, default=1.0, show_default=True,
              help="0 = uniform routing; larger = a few popular experts per layer.")
@click.option("--size", "size_text", help="Choose the free dimensions so the file reaches this size, e.g. 2GiB.")
@click.option("--split", "split_count", type=INT, default=1, show_default=True,
              help="Write the model as this many -0000i-of-0000N.gguf shards.")
@click.option("--shape-only", is_flag=True,
              help="Write the real header and extend the file sparsely: a shape to price, no weights.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
@click.option("--quiet", is_flag=True, help="No progress output.")
def model_synth(out: str, preset: str, size_text: str | None, split_count: int, shape_only: bool,
                as_json: bool, quiet: bool, **dims) -> None:
    """Write a real MoE GGUF with random weights (llama.cpp conventions) to OUT."""
    from engine.gguf.synth import synth_options, write_model
    from engine.units import parse_bytes

    options = synth_options(preset, size_bytes=parse_bytes(size_text) if size_text else None,
                            split_count=split_count, shape_only=shape_only, **dims)
    progress = None if quiet or as_json else _ProgressLine("writing " + out)
    result = write_model(out, options, progress=progress)
    if progress:
        progress.done()
    if as_json:
        _emit_json(result.to_dict())
    else:
        click.echo(result.summary())


class _ProgressLine:
    """A single self-overwriting progress line on a terminal, fitted to its width by rich; a few
    plain lines otherwise (a pipe, a log). `console` (tests) replaces the one on stderr."""

    def __init__(self, label: str, console: Console | None = None):
        from rich.console import Console

        self.label = label
        self.console = console if console is not None else Console(stderr=True, highlight=False)
        self.tty = self.console.is_terminal
        self.last_pct = -1

    def __call__(self, done_bytes: int, total_bytes: int) -> None:
        pct = int(100 * done_bytes / total_bytes) if total_bytes else 100
        step = 1 if self.tty else 25
        if pct // step == self.last_pct // step:
            return
        self.last_pct = pct
        counts = f"{done_bytes / MIB:,.0f} / {total_bytes / MIB:,.0f} MiB ({pct}%)"
        if not self.tty:
            print(one_line(f"{self.label}: {counts}", MESSAGE_CHARS), file=self.console.file, flush=True)
            return
        from rich.control import Control
        from rich.segment import ControlType

        from harness.run.progress import fitted

        # back to the line's start and clear it; the line stays off the last column, so the
        # terminal never wraps it before the next carriage return
        self.console.control(Control((ControlType.CARRIAGE_RETURN,), (ControlType.ERASE_IN_LINE, 2)))
        self.console.print(fitted(self.label + ":", done_bytes, total_bytes, counts, self.console.width - 1),
                           end="")

    def done(self) -> None:
        """End the line (a terminal's cursor moves below it)."""
        if self.tty and self.last_pct >= 0:
            self.console.print()


@main.command("devices")
@click.option("--adb", "adb_servers", multiple=True, metavar="HOST:PORT",
              help="An adb server to ask (repeatable). Default: the one adb's environment names "
                   "($ADB_SERVER_SOCKET, else $ANDROID_ADB_SERVER_ADDRESS and $ANDROID_ADB_SERVER_PORT), else "
                   "127.0.0.1:5037; a local one is started there when none answers.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def devices_cmd(adb_servers: tuple[str, ...], as_json: bool) -> None:
    """List every reachable device (this host and phones) with identity and state.

    Like `adb devices`, every attached phone is listed, $ANDROID_SERIAL or not."""
    from devices.adb.server import AdbServer
    from devices.inventory import inventory

    reports = inventory([AdbServer.parse(s) for s in adb_servers] or None)
    if as_json:
        _emit_json({"format": "bmoe-fleet.devices", "version": 1, "devices": [r.to_dict() for r in reports]})
    else:
        for r in reports:
            click.echo(r.line())


@main.command("demo")
@click.option("--out", "out_dir", default="demo-out", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the demo's model, campaign directory and site.")
@click.option("--no-phones", is_flag=True, help="Run on this host only (no virtual phones).")
def demo(out_dir: str, no_phones: bool) -> None:
    """The main job on an embedded default: a model, two virtual phones, a sweep, the site."""
    from harness.demo import run_demo

    run_demo(out_dir, echo=click.echo, use_phones=not no_phones)


# Commands defined in their own modules (each parses and calls one library function).
from harness.cli.campaign import COMMANDS as CAMPAIGN_COMMANDS  # noqa: E402
from harness.cli.db import COMMANDS as DB_COMMANDS  # noqa: E402
from harness.cli.replay import replay  # noqa: E402
from harness.cli.results import COMMANDS as RESULTS_COMMANDS  # noqa: E402
from harness.cli.virtual import virtual  # noqa: E402

for _command in (*CAMPAIGN_COMMANDS, *RESULTS_COMMANDS, *DB_COMMANDS, replay, virtual):
    main.add_command(_command)
