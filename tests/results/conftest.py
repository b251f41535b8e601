"""Campaign directories for the results tests, made by REALLY running campaigns (never written by
hand), plus headless Chromium driven over the DevTools protocol on a pipe.

- `local_campaign`: bmoe-py on this host, a small synthetic model, budgets under, at and over the
  token cycle, `auto`, two dense modes, two repeats, route traces.
- `vphone_campaign`: bmoe-py on a small virtual phone (its memory cgroup does the killing, its
  lmkd logs the kill), reached through a real adb server. The phone's RAM is sized from a probe
  campaign of the engine itself on a roomy phone: VPHONE_KILL_MARGIN_MIB under the anonymous RSS
  of its 256 MiB-cache runs (anonymous memory cannot be reclaimed, so those are killed), which must
  be VPHONE_KILL_GAP_MIB over its 102 MiB-cache runs' (the room those keep for page cache), so a
  102 MiB cache fits and a 256 MiB one is killed whatever the engine's own footprint is today.
  At top-k 2 (cycle 51 MiB) 256 MiB is killed; at top-k 8 (cycle 204 MiB) every budget that
  survives is under the cycle. The phone reports the getprop model `<script>alert(1)</script>`.
- `imported`: `bmoe-fleet import` of the upstream fixtures (the device label is a script tag too).
- `quality_campaign`: lossless and lossy runs (a drop at the app's default, a top-k under the model's
  own) of one question, `--progress` on, for the quality columns, the front and the quality chart.
- Wrapper engines (`write_engine`): a campaign may run `engine.kind = "native"` with a small Python
  script as bmoe-cli. It runs the real bmoe-py in-process and, on the conditions baked into it,
  makes every decode step SLOW_FACTOR (5) times as long plus a fixed delay (a slowed engine / a
  throttled device: in proportion, so a loaded host cannot blur the effect), pages the model's
  mapping out from a thread while the engine runs (MADV_PAGEOUT: someone else taking the page
  cache), or sends itself SIGKILL after the load, before its first token (a kill during prefill).
  `--version` prints `bmoe-py 0.1.0 (LABEL)`. These are documented in docs/results.md.
- `native_campaign`: the real bmoe-cli (BMOE_CLI, -t 1) on this host, at a top-k whose token
  cycle is 204 MiB, budgets at the cycle and auto: the fixed recommendation must be 204 MiB,
  never the 200 a rounded step would give.

Under `run.sh test` the campaigns and their models are built once for both pytest parts and both
workers (tests/conftest.py built_once); each process reads its own copy of a campaign.

Everything started here is stopped here, pass or fail.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import io
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from engine.gguf.synth import synth_options, write_model
from harness.campaign.file import parse_campaign
from harness.run.runner import run_campaign
from tests.conftest import built_once, copied_once, running_adb_server

PROJECT = Path(__file__).resolve().parents[2]
UPSTREAM = PROJECT / "tests" / "fixtures" / "upstream"
UPSTREAM_FOLDERS = ("2026-07-12", "2026-07-13", "2026-07-14", "2026-07-15-route-trace", "2026-07-17", "host-v2-0.19.0")
SCRIPT_TAG = "<script>alert(1)</script>"
VPHONE_KILL_GAP_MIB = 24         # the probe must find a 256 MiB cache's run this much larger than a 102 MiB one's
VPHONE_KILL_MARGIN_MIB = 4       # the phone's RAM sits this far under the 256 MiB run's anonymous RSS (measured
                                 # gaps 29-40 MiB: the 102 MiB runs keep 20+ MiB for page cache)
PROMPT = "Every token visits its experts; the cache keeps them."


# ── models ───────────────────────────────────────────────────────────────────────────────────


@pytest.fixture(scope="session")
def results_models(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("results-models")


def shared_model(tmp_path_factory, name: str, **options) -> Path:
    """A synthetic model written once per test run (tests/conftest.py built_once): the campaigns
    built once record its path, so every process reads the same file."""
    return built_once(tmp_path_factory, f"model-{name}",
                      lambda folder: write_model(folder / f"{name}.gguf", synth_options(**options))) / f"{name}.gguf"


@pytest.fixture(scope="session")
def small_model(tmp_path_factory) -> Path:
    """qwen3moe, 4 layers x 8 experts, top-2, uniform routing: token cycle 3.2 MiB, bank 12.8 MiB."""
    return shared_model(tmp_path_factory, "small", preset="qwen3moe", layers=4, experts=8, top_k=2, hidden=256,
                        expert_ffn=512, vocab=300, seed=7, router_skew=0.0)


@pytest.fixture(scope="session")
def router_model(results_models) -> Path:
    """64 small experts per layer behind a 1024-wide F32 router (256 KiB a layer): with
    --dense-weights mmap every token reads those pages from the file's mapping."""
    path = results_models / "router.gguf"
    write_model(path, synth_options("qwen3moe", layers=4, experts=64, top_k=2, hidden=1024, expert_ffn=32, vocab=300,
                                    seed=5))
    return path


