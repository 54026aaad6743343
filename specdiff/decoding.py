"""The decoding loops: plain autoregressive decoding (the reference) and one speculative loop that
serves every proposer. Both decode a stream of rows over the Target contract, up to `batch_size`
rows per forward pass, and know nothing about tokenization or runtimes. They are iterators: each
step yields (row, the tokens it appended) for every row in the batch (streaming); a row's metrics
are complete once it has a stop_reason.

Batches (docs/lossless.md, "Batches of prompts"): rows join the batch as others finish
(continuous refill: a new row is prefilled alone, `Target.join`, and joins the cache) and leave it
when they stop (`Target.keep`). Every random draw of a row comes from its own generator, in the
order it would come in batch 1, and every decision of a row uses only its own p, q and coins, so
a row's output does not depend on the rows beside it. The target re-aligns its cache per row.

Speculative step (cache invariant: the target has cached every token of a row but the last, x):
    draft   x_1..x_g ~ q                        proposer.propose(context, g) (decode_speculative),
                                                 or any draft step (decode_drafted: methods.dflash)
    verify  p_1..p_{g+1} = target.extend([x, x_1..x_g])  one target call for the batch (K
                                                 candidate drafts: each row's cache repeated K
                                                 times, B * K rows in the call, _verify_selected;
                                                 a draft tree: specdiff.trees, one call over
                                                 every row's tree, the cache kept to the path)
    accept  n, y = rule(draft, q, p)            n draft tokens kept, then y (K drafts: the rule
                                                 also picks the candidate k whose copy is kept)
    roll back the row to len(row) + n, append x_1..x_n, y
g = gamma, or with `costs` (gamma auto) the G that specdiff.adaptive.Controller chooses from the
steps before this one, clipped per row so that neither max_new_tokens nor the context window is
overshot; rows drafting the same g share a proposer call. The choice reads no draw of this step,
so every rule stays exact; its seconds are the step's `control` time (Metrics.control_s).
tree auto (`tree_max`): g = gamma, the depth bound, and each step's tree size N, chosen by a
specdiff.tree_sizes.SizeController from this step's q and the past (never p or the coins), cuts
every row's tree to its first N nodes; or the step is plain.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Callable, Iterable, Iterator, cast

import torch

from . import selection, trees
from .adaptive import ROWS, Controller, measure
from .contracts import Draft, Proposer, Row, Rule, Target, TreeTarget
from .errors import UsageError
from .metrics import Costs, Metrics
from .sampling import Sampling
from .tree_sizes import SizeController

Step = Callable[[list[Row], "_Parts"], list[list[int]]]
DraftStep = Callable[[list[Row], list[int]], list[Draft]]  # (batch, g per row) -> one Draft (1, g_b) per row


class _Parts:
    """Seconds of one batched step spent drafting, verifying and choosing the draft length (a
    Metrics' draft_s / verify_s / control_s), shared out among its rows; the first step of gamma
    auto also carries the seconds spent timing its cost table before decoding (costs_s)."""

    def __init__(self, sync: Callable[[], None]):
        self.sync, self.m = sync, Metrics()

    def timed(self, part: str, sync: bool = True) -> AbstractContextManager[None]:
        """sync=False: host work only (the controller), no device to wait for (nor its cost)."""
        return self.m.timed(part, self.sync if sync else None)

    def charge(self, rows: list[Row], wall_s: float) -> None:
        """Each row's share of the step: a prompt's wall_s sums to the decoding time it used."""
        for row in rows:
            m = row.metrics
            m.wall_s += (wall_s + self.m.costs_s) / len(rows)
            m.costs_s += self.m.costs_s / len(rows)
            m.draft_s += self.m.draft_s / len(rows)
            m.verify_s += self.m.verify_s / len(rows)
            m.control_s += self.m.control_s / len(rows)
            m.target_calls += 1
            m.new_tokens, m.stop_reason = len(row.new_tokens), row.stop_reason


def _decode(target: Target, rows: Iterable[Row], sampling: Sampling, batch_size: int, step: Step,
            copies: int = 1) -> Iterator[tuple[Row, list[int]]]:
    """Run `step` over batches of up to batch_size rows, refilled from `rows` as rows finish;
    `copies`: cached rows per row in the step's target calls (K candidate drafts)."""
    pending, active = iter(rows), list[Row]()
    if target.max_rows:
        if target.max_rows < copies:
            raise UsageError(f"`drafts` {copies} verifies {copies} rows per target call; this target takes "
                             f"at most {target.max_rows}")
        batch_size = min(batch_size, target.max_rows // copies)
    target.keep([])
    while True:
        while len(active) < batch_size and (row := next(pending, None)) is not None:
            first = _first(target, row, sampling)
            if row.stop_reason:  # done at its first token: it leaves at once
                target.keep(list(range(len(active))))
            else:
                active.append(row)
            yield row, first
        if not active:
            return
        batch, parts, start = active, _Parts(target.sync), time.perf_counter()
        pushed = step(batch, parts)
        active = [row for row in batch if not row.stop_reason]
        if len(active) < len(batch):  # finished rows leave the cache
            target.keep([b for b, row in enumerate(batch) if not row.stop_reason])
        parts.charge(batch, time.perf_counter() - start)
        yield from zip(batch, pushed)


def _first(target: Target, row: Row, sampling: Sampling) -> list[int]:
    """Prefill the row alone into the batch, push the first new token; -> [that token]."""
    parts, start = _Parts(target.sync), time.perf_counter()
    with parts.timed("verify"):
        logits = target.join(row.tensor())  # (1, S, V)
    x = int(sampling.sample(_next_p(sampling, logits[:, -1:], row), row.generator))
    pushed = row.push([x])
    parts.charge([row], time.perf_counter() - start)
    return pushed


def decode_ar(target: Target, rows: Iterable[Row], sampling: Sampling,
              batch_size: int = 1) -> Iterator[tuple[Row, list[int]]]:
    """Plain decoding, one target call per token and batch: the reference every method must match."""

    def step(batch: list[Row], parts: _Parts) -> list[list[int]]:
        return _plain_step(target, batch, sampling, parts)

    return _decode(target, rows, sampling, batch_size, step)


def _plain_step(target: Target, batch: list[Row], sampling: Sampling, parts: _Parts) -> list[list[int]]:
    """One token per row from one target call: decode_ar's step, and a speculative step that
    drafts nothing (G = 0), which is the same draw from the same p without the verify machinery."""
    x = torch.tensor([[row.ids[-1]] for row in batch], device=target.device)  # (B, 1)
    with parts.timed("verify"):
        logits = target.extend(x)  # (B, 1, V)
    for row in batch:
        row.metrics.record(0, 0)
    return [row.push([int(sampling.sample(_next_p(sampling, logits[b:b + 1], row), row.generator))])
            for b, row in enumerate(batch)]


def decode_speculative(target: Target, proposer: Proposer, rows: Iterable[Row], sampling: Sampling,
                       rule: Rule | selection.SelectRule, gamma: int,
                       batch_size: int = 1, K: int = 1, costs: Costs | None = None,
                       costs_s: float = 0.0) -> Iterator[tuple[Row, list[int]]]:
    """Speculative decoding with any proposer and acceptance rule (see the module docstring). K > 1
    candidate drafts per row: the proposer drafts selection.Candidates (a SelfSelection) and the
    rule is a selection rule (specdiff.selection.RULES). costs, costs_s: gamma auto (decode_drafted)."""
    return decode_drafted(target, proposer_step(proposer, sampling, target), rows, sampling, rule, gamma,
                          batch_size, K, costs, costs_s)


def proposer_step(proposer: Proposer, sampling: Sampling, target: Target) -> DraftStep:
    """The draft step of a proposer (decode_speculative's, and what measure_costs times)."""

    def draft(batch: list[Row], g: list[int]) -> list[Draft]:
        return _draft(proposer, batch, g, sampling, target)

    return draft


def decode_drafted(target: Target, draft: DraftStep, rows: Iterable[Row], sampling: Sampling,
                   rule: Rule | selection.SelectRule | trees.TreeRule, gamma: int, batch_size: int = 1, K: int = 1,
                   costs: Costs | None = None, costs_s: float = 0.0,
                   tree: bool = False, tree_max: int = 0) -> Iterator[tuple[Row, list[int]]]:
    """The speculative loop around any draft step: draft(batch, g) -> one Draft (1, g_b) per row
    of the batch (batch row b is the target's cache row b). decode_speculative drafts with a
    proposer; methods.dflash reads the target's cached hidden states. costs (measure_costs):
    gamma auto, each step's length chosen by an adaptive.Controller, at most costs.gamma_max;
    None: gamma every step. costs_s: the seconds timing `costs` took for this run (0: a kept
    table), counted in the first step (Metrics.costs_s). tree: the draft step drafts a
    trees.Tree per row, of depth <= g_b, verified by trees.verify with a trees.TreeRule; tree_max
    (tree auto, with costs timed up to width tree_max + 1): trees of up to tree_max nodes, each step
    cut to the size a SizeController chooses, gamma the depth bound."""
    sizes = SizeController(costs, gamma, tree_max) if tree_max and costs is not None else None
    controller = Controller(costs) if costs is not None and sizes is None else None
    untold = costs_s  # not yet charged to a step

    def step(batch: list[Row], parts: _Parts) -> list[list[int]]:
        nonlocal untold
        parts.m.costs_s, untold = untold, 0.0
        if sizes is not None:
            with parts.timed("control", sync=False):
                drafting = sizes.drafts()
                for row in batch:
                    row.metrics.costs = sizes.costs
            if drafting:
                return speculate(batch, parts, gamma)
            pushed = _plain_step(target, batch, sampling, parts)
            for row in batch:
                row.metrics.record_tree(0)  # a plain step: no node verified
            return pushed
        if controller is None:
            return speculate(batch, parts, gamma)
        with parts.timed("control", sync=False):
            G = controller.width(batch)
            for row in batch:
                row.metrics.costs = controller.costs
        # between steps the cache holds one copy per row (K drafts too): a plain step needs no more
        pushed = speculate(batch, parts, G) if G else _plain_step(target, batch, sampling, parts)
        controller.observe(len(batch), G, parts.m.draft_s + parts.m.verify_s)
        return pushed

    def speculate(batch: list[Row], parts: _Parts, G: int) -> list[list[int]]:
        g = [min(G, row.room() - 1) for row in batch]  # a step emits at most g + 1 tokens
        with parts.timed("draft"):
            drafts = draft(batch, g)
        if sizes is not None:  # this step's q and the past only: the invariant of tree_sizes
            with parts.timed("control", sync=False):
                N = sizes.size(cast(list[trees.Tree], drafts), gamma)
                drafts = [trees.first(cast(trees.Tree, d), N) for d in drafts]
        with parts.timed("verify"):
            if tree:
                accepted = trees.verify(cast(TreeTarget, target), batch, cast(list[trees.Tree], drafts), sampling,
                                        cast(trees.TreeRule, rule))
            elif K == 1:
                accepted = _verify(target, batch, drafts, g, sampling, cast(Rule, rule))
            else:
                accepted = _verify_selected(target, batch, drafts, g, sampling, cast(selection.SelectRule, rule), K)
            target.rollback(torch.tensor([len(row.ids) + len(x) for row, (x, _) in zip(batch, accepted)]))
        pushed = []
        for row, d, g_b, (x, y) in zip(batch, drafts, g, accepted):
            row.metrics.drafter_calls += d.calls
            row.metrics.record(len(x), g_b)
            if tree:
                row.metrics.record_tree(len(d.tokens))
            pushed.append(row.push(x + [y]))
        if controller is not None or sizes is not None:
            with parts.timed("control", sync=False):
                for row, d, g_b, (x, _) in zip(batch, drafts, g, accepted):
                    if controller is not None:
                        controller.record(row, g_b, len(x))
                    if sizes is not None:
                        sizes.record(cast(trees.Tree, d), len(x))
        return pushed

    return _decode(target, rows, sampling, batch_size, step, K)


def measure_costs(target: Target, draft: DraftStep, gamma_max: int, batch_size: int, K: int = 1,
                  context: int = 32, width: int = 0) -> Costs:
    """adaptive.measure on dummy rows of `context` tokens (fewer where the target's window is
    short), as many as a step of `batch_size` rows holds, at most adaptive.ROWS (more rows are
    extrapolated); width: the widest verify timed (tree auto: N_max + 1); the target's cache is
    left empty."""
    rows = min(batch_size, ROWS, target.max_rows // K if target.max_rows else ROWS)
    n = max(1, min(max(context, width), target.max_length - max(gamma_max + 1, width)))
    ids = [(7 * i + 1) % target.vocab_size for i in range(n)]
    dummies = [Row(ids, gamma_max + 1, target.max_length, None, target.device,
                   torch.Generator(target.device).manual_seed(b))
               for b in range(rows)]
    return measure(target, draft, dummies, gamma_max, K, width)


def _verify(target: Target, batch: list[Row], drafts: list[Draft], g: list[int], sampling: Sampling,
            rule: Rule) -> list[tuple[list[int], int]]:
    """One target call over every row's draft (1, g_b), p of the whole batch in one pass, the
    rule once per draft length among the rows (once where all draft alike), each row with its own
    generator (its own coins: the outputs of a row alone) -> per row (accepted draft tokens, next token)."""
    new = torch.tensor(g) + 1
    logits = target.extend(_fed(batch, [d.tokens for d in drafts], target.device), new)  # (B, G + 1, V)
    p = sampling.batch_probs(logits, new, lambda b: sampling.target_probs(
        logits[b:b + 1, :g[b] + 1], batch[b].tensor(), drafts[b].tokens))  # (B, G + 1, V)
    accepted: list[tuple[list[int], int]] = [([], 0)] * len(batch)
    for g_b, members in _by_length(g).items():
        tokens = torch.cat([drafts[b].tokens for b in members])  # (B_g, g_b)
        q = torch.cat([drafts[b].q for b in members])  # (B_g, g_b, V)
        n, y = rule(tokens, q, p[members, :g_b + 1], [batch[b].generator for b in members])
        for i, b in enumerate(members):
            accepted[b] = (tokens[i, :int(n[i])].tolist(), int(y[i]))
    return accepted


def _by_length(g: list[int]) -> dict[int, list[int]]:
    """Draft length -> the rows (batch indices) drafting it."""
    groups = defaultdict(list)
    for b, g_b in enumerate(g):
        groups[g_b].append(b)
    return groups


def _verify_selected(target: Target, batch: list[Row], drafts: list[Draft], g: list[int], sampling: Sampling,
                     rule: selection.SelectRule, K: int) -> list[tuple[list[int], int]]:
    """K candidate drafts per row (selection.Candidates, tokens (1, K, g_b)): each row's cache is
    repeated K times, the B * K candidates are extended in one target call, the rule chooses a
    candidate per row, and only the chosen copy of each row stays cached.
    -> per row (the chosen candidate's accepted draft tokens, next token)."""
    target.keep(torch.arange(len(batch)).repeat_interleave(K))  # row b -> rows b*K .. b*K + K - 1
    tokens = [selection.candidates(d, K) for d in drafts]  # each (K, g_b)
    new = (torch.tensor(g) + 1).repeat_interleave(K)
    logits = target.extend(_fed(batch, tokens, target.device), new)  # (B * K, G + 1, V)
    chosen, accepted = [], []
    for b, (row, d) in enumerate(zip(batch, drafts)):
        x, y, k = selection.choose(rule, tokens[b], d.q, logits[b * K:(b + 1) * K, :g[b] + 1], row.tensor(),
                                   sampling, row.generator)
        chosen.append(b * K + k)
        accepted.append((x, y))
    target.keep(chosen)
    return accepted


def _draft(proposer: Proposer, batch: list[Row], g: list[int], sampling: Sampling, target: Target) -> list[Draft]:
    """One proposer call per distinct draft length among the rows; -> one Draft (1, g_b) per row
    (selection.Candidates (1, K, g_b) from a SelfSelection)."""

    def chains(rows: list[Row], g_b: int, context: torch.Tensor, ragged: dict[str, torch.Tensor]) -> list[Draft]:
        generators = rows[0].generator if len(rows) == 1 else [row.generator for row in rows]
        d = proposer.propose(context, g_b, sampling, generators, **ragged)
        return [replace(d, tokens=d.tokens[i:i + 1], q=d.q[i:i + 1]) for i in range(len(rows))]

    return grouped(batch, g, target, chains, empty_draft(target))


Group = Callable[[list[Row], int, torch.Tensor, dict[str, torch.Tensor]], list[Draft]]


def grouped(batch: list[Row], g: list[int], target: Target, draft: Group, none: Draft) -> list[Draft]:
    """draft(rows, g_b, context, ragged) -> one Draft per row, called once per distinct draft
    length g_b >= 1 among the rows: the rows of that length, their ids left-padded (B_g, L) and
    {"lengths": (B_g,)} when they differ in length (else {}); rows drafting nothing get `none`."""
    drafts: list[Draft] = [none] * len(batch)
    for g_b, members in _by_length(g).items():
        if not g_b:
            continue
        rows = [batch[b] for b in members]
        context, lengths = _left_padded(rows, target.device)  # (B_g, L), (B_g,)
        ragged = {"lengths": lengths} if bool((lengths < context.shape[1]).any()) else {}
        for b, d in zip(members, draft(rows, g_b, context, ragged)):
            drafts[b] = d
    return drafts


def _left_padded(rows: list[Row], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' ids, left-padded with 0 -> ((B, L) int64, lengths (B,))."""
    L = max(len(row.ids) for row in rows)
    ids = torch.zeros(len(rows), L, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, L - len(row.ids):] = torch.tensor(row.ids)
    return ids.to(device), torch.tensor([len(row.ids) for row in rows], device=device)


def _fed(batch: list[Row], tokens: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """[x, x_1..x_g] for each of the R drafts (R, g_b) of each row (x: the row's last token),
    right-padded with 0 -> (B * R, max g + 1)."""
    R, G = tokens[0].shape[0], max(t.shape[1] for t in tokens)
    fed = torch.zeros(len(batch), R, G + 1, dtype=torch.long)
    for b, (row, t) in enumerate(zip(batch, tokens)):
        fed[b, :, 0] = row.ids[-1]
        fed[b, :, 1:1 + t.shape[1]] = t.cpu()
    return fed.reshape(len(batch) * R, G + 1).to(device)


def _next_p(sampling: Sampling, logits: torch.Tensor, row: Row) -> torch.Tensor:
    """logits (1, 1, V) of the token after the row -> p (V,)."""
    context = row.tensor()  # (1, L)
    return sampling.target_probs(logits, context, context[:, :0])[0, -1]


def empty_draft(target: Target) -> Draft:
    """The draft of a row that drafts nothing this step (g_b = 0)."""
    return Draft(torch.zeros(1, 0, dtype=torch.long, device=target.device),
                 torch.zeros(1, 0, target.vocab_size, device=target.device), calls=0)
