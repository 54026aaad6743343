"""The decoding loops: plain autoregressive decoding (the reference) and one speculative loop that
serves every proposer. Both decode one row over the Target contract (prefill / extend / rollback)
and know nothing about tokenization or runtimes. They are iterators: each step yields the tokens
it appended (streaming); the row's metrics are complete once the iterator is exhausted.

Speculative step (cache invariant: the target has cached every token but the last one, x):
    draft   x_1..x_g ~ q                        proposer.propose(row, g)
    verify  p_1..p_{g+1} = target.extend([x, x_1..x_g])  one target call (K candidate drafts:
                                                 K rows in one call, selection.verify)
    accept  n, y = rule(draft, q, p)            n draft tokens kept, then y
    roll back the target to len(row) + n, append x_1..x_n, y
g = gamma, clipped so that neither max_new_tokens nor the context window is overshot.
"""

from __future__ import annotations

import time
from typing import Callable, Generator, Iterator

import torch

from . import selection
from .contracts import Draft, Proposer, Rule, Target
from .metrics import Metrics
from .sampling import Sampling


class Row:
    """One sequence being decoded: its tokens, stop conditions (EOS, max_new_tokens, context
    window, and `stop`: a test of the new tokens such as text.StopStrings), its own generator
    and its metrics."""

    def __init__(self, prompt: list[int], max_new_tokens: int, max_length: int, eos: int | None,
                 device: torch.device, generator: torch.Generator | None = None,
                 stop: Callable[[list[int]], bool] | None = None):
        self.ids = list(prompt)
        self.n_prompt = len(prompt)
        self.limit = min(self.n_prompt + max_new_tokens, max_length)
        self.max_length = max_length
        self.eos = eos
        self.device = device
        self.generator = generator
        self.stop = stop
        self.stop_reason = ""
        self.metrics = Metrics(prompts=1)

    @property
    def new_tokens(self) -> list[int]:
        return self.ids[self.n_prompt:]

    def room(self) -> int:
        """Tokens that may still be appended (>= 1 while decoding goes on)."""
        return self.limit - len(self.ids)

    def tensor(self) -> torch.Tensor:
        return torch.tensor([self.ids], device=self.device)  # (1, L)

    def push(self, tokens: list[int]) -> list[int]:
        """Append tokens up to the first stop condition; -> the tokens appended."""
        for i, t in enumerate(tokens):
            self.ids.append(t)
            if t == self.eos:
                self.stop_reason = "eos"
            elif self.stop is not None and self.stop(self.new_tokens):
                self.stop_reason = "stop"
            elif len(self.ids) >= self.limit:
                self.stop_reason = "length" if self.limit < self.max_length else "context"
            if self.stop_reason:
                return tokens[:i + 1]
        return list(tokens)


class _Clock:
    """Decoding seconds of one row: time spent inside the loop, not in its consumer."""

    def __init__(self, m: Metrics):
        self.m = m
        self.resume()

    def resume(self) -> None:
        self.t = time.perf_counter()

    def pause(self, row: Row) -> None:
        self.m.wall_s += time.perf_counter() - self.t
        self.m.new_tokens = len(row.new_tokens)
        self.m.stop_reason = row.stop_reason


def _first(target: Target, row: Row, sampling: Sampling, clock: _Clock) -> Generator[list[int], None, int]:
    """Prefill the prompt, push and yield the first new token; -> that token."""
    with row.metrics.timed("verify", target.sync):
        logits = target.prefill(row.tensor())  # (1, S, V)
    row.metrics.target_calls += 1
    x = int(sampling.sample(_next_p(sampling, logits[:, -1:], row), row.generator))
    row.push([x])
    clock.pause(row)
    yield [x]
    return x


def decode_ar(target: Target, row: Row, sampling: Sampling) -> Iterator[list[int]]:
    """Plain decoding, one target call per token: the reference every method must match."""
    m, clock = row.metrics, _Clock(row.metrics)
    x = yield from _first(target, row, sampling, clock)
    while not row.stop_reason:
        clock.resume()
        with m.timed("verify", target.sync):
            logits = target.extend(torch.tensor([[x]], device=row.device))  # (1, 1, V)
        m.target_calls += 1
        m.record(0, 0)
        x = int(sampling.sample(_next_p(sampling, logits, row), row.generator))
        pushed = row.push([x])
        clock.pause(row)
        yield pushed


def decode_speculative(target: Target, proposer: Proposer, row: Row, sampling: Sampling, rule: Rule,
                       gamma: int) -> Iterator[list[int]]:
    """Speculative decoding with any proposer and acceptance rule (see the module docstring)."""
    m, clock = row.metrics, _Clock(row.metrics)
    verify: Callable[..., tuple[list[int], int]] = (  # K candidate drafts (rule: a selection rule) or one
        selection.verify if isinstance(proposer, selection.SelfSelection) else _verify)
    x = yield from _first(target, row, sampling, clock)
    while not row.stop_reason:
        clock.resume()
        g = min(gamma, row.room() - 1)  # a step emits at most g + 1 tokens
        n_row, context = len(row.ids), row.tensor()  # (1, L)
        with m.timed("draft", target.sync):
            draft = proposer.propose(context, g, sampling, row.generator) if g else _empty(target, row)
        with m.timed("verify", target.sync):
            accepted, x = verify(target, draft, x, context, sampling, rule, row.generator)
            target.rollback(n_row + len(accepted))
        m.target_calls += 1
        m.drafter_calls += draft.calls
        m.record(len(accepted), g)
        pushed = row.push(accepted + [x])
        clock.pause(row)
        yield pushed


def _verify(target: Target, draft: Draft, x: int, context: torch.Tensor, sampling: Sampling, rule: Rule,
            generator: torch.Generator | None) -> tuple[list[int], int]:
    """One row's verify call over its draft (1, g) -> (the accepted draft tokens, the next token)."""
    fed = torch.cat([draft.tokens.new_full((1, 1), x), draft.tokens], dim=1)  # (1, g + 1)
    p = sampling.target_probs(target.extend(fed), context, draft.tokens)  # (1, g + 1, V)
    n, y = rule(draft.tokens, draft.q, p, generator)
    return draft.tokens[0, :int(n[0])].tolist(), int(y[0])


def _next_p(sampling: Sampling, logits: torch.Tensor, row: Row) -> torch.Tensor:
    """logits (1, 1, V) of the token after the row -> p (V,)."""
    context = row.tensor()  # (1, L)
    return sampling.target_probs(logits, context, context[:, :0])[0, -1]


def _empty(target: Target, row: Row) -> Draft:
    return Draft(torch.zeros(1, 0, dtype=torch.long, device=row.device),
                 torch.zeros(1, 0, target.vocab_size, device=row.device), calls=0)