@pytest.fixture(scope="session")
def alpha_model(tmp_path_factory) -> Path:
    """qwen3moe, 4 layers x 8 experts of 6.375 MiB, uniform routing: cycle 51 MiB at top-k 2 and
    204 MiB (the whole bank) at top-k 8."""
    return shared_model(tmp_path_factory, "alpha", preset="qwen3moe", layers=4, experts=8, top_k=2, hidden=1024,
                        expert_ffn=2048, vocab=300, seed=11, quant="Q8_0", router_skew=0.0)


# ── campaigns ────────────────────────────────────────────────────────────────────────────────


def local_campaign_data(name: str, model: Path, axes: dict, run: dict | None = None, gate: dict | None = None,
                        engine: dict | None = None) -> dict:
    data = {"version": 1, "name": name, "fleet": {"devices": ["local"]}, "models": {model.stem: str(model)},
            "axes": axes, "run": {"n_predict": 8, **(run or {})}, "gate": {"max_wait_s": 1, **(gate or {})}}
    if engine:
        data["engine"] = engine
    return data


def run_local(out: Path, data: dict) -> Path:
    campaign = parse_campaign(data, source=f"{data['name']}.toml")
    run_campaign(campaign, out, progress_stream=io.StringIO())
    return out


@pytest.fixture(scope="session")
def local_campaign(tmp_path_factory, small_model) -> Path:
    data = local_campaign_data(
        "local-sweep", small_model,
        {"cache_mb": [0, "cycle*0.5", "cycle*1.5", "cycle*3", "auto"], "dense_weights": ["anon", "warm"]},
        run={"repeats": 2, "route_trace": True})
    return copied_once(tmp_path_factory, "local", lambda folder: run_local(folder / "local-sweep", data)) / "local-sweep"


@pytest.fixture(scope="session")
def imported(tmp_path_factory) -> Path:
    from harness.importer import import_runs

    out = tmp_path_factory.mktemp("imported") / "upstream"
    import_runs([UPSTREAM / f for f in UPSTREAM_FOLDERS], out, device=SCRIPT_TAG)
    return out


# ── wrapper engines ──────────────────────────────────────────────────────────────────────────

