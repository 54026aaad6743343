"""The decoding loops: plain autoregressive decoding (the reference) and one speculative loop that
serves every drafter. Both work on one prompt over the Target contract (prefill / extend /
rollback) and know nothing about tokenization or runtimes.

Speculative step (cache invariant: the target has cached every token but the last one, x):
    draft   x_1..x_g ~ q                        drafter.propose(sequence, g)
    verify  p_1..p_{g+1} = target.extend([x, x_1..x_g])  one target call
    accept  n, y = rule(draft, q, p)            n draft tokens kept, then y
    roll back the target to len(sequence) + n, append x_1..x_n, y
g = gamma, clipped so that neither max_new_tokens nor the context window is overshot.
"""

from __future__ import annotations

import time

import torch

from .drafters import Draft, Drafter
from .metrics import Metrics
from .sampling import Sampling


class Sequence:
    """The growing token sequence and the stop conditions: EOS, max_new_tokens, context window."""

    def __init__(self, prompt: list[int], max_new_tokens: int, max_length: int, eos: int | None,
                 device: torch.device):
        self.ids = list(prompt)
        self.n_prompt = len(prompt)
        self.limit = min(self.n_prompt + max_new_tokens, max_length)
        self.max_length = max_length
        self.eos = eos
        self.device = device
        self.stop_reason = ""

    @property
    def new_tokens(self) -> list[int]:
        return self.ids[self.n_prompt:]

    def room(self) -> int:
        """Tokens that may still be appended (>= 1 while decoding goes on)."""
        return self.limit - len(self.ids)

    def tensor(self) -> torch.Tensor:
        return torch.tensor([self.ids], device=self.device)

    def push(self, tokens: list[int]) -> bool:
        """Append tokens until a stop condition; -> whether decoding goes on."""
        for t in tokens:
            self.ids.append(t)
            if t == self.eos:
                self.stop_reason = "eos"
            elif len(self.ids) >= self.limit:
                self.stop_reason = "length" if self.limit < self.max_length else "context"
            if self.stop_reason:
                return False
        return True


def _start(target, seq: Sequence, sampling: Sampling, generator, m: Metrics) -> int:
    """Prefill the prompt; -> the first new token (already pushed)."""
    with m.timed("verify", target.sync):
        logits = target.prefill(seq.tensor())  # (1, S, V)
    m.target_calls += 1
    x = int(sampling.sample(sampling.probs(logits[0, -1]), generator))
    seq.push([x])
    return x


def decode_ar(target, seq: Sequence, sampling: Sampling, generator=None) -> Metrics:
    """Plain decoding, one target call per token: the reference every method must match."""
    m = Metrics()
    start = time.perf_counter()
    x = _start(target, seq, sampling, generator, m)
    while not seq.stop_reason:
        with m.timed("verify", target.sync):
            logits = target.extend(torch.tensor([[x]], device=seq.device))  # (1, 1, V)
        m.target_calls += 1
        m.record(0, 0)
        x = int(sampling.sample(sampling.probs(logits[0, -1]), generator))
        seq.push([x])
    return _finish(m, seq, start)


def decode_speculative(target, drafter: Drafter, seq: Sequence, sampling: Sampling, rule,
                       gamma: int, generator=None) -> Metrics:
    """Speculative decoding with any drafter and acceptance rule (see the module docstring)."""
    m = Metrics()
    start = time.perf_counter()
    x = _start(target, seq, sampling, generator, m)
    while not seq.stop_reason:
        g = min(gamma, seq.room() - 1)  # a step emits at most g + 1 tokens
        n_seq = len(seq.ids)
        with m.timed("draft", target.sync):
            draft = drafter.propose(seq.tensor(), g, sampling, generator) if g else _empty(target, seq)
        with m.timed("verify", target.sync):
            fed = torch.cat([torch.tensor([[x]], device=seq.device), draft.tokens], dim=1)
            p = sampling.probs(target.extend(fed))  # (1, g + 1, V)
            n, y = rule(draft.tokens, draft.q, p, generator)
            n, x = int(n[0]), int(y[0])
            target.rollback(n_seq + n)
        m.target_calls += 1
        m.drafter_calls += draft.calls
        m.record(n, g)
        seq.push(draft.tokens[0, :n].tolist() + [x])
    return _finish(m, seq, start)


def _empty(target, seq: Sequence) -> Draft:
    return Draft(torch.zeros(1, 0, dtype=torch.long, device=seq.device),
                 torch.zeros(1, 0, target.vocab_size, device=seq.device), calls=0)


def _finish(m: Metrics, seq: Sequence, start: float) -> Metrics:
    m.wall_s = time.perf_counter() - start
    m.new_tokens = len(seq.new_tokens)
    m.stop_reason = seq.stop_reason
    m.prompts = 1
    return m
