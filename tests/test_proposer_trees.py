"""Draft trees of spec-ar and specdiff (issue 39; methods.speculative.ProposerTrees): the tree an
autoregressive drafter grows (trees.grown: best-first over q given the path, against enumeration),
greedy identity with ar on the tiny GPT-2 / Llama / Qwen3 targets at tree 4, 8 and auto and batch
1 and 3, the rules' distributions by the chi-square test of tests/test_trees_exact.py on the
V = 8 target of tests/test_sampling_exact.py (match over deterministic children, multi over
specdiff's sampled children; min(1, p/q) on a deterministic child fails it), refusals.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from specdiff import generate, load_target
from specdiff.acceptance import standard
from specdiff.decoding import Row
from specdiff.drafters.autoregressive import ARProposer
from specdiff.drafters.diffusion import DiffusionDrafter, DiffusionProposer
from specdiff.errors import UsageError
from specdiff.generation import iter_generate, plan
from specdiff.methods.speculative import GrownTrees, MarginalTrees
from specdiff.metrics import Costs
from specdiff.settings import TREE_MAX
from specdiff.tree_sizes import reach
from specdiff.trees import ancestry, best_first, grown, multi, walk

import exactness as exact
from tiny import TEXT, target_paths

PROMPTS = [" ".join(TEXT.split()[i: i + 2 + i % 5]) for i in range(0, 8, 2)]  # 4 prompts, 2-5 words
MAX_NEW = 12
TARGETS = ("gpt2", "llama", "qwen3")
SLOW = pytest.mark.slow


# --- the grown tree -----------------------------------------------------------------------------

class Conditional:
    """A drafter whose q depends on the whole path (trees.Paths): q after a path is a fixed random
    softmax of its hash; counts its calls and the rows it is run on."""

    def __init__(self, V: int, seed: int = 0):
        self.V, self.seed, self.rows = V, seed, [()]  # each row of the last call: its path
        self.first = self.q(())
        self.calls = 1

    def q(self, path: tuple[int, ...]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((self.seed, path)) % 2 ** 31)
        return torch.softmax(torch.randn(self.V, generator=g) * 2, -1)

    def __call__(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        self.rows = [self.rows[r] + (t,) for r, t in zip(rows.tolist(), tokens.tolist())]
        self.calls += 1
        return torch.stack([self.q(path) for path in self.rows])


def test_grown_keeps_the_nodes_of_largest_joint_probability_under_q_given_the_path():
    """Against enumeration of every path of depth <= g: prefix-closed, the N most likely, in
    order of joint probability; each node's q is its parent's; one drafter call per depth."""
    g, V, N = 3, 5, 11
    paths = Conditional(V)
    tree = grown(paths, N, g)
    parents = [-1] + (tree.parent + 1).tolist()
    got = [tuple(tree.tokens[i - 1].item() for i in ancestry(parents, n)[1:]) for n in range(1, N + 1)]
    joint = {p: math.prod(paths.q(p[:d])[t].item() for d, t in enumerate(p))
             for d in range(1, g + 1) for p in itertools.product(range(V), repeat=d)}
    assert len(set(got)) == N and all(len(p) == 1 or p[:-1] in got[:i] for i, p in enumerate(got))
    assert max(joint[p] for p in joint if p not in got) <= min(joint[p] for p in got) + 1e-7
    assert [joint[p] for p in got] == sorted((joint[p] for p in got), reverse=True)
    for i, p in enumerate(got):
        assert torch.equal(tree.q[i], paths.q(p[:-1])) and tree.depth[i] == len(p)
    assert tree.calls == paths.calls <= g


def test_tree_auto_reads_each_nodes_own_q():
    """tree_sizes.reach over a grown tree: the drafter's chance of reaching depth d is the sum of
    its nodes' joint probabilities under q given their paths, for every cut of the tree."""
    g, V, N = 3, 5, 11
    paths = Conditional(V, seed=2)
    tree = grown(paths, N, g)
    parents = [-1] + (tree.parent + 1).tolist()
    joints = [math.prod(paths.q(tuple(tree.tokens[j - 1].item() for j in ancestry(parents, i)[1:k]))[
        tree.tokens[ancestry(parents, i)[k] - 1]].item() for k in range(1, len(ancestry(parents, i))))
              for i in range(1, N + 1)]
    want = torch.zeros(N + 1, g, dtype=torch.float64)
    for n in range(1, N + 1):
        want[n] = want[n - 1]
        want[n, int(tree.depth[n - 1]) - 1] += joints[n - 1]
    assert torch.allclose(reach(tree, g), want)


