"""Draft trees (docs/lossless.md, "Trees"): a row drafts a tree of N tokens instead of a chain,
the target verifies the whole tree in one call (contracts.TreeTarget.extend_tree: each node
attends the row's cache and its own ancestors, at position length + depth), a rule walks it and
the row's cache keeps only the accepted path (TreeTarget.keep_path).

Verify numbering: node 0 is the row's last token x (the root, the one token the target has not
cached), nodes 1..N the tree's tokens; parent[i] < i (a parent precedes its children), -1 for x.

    best_first(probs (g, V), N) -> Tree   N nodes, best-first by joint probability over per-slot
                                          marginals that do not depend on the prefix (DFlash, a
                                          masked-diffusion drafter in one call: q_j does not depend
                                          on x_<j), depth <= g; children chosen deterministically
    marginal_tree(probs, N, ...)           best_first with q widened to the target's ids, or its
                                          shape with sampled children (dflash, specdiff)
    grown(paths, N, g, ...) -> Tree        N nodes, best-first by joint probability under a drafter
                                          whose q depends on the path (an autoregressive drafter:
                                          spec-ar), expanded depth by depth (EAGLE-2, SpecInfer)
    walk(tokens (B, S), parent (B, S), p (B, S, V), q (B, S, V), generator) -> (node (B,), y (B,))
        the rule (RULES: walk_greedy at temperature 0): from the root, draw y ~ p(node) (greedy:
        its argmax); descend while y is a child of the node, else stop: `node` the deepest
        accepted node, y the token after it. Exact for any tree chosen without the target's
        coins (match over a tree).
    multi(tokens, parent, p, q, generator)   recursive rejection over siblings drawn i.i.d. from q
        (sampled_children: best_first's shape, every node's token drawn from q at its depth)
    verify(target, batch, trees, sampling, rule) -> per row (accepted draft tokens, next token)

May import: acceptance, contracts, sampling.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from .acceptance import residual
from .contracts import Draft, Row, TreeTarget
from .sampling import Generators, Sampling, rows_of, sample, uniform

# (tokens (B, S), parent (B, S), p (B, S, V), q (B, S, V), generator) -> (deepest accepted node (B,), next token
# (B,)); q[b, i]: the distribution node i's token was drawn from (read only by `multi`)
TreeRule = Callable[..., tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Tree(Draft):
    """One row's draft tree after its last token x (a Draft whose tokens are the nodes'): tokens
    (N,) int64 (target ids; siblings distinct unless sampled_children), q (N, V) per node the
    drafter's distribution its token was ranked or drawn by, over the target's ids (the
    conditional given its parent's path; a marginal drafter's: its depth's marginal), calls:
    drafter calls; parent (N,) int64 (the parent's index among these nodes, -1: x), depth (N,)
    int64 (1 .. g); parents precede children."""

    parent: torch.Tensor
    depth: torch.Tensor


def empty_tree(device: torch.device, V: int) -> Tree:
    """The tree of a row that drafts nothing this step (g_b = 0)."""
    none = torch.zeros(0, dtype=torch.long, device=device)
    return Tree(none, torch.zeros(0, V, device=device), 0, none, none)


def best_first(probs: torch.Tensor, N: int, ids: Callable[[torch.Tensor], torch.Tensor] = lambda i: i) -> Tree:
    """probs (g, V): slot j's marginal, the same after any prefix -> the N nodes of largest joint
    probability prod_j probs[j, x_j] (ties: lower rank first), depth <= g; nodes of probability 0
    are not drafted (fewer than N then). A node's children are the top tokens of the next slot:
    expanding a node pushes its next sibling and its first child (DDTree, EAGLE-2's best-first).
    ids: the rows of probs -> target ids (a draft vocabulary's map, specdiff.vocab); q: each
    node's slot's row of probs, which the caller widens to the target's ids where they differ."""
    g, V = probs.shape
    k = min(N, V)
    top, rank_ids = probs.float().topk(k, dim=-1)  # (g, k) each slot's tokens, best first
    logp, tok = top.log().tolist(), rank_ids.tolist()
    heap: list[tuple[float, int, int, int, int]] = []  # (-log joint, order, parent, slot, rank)
    order = 0

    def push(cost: float, parent: int, slot: int, rank: int) -> None:
        nonlocal order
        if rank < k and logp[slot][rank] > -math.inf:
            heapq.heappush(heap, (cost - logp[slot][rank], order, parent, slot, rank))
            order += 1

    push(0.0, -1, 0, 0)
    tokens: list[int] = []
    parent: list[int] = []
    depth: list[int] = []
    while heap and len(tokens) < N:
        cost, _, par, slot, rank = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(tok[slot][rank])
        parent.append(par)
        depth.append(slot + 1)
        push(cost + logp[slot][rank], par, slot, rank + 1)  # the next sibling: same parent's joint
        if slot + 1 < g:
            push(cost, node, slot + 1, 0)  # the first child
    device = probs.device
    at = torch.tensor(depth, dtype=torch.long, device=device)
    return Tree(ids(torch.tensor(tokens, dtype=torch.long, device=device)), probs[at - 1], 1,
                torch.tensor(parent, dtype=torch.long, device=device), at)


def ranking(sampling: Sampling) -> Sampling:
    """The warping a tree ranks its nodes by: the target's (q), at temperature 0 the drafter's
    softmax at temperature 1 (a greedy q is one-hot: it would rank one child per node)."""
    return Sampling(temperature=1.0) if sampling.greedy else sampling


def marginal_tree(probs: torch.Tensor, N: int, ids: Callable[[torch.Tensor], torch.Tensor] = lambda i: i,
                  widen: Callable[[torch.Tensor], torch.Tensor] = lambda p: p,
                  generator: torch.Generator | None = None, sampled: bool = False) -> Tree:
    """A marginal drafter's tree (dflash, specdiff): best_first over probs (g, V_d) (the slots'
    marginals, warped by `ranking`), q widened to the target's ids (widen: (..., V_d) -> (..., V));
    sampled (rule multi): its shape with every node's token drawn from q with `generator`."""
    tree = best_first(probs, N, ids)
    tree.q = widen(tree.q)
    return sampled_children(tree, generator) if sampled else tree


class Paths(Protocol):
    """A drafter over the paths of a tree being grown (grown): `first` (V_d,) its probabilities
    after the row (the root); calling it with (rows (n,), tokens (n,)) -> (n, V_d) its
    probabilities after each of the previous call's rows `rows` (of `first`: row 0) followed by
    its token (the drafter keeps each row's cache)."""

    first: torch.Tensor

    def __call__(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor: ...


def grown(paths: Paths, N: int, g: int, ids: Callable[[torch.Tensor], torch.Tensor] = lambda i: i,
          widen: Callable[[torch.Tensor], torch.Tensor] = lambda p: p) -> Tree:
    """The N nodes of largest joint probability prod q(x_d | x_<d) under a drafter whose q depends
    on the path (ties: the node found first), depth <= g, built depth by depth: a node's children
    are its top min(N, V) tokens under its own q; at depth d the drafter is run (one call) on the
    nodes of depth d that rank among the N best found so far (only those can be in the answer:
    the nodes above a node of the answer are fewer than N), and the answer is the N best found.
    The result is the tree best-first by joint probability over the drafter's conditionals, in
    order of joint probability (parents first): its first n nodes are the n best. q (N, V): each
    node's parent's q (its token was ranked by it); calls: the drafter calls (paths.first's
    included). ids, widen: as marginal_tree's."""
    V, device = paths.first.shape[-1], paths.first.device
    k = min(N, V)
    qs = [paths.first.float()[None]]  # per drafter call: (rows, V_d), row r of call d: a depth-d node
    token, parent, depth, logp = list[int](), list[int](), list[int](), list[float]()
    source = list[tuple[int, int]]()  # per node: (call, row) of the q its token was ranked by
    row_of: dict[int, int] = {}  # node -> its row in the call that expanded it

    def children(call: int, row: int, node: int) -> None:
        top, rank = qs[call][row].topk(k)
        base = logp[node] if node >= 0 else 0.0
        for prob, tok in zip(top.tolist(), rank.tolist()):
            if prob > 0:
                token.append(tok)
                parent.append(node)
                depth.append(call + 1)
                logp.append(base + math.log(prob))
                source.append((call, row))

    children(0, 0, -1)
    for d in range(1, g):
        order = sorted(range(len(token)), key=lambda i: (-logp[i], i))[:N]
        frontier = sorted(i for i in order if depth[i] == d)
        if not frontier:
            break
        rows = torch.tensor([row_of[parent[i]] if parent[i] >= 0 else 0 for i in frontier], device=device)
        fed = ids(torch.tensor([token[i] for i in frontier], dtype=torch.long, device=device))  # target ids
        qs.append(paths(rows, fed).float())
        for r, i in enumerate(frontier):
            row_of[i] = r
        for r, i in enumerate(frontier):
            children(d, r, i)
    kept = sorted(range(len(token)), key=lambda i: (-logp[i], i))[:N]  # parents rank before children
    index = {node: n for n, node in enumerate(kept)}
    q = torch.stack([qs[source[i][0]][source[i][1]] for i in kept]) if kept else qs[0][:0]
    return Tree(ids(torch.tensor([token[i] for i in kept], dtype=torch.long, device=device)), widen(q), len(qs),
                torch.tensor([index[parent[i]] if parent[i] >= 0 else -1 for i in kept], dtype=torch.long,
                             device=device),
                torch.tensor([depth[i] for i in kept], dtype=torch.long, device=device))


def first(tree: Tree, N: int) -> Tree:
    """The tree's first N nodes (a best-first tree's: the tree best_first gives for N; parents
    precede children, so they are a tree)."""
    return Tree(tree.tokens[:N], tree.q[:N], tree.calls, tree.parent[:N], tree.depth[:N])


def walk(tokens: torch.Tensor, parent: torch.Tensor, p: torch.Tensor, q: torch.Tensor | None = None,
         generator: Generators = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The tree rule over B rows (verify numbering): at node u draw y ~ p[u]; if a node c has
    parent u and token y, descend to c; else stop. -> (deepest accepted node (B,), y (B,)).
    q is not read: any tree chosen without the target's coins will do."""
    return _walk(tokens, parent, p, lambda probs, live: sample(probs, rows_of(generator, live)))


def walk_greedy(tokens: torch.Tensor, parent: torch.Tensor, p: torch.Tensor, q: torch.Tensor | None = None,
                generator: Generators = None) -> tuple[torch.Tensor, torch.Tensor]:
    """walk with y = argmax p[u] (temperature 0): the target's own greedy path through the tree."""
    return _walk(tokens, parent, p, lambda probs, live: probs.argmax(-1))


def multi(tokens: torch.Tensor, parent: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
          generator: Generators = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Recursive rejection over sampled siblings (SpecInfer, SpecTr), for trees whose children
    of a node were drawn i.i.d. from q (given the node's path): at node u, r = p[u]; for each
    child c in order accept it with probability min(1, r(c) / q_c(c)) and descend, else replace r
    by norm(max(0, r - q_c)); when every child is rejected (a leaf: none) emit y ~ r.
    -> (deepest accepted node (B,), y (B,))."""
    B = tokens.shape[0]
    node = torch.zeros(B, dtype=torch.long, device=p.device)
    y = torch.zeros(B, dtype=torch.long, device=p.device)
    live = torch.arange(B, device=p.device)
    while len(live):
        r = p[live, node[live]].clone()  # (L, V) each live row's residual
        nxt = torch.full((len(live),), -1, dtype=torch.long, device=p.device)  # the child accepted
        for i in range(1, tokens.shape[1]):
            trying = torch.nonzero((parent[live, i] == node[live]) & (nxt < 0))[:, 0]
            if not len(trying):
                continue
            c, q_c = tokens[live[trying], i], q[live[trying], i]  # (n,), (n, V)
            u = uniform((len(trying),), rows_of(generator, live[trying]), p.device)
            ok = u * q_c.gather(1, c[:, None])[:, 0] < r[trying].gather(1, c[:, None])[:, 0]
            nxt[trying[ok]] = i
            r[trying[~ok]] = residual(r[trying[~ok]], q_c[~ok])
        stop = nxt < 0
        y[live[stop]] = sample(r[stop], rows_of(generator, live[stop]))
        node[live[~stop]] = nxt[~stop]
        live = live[~stop]
    return node, y


def sampled_children(tree: Tree, generator: torch.Generator | None) -> Tree:
    """The tree's shape (chosen from q alone) with every node's token drawn anew from its q (a
    marginal drafter's: its depth's, independent of the path: DFlash's slots, a masked-diffusion
    drafter's in one call): siblings i.i.d. q, as `multi` needs."""
    return Tree(sample(tree.q, generator), tree.q, tree.calls, tree.parent, tree.depth)


RULES: dict[str, TreeRule] = {"greedy": walk_greedy, "match": walk, "multi": multi}  # match: over a tree


def _walk(tokens: torch.Tensor, parent: torch.Tensor, p: torch.Tensor,
          draw: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """walk, with y = draw(p (B_live, V), live (B_live,): the rows still walking) at each node."""
    B = tokens.shape[0]
    node = torch.zeros(B, dtype=torch.long, device=p.device)
    y = torch.zeros(B, dtype=torch.long, device=p.device)
    live = torch.arange(B, device=p.device)
    while len(live):
        y[live] = y_live = draw(p[live, node[live]], live)  # (B_live,)
        child = (parent[live] == node[live, None]) & (tokens[live] == y_live[:, None])  # (B_live, S)
        found = child.any(-1)
        node[live[found]] = child.long().argmax(-1)[found]
        live = live[found]
    return node, y


def verify(target: TreeTarget, batch: list[Row], trees: list[Tree], sampling: Sampling,
           rule: TreeRule) -> list[tuple[list[int], int]]:
    """One target call over every row's tree, p of the whole batch in one pass and the rule over
    all rows at once, each row with its own generator (its own coins: the outputs of a row alone),
    then each row's cache compacted to its accepted path -> per row (accepted draft tokens, next token)."""
    tokens, parent = _fed(batch, trees, target.device)  # (B, S) each
    new = torch.tensor([len(t.tokens) + 1 for t in trees])
    logits = target.extend_tree(tokens, parent.clamp_min(-1), new)  # (B, S, V)
    p = sampling.batch_probs(logits, new, lambda b: tree_probs(
        sampling, logits[b:b + 1, :int(new[b])], batch[b].tensor(), tokens[b, :int(new[b])], parent[b, :int(new[b])]))
    node, y = rule(tokens, parent, p, node_q(trees, tokens.shape[1]), [row.generator for row in batch])
    paths = [ancestry(parent[b].tolist(), int(node[b])) for b in range(len(batch))]
    target.keep_path(paths)
    return [([int(tokens[b, i]) for i in path[1:]], int(y[b])) for b, path in enumerate(paths)]


def node_q(trees: list[Tree], S: int) -> torch.Tensor:
    """q of every node of each row's tree in verify numbering, padded to S (the root and
    padding: zeros) -> (B, S, V)."""
    V = trees[0].q.shape[-1]
    q = trees[0].q.new_zeros(len(trees), S, V)
    for b, tree in enumerate(trees):
        q[b, 1:1 + len(tree.tokens)] = tree.q
    return q


def ancestry(parent: list[int], node: int) -> list[int]:
    """The path root .. node (verify numbering)."""
    path = [node]
    while path[-1] > 0:
        path.append(parent[path[-1]])
    return path[::-1]


def tree_probs(sampling: Sampling, logits: torch.Tensor, context: torch.Tensor, tokens: torch.Tensor,
               parent: torch.Tensor) -> torch.Tensor:
    """The target's p after every node: logits (1, S, V), context (1, L) (ending in the root x),
    the nodes' tokens and parents (S,) -> (1, S, V). With a repetition penalty each node's p is
    penalised with its own prefix: the context and the tokens of its path."""
    if sampling.repetition_penalty == 1:
        return sampling.probs(logits)
    parents = parent.tolist()
    rows = []
    for i in range(logits.shape[1]):
        path = torch.stack([tokens[j] for j in ancestry(parents, i)[1:]]) if i else tokens[:0]
        prefix = torch.cat([context, path[None].to(context.device)], 1)
        rows.append(sampling.target_probs(logits[:, i:i + 1], prefix, prefix[:, :0]))
    return torch.cat(rows, 1)


def _fed(batch: list[Row], trees: list[Tree], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """[x, the tree's tokens] per row in verify numbering, right-padded -> (tokens (B, S),
    parent (B, S)); padding nodes get parent -2, so that no walk ever reaches them."""
    S = 1 + max(len(t.tokens) for t in trees)
    tokens = torch.zeros(len(batch), S, dtype=torch.long)
    parent = torch.full((len(batch), S), -2, dtype=torch.long)
    for b, (row, t) in enumerate(zip(batch, trees)):
        n = len(t.tokens)
        tokens[b, 0], parent[b, 0] = row.ids[-1], -1
        tokens[b, 1:1 + n], parent[b, 1:1 + n] = t.tokens.cpu(), t.parent.cpu() + 1
    return tokens.to(device), parent.to(device)
