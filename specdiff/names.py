"""Names of the decoding methods, acceptance rules and drafting schedules, without importing torch,
so that `specdiff --help` stays fast. tests/test_methods.py checks them against the registries
(methods.METHODS, acceptance.RULES with selection.RULES, drafters.diffusion.SCHEDULES, tools.bench.PASSES)."""

METHODS = ("ar", "spec-ar", "specdiff", "dflash", "eagle3", "block", "simsd-exact", "simsd")
REMASKING = ("sequential", "static", "dynamic")  # block_decoding.REMASKING
RULES = ("greedy", "standard", "match", "select", "multi")
SCHEDULES = ("l2r", "oneshot", "confidence")
PEERS = ("hf-assisted", "hf-prompt-lookup")  # Hugging Face's own loops, timed by `specdiff bench`
