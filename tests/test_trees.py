"""Draft trees (issue 39; specdiff.trees, targets.trees): the tree a drafter's marginals give, the
target's verify of a whole tree per row (ragged, left-padded rows; windowed layers), the cache
kept to the accepted path, greedy identity with ar, batch-size independence, refusals. The
rules' distributions: tests/test_trees_exact.py.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch

from specdiff import generate, load_drafter, load_target
from specdiff import trees
from specdiff.decoding import Row, decode_drafted
from specdiff.errors import UsageError
from specdiff.generation import plan
from specdiff.sampling import Sampling
from specdiff.targets.causal import CausalLMTarget
from specdiff.trees import Tree, ancestry, best_first, walk_greedy

from tiny import dflash_pairs, make_dflash, target_paths
from tree_runs import MAX_NEW, PROMPTS, TARGETS, differing, windowed_qwen3


@pytest.fixture(scope="module")
def models(tiny):
    paths = {**target_paths(tiny, "tr"), "qwen3-window": windowed_qwen3(tiny.root / "tr-qwen3w", tiny.tokenizer)}
    found = dflash_pairs(tiny, "tr", paths)
    assert "sliding_attention" in found["qwen3-window"].model.config.layer_types
    return found


@pytest.fixture(scope="module")
def reference(models):
    return {name: generate(PROMPTS, target=models[name], method="ar", max_new_tokens=MAX_NEW) for name in TARGETS}


# --- the tree --------------------------------------------------------------------------------

def test_best_first_keeps_the_nodes_of_largest_joint_probability():
    """Against enumeration: every prefix-closed path of the tree, and no path outside it is more
    likely than the least likely node kept."""
    g, V, N = 3, 5, 9
    probs = torch.softmax(torch.randn(g, V, generator=torch.Generator().manual_seed(1)) * 2, -1)
    tree = best_first(probs, N)
    parents = [-1] + (tree.parent + 1).tolist()  # verify numbering: node 0 is the root
    paths = {tuple(tree.tokens[i - 1].item() for i in ancestry(parents, n)[1:]) for n in range(1, N + 1)}
    joint = {p: math.prod(probs[d, t].item() for d, t in enumerate(p))
             for d in range(1, g + 1) for p in itertools.product(range(V), repeat=d)}
    assert len(paths) == N and all(p[:-1] in paths or len(p) == 1 for p in paths)
    assert max(joint[p] for p in joint if p not in paths) <= min(joint[p] for p in paths) + 1e-7
    assert all(tree.parent[i] < i for i in range(N)) and tree.depth.max() <= g


def test_best_first_drafts_no_node_of_probability_zero():
    probs = torch.tensor([[0.7, 0.3, 0.0], [1.0, 0.0, 0.0]])
    tree = best_first(probs, 10)
    assert sorted(zip(tree.depth.tolist(), tree.tokens.tolist())) == [(1, 0), (1, 1), (2, 0), (2, 0)]


@pytest.mark.parametrize("name", ["match", "multi"])
def test_a_tree_rule_over_rows_with_their_own_generators_draws_what_each_row_draws_alone(name):
    """trees.verify walks every row's tree at once, one generator per row: each row's (node, y)
    must be what it gets alone (a batch's outputs = its rows' alone); the control: one generator
    shared by the batch draws otherwise."""
    gen, B, g, V = torch.Generator().manual_seed(4), 6, 3, 5
    shapes = [best_first(torch.softmax(torch.randn(g, V, generator=gen), -1), 7) for _ in range(B)]
    shapes = [trees.sampled_children(t, gen) if name == "multi" else t for t in shapes]
    S = 1 + max(len(t.tokens) for t in shapes)
    tokens = torch.stack([torch.cat([torch.tensor([0]), t.tokens, t.tokens.new_zeros(S - 1 - len(t.tokens))])
                          for t in shapes])  # (B, S)
    parent = torch.stack([torch.cat([torch.tensor([-1]), t.parent + 1, t.parent.new_full((S - 1 - len(t.tokens),), -2)])
                          for t in shapes])
    p, q = torch.softmax(torch.randn(B, S, V, generator=gen), -1), trees.node_q(shapes, S)
    rule, seeds = trees.RULES[name], range(20, 20 + B)
    node, y = rule(tokens, parent, p, q, [torch.Generator().manual_seed(s) for s in seeds])
    alone = [rule(tokens[b:b + 1], parent[b:b + 1], p[b:b + 1], q[b:b + 1], torch.Generator().manual_seed(s))
             for b, s in enumerate(seeds)]
    assert (node.tolist(), y.tolist()) == ([int(a[0][0]) for a in alone], [int(a[1][0]) for a in alone])
    shared = rule(tokens, parent, p, q, torch.Generator().manual_seed(20))
    assert (shared[0].tolist(), shared[1].tolist()) != (node.tolist(), y.tolist())


# --- the target's verify -----------------------------------------------------------------------

@pytest.mark.parametrize("name", TARGETS)
def test_a_tree_verify_gives_each_node_the_logits_of_its_path(models, name):
    """Three rows of different lengths (longer than the window), one tree each (one row's
    smaller): node i's logits are the model's after the row and i's path; after keep_path the next
    extend's logits are those after the row and the kept path, as if only it had been appended."""
    target = models[name]
    model, V = target.model, target.vocab_size
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, V, (1, n), generator=gen) for n in (9, 17, 4)]
    tokens = torch.tensor([[r[0, -1].item(), 11, 12, 13, 14, 15] for r in rows])
    parent = torch.tensor([[-1, 0, 0, 1, 3, 2]] * 3)
    new = torch.tensor([6, 6, 4])
    target.keep([])
    for r in rows:
        target.join(r[:, :-1])
    logits = target.extend_tree(tokens, parent, new)
    kept = [[0, 1, 3, 4], [0, 2, 5], [0]]
    target.keep_path(kept)
    nxt = target.extend(torch.tensor([[7], [8], [9]]))
    with torch.no_grad():
        for b, r in enumerate(rows):
            for node in range(int(new[b])):
                path = tokens[b, ancestry(parent[b].tolist(), node)[1:]]
                want = model(torch.cat([r[0], path])[None]).logits[0, -1, :V]
                assert torch.allclose(logits[b, node], want, atol=1e-4), (b, node)
            seq = torch.cat([r[0], tokens[b, kept[b][1:]], torch.tensor([7 + b])])[None]
            assert torch.allclose(nxt[b, 0], model(seq).logits[0, -1, :V], atol=1e-4), b
    target.keep([])


