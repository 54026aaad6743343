"""Draft trees under sampling (issue 39; docs/lossless.md, "Trees"): one tree step on the V = 8
target of test_sampling_exact with a DFlash drafter over it, 60,000 rows, the first three tokens'
joint distribution against the enumerated one by the chi-square test: match over the best-first
tree and multi over sampled children pass it; min(1, p/q) on the deterministic top child, multi
without the residual update and multi over deterministic children fail it.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from specdiff import trees
from specdiff.acceptance import standard
from specdiff.decoding import Row
from specdiff.methods.dflash import DFlashDrafts
from specdiff.sampling import sample
from specdiff.trees import ancestry, multi, node_q, tree_probs, walk

import test_sampling_exact as exact
from test_dflash_method import small  # noqa: F401  (the V = 8 target and its DFlash drafter)

SLOW = pytest.mark.slow


# --- the target's distribution -----------------------------------------------------------------

@torch.no_grad()
def tree_samples(target, drafter, sampling, rule, seed, nodes=6):
    """exact.N samples of the first exact.DEPTH tokens after exact.CONTEXT through one tree step:
    the DFlash tree (the same for every row: the context is), its verify (extend_tree, tree_probs),
    then `rule` over all rows at once -> (cell ids (N,), accepted depth (N,))."""
    g = torch.Generator().manual_seed(seed)
    prompt = exact.CONTEXT[0].tolist()
    step = DFlashDrafts(target, drafter, sampling, tree=nodes)
    target.capture(step.layers)
    try:
        target.prefill(exact.CONTEXT[:, :-1])
        tree = step([Row(prompt, 8, target.max_length, None, target.device, g)], [exact.GAMMA])[0]
        tokens = torch.cat([exact.CONTEXT[0, -1:], tree.tokens])[None]  # verify numbering (1, S)
        parent = torch.cat([torch.tensor([-1]), tree.parent + 1])[None]
        logits = target.extend_tree(tokens, parent, torch.tensor([tokens.shape[1]]))
    finally:
        target.capture(())
    p = tree_probs(sampling, logits, exact.CONTEXT, tokens[0], parent[0])
    n_rows = exact.N
    node, y = rule(tokens.expand(n_rows, -1), parent.expand(n_rows, -1), p.expand(n_rows, -1, -1), None, g, tree=tree)
    paths = [ancestry(parent[0].tolist(), i)[1:] for i in range(tokens.shape[1])]  # per node: its path's nodes
    table = torch.zeros(tokens.shape[1], exact.GAMMA, dtype=torch.long)
    for i, path in enumerate(paths):
        table[i, :len(path)] = tokens[0, path]
    depth = torch.tensor([len(path) for path in paths])[node]
    return exact.first_tokens(target.model, table[node], depth, y, sampling, g), depth


def tree_walk(tokens, parent, p, q, generator=None, tree=None):
    return walk(tokens, parent, p, q, generator)


def standard_on_the_top_chain(tokens, parent, p, q, generator=None, tree=None):
    """A broken rule: each node's first child (chosen deterministically, the top of its slot)
    accepted with probability min(1, p / q), q the slot's marginal, as if it had been drawn from
    q; at the first rejection a draw from norm(max(0, p - q))."""
    chain, node = [0], 0
    while bool((parent[0] == node).any()):
        node = int((parent[0] == node).long().argmax())
        chain.append(node)
    draft = tokens[:, chain[1:]]
    n, y = standard(draft, tree.q[None, :len(chain) - 1].expand(tokens.shape[0], -1, -1), p[:, chain], generator)
    return torch.tensor(chain)[n], y


SAMPLINGS = ["t1", "t0.7-top3"]


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_a_tree_step_has_the_target_distribution(small, sampling):  # noqa: F811
    target, drafter = small
    s = exact.SAMPLINGS[sampling]
    cells, depth = tree_samples(target, drafter, s, tree_walk, seed=11)
    print(f"accepted depth {depth.float().mean():.3f}")
    assert exact.chi_square_pvalue(cells, exact.exact_joint(target.model, s)) > exact.P_EXACT
    assert 0.05 < (depth > 0).float().mean() < 0.95  # sensitive: trees neither always rejected nor always taken


@pytest.mark.parametrize("sampling", ["t1", pytest.param("t0.7-top3", marks=SLOW)])
def test_a_deterministic_child_accepted_by_p_over_q_fails_the_same_test(small, sampling):  # noqa: F811
    target, drafter = small
    s = exact.SAMPLINGS[sampling]
    cells, _ = tree_samples(target, drafter, s, standard_on_the_top_chain, seed=11)
    assert exact.chi_square_pvalue(cells, exact.exact_joint(target.model, s)) < exact.P_BROKEN


@torch.no_grad()
def multi_samples(target, drafter, sampling, rule, seed, sampled=True, nodes=6):
    """As tree_samples, each row's children drawn i.i.d. from q on the DFlash tree's shape (what
    trees.sampled_children does per row, here for all rows in one draw; sampled False: the
    deterministic tree itself), verified by `rule` (tokens, parent, p, q, generator); p after
    every path looked up from the target's p after all V + V^2 + V^3 paths."""
    g = torch.Generator().manual_seed(seed)
    step = DFlashDrafts(target, drafter, sampling, tree=nodes)
    target.capture(step.layers)
    try:
        target.prefill(exact.CONTEXT[:, :-1])
        shape = step([Row(exact.CONTEXT[0].tolist(), 8, target.max_length, None, target.device, g)], [exact.GAMMA])[0]
    finally:
        target.capture(())
    R, V, G = exact.N, exact.V, exact.GAMMA
    q = node_q(shape)  # (1, S, V)
    drawn = sample(q[0, 1:].expand(R, -1, -1), g) if sampled else shape.tokens.expand(R, -1)  # (R, S - 1)
    tokens = torch.cat([exact.CONTEXT[0, -1:].expand(R, 1), drawn], 1)  # (R, S)
    parent = torch.cat([torch.tensor([-1]), shape.parent + 1])[None].expand(R, -1)
    prefixes = [torch.zeros(1, 0, dtype=torch.long)] + [torch.tensor(list(itertools.product(range(V), repeat=d)))
                                                        for d in range(1, G + 1)]
    table = torch.cat([exact._p(target.model, torch.cat([exact.CONTEXT.expand(len(x), -1), x], 1), sampling)[:, -1]
                       for x in prefixes])  # p after every path, by (offset of its length) + its base-V code
    offset = [sum(V ** e for e in range(d)) for d in range(G + 1)]
    paths = [ancestry(parent[0].tolist(), i)[1:] for i in range(tokens.shape[1])]
    codes = torch.stack([offset[len(path)] + sum(tokens[:, j] * V ** (len(path) - 1 - k) for k, j in enumerate(path))
                         if path else torch.zeros(R, dtype=torch.long) for path in paths], 1)  # (R, S)
    node, y = rule(tokens, parent, table[codes], q.expand(R, -1, -1), g)
    at = torch.tensor([path + [0] * (G - len(path)) for path in paths])[node]  # (R, G) each row's path, padded
    depth = torch.tensor([len(path) for path in paths])[node]
    return exact.first_tokens(target.model, tokens.gather(1, at), depth, y, sampling, g), depth