_WRAPPER = '''#!{python}
"""bmoe-py with a deliberate contamination, for the results tests (see tests/results/conftest.py)."""
import ctypes, os, sys, threading, time
sys.path.insert(0, {project!r})
argv = sys.argv[1:]
if {claim!r}:
    os.environ["BMOE_PY_RELEASE"] = {claim!r}
if argv == ["--version"]:
    print("bmoe-py 0.1.0 ({version})")
    sys.exit(0)
counter = {counter!r}
with open(counter, "a") as f:
    f.write("x")
call = os.path.getsize(counter)


def flag(name):
    return name in argv and argv[argv.index(name) + 1]


def wanted(condition):
    kind, _, arg = condition.partition(":")
    return (kind == "always" or (kind == "cache0" and flag("--cache-mb") == "0")
            or (kind == "topk" and flag("--n-expert-used") == arg) or (kind == "after" and call > int(arg))
            or (kind == "auto" and flag("--cache-mb") == "auto")
            or (kind == "call" and call == int(arg))
            or (kind == "without" and flag(arg) in (False, "0")))


if wanted({fail_when!r}):
    print("error: this engine was told to fail here", file=sys.stderr)
    sys.exit(1)
if wanted({kill_when!r}):
    import signal
    import engine.forward.graph as forward

    def killed(self, *args, **kwargs):
        # as a low-memory killer takes an engine during prefill: after the load, before any token
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    forward.Model.decode = killed
SLOW_FACTOR = 5
if wanted({slow_when!r}):
    import engine.forward.graph as forward
    decode = forward.Model.decode

    def slowed(self, *args, **kwargs):
        # Slow in proportion as well as by a fixed delay: a busy machine slows the real decode too,
        # so the slowed step stays SLOW_FACTOR times the plain one however loaded the host is.
        started = time.perf_counter()
        out = decode(self, *args, **kwargs)
        time.sleep({slow_ms} / 1000 + (SLOW_FACTOR - 1) * (time.perf_counter() - started))
        return out

    forward.Model.decode = slowed
if wanted({squeeze_when!r}):
    model = os.path.realpath(flag("-m"))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)

    def squeeze():
        ranges, seen = [], 0.0
        while True:
            if time.monotonic() - seen > 0.05:     # the engine maps the file once it loads: look again now and then
                with open("/proc/self/maps") as maps:
                    ranges = [tuple(int(x, 16) for x in line.split()[0].split("-")) for line in maps
                              if line.split()[5:6] == [model]]
                seen = time.monotonic()
                for lo, hi in ranges:              # MADV_RANDOM: no readahead, so each paged-out page is a fault
                    libc.madvise(lo, hi - lo, 1)   # of its own (with it, one fault brought back ~10 pages)
            for lo, hi in ranges:
                libc.madvise(lo, hi - lo, 21)      # MADV_PAGEOUT: reclaim these pages now
            time.sleep(0.0002)

    threading.Thread(target=squeeze, daemon=True).start()
from engine.app.cli import main
sys.argv = ["bmoe-cli"] + argv
main()
'''


def write_engine(folder: Path, label: str, slow_when: str = "never", slow_ms: float = 0.0,
                 squeeze_when: str = "never", fail_when: str = "never", kill_when: str = "never",
                 claim: str = "") -> dict:
    """A wrapper engine script and the campaign `engine` table that runs it as native bmoe-cli; with
    a `claim`, the bmoe-py inside claims that release (BMOE_PY_RELEASE) and `--version` says so as
    bmoe-py does (`bmoe-py 0.1.0 (bmoe-cli 0.24.0)`) instead of naming LABEL."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"bmoe-cli-{label}"
    counter = folder / f"calls-{label}"
    counter.write_text("")
    version = f"bmoe-cli {claim}" if claim else label
    path.write_text(_WRAPPER.format(python=sys.executable, project=str(PROJECT), version=version, claim=claim,
                                    counter=str(counter),
                                    slow_when=slow_when, slow_ms=slow_ms, squeeze_when=squeeze_when,
                                    fail_when=fail_when, kill_when=kill_when))
    path.chmod(0o755)
    return {"kind": "native", "native": {os.uname().machine: {"cli": str(path)}}}


@pytest.fixture(scope="session")
def compare_pair(tmp_path_factory, small_model) -> tuple[Path, Path]:
    """One plan run twice: by an unchanged wrapper engine, then by one that sleeps 100 ms before every
    decode step of the cache-0 cells (and only those)."""
    axes = {"cache_mb": [0, "cycle*1.5"]}
    run = {"repeats": 3, "n_predict": 12}

    def build(root: Path) -> None:
        run_local(root / "a", local_campaign_data("pair", small_model, axes, run,
                                                  engine=write_engine(root / "engines", "plain")))
        run_local(root / "b", local_campaign_data("pair", small_model, axes, run,
                                                  engine=write_engine(root / "engines", "slowed", "cache0", 100)))

    root = copied_once(tmp_path_factory, "compare", build)
    return root / "a", root / "b"


@pytest.fixture(scope="session")
def failing_twin(tmp_path_factory, small_model) -> Path:
    """compare_pair's plan once more, by an engine that fails every cache-0 run (exit 1, `error: …`)."""
    return copied_once(tmp_path_factory, "compare-fail", lambda root: run_local(root / "c", local_campaign_data(
        "pair", small_model, {"cache_mb": [0, "cycle*1.5"]}, {"repeats": 3, "n_predict": 12},
        engine=write_engine(root / "engines", "failing", fail_when="cache0")))) / "c"