def test_a_model_whose_windows_count_columns_cannot_verify_trees(tiny):
    """GPT-Neo's local layers window cache columns: a tree's branches would shift them."""
    neo = load_target(str(tiny.neo))
    assert "windowed attention counts cache columns" in neo.can_tree()
    with pytest.raises(UsageError, match="`tree`: .*windowed attention"):
        plan(target=neo, drafter=load_drafter(str(make_dflash(tiny.root / "tr-neo-dflash", tiny.neo, seed=6))),
             method="dflash", gamma=3, tree=4)


# --- greedy identity ---------------------------------------------------------------------------

SLOW = pytest.mark.slow  # 6-9 s each here: CI's slow step


@pytest.mark.parametrize("target,batch_size", [(t, b) if b == 3 or t in ("gpt2", "qwen3-window") else
                                               pytest.param(t, b, marks=SLOW) for t in TARGETS for b in (1, 3)])
def test_tree_greedy_equals_ar(models, reference, target, batch_size):
    result = generate(PROMPTS, target=models[target], drafter=models[f"{target}-dflash"], method="dflash",
                      max_new_tokens=MAX_NEW, gamma=4, tree=8, batch_size=batch_size)
    assert differing(result, reference[target]) == []
    assert result.metrics.new_tokens == reference[target].metrics.new_tokens
    assert models[target].captured == ()
    sizes = result.metrics.tree_sizes  # nodes verified per row and step: a size for every iteration
    assert sum(sizes) == result.metrics.iterations and len(sizes) <= 9 and sizes[8] > 0, sizes


