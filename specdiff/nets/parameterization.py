"""Parameterisations: raw DDiT logits -> the model's own output, and the drafter's x0 logits.

    sedd  SEDD log score (scale_by_sigma):
              s = raw - log(e^sigma - 1) - log(V - 1), then s[..., x_t] = 0,
          i.e. log p_t(y) / p_t(x_t) for moving to token y. At a masked slot
          exp(s_j) = p_theta(x0 = j) / (e^sigma - 1) for every j != mask.
    subs  MDLM SUBS: log p_theta(x0 | x_t). The mask logit is set to -inf, a log-softmax runs over
          every column, and unmasked positions carry over as a one-hot on their own token.

Drafting reads the x0 distribution at masked slots over the real vocabulary only (ids < V_real:
never the mask id, never padding rows). Restricted to those columns, both outputs differ from
raw[..., :V_real] by one constant per row, so at masked slots
softmax(x0_logits(...)) == softmax(raw[..., :V_real]) exactly. Rows of unmasked slots are what
the parameterisation makes of them (SUBS: one-hot); drafting never samples from them.

Both are computed in fp32 whatever the backbone's dtype (the originals ran them on bf16 logits).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..errors import LoadError

NEG_INF = float("-inf")


def esigm1_log(sigma: torch.Tensor) -> torch.Tensor:
    """log(e^sigma - 1) for sigma (B,), as SEDD computes it: expm1 below 0.5, exp - 1 above."""
    sigma = sigma.float()
    return torch.where(sigma < 0.5, torch.expm1(sigma), sigma.exp() - 1).log()


def sedd_log_score(raw: torch.Tensor, input_ids: torch.Tensor, sigma: torch.Tensor,
                   mask_id: int | None = None) -> torch.Tensor:
    """raw (B, L, V), input_ids (B, L), sigma (B,) -> SEDD log score (B, L, V), fp32.

    `mask_id` is unused: the absorbing score needs no special case for the mask column."""
    V = raw.shape[-1]
    score = raw.float() - esigm1_log(sigma)[:, None, None] - math.log(V - 1)
    return score.scatter(-1, input_ids[..., None], 0.0)


def subs_log_probs(raw: torch.Tensor, input_ids: torch.Tensor, sigma: torch.Tensor | None,
                   mask_id: int) -> torch.Tensor:
    """raw (B, L, V), input_ids (B, L) -> log p_theta(x0 | x_t) (B, L, V), fp32.

    `sigma` is unused: SUBS depends on the noise level only through the backbone."""
    is_mask_col = torch.arange(raw.shape[-1], device=raw.device) == mask_id  # (V,)
    logp = raw.float().masked_fill(is_mask_col, NEG_INF).log_softmax(dim=-1)  # (B, L, V)
    carry = torch.full_like(logp, NEG_INF).scatter(-1, input_ids[..., None], 0.0)  # one-hot of x_t
    keep = (input_ids != mask_id)[..., None]  # (B, L, 1) unmasked: carried over
    return torch.where(keep, carry, logp)  # out of place: gradients flow through it


PARAMETERIZATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "sedd": sedd_log_score,
    "subs": subs_log_probs,
}


def get_parameterization(name: str) -> Callable[..., torch.Tensor]:
    """The output function (raw, input_ids, sigma, mask_id) -> (B, L, V) registered as `name`."""
    try:
        return PARAMETERIZATIONS[name]
    except KeyError as e:
        raise LoadError(f"unknown parameterization '{name}' (known: {', '.join(PARAMETERIZATIONS)})") from e


def x0_logits(name: str, raw: torch.Tensor, input_ids: torch.Tensor, sigma: torch.Tensor,
              mask_id: int, vocab_size: int) -> torch.Tensor:
    """raw (B, L, V_drafter) -> logits of x0 over the real vocabulary (B, L, vocab_size), fp32.

    At masked slots their softmax is the model's x0 distribution (see the module docstring). A
    mask id inside the real vocabulary (a tokenizer's own `<|mask|>`) gets -inf: never proposed."""
    logits = get_parameterization(name)(raw, input_ids, sigma, mask_id)[..., :vocab_size]
    if mask_id < vocab_size:
        logits = logits.index_fill(-1, torch.tensor([mask_id], device=logits.device), NEG_INF)
    return logits
