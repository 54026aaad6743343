"""DistillConfig: the settings of one `specdiff distill` run (one field per CLI option), their
checks, and what a run derives from them.

Checks (`check`, before anything is loaded): ranges and combinations, and sizes: floors of the
bytes the teacher data, a new drafter's weights and optimizer state, and one training batch need
(`_floors`, widths not yet known counted as 1), refused when over the memory free on the device
(budget.check_fits), one line naming the options that make them so big. A run that continues a
checkpoint (or a DFlash `drafter`) takes the settings it records where they are unset and refuses
those given otherwise (`settled`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from ..atomic import check_new_directory
from ..budget import check_fits
from ..errors import UsageError
from .losses import LOSSES, READING_LOSSES

DEFAULT_SHAPE = {"layers": 2, "dim": 128, "heads": 4, "context": 32}  # a new drafter's, unless given
RAW_FRACTION = 0.25  # default share of raw text rows when `raw_text` is given
CHAT_PROMPT_TOKENS = 96  # default `prompt_tokens` with `chat`
METHODS = ("specdiff", "dflash", "eagle3")  # the drafter kinds distill trains
READING = ("dflash", "eagle3")  # those reading the target's hidden states (reading.py)
UNROLL = 7  # eagle3's default `unroll`: EAGLE-3's training-time-test length
GAMMA = 8  # the default `gamma`, where no checkpoint or DFlash drafter being continued records one


@dataclass(frozen=True)
class DistillConfig:
    target: str
    out: str
    prompts: str
    method: str = "specdiff"  # the drafter trained: a masked-diffusion drafter (specdiff), a DFlash drafter
    # (dflash) or an EAGLE-3 head (eagle3)
    chat: bool = False  # prompts: one question a line, through the target's chat template
    prefill: bool = False  # with chat, prompts: JSONL {"prompt", "answer"} pairs the target reads (one forward
    # pass a batch) instead of answering: its soft labels and features of the given answers
    prompt_tokens: int | None = None  # chat: prompts left-padded to this length (default CHAT_PROMPT_TOKENS)
    data: str | None = None  # the teacher data cache (default OUT/data); runs with equal data settings may share it
    more_data: tuple[str, ...] = ()  # complete caches of the same target, P, L and k, trained on beside `data`
    data_only: bool = False  # build the teacher data cache, then stop (no drafter)
    from_target: bool = False  # a new drafter of the target's width that reads and writes through the target's
    # own (frozen) token embedding and output head, so that it starts from what the target knows of tokens
    drafter: str | None = None  # an existing drafter to start from, else a new one of this shape:
    layers: int | None = None
    dim: int | None = None
    heads: int | None = None
    context: int | None = None
    mask_token: str | None = None  # a token of the tokenizer to use as mask id (else an extra row)
    target_layers: tuple[int, ...] | None = None  # dflash, eagle3: the target layers (0-based) it reads
    anchors: int = 4  # dflash: blocks drafted from each sequence of a batch
    draft_vocab: int | None = None  # dflash, eagle3: the head scores the N most frequent answer tokens (specdiff.vocab)
    unroll: int | None = None  # eagle3: steps of the head unrolled on its own output in training (default UNROLL)
    raw_text: str | None = None
    raw_fraction: float | None = None
    gamma: int | None = None  # the draft length trained for: None, the continued checkpoint's, else GAMMA
    steps_per_draft: int = 4
    num_prompts: int = 512
    continuation_tokens: int = 64
    teacher_temperature: tuple[float, ...] = (0.0,)  # one teacher setting per entry, chunks alternate
    teacher_top_p: tuple[float, ...] = (1.0,)  # one entry for all settings, or one per setting
    samples_per_prompt: int = 1
    soft_labels: int = 0  # k of the target's top-k distribution kept per position (kl needs it)
    draft_temperature: float = 1.0  # the drafter's softmax temperature in the streak losses
    eval_temperature: float = 1.0  # tau / alpha are measured greedy and at this temperature
    batch_size: int = 32
    lr: float = 5e-4
    max_steps: int = 1000
    time_budget: float | None = None  # seconds of training in this run
    val_every: int = 100
    checkpoint_every: int = 200
    eval_prompts: int = 8
    loss: str = "ce"
    resume: bool = False
    seed: int = 0
    device: str = "cpu"

    @property
    def draft_unroll(self) -> int:
        """eagle3's unrolled steps: the option, else UNROLL."""
        return UNROLL if self.unroll is None else self.unroll

    @property
    def draft_gamma(self) -> int:
        """gamma as trained (once `settled`): the option, else GAMMA."""
        return GAMMA if self.gamma is None else self.gamma