def test_a_repetition_penalty_reads_each_nodes_own_path(models):
    """p at a node is penalised with the context and that node's path (tree_probs): greedy with
    a penalty stays ar's, and penalising with the whole tree's tokens instead does not."""
    options = dict(max_new_tokens=MAX_NEW, repetition_penalty=3.0)
    ref = generate(PROMPTS[:6], target=models["llama"], method="ar", **options)
    got = generate(PROMPTS[:6], target=models["llama"], drafter=models["llama-dflash"], method="dflash", gamma=4,
                   tree=16, batch_size=3, **options)
    assert differing(got, ref) == []
    def whole_tree(sampling, logits, context, tokens, parent):
        prefix = torch.cat([context, tokens[None, 1:].to(context.device)], 1)  # every node's token, not the path's
        return torch.cat([sampling.target_probs(logits[:, i:i + 1], prefix, prefix[:, :0])
                          for i in range(logits.shape[1])], 1)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(trees, "tree_probs", whole_tree)
        broken = generate(PROMPTS[:6], target=models["llama"], drafter=models["llama-dflash"], method="dflash", gamma=4,
                          tree=16, batch_size=3, **options)
    assert differing(broken, ref) != []


class Oracle:
    """A draft step that knows the greedy output: at every depth the right token is the second
    child of the right node, after a wrong first child (and its own wrong subtree), so the walk
    must take branches and the cache must keep them."""

    def __init__(self, target, outputs: dict[tuple[int, ...], list[int]]):
        self.target, self.outputs = target, outputs

    def __call__(self, batch: list[Row], g: list[int]) -> list[Tree]:
        return [self._tree(row, g_b) for row, g_b in zip(batch, g)]

    def _tree(self, row: Row, g: int) -> Tree:
        truth = self.outputs[tuple(row.ids[:row.n_prompt])][len(row.new_tokens):][:g]
        tokens, parent, depth, at = [], [], [], -1
        for d, t in enumerate(truth):
            wrong = (t + 1) % self.target.vocab_size
            tokens += [wrong, t, (t + 2) % self.target.vocab_size]  # a wrong child, the right one, the wrong one's child
            parent += [at, at, len(tokens) - 3]
            depth += [d + 1, d + 1, d + 2]
            at = len(tokens) - 2
        keep = [i for i, dep in enumerate(depth) if dep <= g]
        as_tensor = torch.tensor
        return Tree(as_tensor([tokens[i] for i in keep], dtype=torch.long),
                    torch.zeros(len(keep), self.target.vocab_size), 0,
                    as_tensor([parent[i] for i in keep], dtype=torch.long), as_tensor([depth[i] for i in keep]))


def _oracle_run(models, reference, name, rule, batch_size):
    target = models[name]
    prompts = [target.tokenizer(p)["input_ids"] for p in PROMPTS]
    outputs = {tuple(p): o.tokens for p, o in zip(prompts, reference[name].outputs)}
    rows = [Row(p, MAX_NEW, target.max_length, target.eos_token_id, target.device, index=i)
            for i, p in enumerate(prompts)]
    for _ in decode_drafted(target, Oracle(target, outputs), rows, Sampling(), rule, 4, batch_size, tree=True):
        pass
    return rows, outputs


@pytest.mark.parametrize("name", ["llama", "qwen3-window"])
def test_paths_through_second_children_keep_the_cache_exact(models, reference, name):
    """Every step accepts a path of second children (tau near gamma + 1): a cache that kept the
    wrong columns, or positions by column rather than by depth, would change the next steps."""
    rows, outputs = _oracle_run(models, reference, name, walk_greedy, 3)
    assert [row.new_tokens for row in rows] == [outputs[tuple(row.ids[:row.n_prompt])] for row in rows]
    assert sum(row.metrics.accepted for row in rows) / sum(row.metrics.iterations for row in rows) > 3


def first_child(tokens, parent, p, q=None, generator=None):
    """A broken rule: descend to the first child unchecked, then emit the target's argmax."""
    B, node = tokens.shape[0], torch.zeros(tokens.shape[0], dtype=torch.long)
    while True:
        child = (parent == node[:, None])
        if not bool(child.any()):
            return node, p[torch.arange(B), node].argmax(-1)
        node = child.long().argmax(-1)


