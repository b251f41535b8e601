"""The names the replay offers, in a module that imports nothing, so the CLI can declare its
options without loading the replay itself (harness/cli/replay.py)."""

POLICIES = ("lru", "layer-lru", "lfu", "belady")      # results.replay.lru_replay, results.replay.policy_replay
PHASES = ("decode", "all")                            # results.replay.replay: the hit rate of decode, or of all