@pytest.fixture(scope="session")
def native_campaign(tmp_path_factory, alpha_model, bmoe_cli) -> Path:
    """bmoe-cli on this host (-t 1: ggml's pool spins past the free cores), alpha at top-k 8 (a
    204 MiB cycle), budgets at the cycle and auto, two repeats."""
    out = tmp_path_factory.mktemp("native") / "native"
    return run_local(out, local_campaign_data(
        "native", alpha_model, {"cache_mb": ["cycle*1.0", "auto"], "n_expert_used": [8]},
        run={"repeats": 2, "n_predict": 2, "threads": 1},
        engine={"kind": "native", "native": {"host": {"cli": str(bmoe_cli)}}}))


@pytest.fixture(scope="session")
def killed_auto_campaign(tmp_path_factory, small_model) -> Path:
    """`auto` killed during prefill (the wrapper engine's SIGKILL after the load): its CSV has no
    token, only its stderr says what budget it was sized to."""
    root = tmp_path_factory.mktemp("killed-auto")
    return run_local(root / "killed-auto", local_campaign_data(
        "killed-auto", small_model, {"cache_mb": ["cycle*1.5", "auto"]},
        engine=write_engine(root / "engines", "killer", kill_when="auto")))


@pytest.fixture(scope="session")
def skewed_model(tmp_path_factory) -> Path:
    """qwen3moe, 4 layers x 8 F32 experts, top-2, router_skew 3 (docs/decisions/drop-cold-experts.md):
    a drop at a budget of the token cycle changes the output a few tokens in."""
    return shared_model(tmp_path_factory, "skewed", preset="qwen3moe", layers=4, experts=8, top_k=2, hidden=128,
                        expert_ffn=256, vocab=300, seed=7, router_skew=3.0)


@pytest.fixture(scope="session")
def quality_campaign(tmp_path_factory, skewed_model) -> Path:
    """The quality campaign (tests/results/test_quality.py, test_site_quality.py): bmoe-py (the campaign's
    quality runs: --progress) on the skewed model at one budget (the token cycle), top-k 2 (the model's own) and 1,
    `--drop-cold-experts` 0 and the app's default (android_app.APP_DROP_COLD), two repeats, by a wrapper
    engine that makes every run without a drop five times as slow and 40 ms a token slower still: a
    few times apart, one drop run slowed by the host's load beside it (three workers on two cores)
    made the two drop runs' spread wider than the gap ("not faster beyond noise (2.03×)")."""
    from results.analysis.android_app import APP_DROP_COLD

    drop = "--drop-cold-experts"

    def build(root: Path) -> None:
        run_local(root / "quality", local_campaign_data(
            "quality", skewed_model,
            {"cache_mb": ["cycle*1.0"], "n_expert_used": [2, 1], "flags": {drop: [0, APP_DROP_COLD]}},
            run={"repeats": 2, "n_predict": 16},      # quality on (a drop axis): the harness adds --progress
            engine=write_engine(root / "engines", "lossless-slowed", "without:" + drop, slow_ms=40)))

    return copied_once(tmp_path_factory, "quality", build) / "quality"


