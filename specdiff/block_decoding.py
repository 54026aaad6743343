"""Decoding loops for block-diffusion targets (contracts.BlockTarget; SDAR, arXiv 2510.06303),
all on one outer loop (decode_blocks: prefill, denoise each block until done, push it, cache it)
into which each method plugs its BlockStep:

    decode_block        Vanilla: block decoding, the reference every block method must match
    decode_simsd_exact  StateCopies: a smaller block-diffusion model drafts a block's denoising
                        trajectory, the target verifies it by state copies in one call
    (simsd.decode_simsd SimSD's single verify pass, approximate)

Vanilla (the reference). The block grid is anchored at position 0. Prefill stores the
block-aligned part of the prompt (floor(P / B) * B tokens) block-causally; the prompt's trailing
partial block is the first decode block (its prompt tokens fixed, the rest masks). A block is
denoised in at most S = `steps` steps: each step is one forward of the block's B tokens against
the cache, nothing stored, bidirectional inside the block, then `transition`: x0 (argmax, or a
sample by Gumbel-max) and its probability (the confidence) at every masked slot, and the
remasking rule commits some of them; step s (0-based) commits at least ceil(masked / (S - s)).
A finished block is stored by one more forward. Decoding stops after the block that holds EOS
(or reaches max_new_tokens); the row cuts the text at either.

Sampling draws the Gumbel noise of step s of the block at position `start` from a generator
seeded by (a base seed drawn once per row from the row's generator, start, s): every method then
sees the same noise at the same step, so the exact method's output is token-identical to
vanilla's under sampling too, not only equal in distribution.

State-copy verification (simsd-exact; reference notes, section 5). From the block's state s_0 at
step j the draft model runs the same transitions (same rule, quota, warping and noise) for k
steps: s_0 .. s_k. One target call runs the k + 1 states as copies (each with the block's
position ids, bidirectional inside its copy only, all seeing the cache): the target's logits in
copy t are exactly vanilla's at state s_t. Transitions t -> t + 1 are accepted while the target's
own transition from s_t is s_{t+1}; at the first disagreement (or after s_k) the target's own
transition is committed. When every transition is accepted and s_k is the finished block, the
K/V of copy k are the block's stored K/V. Every committed transition is thus the target's own:
the output is vanilla's, for every remasking rule, whatever the draft.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import torch

from .contracts import BlockTarget
from .contracts import Row
from .metrics import Clock, Metrics
from .sampling import Sampling
from .settings import BlockSettings
from .targets.block import copies

SEED_SPACE = 2**62


def _sequential(conf: torch.Tensor, masked: torch.Tensor, quota: int, threshold: float) -> torch.Tensor:
    """The leftmost `quota` masked slots."""
    return masked & (masked.cumsum(0) <= quota)


def _static(conf: torch.Tensor, masked: torch.Tensor, quota: int, threshold: float) -> torch.Tensor:
    """The `quota` most confident masked slots (ties: the leftmost)."""
    order = torch.sort(conf.masked_fill(~masked, -1.0), descending=True, stable=True).indices
    chosen = torch.zeros_like(masked)
    chosen[order[:quota]] = True
    return chosen & masked


def _dynamic(conf: torch.Tensor, masked: torch.Tensor, quota: int, threshold: float) -> torch.Tensor:
    """Every masked slot more confident than `threshold` if at least `quota` are, else static."""
    above = masked & (conf > threshold)
    return above if int(above.sum()) >= quota else _static(conf, masked, quota, threshold)


# conf (B,), masked (B,) bool, quota, threshold -> chosen (B,) bool
REMASKING: dict[str, Callable[[torch.Tensor, torch.Tensor, int, float], torch.Tensor]] = {
    "sequential": _sequential, "static": _static, "dynamic": _dynamic}


class StepNoise:
    """Gumbel noise (B, V) per (block start, step), the same for every method (module docstring);
    None when greedy."""

    def __init__(self, sampling: Sampling, generator: torch.Generator | None, device: torch.device):
        self.greedy = sampling.greedy
        self.device = device
        self.base = 0 if self.greedy else int(torch.randint(0, SEED_SPACE, (1,), generator=generator,
                                                            device=generator.device if generator else "cpu"))

    def __call__(self, start: int, step: int, shape: tuple[int, ...]) -> torch.Tensor | None:
        if self.greedy:
            return None
        seed = hash((self.base, start, step)) % SEED_SPACE
        g = torch.Generator(self.device).manual_seed(seed)
        u = torch.rand(shape, generator=g, device=self.device).clamp_min(torch.finfo(torch.float32).tiny)
        return -torch.log(-torch.log(u))


def transition(logits: torch.Tensor, block: torch.Tensor, step: int, mask_id: int, sampling: Sampling,
               settings: BlockSettings, noise: torch.Tensor | None) -> torch.Tensor:
    """One denoising step: logits (B, V) at state block (B,), step s of the block -> the next
    state (B,) (module docstring). Greedy: x0 = argmax, confidence its softmax probability."""
    masked = block == mask_id
    if noise is None:
        x0 = logits.argmax(-1)
        conf = logits.softmax(-1).gather(-1, x0[:, None])[:, 0]
    else:
        probs = sampling.probs(logits)  # (B, V)
        x0 = (probs.log() + noise).argmax(-1)  # Gumbel-max: a draw from probs
        conf = probs.gather(-1, x0[:, None])[:, 0]
    quota = math.ceil(int(masked.sum()) / ((settings.steps or len(block)) - step))  # None: one slot per step
    chosen = REMASKING[settings.remasking](conf, masked, quota, settings.threshold)
    return torch.where(chosen, x0, block)


class BlockRun:
    """One row's block grid: the block being decoded (B,), its first position, its step; the
    prefill of each model (once per model: a target drafting for itself has one cache)."""

    def __init__(self, models: tuple[BlockTarget, ...], row: Row, m: Metrics):
        target, models = models[0], tuple({id(model): model for model in models}.values())
        self.B, self.mask_id = target.block_size, target.mask_id  # B: the block size
        self.row = row
        self.start = row.n_prompt // self.B * self.B
        for model in models:
            model.reset()
            if self.start:
                model.store(row.tensor()[:, :self.start])
        m.target_calls += bool(self.start)
        m.drafter_calls += bool(self.start) * (len(models) - 1)
        self.block = self.fresh(row.ids[self.start:])
        self.step = 0
        self.unstored: torch.Tensor | None = None  # a finished block the draft has yet to cache
        self.target_unstored: torch.Tensor | None = None  # ... and the target

    def fresh(self, fixed: list[int]) -> torch.Tensor:
        return torch.tensor(fixed + [self.mask_id] * (self.B - len(fixed)), device=self.row.device)

    @property
    def done(self) -> bool:
        return not bool((self.block == self.mask_id).any())

    def finish(self) -> list[int]:
        """Push the finished block's new tokens; start the next block. -> the tokens pushed."""
        skip = max(self.row.n_prompt - self.start, 0)
        pushed = self.row.push(self.block[skip:].tolist())
        self.start, self.step, self.block = self.start + self.B, 0, self.fresh([])
        return pushed