def test_grown_over_marginals_is_best_first():
    """A drafter whose q does not depend on the path grows best_first's tree."""
    probs = torch.softmax(torch.randn(3, 6, generator=torch.Generator().manual_seed(4)) * 2, -1)

    class Marginal:
        first = probs[0]
        depth = 0

        def __call__(self, rows, tokens):
            self.depth += 1
            return probs[self.depth].expand(len(rows), -1)

    a, b = grown(Marginal(), 9, 3), best_first(probs, 9)
    assert sorted(zip(a.depth.tolist(), a.tokens.tolist())) == sorted(zip(b.depth.tolist(), b.tokens.tolist()))


# --- greedy identity ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def models(tiny):
    """The tiny targets (target_paths, in this module's directories) and the session's drafters:
    a one-layer GPT-2 (spec-ar) and a diffusion drafter (specdiff), both over the shared tokenizer."""
    found = {name: load_target(str(path)) for name, path in target_paths(tiny, "pt").items()}
    return {**found, "spec-ar": str(tiny.ar), "specdiff": str(tiny.drafter)}


@pytest.fixture(scope="module")
def reference(models):
    return {name: generate(PROMPTS, target=models[name], method="ar", max_new_tokens=MAX_NEW) for name in TARGETS}


def cheap(batch_size: int) -> Costs:
    """A cost table under which a node pays where the drafter gives it a chance of 0.2%: tree auto
    then drafts, at sizes that follow q."""
    verify = tuple(1.0 + 0.002 * w for w in range(1, TREE_MAX + 2))
    rows = tuple(dict.fromkeys((1, batch_size)))
    return Costs(rows, (verify,) * len(rows), ((0.0,) * 4,) * len(rows))


@pytest.mark.parametrize("method", ["spec-ar", "specdiff"])
@pytest.mark.parametrize("target,batch_size", [(t, b) if (t, b) in (("gpt2", 1), ("qwen3", 3)) else
                                               pytest.param(t, b, marks=SLOW) for t in TARGETS for b in (1, 3)])
def test_proposer_tree_greedy_equals_ar(models, reference, method, target, batch_size):
    """tree 4, 8 and auto (with a cost table that makes it draft): ar's tokens, every tree drafted."""
    options = dict(target=models[target], drafter=models[method], method=method, gamma=4, batch_size=batch_size,
                   max_new_tokens=MAX_NEW, **({"steps": 1} if method == "specdiff" else {}))
    for tree in (4, 8, "auto"):
        p = plan(**options, tree=tree)
        if tree == "auto":
            p = replace(p, decoder=replace(p.decoder, measured={batch_size: cheap(batch_size)}))
        got = list(iter_generate(PROMPTS, p))
        assert [o.tokens for o in got] == [o.tokens for o in reference[target].outputs], tree
        histograms = [o.metrics.tree_sizes for o in got]  # per row: steps per tree size (0: plain)
        if tree == "auto":  # trees drafted (the controller may rest a drafter it finds poor)
            assert sum(count for h in histograms for count in h[1:]) > 0, histograms
        else:
            assert all(len(h) > tree and h[tree] > 0 for h in histograms), histograms


@pytest.mark.parametrize("method,acceptance", [("spec-ar", None), ("specdiff", None), ("specdiff", "multi")])
def test_sampled_proposer_tree_output_does_not_depend_on_the_batch_size(models, method, acceptance):
    """A whole sampled run: each row draws its tree (specdiff multi: its children from q) and its
    coins from its own generator, so batch 3 writes what batch 1 writes."""
    options = dict(target=models["gpt2"], drafter=models[method], method=method, gamma=4, tree=6, temperature=1.0,
                   top_k=20, seed=7, acceptance=acceptance, max_new_tokens=MAX_NEW,
                   **({"steps": 1} if method == "specdiff" else {}))
    one, three = (generate(PROMPTS, **options, batch_size=b) for b in (1, 3))
    assert [o.tokens for o in three.outputs] == [o.tokens for o in one.outputs]
    assert len({tuple(o.tokens[:4]) for o in one.outputs}) == len(PROMPTS)  # really sampled
    assert one.metrics.drafter_calls > 0 and three.metrics.tree_sizes[6] > 0