# ── adb server and the virtual phone ─────────────────────────────────────────────────────────


@pytest.fixture(scope="session")
def vphone_campaign(tmp_path_factory, alpha_model) -> Path:
    def build(folder: Path) -> None:
        from devices.virtual import manager

        phone_home = tmp_path_factory.mktemp("vphones")
        with running_adb_server(tmp_path_factory.mktemp("android-home")) as (port, _env):
            _vphone_campaign(folder, alpha_model, manager, phone_home, port)

    return copied_once(tmp_path_factory, "vphone", build) / "vphone-lmk"


def _vphone_campaign(root: Path, alpha_model, manager, phone_home, port) -> Path:
    out = root / "vphone-lmk"

    def campaign(name: str, axes: dict, run: dict) -> object:
        return parse_campaign({"version": 1, "name": name,
                               "fleet": {"devices": ["virtual:tight"], "virtual_home": str(phone_home),
                                         "adb": [{"host": "127.0.0.1", "port": port}]},
                               "models": {"alpha": str(alpha_model)}, "axes": axes,
                               "run": {"n_predict": 4, "prompt": PROMPT, **run}, "gate": {"max_wait_s": 2}},
                              source=f"{name}.toml")

    try:
        # the probe, on a roomy phone: the anonymous RSS of the largest budget that must survive
        # (102 MiB) and of the smallest that must be killed (256 MiB), at both top-ks
        manager.up("tight", 1 << 30, model=SCRIPT_TAG, home=phone_home, adb_host="127.0.0.1", adb_port=port)
        run_campaign(campaign("probe", {"cache_mb": [102, 256], "n_expert_used": [2, 8]}, {}), root / "probe",
                     progress_stream=io.StringIO())
        from results.read.parse import read_metrics_csv

        anon_mib: dict[int, list[float]] = {102: [], 256: []}
        for run_json in (root / "probe").glob("runs/*/1/run.json"):
            budget = int(json.loads(run_json.read_text())["config"]["cache_mb"])
            anon_mib[budget].append(float(read_metrics_csv(run_json.parent / "metrics.csv").rows["rss_anon_mib"].max()))
        survives, killed = max(anon_mib[102]), min(anon_mib[256])
        assert killed - survives >= VPHONE_KILL_GAP_MIB, (
            f"the engine's anonymous RSS no longer separates a 102 MiB cache ({survives:.0f} MiB) from a 256 MiB "
            f"one ({killed:.0f} MiB): the vphone campaign cannot size its phone")
        manager.down("tight", home=phone_home, adb_host="127.0.0.1", adb_port=port)
        ram_mib = int(killed - VPHONE_KILL_MARGIN_MIB)
        manager.up("tight", ram_mib << 20, model=SCRIPT_TAG, home=phone_home, adb_host="127.0.0.1", adb_port=port)
        run_campaign(campaign("vphone-lmk", {"cache_mb": ["cycle*0.5", "cycle*2", 256], "n_expert_used": [2, 8]},
                              {"repeats": 2, "route_trace": True}), out, progress_stream=io.StringIO())
    finally:
        manager.down(all_phones=True, home=phone_home, adb_host="127.0.0.1", adb_port=port)
    return out


@pytest.fixture(scope="session")
def site(tmp_path_factory, local_campaign, vphone_campaign, imported) -> Path:
    from results.site.report import build_site

    out = tmp_path_factory.mktemp("site") / "site"
    build_site([local_campaign, vphone_campaign, imported], out,
               {"tiny": str(UPSTREAM / "host-v2-0.19.0" / "tiny-qwen3moe.gguf")})
    return out


# ── headless Chromium over the DevTools protocol (--remote-debugging-pipe) ───────────────────


