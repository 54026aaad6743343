"""How well a trained drafter drafts: tau and alpha against its target on held-out prompts."""

from __future__ import annotations

from typing import Any

from .config import DistillConfig
from .sequences import Sequences
from .teacher import Teacher


def evaluate_drafter(cfg: DistillConfig, target: Teacher, drafter: Any, val: Sequences, P: int,
                     **settings: Any) -> dict[str, Any]:
    """tau and alpha of `settings` (default: specdiff, l2r, T steps) against the target on
    held-out prompts (distinct prompts: the S samples of one share it), greedy and at
    eval_temperature (seed cfg.seed)."""
    from ..generation import generate

    settings = settings or {"method": "specdiff", "steps": cfg.steps_per_draft, "schedule": "l2r"}
    prompts = list(val.ids[::cfg.samples_per_prompt, :P])
    if cfg.chat:  # templated questions, left-padded: drop the padding, keep the template's tokens
        fill = target.tokenizer.pad_token_id
        prompts = [row[int((row != fill).float().argmax()):] for row in prompts]
    texts = [t for t in target.tokenizer.batch_decode(prompts) if t.strip()][:cfg.eval_prompts]
    drafter.eval()
    report: dict[str, Any] = {"prompts": len(texts), "max_new_tokens": cfg.continuation_tokens}
    for key, temperature in (("greedy", 0.0), ("sampled", cfg.eval_temperature)):
        m = generate(texts, target=target, drafter=drafter, gamma=cfg.draft_gamma, temperature=temperature,
                     max_new_tokens=cfg.continuation_tokens, seed=cfg.seed, **settings).metrics
        report[key] = {"temperature": temperature, "tau": round(m.tau, 4),
                       "alpha": None if m.alpha is None else round(m.alpha, 4),
                       "per_position_acceptance": m.to_dict()["per_position_acceptance"]}
    return report
