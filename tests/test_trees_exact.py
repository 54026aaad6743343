"""Draft trees under sampling (issue 39; docs/lossless.md, "Trees"): one tree step on the V = 8
target of test_sampling_exact with a DFlash drafter over it, 60,000 rows, the first three tokens'
joint distribution against the enumerated one by the chi-square test: match over the best-first
tree and multi over sampled children pass it; min(1, p/q) on the deterministic top child, multi
without the residual update and multi over deterministic children fail it.

tree auto (specdiff.tree_sizes): each row's tree cut to the size a SizeController chose from the
step's q after a history of its own passes it too; a controller that shrinks a row's tree to
nothing after seeing that the rule would reject it (the step's p and coins) fails it.
"""

from __future__ import annotations

import pytest
import torch

from specdiff import trees
from specdiff.acceptance import leading_true, standard
from specdiff.decoding import Row
from specdiff.metrics import Costs
from specdiff.methods.dflash import DFlashDrafts
from specdiff.tree_sizes import SizeController
from specdiff.trees import ancestry, multi, tree_probs, walk

import exactness as exact

SLOW = pytest.mark.power  # the high-power cases: python -m pytest -m power


# --- the target's distribution -----------------------------------------------------------------

@torch.no_grad()
def tree_samples(target, drafter, sampling, rule, seed, nodes=6, sizes=None):
    """exact.N samples of the first exact.DEPTH tokens after exact.CONTEXT through one tree step:
    the DFlash tree (the same for every row: the context is), its verify (extend_tree, tree_probs),
    then `rule` over all rows at once (sizes (N,): row b's tree cut to its first sizes[b] nodes,
    or sizes(tree) -> (N,)) -> (cell ids (N,), accepted depth (N,))."""
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
    rows_parent = parent.expand(n_rows, -1) if sizes is None else exact.cut(parent.expand(n_rows, -1), sizes(tree))
    node, y = rule(tokens.expand(n_rows, -1), rows_parent, p.expand(n_rows, -1, -1), None, g, tree=tree)
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
    q = tree.q[torch.tensor(chain[1:]) - 1]  # (len(chain) - 1, V): each chain node's slot's marginal
    n, y = standard(draft, q[None].expand(tokens.shape[0], -1, -1), p[:, chain], generator)
    return torch.tensor(chain)[n], y


SAMPLINGS = ["t1", "t0.7-top3"]


@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("children", ["deterministic", "sampled"])
def test_a_tree_step_has_the_target_distribution(v8_dflash, children, sampling):
    """match over a best-first tree (tree_samples); multi over children drawn from q (multi_samples)."""
    target, drafter = v8_dflash
    s = exact.SAMPLINGS[sampling]
    if children == "deterministic":
        cells, depth = tree_samples(target, drafter, s, tree_walk, seed=11)
    else:
        cells, depth = multi_samples(target, drafter, s, multi, seed=13)
    print(f"accepted depth {depth.float().mean():.3f}")
    assert exact.chi_square_pvalue(cells, exact.exact_joint(target.model, s)) > exact.P_EXACT
    assert 0.05 < (depth > 0).float().mean() < 0.95  # sensitive: trees neither always rejected nor always taken


@pytest.mark.parametrize("sampling", ["t1", pytest.param("t0.7-top3", marks=SLOW)])
def test_a_deterministic_child_accepted_by_p_over_q_fails_the_same_test(v8_dflash, sampling):
    target, drafter = v8_dflash
    s = exact.SAMPLINGS[sampling]
    cells, _ = tree_samples(target, drafter, s, standard_on_the_top_chain, seed=11)
    assert exact.chi_square_pvalue(cells, exact.exact_joint(target.model, s)) < exact.P_BROKEN


@torch.no_grad()
def multi_samples(target, drafter, sampling, rule, seed, sampled=True, nodes=6, sizes=None, peek=None):
    """As tree_samples, each row's children drawn i.i.d. from q on the DFlash tree's shape
    (samples_over; sampled False: the deterministic tree itself), verified by `rule` (tokens,
    parent, p, q, generator). sizes, peek: samples_over's."""
    g = torch.Generator().manual_seed(seed)
    step = DFlashDrafts(target, drafter, sampling, tree=nodes)
    target.capture(step.layers)
    try:
        target.prefill(exact.CONTEXT[:, :-1])
        shape = step([Row(exact.CONTEXT[0].tolist(), 8, target.max_length, None, target.device, g)], [exact.GAMMA])[0]
    finally:
        target.capture(())
    return exact.samples_over(target.model, shape, sampling, rule, g, sampled, sizes, peek)