def multi_without_residual(tokens, parent, p, q, generator=None):
    """A broken rule: trees.multi with r left at p after each rejected sibling."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(trees, "residual", lambda r, q_c: r)
        return multi(tokens, parent, p, q, generator)


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_recursive_rejection_over_sampled_children_has_the_target_distribution(small, sampling):  # noqa: F811
    target, drafter = small
    s = exact.SAMPLINGS[sampling]
    cells, depth = multi_samples(target, drafter, s, multi, seed=13)
    print(f"accepted depth {depth.float().mean():.3f}")
    assert exact.chi_square_pvalue(cells, exact.exact_joint(target.model, s)) > exact.P_EXACT
    assert 0.05 < (depth > 0).float().mean() < 0.95


@pytest.mark.parametrize("broken", ["no-residual", "deterministic-children"])
def test_multi_without_the_residual_or_over_deterministic_children_fails_the_same_test(small, broken):  # noqa: F811
    target, drafter = small
    s = exact.SAMPLINGS["t1"]
    rule = multi_without_residual if broken == "no-residual" else multi
    cells, _ = multi_samples(target, drafter, s, rule, seed=13, sampled=broken == "no-residual")
    assert exact.chi_square_pvalue(cells, exact.exact_joint(target.model, s)) < exact.P_BROKEN
