"""`tree` auto (specdiff.tree_sizes): each step's tree size chosen from this step's q, the past and
the costs. Best-first trees are nested (a step cuts one tree to any size); the controller follows
calibration and costs and rests when drafting does not pay; the size is chosen before the target
sees the tree; greedy output stays ar's on the tiny GPT-2 / Llama / Qwen3 targets, with timed
costs and with costs that make every size occur. Distributions: tests/test_trees_exact.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specdiff import generate, trees
from specdiff.errors import UsageError
from specdiff.generation import iter_generate, plan
from specdiff.metrics import Costs
from specdiff.settings import TREE_MAX
from specdiff.tree_sizes import SizeController
from specdiff.trees import best_first, first

from tiny import dflash_pairs, make_dflash
from tree_runs import MAX_NEW, PROMPTS, differing

TARGETS = ("gpt2", "llama", "qwen3")


@pytest.fixture(scope="module")
def models(tiny):
    """test_trees' tiny targets and DFlash drafters, in directories of this module's own."""
    return dflash_pairs(tiny, "ta")


@pytest.fixture(scope="module")
def reference(models):
    return {name: generate(PROMPTS, target=models[name], method="ar", max_new_tokens=MAX_NEW) for name in TARGETS}


def costs(per_token: float = 0.02, draft: float = 0.1, rows: tuple[int, ...] = (1,)) -> Costs:
    """verify 1 + per_token * w for w = 1..TREE_MAX + 1; drafting `draft` whatever its length."""
    verify = tuple(1.0 + per_token * w for w in range(1, TREE_MAX + 2))
    return Costs(rows, (verify,) * len(rows), ((draft,) * 4,) * len(rows))


def test_best_first_trees_are_nested():
    """The first n nodes of a tree of N are best_first's tree of n: one draft serves every size."""
    probs = torch.softmax(torch.randn(4, 9, generator=torch.Generator().manual_seed(2)) * 2, -1)
    whole = best_first(probs, 20)
    for n in range(21):
        cut, own = first(whole, n), best_first(probs, n)
        assert (cut.tokens.tolist(), cut.parent.tolist(), cut.depth.tolist()) == \
               (own.tokens.tolist(), own.parent.tolist(), own.depth.tolist())


def _peaked(sharp: float, V: int = 12) -> trees.Tree:
    probs = torch.softmax(torch.randn(4, V, generator=torch.Generator().manual_seed(3)) * sharp, -1)
    return best_first(probs, TREE_MAX)  # q: each node's slot's marginal


def test_the_size_follows_calibration_and_costs():
    tree = _peaked(1.0)
    sizes = SizeController(costs(), depth=4)
    fresh = sizes.size([tree], 4)
    assert 1 < fresh <= TREE_MAX and not sizes.resting
    for _ in range(40):  # every step accepts its whole depth: the drafter under-promises
        sizes.record(first(tree, fresh), 4)
    assert sizes.size([tree], 4) >= fresh
    dear = SizeController(costs(per_token=0.5), depth=4)
    assert dear.size([tree], 4) < fresh  # wide verifies cost more: a smaller tree


def test_a_drafter_whose_trees_are_rejected_is_rested_then_probed():
    tree = _peaked(1.0)
    sizes = SizeController(costs(draft=0.3), depth=4, probe=3)
    for _ in range(200):
        sizes.record(first(tree, 8), 0)  # never a token accepted
    sizes.size([tree], 4)
    assert not sizes.resting  # one step's promise is not the run's
    for steps in range(2, 11):
        sizes.size([tree], 4)
        if sizes.resting:
            break
    assert sizes.resting and steps <= 10
    assert [sizes.drafts() for _ in range(9)] == [False, False, True, False, False, False, False, False, True]


def test_an_unsure_step_does_not_stop_a_drafter_that_pays():
    """A flat q (a step the drafter is unsure of) promises less than a plain step; between sure
    steps it must not rest the drafter (it did: 502 of 600 greedy smol steps went plain)."""
    sure, unsure = _peaked(4.0), _peaked(0.01, V=1000)
    sizes = SizeController(costs(draft=0.3), depth=4)
    for tree in [sure, unsure, unsure] * 10:
        sizes.size([tree], 4)
        assert not sizes.resting
    broken = SizeController(costs(draft=0.3), depth=4)
    for _ in range(10):
        broken.size([unsure], 4)
    assert broken.resting  # the control: unsure steps alone do rest it


