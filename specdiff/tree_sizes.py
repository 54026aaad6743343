"""Tree auto (`tree` auto): each step's draft tree size N in 0..N_max chosen from the cost table
and the acceptance seen so far, as specdiff.adaptive chooses a chain's gamma. N = 0 is a plain step.

Invariant (what keeps every tree rule exact, docs/lossless.md "Trees"): the size of a step reads
only the drafter's q of that step (drawn without the target's coins), what earlier steps
recorded and the costs timed before decoding; never the target's p, its draws or the rule's
coins of the step it sizes. A tree cut to its first N nodes is then a tree chosen without the
coins (match), and the shape of a sampled-children tree (multi) is still a function of q alone.

Best-first trees are nested: the first N nodes of a tree of N_max are the tree best_first gives
for N (trees.best_first pops nodes in order of joint probability, parents first; trees.grown
orders its nodes the same way: its first N are the N most likely), so one draft serves every
size, and the step keeps the first N nodes of each row's tree.

    joint_i     = prod_{j on node i's path} q(x_j | x_<j)   the drafter's chance of node i's path
    reach_bd(N) = sum_{i < N, depth_i = d} joint_i           its chance that the walk reaches depth d
    a_d         = (reached_d + S) / (predicted_d + S)       calibration by the run's past tree steps:
                  how many reached depth d, over the reach they predicted (1 before any step)
    E_b(N)      = 1 + sum_d min(1, a_d reach_bd(N), the term of d - 1)    expected tokens of row b
    N*          = argmax_{N >= 1} sum_b E_b(N) / (c_v(R, N + 1) + c_d(R, g))

A tree's verify is one target call of N + 1 tokens per row (Costs.verify up to N_max + 1: measure's
`width`), its draft one drafter call of g slots (g: the depth bound). Whether the next step drafts
at all is decided before its q exists, so from the past: the run's gain

    gain <- (1 - W) gain + W (rate(N*) / (R / c_v(R, 1)))     after every drafted step, from GAIN

a running mean of what its trees promised over a plain step (one step's q says little of the
next's: a single unsure step must not stop a drafter that pays on average). While gain < 1 the
steps are plain (no drafter call) until a probe, as adaptive.Controller's: after `probe` plain
steps in a row, doubled after each probe that does not bring drafting back. The step that finds
drafting does not pay still verifies N* (its drafter call is spent).

May import: torch, adaptive (its probing), metrics, settings, trees.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .adaptive import PROBE, Probes
from .metrics import Costs
from .settings import TREE_MAX
from .trees import Tree

STRENGTH = 4.0  # pseudo-observations of a calibration of 1 (the drafter believed until it is judged)
GAIN, W = 1.5, 1 / 8  # the gain before any step (tried before it is judged: 8 steps that promise 0.7 of
# a plain step's rate bring it under 1) and the weight of each step's own promise in it


def reach(tree: Tree, depth: int) -> torch.Tensor:
    """reach_d(N) for N = 0..len(tree.tokens), d = 1..depth -> (N + 1, depth) float64, from the
    tree's own q (tree.q (N, V): the distribution each node's token was ranked or drawn by, given
    its parent's path: a node's joint is the drafter's chance of its path, conditional drafters
    (spec-ar) or marginal ones)."""
    n = len(tree.tokens)
    out = torch.zeros(n + 1, depth, dtype=torch.float64)
    if not n:
        return out
    slot = tree.q.double().gather(1, tree.tokens[:, None])[:, 0].cpu()  # (N,) q at each node
    parents, joint = tree.parent.tolist(), list[float]()
    for i, par in enumerate(parents):
        joint.append(float(slot[i]) * (joint[par] if par >= 0 else 1.0))
    at = torch.nn.functional.one_hot(tree.depth.cpu() - 1, depth).double() * torch.tensor(joint)[:, None]  # (N, depth)
    out[1:] = at.cumsum(0)
    return out


class SizeController:
    """Chooses each step's tree size: `drafts()` before the drafter is called (plain steps and
    probes, from the past only), `size(batch_trees, g)` from this step's q, `record` after the verify."""

    def __init__(self, costs: Costs, depth: int, n_max: int = TREE_MAX, probe: int = PROBE):
        self.costs, self.depth, self.n_max, self.probes = costs, depth, n_max, Probes(probe)
        self.reached = [0.0] * depth  # past tree steps whose accepted path reached depth d
        self.predicted = [0.0] * depth  # the reach their trees predicted at depth d
        self.gain = GAIN  # the running mean of rate(N*) / the plain rate (the module docstring)

    @property
    def resting(self) -> bool:
        """Whether drafting has stopped paying: the run's gain under 1."""
        return self.gain < 1

    def drafts(self) -> bool:
        """Whether this step drafts: True while the gain says drafting pays, else False for the
        plain steps before a probe, and True for the probe (adaptive.Probes)."""
        return not self.resting or self.probes.due()

    def expected(self, tree: Tree) -> torch.Tensor:
        """E_b(N) for N = 0..n_max (a tree of fewer nodes: its own E past its size) -> (n_max + 1,)."""
        r = reach(tree, self.depth)
        a = torch.tensor([(p + STRENGTH) / (q + STRENGTH) for p, q in zip(self.reached, self.predicted)],
                         dtype=torch.float64)
        terms = (a * r).clamp(max=1.0).cummin(1).values  # (N + 1, depth): reaching d needs reaching d - 1
        e = 1.0 + terms.sum(1)
        return torch.cat([e, e[-1:].expand(self.n_max + 1 - len(e))])[:self.n_max + 1]

    def size(self, trees: Sequence[Tree], g: int) -> int:
        """N* for a step of these rows' trees (drawn from q, depth <= g), at least 1; its promise
        over a plain step enters the gain, which decides whether the next steps draft (see the
        module docstring)."""
        R = len(trees)
        tokens = sum((self.expected(tree) for tree in trees), torch.zeros(self.n_max + 1, dtype=torch.float64))
        cost = torch.tensor([self.costs.verified(R, N + 1) + self.costs.drafted(R, g)
                             for N in range(self.n_max + 1)], dtype=torch.float64)
        rates = tokens / cost
        best = int(rates[1:].argmax()) + 1  # the smallest of equally good sizes
        self.gain += W * (float(rates[best]) * self.costs.verified(R, 1) / R - self.gain)
        if not self.resting:
            self.probes.paid()  # drafting pays: probes start over
        return best

    def record(self, tree: Tree, accepted: int) -> None:
        """A row's verified tree (its first N nodes) and the depth its accepted path reached."""
        r = reach(tree, self.depth)[-1]
        for d in range(self.depth):
            self.predicted[d] += min(1.0, float(r[d]))
            self.reached[d] += accepted > d