def test_a_shared_generator_across_the_batch_changes_a_sampled_tree_run(models, monkeypatch):
    """The control: rows of a batch drawing from one generator do not write what they write alone."""
    from specdiff import decoding

    options = dict(target=models["gpt2"], drafter=models["spec-ar"], method="spec-ar", gamma=4, tree=6,
                   temperature=1.0, top_k=20, seed=7, max_new_tokens=MAX_NEW)
    one = generate(PROMPTS, **options, batch_size=1)
    shared = torch.Generator().manual_seed(7)
    rows = decoding.Row.__init__

    def one_generator(self, *args, **kwargs):
        rows(self, *args, **kwargs)
        self.generator = shared
    monkeypatch.setattr(decoding.Row, "__init__", one_generator)
    three = generate(PROMPTS, **options, batch_size=3)
    assert [o.tokens for o in three.outputs] != [o.tokens for o in one.outputs]


# --- the target's distribution -----------------------------------------------------------------

def drafted(drafter, sampling, seed: int, nodes: int = 6):
    """One row's tree after exact.CONTEXT from spec-ar's or specdiff's tree step (GrownTrees over an
    ARProposer; MarginalTrees over a DiffusionProposer at T = 1), depth <= exact.GAMMA, and the
    generator it drew from."""
    g = torch.Generator().manual_seed(seed)
    shell = SimpleNamespace(device=torch.device("cpu"), vocab_size=exact.V)  # what a tree step reads of its target
    step = (MarginalTrees(DiffusionProposer(drafter), sampling, shell, nodes) if isinstance(drafter, DiffusionDrafter)
            else GrownTrees(ARProposer(drafter), sampling, shell, nodes))
    return step([Row(exact.CONTEXT[0].tolist(), 8, 64, None, torch.device("cpu"), g)], [exact.GAMMA])[0], g


def on_the_top_chain(tokens, parent, p, q, generator=None):
    """A broken rule: each node's first child (its top token under q given its path) accepted with
    probability min(1, p / q), as if drawn from q; at the first rejection a draw from
    norm(max(0, p - q))."""
    chain, node = [0], 0
    while bool((parent[0] == node).any()):
        node = int((parent[0] == node).long().argmax())
        chain.append(node)
    n, y = standard(tokens[:, chain[1:]], q[:, chain[1:]], p[:, chain], generator)
    return torch.tensor(chain)[n], y


CASES = [("ar", "match", "t1"), pytest.param("ar", "match", "t0.7-top3", marks=SLOW), ("diffusion", "match", "t1"),
         pytest.param("diffusion", "match", "t0.7-top3", marks=SLOW),
         pytest.param("diffusion", "multi", "t1", marks=SLOW),
         ("diffusion", "multi", "t0.7-top3")]  # CI's slow step runs them all (3-5 s each)


@pytest.mark.parametrize("kind,rule,sampling", CASES)
def test_a_proposer_tree_step_has_the_target_distribution(target, drafters, kind, rule, sampling):
    """match over the tree grown (spec-ar) or best-first (specdiff) from q; multi over specdiff's
    children drawn from q (its shape's)."""
    s = exact.SAMPLINGS[sampling]
    tree, g = drafted(drafters[kind], s, seed=21)
    cells, depth = exact.samples_over(target, tree, s, walk if rule == "match" else multi, g, sampled=rule == "multi")
    assert exact.chi_square_pvalue(cells, exact.exact_joint(target, s)) > exact.P_EXACT
    assert 0.05 < (depth > 0).float().mean() < 0.95  # sensitive: trees neither always rejected nor always taken


@pytest.mark.parametrize("kind", ["ar", pytest.param("diffusion", marks=SLOW)])
def test_a_deterministic_child_accepted_by_p_over_q_fails_the_same_test(target, drafters, kind):
    s = exact.SAMPLINGS["t1"]
    tree, g = drafted(drafters[kind], s, seed=21)
    cells, _ = exact.samples_over(target, tree, s, on_the_top_chain, g, sampled=False)
    assert exact.chi_square_pvalue(cells, exact.exact_joint(target, s)) < exact.P_BROKEN


