"""The public entry point: prompts in, the target's own continuations and metrics out.

    result = specdiff.generate(["Once upon a time"], target="gpt2-xl", drafter="mdlm-owt",
                               method="specdiff", gamma=8, steps=4, schedule="l2r")
    result.texts, result.metrics.tau

Methods: `ar` (plain decoding, the reference), `spec-ar` (causal-LM drafter), `specdiff`
(diffusion drafter). Prompts are decoded one after another (batch 1), each with its own
generator seeded from `seed` and the prompt's index, so a prompt's output does not depend on the
prompts around it. Every option is validated, and every prompt tokenized and checked, before the
first token is generated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import torch
from tqdm import tqdm

from .acceptance import get_rule
from .decoding import Sequence, decode_ar, decode_speculative
from .drafters.autoregressive import ARDrafter, ARProposer
from .drafters.diffusion import DiffusionDrafter, DiffusionProposer, get_schedule
from .errors import InputError, UsageError
from .loading import check_pair, load_drafter, load_target
from .metrics import Metrics
from .registry import load_registry
from .requests import check_prompts, check_request
from .targets.causal import Target
from .sampling import Sampling

METHODS = ("ar", "spec-ar", "specdiff")
DEFAULT_STEPS = 4
DEFAULTS = {"gamma": 8, "steps": None, "schedule": "l2r", "max_new_tokens": 64,
            "temperature": 0.0, "top_k": 0, "top_p": 1.0}


@dataclass
class Output:
    prompt: str
    text: str  # the continuation only
    tokens: list[int]
    metrics: Metrics


@dataclass
class GenerationResult:
    outputs: list[Output] = field(default_factory=list)

    @property
    def texts(self) -> list[str]:
        return [o.text for o in self.outputs]

    @property
    def metrics(self) -> Metrics:
        total = Metrics()
        for o in self.outputs:
            total = total.merge(o.metrics)
        return total


@dataclass(frozen=True)
class Plan:
    """Everything a run needs, validated: models, method, sampling and draft settings."""

    target: Target
    drafter: object | None
    method: str
    sampling: Sampling
    rule_name: str | None
    gamma: int
    steps: int
    schedule: str
    max_new_tokens: int
    seed: int
    proposer: object | None = None  # the drafting algorithm around `drafter`


def plan(*, target=None, drafter=None, pair=None, method=None, device="cpu", dtype="auto", seed=0,
         acceptance=None, registry=None, **options) -> Plan:
    """Load models (names, paths or loaded objects), fill pair and global defaults, validate.
    With neither pair nor target: the `demo` pair, if models.yaml has one."""
    target, drafter = check_request(target, drafter, seed=seed, device=device, **options)
    registry = registry or load_registry()
    target, drafter, defaults = registry.resolve(pair, target, drafter)
    options = {**defaults, **{k: v for k, v in options.items() if v is not None}}
    method, acceptance = method or defaults.get("method"), acceptance or defaults.get("acceptance")
    opts = {k: options.get(k) if options.get(k) is not None else v for k, v in DEFAULTS.items()}
    sampling = Sampling(float(opts["temperature"]), int(opts["top_k"]), float(opts["top_p"]))
    if opts["steps"] is None:
        opts["steps"] = get_schedule(opts["schedule"]).fixed_steps or DEFAULT_STEPS
    _check_counts(opts)
    if isinstance(target, str):
        target = load_target(target, device=device, dtype=dtype, registry=registry)
    if isinstance(drafter, str):
        drafter = load_drafter(drafter, device=device, dtype=dtype, registry=registry)
    method = method or _default_method(drafter)
    _check_method(method, drafter)
    if drafter is not None and method != "ar":
        check_pair(target, drafter)
    rule_name = _rule_name(method, acceptance, sampling, opts["schedule"]) if method != "ar" else None
    return Plan(target, drafter, method, sampling, rule_name, opts["gamma"], opts["steps"],
                opts["schedule"], opts["max_new_tokens"], seed, _proposer(method, drafter, opts))


def _proposer(method: str, drafter, opts: dict):
    if method == "spec-ar":
        return ARProposer(drafter)
    if method == "specdiff":
        return DiffusionProposer(drafter, opts["schedule"], opts["steps"])
    return None


def _check_counts(opts: dict) -> None:
    for key, low in (("gamma", 1), ("steps", 1), ("max_new_tokens", 1)):
        if not isinstance(opts[key], int) or opts[key] < low:
            raise UsageError(f"{key.replace('_', '-')} must be an integer >= {low}, got {opts[key]!r}")
    get_schedule(opts["schedule"])


def _is_diffusion(drafter) -> bool:
    """A DiffusionDrafter, or any object with its drafting interface (x0_logits, mask_id,
    vocab_size, context_length), such as an exported graph (runtimes.models.GraphDrafter)."""
    return isinstance(drafter, DiffusionDrafter) or hasattr(drafter, "x0_logits")


def _default_method(drafter) -> str:
    if _is_diffusion(drafter):
        return "specdiff"
    return "spec-ar" if isinstance(drafter, ARDrafter) else "ar"


def _check_method(method: str, drafter) -> None:
    if method not in METHODS:
        raise UsageError(f"unknown method '{method}' (choose from {', '.join(METHODS)})")
    needs = {"specdiff": _is_diffusion, "spec-ar": lambda d: isinstance(d, ARDrafter)}.get(method)
    if needs and not needs(drafter):
        kind = "a diffusion drafter" if method == "specdiff" else "an autoregressive (causal LM) drafter"
        raise UsageError(f"method '{method}' needs {kind} (--drafter)")


def _rule_name(method: str, acceptance: str | None, sampling: Sampling, schedule: str) -> str:
    exact_standard = method == "spec-ar" or get_schedule(schedule).exact_for_standard
    if acceptance is None:
        return "greedy" if sampling.greedy else ("standard" if exact_standard else "match")
    get_rule(acceptance)
    if acceptance == "greedy" and not sampling.greedy:
        raise UsageError("greedy acceptance needs --temperature 0; use standard or match when sampling")
    if acceptance == "standard" and not exact_standard and not sampling.greedy:
        raise UsageError(
            f"the {schedule} schedule commits draft slots out of left-to-right order, so q_j is not "
            "the conditional of x_j given x_<j and min(1, p/q) acceptance would not be exact; use "
            "--acceptance match, or --temperature 0, or the l2r / oneshot schedule")
    return acceptance


def encode_prompts(target: Target, prompts: list[str], max_new_tokens: int,
                   truncate: bool = False) -> list[list[int]]:
    """Tokenize and check every prompt (empty, longer than the context window)."""
    encoded = []
    for i, prompt in enumerate(prompts, 1):
        ids = target.tokenizer.encode(prompt) if prompt.strip() else []
        if not ids:
            raise InputError(f"prompt {i} is empty")
        if len(ids) >= target.max_length:
            if not truncate:
                raise InputError(
                    f"prompt {i} is {len(ids)} tokens; the target's context window is "
                    f"{target.max_length} (use --truncate-prompt to keep only its end)")
            ids = ids[-max(1, target.max_length - max_new_tokens):]
        encoded.append(ids)
    return encoded


def iter_generate(prompts: list[str], p: Plan, truncate_prompt: bool = False,
                  progress: bool = False) -> Iterator[Output]:
    """Yield one Output per prompt, in order, as each is finished."""
    encoded = encode_prompts(p.target, prompts, p.max_new_tokens, truncate_prompt)
    proposer, rule = p.proposer, get_rule(p.rule_name) if p.rule_name else None
    device = p.target.device
    for i, (prompt, ids) in enumerate(tqdm(list(zip(prompts, encoded)), disable=not progress,
                                           unit="prompt", leave=False)):
        generator = torch.Generator(device).manual_seed(p.seed + i)
        seq = Sequence(ids, p.max_new_tokens, p.target.max_length, p.target.eos_token_id, device)
        if proposer is None:
            m = decode_ar(p.target, seq, p.sampling, generator)
        else:
            m = decode_speculative(p.target, proposer, seq, p.sampling, rule, p.gamma, generator)
        text = p.target.tokenizer.decode(seq.new_tokens, skip_special_tokens=True)
        yield Output(prompt, text, seq.new_tokens, m)


def generate(prompts: str | list[str], *, target=None, drafter=None, pair=None, method=None,
             gamma=None, steps=None, schedule=None, acceptance=None, temperature=None, top_k=None,
             top_p=None, max_new_tokens=None, seed=0, device="cpu", dtype="auto",
             truncate_prompt=False, progress=False) -> GenerationResult:
    """Generate a continuation of each prompt with the target, accelerated by the drafter.

    target / drafter: models.yaml names, local directories, hub ids, or loaded objects
    (`load_target`, `load_drafter`). pair: a models.yaml pair (its target, drafter and defaults).
    Returns the continuations (`.texts`), per-prompt outputs and total `.metrics`.
    """
    prompts = check_prompts(prompts)
    p = plan(target=target, drafter=drafter, pair=pair, method=method, device=device, dtype=dtype,
             seed=seed, acceptance=acceptance, gamma=gamma, steps=steps, schedule=schedule,
             temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=max_new_tokens)
    return GenerationResult(list(iter_generate(prompts, p, truncate_prompt, progress)))
