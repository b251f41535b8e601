"""`bmoe-fleet recommend --verify`: run every recommended command line once, on its own device.

A recommendation is only as good as the engine's willingness to take it: a recommendation once
printed `--cache-mb 137` without `--force-cache`, which both engines refuse. Each command line of
each recommendation (the fixed budget's and the auto ceiling's) runs once, `-n 1`, on the device
whose runs it was measured from, with that campaign's engine — staged as the campaign stages it
(harness.run.session.DeviceSession: same bytes not pushed again, a native build's libraries along) —
its model and its prompt. The answer is recorded on the recommendation: `accepted` (exit 0, with
the engine's `bmoe: expert streaming ON … cache=N MiB` line), `refused` (the engine's own
`config error:` / `unknown arg:` line), or `failed` (any other end, with its line). Imported
campaigns name no engine and no reachable device: theirs are `not run`, saying why.

It lives in the harness because it runs engines on devices; results.analysis.recommend takes it as its
`verify` step (`verifier`), so the results package never needs a device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from engine.errors import BmoeError
from harness.campaign.file import load_campaign
from harness.run.session import DeviceSession
from results.analysis.recommend import Verify
from results.analysis.recommend_records import Recommendation, Recommendations
from results.errors import ResultsError
from results.publish import Redactor
from results.read.rundir import CampaignData
from store import names

VERIFY_TOKENS = 1


def _campaign_of(r: Recommendation, name: str) -> str | None:
    choice = r.fixed if name == "fixed" else r.auto
    ids = choice.run_ids if choice is not None else ()
    if ids:
        return ids[0].rsplit("/", 2)[0]
    campaigns = r.evidence.get("campaigns") or []
    return campaigns[0] if campaigns else None


def verifier(echo: Callable[[str], None] | None = None) -> Verify:
    """`recommend --verify` as results.analysis.recommend's `verify` step: every line run once, the
    answers redacted for publishing, progress to `echo`."""
    def run_each(recs: Recommendations, camps: Sequence[CampaignData]) -> Recommendations:
        return verify(recs, camps, Redactor(camps).text, echo)
    return run_each


def verify(recs: Recommendations, camps: Sequence[CampaignData], redact: Callable[[str], str] = str,
           echo: Callable[[str], None] | None = None, n_predict: int = VERIFY_TOKENS) -> Recommendations:
    """Every recommendation with `verification`: per command line, how its engine answered."""
    by_label = {c.label: c for c in camps}
    jobs: dict[str, dict[str, list[tuple[int, int, str]]]] = {}      # device -> campaign -> its lines
    results: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for di, d in enumerate(recs.devices):
        for ri, r in enumerate(d.recommendations):
            results[(di, ri)] = {}
            for name in r.argvs():
                label = _campaign_of(r, name)
                camp = by_label.get(label) if label else None
                if label is None or camp is None or camp.imported or not (camp.root / names.CAMPAIGN_TOML).is_file():
                    why = "imported runs name no engine and no device to run on" if camp is not None and \
                        camp.imported else "no campaign file to take the engine and device from"
                    results[(di, ri)][name] = {"status": "not run", "line": why, "exit_status": None,
                                               "engine": None, "campaign": label, "n_predict": n_predict}
                    continue
                jobs.setdefault(r.device, {}).setdefault(label, []).append((di, ri, name))

    def run_job(label: str, device: str, todo: list[tuple[int, int, str]]) -> list[str]:
        """One device's command lines in one session; the lines to echo, in order."""
        camp = by_label[label]
        campaign = load_campaign(camp.root / names.CAMPAIGN_TOML)
        said = [f"verifying {len(todo)} command line(s) on {device} ({campaign.engine.kind} engine of {label})"]
        try:
            with DeviceSession(campaign, device) as session:
                for di, ri, name in todo:
                    r = recs.devices[di].recommendations[ri]
                    run = session.run(r.model, r.argvs()[name], n_predict=n_predict)
                    results[(di, ri)][name] = {"status": run.status, "line": redact(run.line),
                                               "exit_status": run.exit_status, "engine": run.engine,
                                               "campaign": label, "n_predict": n_predict}
                    said.append(f"  {r.model} {name}: {run.status} — {redact(run.line)}")
        except ResultsError:
            raise
        except BmoeError as e:                # a device that is gone: say so on each, keep the others
            for di, ri, name in todo:
                results[(di, ri)][name] = {"status": "not run", "line": redact(str(e)), "exit_status": None,
                                           "engine": None, "campaign": label, "n_predict": n_predict}
        return said

    def run_device(device: str, by_campaign: dict[str, list[tuple[int, int, str]]]) -> list[str]:
        return [line for label, todo in by_campaign.items() for line in run_job(label, device, todo)]

    # each device's lines in a thread of its own (each writes only its own results' keys; one
    # device's campaigns one after another), echoed a device at a time, in the recommendations' order
    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        futures = [pool.submit(run_device, device, by_campaign) for device, by_campaign in jobs.items()]
        for future in futures:
            for line in future.result():
                if echo:
                    echo(line)
    devices = []
    for di, d in enumerate(recs.devices):
        out = [replace(r, verification=results[(di, ri)]) for ri, r in enumerate(d.recommendations)]
        devices.append(replace(d, recommendations=tuple(out)))
    return replace(recs, devices=tuple(devices))