@torch.no_grad()
def test_a_grown_trees_q_is_the_drafters_own_after_each_nodes_parent(drafters):
    """spec-ar's tree (ARPaths: one cache row per path, selected and extended each depth): node i's
    q is the drafter's warped distribution after the context and i's parent's path, decoded alone."""
    s = exact.SAMPLINGS["t0.7-top3"]
    drafter = drafters["ar"]
    step = GrownTrees(ARProposer(drafter), s, SimpleNamespace(device=torch.device("cpu"), vocab_size=exact.V), 12)
    for ids in ([1, 5, 2], [1, 5, 2, 7, 3], [1, 6]):  # the row's cache reused, extended, then cut back
        tree = step([Row(ids, 8, 64, None, torch.device("cpu"), torch.Generator())], [exact.GAMMA])[0]
        parents = [-1] + (tree.parent + 1).tolist()
        assert int(tree.depth.max()) == exact.GAMMA and len({tuple(r) for r in tree.q.tolist()}) > 2
        for i in range(len(tree.tokens)):
            path = tree.tokens[[j - 1 for j in ancestry(parents, i + 1)[1:-1]]]
            logits = drafter(torch.cat([torch.tensor(ids), path])[None])[0, -1, :exact.V]
            assert torch.allclose(tree.q[i], s.probs(logits), atol=1e-5), (ids, i)


# --- planning and refusals ---------------------------------------------------------------------

def test_proposer_tree_settings_and_refusals(models):
    target = models["gpt2"]
    p = plan(target=target, drafter=models["spec-ar"], method="spec-ar", gamma=3, tree=6, temperature=0.7)
    assert (p.decoder.rule, p.decoder.ran()["tree"], p.decoder.trees.nodes) == ("match", 6, 6)
    p = plan(target=target, drafter=models["specdiff"], method="specdiff", gamma=3, steps=1, tree="auto",
             temperature=0.7, acceptance="multi")
    assert (p.decoder.rule, p.decoder.trees.sampled, p.decoder.sized, p.decoder.trees.nodes) == (
        "multi", True, True, TREE_MAX)
    refused = [({"method": "spec-ar", "acceptance": "multi", "temperature": 1.0}, "multi needs children drawn from q"),
               ({"method": "specdiff", "steps": 2}, "give `steps` 1 with it"),
               ({"method": "specdiff", "steps": 1, "drafts": 2}, "give `drafts` 1"),
               ({"method": "spec-ar", "acceptance": "standard", "temperature": 1.0}, "does not apply")]
    for options, message in refused:
        with pytest.raises(UsageError, match=message):
            plan(target=target, drafter=models[options["method"]], gamma=3, tree=6, **options)


def test_the_cli_runs_a_spec_ar_tree_and_refuses_specdiff_steps_in_one_line(tiny):
    from click.testing import CliRunner

    from specdiff_cli.main import cli

    run = ["generate", "--target", str(tiny.gpt2), "--prompt", "The sea", "--max-new-tokens", "6", "--gamma", "3",
           "--tree", "4"]
    ok = CliRunner().invoke(cli, [*run, "--drafter", str(tiny.ar), "--method", "spec-ar", "--stats"])
    assert ok.exit_code == 0, ok.stderr
    assert '"tree": {"value": 4' in ok.stderr.replace("\n", "")
    refused = CliRunner().invoke(cli, [*run, "--drafter", str(tiny.drafter), "--method", "specdiff", "--steps", "2"])
    assert refused.exit_code == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "give --steps 1 with it" in refused.stderr  # the CLI names its flags


def test_bench_sweeps_spec_ar_and_specdiff_trees_where_they_run():
    """specdiff's trees at T = 1 only, spec-ar's without multi."""
    from specdiff.tools.bench.sweep import variants

    labels = [v.label for v in variants(["spec-ar", "specdiff"], gammas=(4,), steps=(1, 4), trees=(0, 8),
                                        rules=("match", "multi"), temperatures=(0.7,))]
    assert [label for label in labels if "tree" in label] == [
        "spec-ar g=4 tree=8 match t=0.7", "specdiff g=4 T=1 l2r tree=8 match t=0.7",
        "specdiff g=4 T=1 l2r tree=8 multi t=0.7"]