class BlockStep(Protocol):
    """What a block method does inside the loop all of them share (decode_blocks):
        denoise(run)          one round on the block being decoded (its target calls, its draft,
                              its metrics); the loop calls it until the block has no mask left
        finished(run, block)  after a finished block (B,) when decoding goes on: cache it now,
                              or leave it to the next round's first call
    """

    def denoise(self, run: BlockRun) -> None: ...

    def finished(self, run: BlockRun, block: torch.Tensor) -> None: ...


def decode_blocks(models: tuple[BlockTarget, ...], row: Row, step: BlockStep) -> Iterator[list[int]]:
    """The outer loop of every block method: prefill (BlockRun), then per block `step.denoise` until
    it is done, push its tokens, `step.finished`; yields each finished block's new tokens. The
    row's decoding seconds are the time spent in here (metrics.Clock), not in the consumer."""
    m, clock = row.metrics, Clock(row.metrics)
    run = BlockRun(models, row, m)
    while not row.stop_reason:
        clock.resume()
        while not run.done:
            step.denoise(run)
        finished, pushed = run.block, run.finish()
        if not row.stop_reason:
            step.finished(run, finished)
        clock.pause(row)
        yield pushed


@dataclass
class Vanilla:
    """`block`: each round is one target call and one transition; a finished block is stored by one
    more call."""

    target: BlockTarget
    sampling: Sampling
    settings: BlockSettings
    noise: StepNoise

    def denoise(self, run: BlockRun) -> None:
        m = run.row.metrics
        with m.timed("verify", self.target.sync):
            logits = self.target.denoise(run.block[None])[0]  # (B, V)
            run.block = transition(logits, run.block, run.step, run.mask_id, self.sampling, self.settings,
                                   self.noise(run.start, run.step, tuple(logits.shape)))
        run.step += 1
        m.target_calls += 1
        m.record(0, 0)

    def finished(self, run: BlockRun, block: torch.Tensor) -> None:
        with run.row.metrics.timed("verify", self.target.sync):
            self.target.store(block[None])
        run.row.metrics.target_calls += 1


