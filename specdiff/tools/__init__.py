"""Tools built on the algorithm: what `specdiff bench` and `specdiff drafter` run.

    bench/           side-by-side speed of decoding methods on the same target and prompts
                     (config, sweep, passes, measure, report)
    bench_block.py   the same for a block-diffusion target (block, simsd-exact, simsd)
    bench_output.py  what bench leaves behind: table, bench.json, plots, a one-line summary
    callstats.py     per-call accounting by forward hooks, for any decoding loop
    convert.py       a diffusion drafter in any readable format -> the project's own
    drafter_init.py  a randomly initialised diffusion drafter for a target
    roofline.py      the hardware's floor for a target step, measured (bench's `x floor`)
    invariance.py    whether a target's logits depend on a call's width (greedy identity's premise)

Distillation (`specdiff distill`) is a package of its own, specdiff.training.
May import: the algorithm (generation, methods, loading, ...), which never imports the tools; none
of specdiff_cli, specdiff.exporters or specdiff.runtimes (tests/test_layout.py checks both).
"""