def check(cfg: DistillConfig) -> None:
    """Refuse a config before any work (loading the target included), naming the parameter."""
    for name in ("gamma", "steps_per_draft", "num_prompts", "continuation_tokens", "batch_size",
                 "max_steps", "val_every", "checkpoint_every", "eval_prompts", "samples_per_prompt"):
        if getattr(cfg, name) is not None and getattr(cfg, name) < 1:
            raise UsageError(f"`{name}` must be >= 1, got {getattr(cfg, name)}")
    if cfg.method not in METHODS:
        raise UsageError(f"unknown distill method '{cfg.method}' (choose from {', '.join(METHODS)})")
    losses = READING_LOSSES if cfg.method in READING else LOSSES
    if any(name not in losses for name in cfg.loss.split("+")):
        raise UsageError(f"unknown loss '{cfg.loss}' for method {cfg.method} (choose from {', '.join(losses)}, "
                         "or a sum such as ce+kl)")
    _check_reading(cfg)
    _check_finite(cfg)
    if cfg.lr <= 0 or cfg.draft_temperature <= 0 or (cfg.time_budget is not None and cfg.time_budget <= 0):
        raise UsageError("lr, draft_temperature and time_budget must be > 0")
    _check_teacher(cfg)
    _check_data(cfg)
    for name in DEFAULT_SHAPE:  # given: used as given (0 once became the default silently)
        if getattr(cfg, name) is not None and getattr(cfg, name) < 1:
            raise UsageError(f"`{name}` must be >= 1, got {getattr(cfg, name)}")
    if cfg.drafter and any(getattr(cfg, k) is not None for k in DEFAULT_SHAPE):
        raise UsageError("`drafter` fixes the architecture: drop `layers` / `dim` / `heads` / `context`")
    _check_sizes(cfg)
    if not cfg.resume and not cfg.data_only:
        check_new_directory(Path(cfg.out))


def settled(cfg: DistillConfig, recorded: dict[str, Any], source: str) -> DistillConfig:
    """cfg continuing what `source` (the checkpoint being resumed, a drafter started from) records
    (name -> value, None: not recorded): a setting given otherwise is refused, naming it; an unset
    `gamma` becomes the recorded one (the drafter keeps its own shape whatever cfg says)."""
    for name, value in recorded.items():
        given = getattr(cfg, name)
        if value is not None and given is not None and _shown(given) != _shown(value):
            raise UsageError(f"`{name}` {_shown(given)}: {source} has {_shown(value)}; leave `{name}` out or "
                             "give the same (or start a new run)")
    cfg = replace(cfg, gamma=cfg.draft_gamma if recorded.get("gamma") is None else recorded["gamma"])
    _check_data(cfg)
    return cfg


def _shown(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)


def _check_sizes(cfg: DistillConfig) -> None:
    """Refuse sizes whose tensors cannot fit in the memory free on the device (module docstring)."""
    try:
        device = torch.device(cfg.device)
    except RuntimeError:
        return  # loading says what is wrong with it
    for need, sizes, what in _floors(cfg):
        check_fits(need, device, sizes, what)


def _floors(cfg: DistillConfig) -> list[tuple[int, dict[str, int], str]]:
    """[(bytes at least, the options that make them, what needs them)]: the teacher data's int64
    ids, a new diffusion drafter's fp32 weights, gradients and two Adam moments (12 dim^2 a block),
    a training batch's activations (one dim-wide and one attention map per block) or a DFlash
    batch's attention over its anchors' blocks (mask and fp32 scores), an EAGLE-3 batch's over its
    rows at the last unrolled step."""
    g, L, B = cfg.draft_gamma, cfg.continuation_tokens, cfg.batch_size
    W = L + (cfg.prompt_tokens or (CHAT_PROMPT_TOKENS if cfg.chat or cfg.method in READING else 0))
    floors = [(cfg.num_prompts * cfg.samples_per_prompt * W * 8, {"num_prompts": cfg.num_prompts,
               "samples_per_prompt": cfg.samples_per_prompt, "continuation_tokens": L}, "the teacher data")]
    if cfg.method == "dflash":
        AS = cfg.anchors * (g + 1)
        return floors + [(B * AS * (W + AS) * (1 + 4 * (cfg.heads or 1)), {"anchors": cfg.anchors, "batch_size": B,
                          "gamma": g}, "a training batch's attention over its blocks")]
    if cfg.method == "eagle3":
        U = cfg.draft_unroll
        return floors + [(B * W * U * W * (1 + 4 * (cfg.heads or 1)), {"batch_size": B, "unroll": U,
                          "continuation_tokens": L}, "a training batch's attention over its unrolled steps")]
    shape = {k: getattr(cfg, k) or (1 if cfg.drafter else v) for k, v in DEFAULT_SHAPE.items()}
    layers, dim, heads, T = shape["layers"], shape["dim"], shape["heads"], shape["context"] + g
    if not cfg.drafter:
        floors.append((16 * 12 * layers * dim**2, {"layers": layers, "dim": dim}, "a new drafter's training state"))
    named = {"batch_size": B, **({} if cfg.drafter else shape), "gamma": g}  # a `drafter`'s shape: not known yet
    return floors + [(4 * B * layers * T * (dim + heads * T), named, "a training batch's activations")]


