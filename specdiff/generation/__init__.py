"""The public entry point: prompts in, the target's own continuations and metrics out.

    result = specdiff.generate(["Once upon a time"], target="gpt2-xl", drafter="mdlm-owt",
                               method="specdiff", gamma=8, steps=4, schedule="l2r")
    result.texts, result.metrics.tau
    for event in specdiff.stream(["Once upon a time"]):   # tokens as each step accepts them
        print(event.index, event.tokens)

Methods are declared in `methods/` (`ar`, the reference; `spec-ar`; `specdiff`; for
block-diffusion targets `block`, their reference, and `simsd-exact`). Prompts are decoded
`batch_size` at a time (rows leave the batch as they finish and the next prompts take their
place; block-diffusion methods decode one prompt at a time), each with its own generator seeded
from `seed` and the prompt's index, so a prompt's output depends neither on the prompts around it
nor on the batch size (greedy always; sampled with an integer gamma: `gamma` auto chooses each
step's draft length from the batch's rows and costs, which changes a seed's draws, never the
distribution). A setting not
given comes from the models.yaml pair's defaults, else from the drafter (the settings it records
it was trained for), else its declared default (specdiff.settings; generation.choosing). Every option is validated, and every prompt
tokenized and checked, before the first token is generated.

Rooms: choosing (where each setting comes from), planning (Plan: models, method, decoder),
loaded (models given loaded: their device and dtype, one decoding loop per target at a time),
prompts (chat template, stop strings, prompt checks), streaming (stream, iter_generate). This
module holds `generate` and re-exports what the others offer. May import: methods, kinds, loading,
registry, requests, settings, decoding; never the CLI or bench.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..registry import as_registry
from ..requests import check_prompts
from ..settings import DEFAULTS
from .choosing import DEFAULT_STEPS, SOURCES, Setting, choose, values
from .planning import Plan, plan
from .prompts import TextOptions, encode_prompts, text_options
from .streaming import Event, GenerationResult, Output, in_order, iter_generate, stream, torch_threads
from .tuned import lookup

__all__ = ["DEFAULTS", "DEFAULT_STEPS", "SOURCES", "Event", "GenerationResult", "Output", "Plan", "Setting",
           "TextOptions", "choose", "encode_prompts", "generate", "in_order", "iter_generate", "plan", "stream",
           "text_options", "torch_threads", "values"]


def generate(prompts: str | list[str], *, target: Any = None, drafter: Any = None, pair: str | None = None,
             method: str | None = None, gamma: int | str | None = None, adaptive: bool | None = None,
             steps: int | None = None,
             schedule: str | None = None, drafts: int | None = None, draft_temperature: float | None = None,
             tree: int | str | None = None, acceptance: str | None = None, temperature: float | None = None,
             top_k: int | None = None, top_p: float | None = None, repetition_penalty: float | None = None,
             max_new_tokens: int | None = None, seed: int = 0, device: str | None = None, dtype: str | None = None,
             truncate_prompt: bool = False, progress: bool = False, chat: bool | None = None,
             system: str | None = None, stop: Iterable[str] | str | None = None,
             batch_size: int | None = None, remasking: str | None = None,
             threshold: float | None = None, compile: bool = False, threads: int | None = None) -> GenerationResult:
    """Generate a continuation of each prompt with the target, accelerated by the drafter.

    target / drafter: models.yaml names, local directories, hub ids, or loaded objects
    (`load_target`, `load_drafter`). pair: a models.yaml pair (its target, drafter and defaults).
    device / dtype: what models given by name are loaded with (default: a loaded model's device,
    else cpu; auto); a model given loaded keeps its own, and one it does not hold is refused.
    A loaded target decodes one call or stream at a time (see `stream`).
    chat / system: prompts go through the target tokenizer's chat template. stop: strings that
    end a continuation (the text ends before the first one; as vLLM / OpenAI).
    repetition_penalty: Hugging Face's, applied to the target's p exactly as plain decoding does.
    gamma: the draft length, fixed (an integer), or "auto" (the default: adaptive): chosen each step
    (0 = a plain step) up to the pair's, else the drafter's, else 8 (specdiff.adaptive). adaptive:
    True with an integer gamma chooses up to that gamma. With auto, sampled output is exactly
    distributed but what a seed gives depends on the batch and on the costs measured before
    decoding; an integer gamma keeps it independent of both.
    batch_size: prompts decoded together (default 8); the output does not depend on it (sampled
    output with gamma auto may: see gamma).
    remasking / threshold / steps: for block-diffusion targets (block_decoding.py), the rule that
    picks the slots each denoising step commits, dynamic's confidence threshold, steps per block.
    drafts: K > 1 candidate drafts per step, one kept by the target (specdiff.selection;
    acceptance greedy, select or multi); draft_temperature: how candidates 2..K are sampled.
    tree: N > 0 draft tokens as a tree (dflash; specdiff.trees), depth at most an integer gamma;
    "auto": the size chosen each step from measured costs and the acceptance so far (tree_sizes).
    compile: the static KV cache and torch.compile'd steps (specdiff.compiled): the same tokens,
    compiled once per run before decoding.
    Given no model, method or draft setting (nor compile), the configuration `specdiff tune` measured
    fastest on torch on this machine for the default pair runs (generation.tuned; its threads unless
    given), and result.settings says so ("from": "tuned on this machine, DATE").
    threads: torch's CPU threads for this call (set, then restored; None: as the process has
    them). torch takes one per core; where other processes share the cores (a 2-core machine)
    one thread is several times faster, which is what the CLI's --threads defaults to.
    Returns the continuations (`.texts`), per-prompt outputs and total `.metrics`.
    """
    prompts = check_prompts(prompts)
    chosen = {"target": target, "drafter": drafter, "pair": pair, "method": method, "gamma": gamma, "tree": tree,
              "adaptive": adaptive, "steps": steps, "schedule": schedule, "drafts": drafts, "compile": compile,
              "draft_temperature": draft_temperature, "acceptance": acceptance}
    tuned = lookup(chosen, as_registry(None), ("torch",))  # the torch models: the fastest tuned on torch
    if tuned is not None:
        pair, threads = tuned.config["pair"], threads if threads is not None else tuned.config["threads"]
    with torch_threads(threads):
        p = plan(target=target, drafter=drafter, pair=pair, method=method, device=device, dtype=dtype, tuned=tuned,
                 seed=seed, acceptance=acceptance, gamma=gamma, adaptive=adaptive, steps=steps, schedule=schedule, drafts=drafts,
                 draft_temperature=draft_temperature, tree=tree,
                 temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty,
                 max_new_tokens=max_new_tokens, chat=chat, system=system, stop=stop, batch_size=batch_size,
                 remasking=remasking, threshold=threshold, compile=compile)
        return GenerationResult(list(iter_generate(prompts, p, truncate_prompt, progress)), p.settings())
