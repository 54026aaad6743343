"""Decoding prompts with a plan: a stream of events as steps accept tokens (stream), the outputs
in prompt order (in_order, iter_generate), and torch's thread count for a call (torch_threads).

May import: planning, choosing, loaded, prompts, decoding (Row), metrics, text; not the CLI.
"""

from __future__ import annotations

from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from typing import Any, Generator, Iterable, Iterator

import torch
from tqdm import tqdm

from ..contracts import Row
from ..errors import UsageError
from ..metrics import Metrics
from ..requests import check_flags, check_indices, check_prompts, check_threads
from ..text import StopStrings
from .choosing import Setting, said_where
from .loaded import decoding
from .planning import Plan, plan
from .prompts import encode_prompts


@dataclass
class Output:
    prompt: str
    text: str  # the continuation only
    tokens: list[int]
    metrics: Metrics


@dataclass
class Event:
    """One decoding step of prompt `index`: the tokens it appended. The last event of a prompt
    carries its finished `output` (and no tokens). Prompts decoded in one batch interleave."""

    index: int
    tokens: list[int]
    output: Output | None = None


@dataclass
class GenerationResult:
    outputs: list[Output] = field(default_factory=list)
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)  # Plan.settings(): what ran, from where

    @property
    def texts(self) -> list[str]:
        return [o.text for o in self.outputs]

    @property
    def metrics(self) -> Metrics:
        total = Metrics()
        for o in self.outputs:
            total = total.merge(o.metrics)
        return total


def stream(prompts: str | list[str], p: Plan | None = None, *, truncate_prompt: bool = False,
           progress: bool = False, indices: list[int] | None = None, threads: int | None = None,
           **options: Any) -> Iterator[Event]:
    """Decode the prompts, `p.batch_size` at a time, yielding an Event per decoding step of each
    prompt (the tokens it appended; prompts of one batch interleave) and a final Event per prompt
    holding its Output, as soon as it is finished. `p`: a Plan; else `options` (as for
    `generate`) make one. `indices`: each prompt's place in a larger input (default 0, 1, ...),
    which seeds its generator and numbers it in errors, so that a shard decodes as the whole
    would; events are indexed by the position in `prompts` all the same. threads: as for
    `generate`, set while each step runs (the caller's code between events keeps its own).

    A loaded target decodes one stream at a time (its KV cache is that stream's): another stream
    or generate() on it, while this one is suspended, is refused (a UsageError) until this one is
    exhausted or closed (`.close()`, or dropped); a target loaded twice decodes two side by side."""
    check_threads(threads)
    events = _stream(check_prompts(prompts), p, truncate_prompt, progress, indices, options)
    return events if threads is None else _with_threads(events, threads)


def _stream(prompts: list[str], p: Plan | None, truncate_prompt: bool, progress: bool,
            indices: list[int] | None, options: dict[str, Any]) -> Generator[Event, None, None]:
    check_flags(truncate_prompt=truncate_prompt, progress=progress)
    if p is not None and not isinstance(p, Plan):
        raise UsageError(f"`p` must be a Plan (specdiff.generation.plan), got {type(p).__name__}")
    if p is not None and options:
        raise UsageError(f"`{next(iter(options))}` is a setting of a plan: pass the settings or the plan `p`, not both")
    p = p or plan(**options)
    indices = list(range(len(prompts))) if indices is None else check_indices(indices, len(prompts))
    chosen = {k: Setting(s["value"], s["from"]) for k, s in p.settings().items()}
    with decoding(p.target), said_where(chosen):  # a pair's `drafts` 2 was no option given
        yield from _decode(prompts, p, truncate_prompt, progress, indices)


def _decode(prompts: list[str], p: Plan, truncate_prompt: bool, progress: bool,
            indices: list[int]) -> Iterator[Event]:
    """stream's loop, on a target it holds."""
    encoded = encode_prompts(p.target, prompts, p.max_new_tokens, truncate_prompt, p.text, indices)
    if prompts:
        longest = max(map(len, encoded)) + p.max_new_tokens  # the cache holds no more per row
        rows = min(p.batch_size, len(prompts))
        p.decoder.check_sizes(rows, p.batch_size, p.max_new_tokens, longest)
        if p.compiled:
            p.decoder.warm_up(rows, longest)
    stop = StopStrings(p.target.tokenizer, p.text.stop) if p.text.stop else None
    vocab = getattr(p.drafter, "draft_vocab", None)  # specdiff.vocab: its coverage of what was emitted
    pending = (Row(ids, p.max_new_tokens, p.target.max_length, p.target.eos_token_id, p.target.device,
                   torch.Generator(p.target.device).manual_seed(p.seed + indices[i]), stop, index=i)
               for i, ids in enumerate(encoded))
    with tqdm(total=len(prompts), disable=not progress, unit="prompt", leave=False) as bar:
        # no more rows than prompts: what gamma auto times its costs at (specdiff.adaptive)
        for row, tokens in p.decoder(pending, min(p.batch_size, max(len(prompts), 1))):
            yield Event(row.index, tokens)
            if row.stop_reason:
                text = p.target.tokenizer.decode(row.new_tokens, skip_special_tokens=True)
                text = stop.cut(text) if stop else text
                bar.update()
                if vocab is not None:
                    row.metrics.outside_vocab = vocab.outside(row.new_tokens)
                yield Event(row.index, [], Output(prompts[row.index], text, row.new_tokens, row.metrics))


def _with_threads(events: Generator[Event, None, None], threads: int) -> Iterator[Event]:
    """The events, torch's thread count `threads` while each is computed, restored between them."""
    with closing(events):
        while True:
            with torch_threads(threads):
                event = next(events, None)
            if event is None:
                return
            yield event


def in_order(events: Iterable[Event]) -> Iterator[Output]:
    """The Outputs of a stream's events in prompt order: a finished output waits for those before it."""
    done: dict[int, Output] = {}
    following = 0
    for event in events:
        if event.output is not None:
            done[event.index] = event.output
            while following in done:
                yield done.pop(following)
                following += 1


def iter_generate(prompts: list[str], p: Plan, truncate_prompt: bool = False,
                  progress: bool = False, indices: list[int] | None = None) -> Iterator[Output]:
    """Yield one Output per prompt, in order, as each is finished (and all before it);
    `indices`: see `stream`."""
    return in_order(stream(prompts, p, truncate_prompt=truncate_prompt, progress=progress, indices=indices))


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's CPU thread count set to `threads` inside (None: left alone), restored after."""
    if threads is None:
        yield
        return
    check_threads(threads)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