def test_the_size_is_chosen_before_the_target_sees_the_tree(models, monkeypatch):
    """The invariant of tree_sizes: when size() runs, the target has cached each row's tokens but
    its last (no p of this step exists) and no row's generator has been read since the draft."""
    target = models["gpt2"]
    seen = []
    size = SizeController.size

    def checked(self, batch_trees, g):
        assert target.lengths.tolist() == lengths, "the tree was verified first"
        assert all(row.generator.get_state().equal(s) for row, s in zip(rows, states)), "coins were drawn"
        seen.append(size(self, batch_trees, g))
        return seen[-1]

    lengths: list[int] = []
    rows: list = []
    states: list = []
    monkeypatch.setattr(SizeController, "size", checked)
    p = plan(target=target, drafter=models["gpt2-dflash"], method="dflash", gamma=4, tree="auto", batch_size=3,
             max_new_tokens=8, temperature=1.0, seed=1)
    p = replace(p, decoder=replace(p.decoder, measured={3: costs(rows=(1, 3))}))
    draft = p.decoder.drafts.__class__.__call__

    def drafted(self, batch, g):
        out = draft(self, batch, g)
        lengths[:], rows[:] = [len(row.ids) - 1 for row in batch], batch
        states[:] = [row.generator.get_state() for row in batch]
        return out

    monkeypatch.setattr(p.decoder.drafts.__class__, "__call__", drafted)
    list(iter_generate(PROMPTS[:3], p))
    assert seen


@pytest.mark.parametrize("target,batch_size", [(t, b) for t in TARGETS for b in (1, 3)])
def test_tree_auto_greedy_equals_ar(models, reference, target, batch_size, monkeypatch):
    """With a cost table under which a node pays where the drafter gives it a chance of 0.2% (the
    sizes then follow the drafter's q: several occur), and with the costs the decoder times."""
    cut, nodes = [], []

    def cut_to(tree, N):
        kept = first(tree, N)
        cut.append(N)
        nodes.append(len(kept.tokens))
        return kept

    monkeypatch.setattr(trees, "first", cut_to)
    p = plan(target=models[target], drafter=models[f"{target}-dflash"], method="dflash", gamma=4, tree="auto",
             batch_size=batch_size, max_new_tokens=MAX_NEW)
    cheap = replace(p, decoder=replace(p.decoder, measured={batch_size: costs(0.002, 0.0, (1, batch_size))}))
    got = list(iter_generate(PROMPTS, cheap))
    assert [o.tokens for o in got] == [o.tokens for o in reference[target].outputs]
    assert len(set(cut)) >= 3, cut  # several sizes were chosen
    sizes = [o.metrics.tree_sizes for o in got]  # per row: each step's size (0: a plain step)
    assert sum(sum(s) for s in sizes) == sum(o.metrics.iterations for o in got)
    counted = [sum(s[n] for s in sizes if n < len(s)) for n in range(TREE_MAX + 1)]
    assert counted[1:] == [nodes.count(n) for n in range(1, TREE_MAX + 1)], (counted, nodes)
    timed = generate(PROMPTS, target=models[target], drafter=models[f"{target}-dflash"], method="dflash", gamma=4,
                     tree="auto", batch_size=batch_size, max_new_tokens=MAX_NEW)
    assert differing(timed, reference[target]) == []
    assert len(timed.outputs[0].metrics.costs.verify[0]) == TREE_MAX + 1  # widths timed up to the largest tree


def test_tree_auto_settings(models):
    target, drafter = models["gpt2"], models["gpt2-dflash"]
    p = plan(target=target, drafter=drafter, method="dflash", tree="auto")  # gamma auto: its cap bounds the depth
    assert p.decoder.sized and p.decoder.drafts.tree == TREE_MAX and p.decoder.ran()["tree"] == "auto"
    with pytest.raises(UsageError, match="or `tree` auto"):
        plan(target=target, drafter=drafter, method="dflash", tree=6)
    with pytest.raises(UsageError, match="`tree` must be an integer >= 0 .* or auto"):
        plan(target=target, drafter=drafter, method="dflash", tree="big")


def test_the_cli_runs_tree_auto_and_refuses_a_bad_size_in_one_line(tiny):
    from click.testing import CliRunner

    from specdiff_cli.main import cli

    drafter = str(make_dflash(tiny.root / "ta-cli-dflash", tiny.gpt2, scale=10, seed=6))
    run = ["generate", "--target", str(tiny.gpt2), "--drafter", drafter, "--method", "dflash", "--prompt", "The sea",
           "--max-new-tokens", "6", "--gamma", "3"]
    ok = CliRunner().invoke(cli, [*run, "--tree", "auto", "--stats"])
    assert ok.exit_code == 0, ok.stderr
    assert '"tree": {"value": "auto"' in ok.stderr.replace("\n", "")
    for bad, message in (("big", "'big' is neither an integer nor auto"), ("-1", "--tree must be an integer >= 0")):
        result = CliRunner().invoke(cli, [*run, "--tree", bad])
        assert result.exit_code == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_bench_sweeps_tree_auto_beside_fixed_sizes():
    from specdiff.tools.bench.sweep import variants

    labels = [v.label for v in variants(["ar", "dflash"], gammas=(4,), trees=(0, 8, "auto"))]
    assert labels == ["ar", "dflash g=4", "dflash g=4 tree=8", "dflash g=4 tree=auto"]
    with pytest.raises(UsageError, match="tree values must be integers >= 0 or auto"):
        variants(["dflash"], gammas=(4,), trees=("big",))