@dataclass
class StateCopies:
    """`simsd-exact` (module docstring): each round the draft's trajectory, verified in one target
    call. Each model caches a finished block in its first call of the next block (its draft step,
    its verification) unless that block's verification already left its K/V in the cache."""

    target: BlockTarget
    drafter: BlockTarget
    sampling: Sampling
    settings: BlockSettings
    noise: StepNoise
    stored: bool = False  # whether the last verification left the finished block in the target's cache

    def denoise(self, run: BlockRun) -> None:
        m = run.row.metrics
        with m.timed("draft", self.target.sync):
            states = _draft(self.drafter, run, self.sampling, self.settings, self.noise)
        m.drafter_calls += len(states) - 1
        with m.timed("verify", self.target.sync):
            accepted, self.stored = _verify(self.target, run, states, self.sampling, self.settings, self.noise)
        m.target_calls += 1
        m.record(accepted, len(states) - 1)

    def finished(self, run: BlockRun, block: torch.Tensor) -> None:
        run.target_unstored = None if self.stored else block  # stored by the next verification
        if self.drafter is not self.target:  # the draft stores it with its next step (_draft)
            run.unstored = block
        self.stored = False


def decode_block(target: BlockTarget, drafter: None, row: Row, sampling: Sampling,
                 settings: BlockSettings) -> Iterator[list[int]]:
    """Vanilla block decoding (module docstring); yields each finished block's new tokens."""
    noise = StepNoise(sampling, row.generator, row.device)
    return decode_blocks((target,), row, Vanilla(target, sampling, settings, noise))


def decode_simsd_exact(target: BlockTarget, drafter: BlockTarget, row: Row,
                       sampling: Sampling, settings: BlockSettings) -> Iterator[list[int]]:
    """Speculative block decoding verified by state copies (module docstring): vanilla's output."""
    noise = StepNoise(sampling, row.generator, row.device)
    return decode_blocks((target, drafter), row, StateCopies(target, drafter, sampling, settings, noise))


def _draft(drafter: BlockTarget, run: BlockRun, sampling: Sampling, settings: BlockSettings,
           noise: StepNoise) -> list[torch.Tensor]:
    """The draft's trajectory s_0 (the block now) .. s_k, k <= gamma, each (B,). Its first
    call also stores the previous block in the draft's cache, if it holds it not yet."""
    states, step = [run.block], run.step
    while len(states) <= settings.gamma and bool((states[-1] == run.mask_id).any()):
        finished, run.unstored = run.unstored, None
        logits = drafter.denoise(states[-1][None], None if finished is None else finished[None])[0]  # (B, V)
        states.append(transition(logits, states[-1], step, run.mask_id, sampling, settings,
                                 noise(run.start, step, tuple(logits.shape))))
        step += 1
    return states


def _verify(target: BlockTarget, run: BlockRun, states: list[torch.Tensor], sampling: Sampling,
            settings: BlockSettings, noise: StepNoise) -> tuple[int, bool]:
    """One target call over the states as copies (after the previous block, if the target has
    yet to cache it); commits the target's own transitions into run. -> (draft transitions
    accepted, whether the target's cache now holds the block)."""
    k1, B, n_cached = len(states), run.B, target.length
    prev = [] if run.target_unstored is None else [run.target_unstored]
    p, run.target_unstored = len(prev) * B, None
    ids = torch.cat(prev + states)[None]  # (1, p + k1 B)
    positions = torch.cat([target.positions(run.start - p, p), target.positions(run.start, B).repeat(1, k1)], 1)
    logits = target.run(ids, positions, copies(k1, B, target.device, before=p))[0, p:]
    for t, state in enumerate(states):
        if not bool((state == run.mask_id).any()):  # s_k finished: copy k holds the block's K/V
            target.trim(n_cached, torch.cat([torch.arange(p), torch.arange(p + t * B, p + (t + 1) * B)]))
            run.block, run.step = state, run.step + t
            return t, True
        new = transition(logits[t * B:(t + 1) * B], state, run.step + t, run.mask_id, sampling, settings,
                         noise(run.start, run.step + t, (B, logits.shape[-1])))
        if t + 1 < k1 and torch.equal(new, states[t + 1]):
            continue
        target.trim(n_cached, slice(0, p))
        run.block, run.step = new, run.step + t + 1
        return t, False
    raise AssertionError("unreachable: the last copy either is finished or commits a transition")