def multi_without_residual(tokens, parent, p, q, generator=None):
    """A broken rule: trees.multi with r left at p after each rejected sibling."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(trees, "residual", lambda r, q_c: r)
        return multi(tokens, parent, p, q, generator)


@pytest.mark.parametrize("broken", ["no-residual", "deterministic-children"])
def test_multi_without_the_residual_or_over_deterministic_children_fails_the_same_test(v8_dflash, broken):
    target, drafter = v8_dflash
    s = exact.SAMPLINGS["t1"]
    rule = multi_without_residual if broken == "no-residual" else multi
    cells, _ = multi_samples(target, drafter, s, rule, seed=13, sampled=broken == "no-residual")
    assert exact.chi_square_pvalue(cells, exact.exact_joint(target.model, s)) < exact.P_BROKEN


# --- tree auto: sizes chosen from the past, and a controller that peeks at the present ----------

def tree_costs(n_max: int) -> Costs:
    """verify 1 + 0.1 w for w = 1..n_max + 1, drafting 0.5: sizes 0..n_max all occur below."""
    return Costs((1,), (tuple(1.0 + 0.1 * w for w in range(1, n_max + 2)),), ((0.5,) * exact.GAMMA,))


def sizes_from_the_past(shape, seed: int = 5, pasts: int = 64) -> torch.Tensor:
    """Each of exact.N rows' tree size (N,): a SizeController's choice for this step's tree
    `shape` (its q, drawn without the target) after one of `pasts` random histories (up to 23
    earlier steps sized by the controller, accepted to a depth drawn with a skill of their own),
    from a generator of their own: nothing of the target's p or coins of the step to come. 0: the
    controller rests (a plain step)."""
    g, sizes = torch.Generator().manual_seed(seed), []
    for _ in range(pasts):
        controller = SizeController(tree_costs(len(shape.tokens)), exact.GAMMA, n_max=len(shape.tokens))
        skill = float(torch.rand(1, generator=g))
        for _ in range(int(torch.randint(0, 24, (1,), generator=g))):
            size = controller.size([shape], exact.GAMMA)
            controller.record(trees.first(shape, size),
                              int(leading_true(torch.rand(1, exact.GAMMA, generator=g) < skill)[0]))
        sizes.append(controller.size([shape], exact.GAMMA) if controller.drafts() else 0)
    return torch.tensor(sizes).repeat(exact.N // pasts + 1)[:exact.N]


def plain_where_rejected(tokens, parent, p, q, sizes, generator):
    """Broken: a plain step (size 0) for the rows whose tree the rule would reject at the root,
    found by running it first on the step's p with the rule's own coins (a copy of the generator),
    as if the controller had known which trees would fail."""
    look = torch.Generator().set_state(generator.get_state())
    node, _ = multi(tokens, exact.cut(parent, sizes), p, q, look)
    return torch.where(node == 0, torch.zeros_like(sizes), sizes)


def pvalues(cells: torch.Tensor, joint: torch.Tensor) -> tuple[float, float]:
    """The chi-square p-values of the first exact.DEPTH tokens' joint and of the first token alone
    (its V cells: the sharper test where a controller biases the first token, as peeking at the
    root's acceptance does)."""
    block = exact.V ** (exact.DEPTH - 1)  # cells sharing a first token
    first = torch.zeros_like(joint)
    first[::block] = joint.reshape(exact.V, block).sum(1)
    return exact.chi_square_pvalue(cells, joint), exact.chi_square_pvalue(cells - cells % block, first)


@pytest.mark.parametrize("rule", ["match", "multi"])
def test_tree_sizes_chosen_from_the_past_keep_the_target_distribution(v8_dflash, rule):
    target, drafter = v8_dflash
    s = exact.SAMPLINGS["t1"]
    seen = []

    def sizes(shape):
        seen.append(sizes_from_the_past(shape))
        return seen[-1]

    if rule == "match":
        cells, depth = tree_samples(target, drafter, s, tree_walk, seed=11, sizes=sizes)
    else:
        cells, depth = multi_samples(target, drafter, s, multi, seed=13, sizes=sizes)
    assert 0 in seen[0] and len(set(seen[0].tolist())) >= 3, seen[0].unique()  # plain steps, several sizes
    assert min(pvalues(cells, exact.exact_joint(target.model, s))) > exact.P_EXACT
    assert 0.05 < (depth > 0).float().mean() < 0.95


def test_a_size_controller_that_peeks_at_the_step_fails_the_same_test(v8_dflash):
    target, drafter = v8_dflash
    s = exact.SAMPLINGS["t1"]
    cells, _ = multi_samples(target, drafter, s, multi, seed=13, sizes=sizes_from_the_past,
                             peek=plain_where_rejected)
    assert min(pvalues(cells, exact.exact_joint(target.model, s))) < exact.P_BROKEN