class Browser:
    """Chromium reads protocol messages on fd 3 and writes them on fd 4, each ended by a NUL."""

    def __init__(self, executable: str = "/usr/bin/chromium"):
        self.profile = tempfile.mkdtemp(prefix="bmoe-chromium-")
        r0, self._to_chrome = os.pipe()
        self._from_chrome, w0 = os.pipe()
        # the child must end up with them as 3 and 4: move them out of the way first
        child_in = fcntl.fcntl(r0, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(w0, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(r0)
        os.close(w0)
        args = [executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={self.profile}",
                "--remote-debugging-pipe", "about:blank"]
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$@" 3<&{child_in} 4>&{child_out} {child_in}<&- {child_out}>&-', "bash", *args],
            pass_fds=(child_in, child_out), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(child_in)
        os.close(child_out)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []
        self.session: str | None = None

    def _message(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium sent nothing in time")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    raise EOFError("chromium closed the protocol pipe")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, browser: bool = False, timeout: float = 30) -> dict:
        self._id += 1
        msg: dict = {"id": self._id, "method": method, "params": params or {}}
        if self.session and not browser:
            msg["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._message(timeout)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, name: str, timeout: float = 30) -> dict:
        for i, e in enumerate(self.events):
            if e.get("method") == name:
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            e = self._message(max(0.01, deadline - time.monotonic()))
            if e.get("method") == name:
                return e
            self.events.append(e)

    def attach(self) -> None:
        targets = self.send("Target.getTargets", browser=True)["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.send("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True},
                                 browser=True)["sessionId"]
        for method in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.send(method)

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def visit(self, url: str, timeout: float = 30) -> tuple[dict, list[str]]:
        """Load a page, wait until site.js says every chart is drawn; (chart counts, console errors)."""
        self.events.clear()
        self.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired", timeout)
        deadline = time.monotonic() + timeout
        while self.evaluate("document.body.getAttribute('data-charts')") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        info = self.evaluate(
            "({charts: document.querySelectorAll('.chart').length,"
            " drawn: document.querySelectorAll('.chart[data-rendered=\"1\"]').length,"
            " svgs: document.querySelectorAll('.chart svg.main-svg').length,"
            " traces: document.querySelectorAll('.chart g.trace').length,"
            " done: document.body.getAttribute('data-charts')})")
        self.send("Runtime.evaluate", {"expression": "0"})      # flush the events queued so far
        return info, console_errors(self.events)

    def screenshot(self, url: str, path: Path, width: int = 1280, max_height: int = 2400) -> list[str]:
        """Load the page at this width (charts size themselves to it), then capture it; the page's
        console errors are returned."""
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": 900, "deviceScaleFactor": 1,
                                                         "mobile": False})
        _, errors = self.visit(url)
        height = min(int(self.evaluate("document.documentElement.scrollHeight")), max_height)
        shot = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                    "clip": {"x": 0, "y": 0, "width": width, "height": height,
                                                             "scale": 1}})
        path.write_bytes(base64.b64decode(shot["data"]))
        self.send("Emulation.clearDeviceMetricsOverride")
        return errors

    def close(self) -> None:
        with contextlib.suppress(OSError, EOFError, TimeoutError, RuntimeError):
            self.send("Browser.close", browser=True, timeout=5)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)
        shutil.rmtree(self.profile, ignore_errors=True)


def console_errors(events: list[dict]) -> list[str]:
    """Console errors, uncaught exceptions and error log entries (failed loads) among CDP events."""
    out = []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
        elif method == "Runtime.exceptionThrown":
            details = p.get("exceptionDetails", {})
            out.append("exception: " + str(details.get("exception", {}).get("description") or details.get("text")))
        elif method == "Page.javascriptDialogOpening":
            out.append(f"dialog: {p.get('type')} {p.get('message')!r}")
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
    return out


@pytest.fixture(scope="session")
def browser():
    b = Browser()
    try:
        b.attach()
        yield b
    finally:
        b.close()