def test_a_rule_that_takes_the_first_child_unchecked_is_not_ar(models, reference):
    """The negative control of the two tests above."""
    rows, outputs = _oracle_run(models, reference, "llama", first_child, 3)
    assert sum(row.new_tokens != outputs[tuple(row.ids[:row.n_prompt])] for row in rows) > len(rows) // 2


@pytest.mark.parametrize("target,acceptance", [("gpt2", None), ("gpt2", "multi"),
                                               pytest.param("qwen3-window", None, marks=SLOW)])
def test_sampled_tree_output_does_not_depend_on_the_batch_size(models, target, acceptance):
    """match over the tree, and multi (children drawn from q with the row's generator)."""
    one, three = (generate(PROMPTS, target=models[target], drafter=models[f"{target}-dflash"], method="dflash",
                           max_new_tokens=MAX_NEW, gamma=4, tree=8, temperature=1.0, top_k=20, seed=7, batch_size=b,
                           acceptance=acceptance)
                  for b in (1, 3))
    assert [o.tokens for o in three.outputs] == [o.tokens for o in one.outputs]
    assert len({tuple(o.tokens[:4]) for o in one.outputs}) > 10  # really sampled


# --- planning and refusals ---------------------------------------------------------------------

def test_tree_refusals(models, tiny):
    target, drafter = models["gpt2"], models["gpt2-dflash"]
    p = plan(target=target, drafter=drafter, method="dflash", gamma=3, tree=6, temperature=0.7)
    assert (p.decoder.rule, p.decoder.ran()["tree"], p.decoder.drafts.iid) == ("match", 6, False)
    p = plan(target=target, drafter=drafter, method="dflash", gamma=3, tree=6, temperature=0.7, acceptance="multi")
    assert (p.decoder.rule, p.decoder.drafts.iid) == ("multi", True)
    for options, message in [({"gamma": 3, "drafts": 2}, "give `drafts` 1"), ({}, "give an integer `gamma`"),
                             ({"gamma": 3, "acceptance": "standard", "temperature": 1.0}, "does not apply"),
                             ({"gamma": 3, "acceptance": "multi"}, "does not apply")]:
        with pytest.raises(UsageError, match=message):
            plan(target=target, drafter=drafter, method="dflash", tree=6, **options)
    with pytest.raises(UsageError, match="method 'ar' does not use `tree`"):
        plan(target=target, method="ar", tree=6)  # spec-ar and specdiff trees: tests/test_proposer_trees.py


def test_a_target_without_tree_verify_is_refused(models):
    """A Target without extend_tree verifies chains only (exported graphs verify trees:
    tests/test_trees_onnx.py)."""
    target = models["gpt2"]
    p = plan(target=target, drafter=models["gpt2-dflash"], method="dflash", gamma=3)
    from specdiff.methods.dflash import tree_rule

    chain_only = replace(p.decoder.settings, tree=4, adaptive=False)
    with pytest.raises(UsageError, match="verifies chains only"):
        tree_rule(object(), chain_only, Sampling(), None)
    assert isinstance(target, CausalLMTarget) and target.can_tree() is None


def test_bench_sweeps_trees_beside_chains_on_fixed_gammas():
    from specdiff.tools.bench.sweep import variants

    labels = [v.label for v in variants(["ar", "specdiff", "dflash"], gammas=("auto", 4), trees=(0, 8))]
    assert {"dflash g=4", "dflash g=4 tree=8", "dflash g=auto"} <= set(labels)
    assert [label for label in labels if "tree" in label] == ["dflash g=4 tree=8"]  # specdiff, gamma auto: chains
    graphs = variants(["ar", "dflash"], gammas=(4,), trees=(0, 8), runtimes=("torch", "onnxruntime"))
    assert [v.label for v in graphs if v.tree] == ["dflash g=4 tree=8", "dflash g=4 tree=8 onnxruntime"]
    sampled = variants(["dflash"], gammas=(4,), trees=(0, 8), rules=("standard", "multi"), temperatures=(0.7,))
    assert [v.label for v in sampled] == ["ar t=0.7", "dflash g=4 standard t=0.7", "dflash g=4 tree=8 multi t=0.7"]
