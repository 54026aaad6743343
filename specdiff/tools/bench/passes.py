"""One pass of a method over the prompts, typed: specdiff's own methods through their plan
(generation.plan / iter_generate), the Hugging Face peers through transformers' generate.
May import: bench.config, bench.sweep and the library.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from transformers.utils import logging as hf_logging

from ...generation import Plan, iter_generate, plan
from ...metrics import Metrics
from ...names import PEERS
from ...settings import AUTO
from ...methods import METHODS as REGISTRY
from .config import Models, Settings, Variant
from .sweep import fits

# one prompt's new tokens, its decoding seconds and the loop's own metrics (peers: None)
Timed = tuple[list[int], float, Metrics | None]


@dataclass(frozen=True)
class Pass:
    """A method's pass: (prompts, their ids) -> one Timed per prompt, in order. `plan`: the plan
    specdiff's own methods decode with (its target holds the KV peak; its compile seconds)."""

    run: Callable[[list[str], list[list[int]]], Iterator[Timed]]
    plan: Plan | None = None

    def __call__(self, prompts: list[str], encoded: list[list[int]]) -> Iterator[Timed]:
        return self.run(prompts, encoded)

    def prime(self, prompts: int) -> None:
        """Time gamma auto's cost table for the batch a pass over `prompts` prompts decodes, now:
        measured inside a timed pass it would add its seconds to the first prompt's and its dummy
        calls to the call log that acceptance is read from. Nothing for other methods."""
        if self.plan is not None and hasattr(self.plan.decoder, "costs"):
            self.plan.decoder.costs(min(self.plan.batch_size, max(prompts, 1)))

    @property
    def compile_s(self) -> float | None:
        return self.plan.warmup_s if self.plan is not None and self.plan.compiled else None


def _loop_pass(models: Models, v: Variant, s: Settings) -> Pass:
    target = models.graphs[v.runtime]["target"] if v.on_graphs else models.target
    drafter = models.drafter_for(v.method, v.runtime)
    k, temperature = v.drafts or 1, _temperature(v, s)
    default = s.acceptance if s.acceptance and fits(s.acceptance, k, temperature) else None  # e.g. a pair's
    auto = v.gamma == AUTO  # the pair's or drafter's gamma is its cap, not an option that would fix it
    p = plan(target=target, drafter=drafter, method=v.method, gamma=s.gamma_cap if auto else v.gamma,
             adaptive=True if auto else None, steps=v.steps,
             schedule=v.schedule, drafts=v.drafts, tree=v.tree, draft_temperature=s.draft_temperature if k > 1 else None,
             acceptance=v.acceptance or default, temperature=temperature, top_k=s.top_k,
             top_p=s.top_p, max_new_tokens=s.max_new_tokens, seed=s.seed, batch_size=v.batch_size,
             compile=v.compiled, chat=s.chat)

    def one_pass(prompts: list[str], encoded: list[list[int]]) -> Iterator[Timed]:
        for out in iter_generate(prompts, p, s.truncate_prompt):
            yield out.tokens, out.metrics.wall_s, out.metrics
    return Pass(one_pass, p)


def _temperature(v: Variant, s: Settings) -> float:
    return s.temperature if v.temperature is None else v.temperature


def _hf_kwargs(models: Models, v: Variant, s: Settings) -> dict[str, Any]:
    t, temperature = models.target, _temperature(v, s)
    kw: dict[str, Any] = {"do_sample": temperature > 0, "pad_token_id": t.eos_token_id,
                          "eos_token_id": t.eos_token_id}
    if temperature > 0:
        kw.update(temperature=temperature, top_k=s.top_k, top_p=s.top_p)
    head_rows = t.model.get_output_embeddings().weight.shape[0]
    if head_rows > t.vocab_size:  # padded head rows: never emitted, as in Target
        kw["suppress_tokens"] = list(range(t.vocab_size, head_rows))
    if v.method == "hf-assisted" and models.ar_drafter is not None:
        kw["assistant_model"] = models.ar_drafter.model
    else:
        kw["prompt_lookup_num_tokens"] = v.gamma
    return kw


@contextmanager
def _hf_settings(models: Models, v: Variant) -> Iterator[None]:
    """Assistant: constant num_assistant_tokens = gamma, no confidence early exit (its generation
    config is where transformers reads these); transformers' warnings off. Restored afterwards."""
    assistant = models.ar_drafter if v.method == "hf-assisted" else None
    config = assistant.model.generation_config if assistant is not None else None
    wanted = {"num_assistant_tokens": v.gamma, "num_assistant_tokens_schedule": "constant",
              "assistant_confidence_threshold": 0.0} if config is not None else {}
    saved, verbosity = {k: getattr(config, k, None) for k in wanted}, hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    for k, value in wanted.items():
        setattr(config, k, value)
    try:
        yield
    finally:
        for k, value in saved.items():
            setattr(config, k, value)
        hf_logging.set_verbosity(verbosity)


def _hf_pass(models: Models, v: Variant, s: Settings) -> Pass:
    t, kwargs = models.target, _hf_kwargs(models, v, s)

    def one_pass(prompts: list[str], encoded: list[list[int]]) -> Iterator[Timed]:
        with _hf_settings(models, v), torch.no_grad():
            for ids in encoded:
                x = torch.tensor([ids], device=t.device)
                n = min(s.max_new_tokens, t.max_length - len(ids))
                start = time.perf_counter()
                out = t.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, **kwargs)
                t.sync()
                yield out[0, len(ids):].tolist(), time.perf_counter() - start, None
    return Pass(one_pass)


PASSES: dict[str, Callable[[Models, Variant, Settings], Pass]] = {**dict.fromkeys(REGISTRY, _loop_pass), **dict.fromkeys(PEERS, _hf_pass)}