def _check_finite(cfg: DistillConfig) -> None:
    """Every float option is a finite number: nan passes every comparison, inf makes no sense."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        values = value if f.type == "tuple[float, ...]" else (value,)
        if f.type in ("float", "float | None", "tuple[float, ...]") and value is not None:
            for v in values:
                if not math.isfinite(v):
                    raise UsageError(f"{f.name} must be a finite number, got {v}")


def _check_reading(cfg: DistillConfig) -> None:
    """A DFlash drafter or an EAGLE-3 head (new, or `drafter`) has the target's width and reads
    target layers; the diffusion drafter's shape options mean nothing to it."""
    if cfg.unroll is not None and (cfg.method != "eagle3" or cfg.unroll < 1):
        raise UsageError(f"`unroll` is for `method` eagle3 and must be >= 1, got {cfg.unroll}")
    if cfg.method not in READING:
        if cfg.target_layers is not None:
            raise UsageError("`target_layers` is for `method` dflash or eagle3 (the target layers its drafter reads)")
        if cfg.draft_vocab is not None:
            raise UsageError("`draft_vocab` trains a DFlash or EAGLE-3 drafter's reduced head; cut a diffusion "
                             "drafter's after training (`specdiff drafter convert`, `draft_vocab` and `frequencies`)")
        return
    if cfg.draft_vocab is not None and cfg.draft_vocab < 1:
        raise UsageError(f"`draft_vocab` must be >= 1, got {cfg.draft_vocab}")
    for name, value in (("context", cfg.context), ("raw_text", cfg.raw_text)):
        if value is not None:
            raise UsageError(f"`{name}` is not used by `method` {cfg.method} (a drafter of the target's width, "
                             "reading all of the context through the target's features)")
    if cfg.drafter is not None and cfg.target_layers is not None:
        raise UsageError("`drafter` fixes the target layers it reads: drop `target_layers`")
    if cfg.anchors < 1 or (cfg.target_layers is not None and (not cfg.target_layers or min(cfg.target_layers) < 0)):
        raise UsageError("`anchors` must be >= 1 and `target_layers` a non-empty list of layers >= 0")


def _check_teacher(cfg: DistillConfig) -> None:
    temperatures, top_ps = cfg.teacher_temperature, cfg.teacher_top_p
    if not temperatures or len(top_ps) not in (1, len(temperatures)):
        raise UsageError(f"`teacher_top_p` needs one value or one per `teacher_temperature` ({len(temperatures)})")
    if min(temperatures) < 0 or cfg.eval_temperature < 0:
        raise UsageError("`teacher_temperature` and `eval_temperature` must be >= 0 (0 = greedy)")
    if not all(0 < p <= 1 for p in top_ps):
        raise UsageError(f"`teacher_top_p` must lie in (0, 1], got {', '.join(map(str, top_ps))}")


def _check_data(cfg: DistillConfig) -> None:
    soft = {"kl", "lk"} & set(cfg.loss.split("+"))
    if cfg.soft_labels < 0 or (soft and cfg.soft_labels == 0):
        raise UsageError(f"`soft_labels` must be >= 0, and > 0 (e.g. 32) for the {min(soft, default='kl')} loss; "
                         f"got {cfg.soft_labels}")
    if cfg.raw_fraction is not None and (cfg.raw_text is None or not 0 <= cfg.raw_fraction <= 1):
        raise UsageError("`raw_fraction` needs `raw_text` and must lie in [0, 1]")
    if cfg.prefill and not cfg.chat:
        raise UsageError("`prefill` needs `chat` (each row: the question through the chat template, then its answer)")
    if cfg.prefill and cfg.samples_per_prompt != 1:
        raise UsageError(f"`samples_per_prompt` {cfg.samples_per_prompt}: `prefill` reads the one answer given")
    if cfg.prompt_tokens is not None and (not cfg.chat or cfg.prompt_tokens < 1):
        raise UsageError(f"`prompt_tokens` needs `chat` and must be >= 1, got {cfg.prompt_tokens}")
    if cfg.continuation_tokens < cfg.draft_gamma:
        raise UsageError(f"`continuation_tokens` ({cfg.continuation_tokens}) must be >= `gamma` ({cfg.draft_gamma})")


def trained_for(cfg: DistillConfig) -> dict[str, Any]:
    """The draft settings a run trains for, recorded in the drafter's config.json: its examples
    are gamma slots masked as the l2r schedule with T = steps_per_draft masks them."""
    return {"gamma": cfg.draft_gamma, "steps": cfg.steps_per_draft, "schedule": "l2r"}


def data_directory(cfg: DistillConfig) -> Path:
    """The teacher data cache: `data`, else OUT/data."""
    return Path(cfg.data) if cfg.data else Path(cfg.out) / "data"
