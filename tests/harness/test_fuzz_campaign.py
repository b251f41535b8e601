"""Property-based fuzzing of the campaign file reader (harness.campaign.file) and the plan a dry run
prints (harness.plan.grid): damaged campaign files (tests/harness/campaign_mutants.py) load into a
campaign that writes back to the same TOML and plans within the cell bound with every number
finite, or are refused with one short terminal-safe CampaignError; never an uncaught exception.

Derandomized, no example database, a fixed number of examples; benchmarks/fuzz_readers.py runs the
same mutators 10,000 times.
"""

from __future__ import annotations

from tests.fuzzing import fuzz
from tests.harness import campaign_mutants as cm


def test_campaign_files_load_or_are_refused_cleanly(tiny_model, tmp_path):
    seeds = cm.seed_texts(tiny_model)
    for seed in seeds:                                    # the seeds themselves are good campaigns
        assert cm.load_mutant(seed, tmp_path) == "accepted"

    def one(pick, n_ops: int) -> str:
        return cm.load_mutant(cm.mutate(seeds[pick(len(seeds))], pick, n_ops), tmp_path)

    assert fuzz(one, 300) == {"accepted", "refused"}


def test_numbers_inside_campaign_strings_load_or_are_refused_cleanly(tiny_model, tmp_path):
    """The apps seed's strings (app sizes, a budget's factor, the release claimed) with their numbers
    made huge, another script's, underscored or 0, and empty apps: accepted or one clean line, never
    a traceback (an app of 400 nines MiB once raised OverflowError under `run --dry-run`)."""
    seed = cm.seed_texts(tiny_model)[2]

    def one(pick, n_ops: int) -> str:
        data = seed
        for _ in range(n_ops):
            data = (cm.string_number, cm.empty_item)[pick(2)](data, pick)
        return cm.load_mutant(data, tmp_path)

    assert fuzz(one, 200) == {"accepted", "refused"}
