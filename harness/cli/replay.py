"""`bmoe-fleet replay`: parse options, call results.replay.replay.replay_traces, print its report.

Registered into the main group by harness/cli/main.py (`main.add_command(replay)`), whose group turns
library errors (BmoeError) into one-line `Error: …` messages with exit 1.
"""

from __future__ import annotations

import math

import click

from engine.errors import BmoeError
from engine.units import ascii_float
from results.replay.choices import PHASES, POLICIES

# the replay itself (numpy, pandas, the campaign model) is imported when the command runs: every
# other command starts without it


def _budgets(ctx: click.Context, param: click.Parameter, value: str | None) -> list[float] | None:
    from harness.campaign.model import INT_MAX, number_text

    if value is None or not value.strip():
        return None
    try:
        budgets = [ascii_float(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of MiB values, e.g. 250,500,1000") from None
    for budget in budgets:
        # a budget is MiB the engine's int can hold: 1e308 or inf would overflow the replay's byte counts
        if not 0 <= budget <= INT_MAX:
            raise BmoeError(f"replay: --budgets {number_text(budget)} is not a budget: 0 to {INT_MAX} MiB")
    return budgets


def _drop_traces(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> list[tuple[float, str]]:
    from harness.campaign.model import INT_MAX

    out = []
    for item in value:
        budget, sep, path = item.partition(":")
        try:
            mib = ascii_float(budget) if sep and path else math.nan
        except ValueError:
            mib = math.nan
        if not (math.isfinite(mib) and 0 < mib <= INT_MAX):
            raise BmoeError(f"replay: --drop-trace {item!r} is not MIB:PATH, a drop run's budget (more than 0 MiB) "
                            f"and its route trace, e.g. 14:route.csv")
        out.append((mib, path))
    return out


def _policies(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


@click.command("replay")
@click.argument("traces", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--budgets", callback=_budgets,
              help="Cache budgets in MiB, comma separated. Default: about twenty from 0 to 2 x T, plus T.")
@click.option("--policies", default="lru", show_default=True, callback=_policies,
              help=f"Comma-separated policies to replay, of {','.join(POLICIES)}. lru is exact at every "
                   "budget in one pass; the others are simulated once per budget.")
@click.option("--phase", type=click.Choice(PHASES), default="decode", show_default=True,
              help="Hit rate shown in the text table: decode-only, or all phases (the engine's cache_hit_pct).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False),
              help="Also write upstream's curve CSV (budget_mib,policy,hit_pct_cum,hit_pct_decode,read_mib) "
                   "for one trace.")
@click.option("--drop-cold-experts", "drop_frac", type=float, default=None, metavar="F",
              help="Also replay the engine's LRU under --drop-cold-experts F (0 to 1): hit %, flash MiB/token "
                   "and drop % per budget, exact on the routing replayed (see --drop-trace).")
@click.option("--drop-in-prefill", is_flag=True, help="With --drop-cold-experts: the run drops in prefill too.")
@click.option("--drop-traced", is_flag=True,
              help="With --drop-cold-experts: the run writes a route trace, so its first decode drops too.")
@click.option("--drop-trace", "drop_traces", multiple=True, metavar="MIB:PATH", callback=_drop_traces,
              help="With --drop-cold-experts: the route trace of a run with that F at MIB (repeatable). The drop "
                   "table replays every budget from the one taken at the lowest budget, a lossy run's routing; "
                   "without it, "
                   "from the TRACES themselves (a lossless trace gives a lower bound on reads).")
@click.option("--json", "as_json", is_flag=True, help="Print a versioned JSON record instead of text.")
def replay(traces: tuple[str, ...], budgets: list[float] | None, policies: list[str], phase: str,
           csv_path: str | None, drop_frac: float | None, drop_in_prefill: bool, drop_traced: bool,
           drop_traces: list[tuple[float, str]], as_json: bool) -> None:
    """Replay bmoe-cli route traces (--route-trace) through expert-cache policies.

    Prints each trace's token cycle T and the hit rate and flash reads at each budget, global LRU
    exactly as the engine runs it.
    """
    from results.replay.drop_replay import DropLever
    from results.replay.replay import replay_traces

    if drop_frac is None and (drop_in_prefill or drop_traced):
        raise BmoeError("replay: --drop-in-prefill and --drop-traced describe --drop-cold-experts F: give F too")
    drop = DropLever(drop_frac, drop_in_prefill, drop_traced) if drop_frac is not None else None
    report = replay_traces(traces, budgets, policies, phase, csv_path, drop, drop_traces)
    click.echo(report.to_json() if as_json else report.text)
