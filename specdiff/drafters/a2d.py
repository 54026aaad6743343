"""A masked-diffusion Qwen3 (dllm's A2D MDLM, nets/a2d.py) as a diffusion drafter.

A2DDrafter has the drafting interface of DiffusionDrafter that DiffusionProposer and planning read
(x0_logits, mask_id, vocab_size, context_length, length, tokenizer; it records no draft settings,
which planning reads as none), so the specdiff method drafts with it under any schedule, T steps
and K drafts, as with a DDiT:

    x0 = drafter.x0_logits(ids (B, L), last, pad (B,))   (B, last, V) float32

One call is one bidirectional pass of the whole window: the network has no time input and keeps
no cache. Padding keys (the first pad[b] positions of row b) are hidden and each row's positions
start at 0 at its first real token, so a row drafts the same whatever the batch beside it.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from ..nets.a2d import TRAINED_LENGTH
from ..nets.formats import DRAFT_ROOM


class A2DDrafter(nn.Module):
    """model: a Qwen3ForCausalLM holding an A2D checkpoint; vocab_size: the real vocabulary shared
    with the target (V; the mask is never proposed); length: the sequence length it was trained on,
    of which it keeps DRAFT_ROOM slots (or half) for the draft and reads the rest as context."""

    draft_vocab = None  # the published head, every row (specdiff.vocab)

    def __init__(self, model: Any, *, mask_id: int, vocab_size: int, tokenizer: Any = None, source: str = "",
                 length: int = TRAINED_LENGTH):
        super().__init__()
        self.model = model
        self.mask_id = mask_id
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.source = source
        self.length = min(length, model.config.max_position_embeddings)
        self.context_length = self.length - min(DRAFT_ROOM, self.length // 2)

    def x0_logits(self, input_ids: torch.Tensor, last: int | None = None,
                  pad: torch.Tensor | None = None, widen: bool = True) -> torch.Tensor:
        """(B, L) ids with mask slots, after pad[b] padding positions in row b -> logits of x0 over
        the real vocabulary at the last `last` positions (B, last, V) (default: all L), fp32; the
        mask's column is -inf when it lies inside V. `widen`: DiffusionDrafter's; an A2D drafter
        has no draft vocabulary (draft_vocab None), so its logits are always over V."""
        B, L = input_ids.shape
        device = input_ids.device
        pad = torch.zeros(B, dtype=torch.long, device=device) if pad is None else pad.to(device)
        index = torch.arange(L, device=device)
        real = index[None] >= pad[:, None]  # (B, L): keys a query may see
        dtype = self.model.dtype
        bias = torch.zeros(B, 1, L, L, dtype=dtype, device=device)
        bias = bias.masked_fill(~real[:, None, None, :], torch.finfo(dtype).min)  # (B, 1, L, L)
        positions = (index[None] - pad[:, None]).clamp_min(0)  # (B, L)
        out = self.model(input_ids=input_ids, attention_mask=bias, position_ids=positions, use_cache=False,
                         logits_to_keep=last or 0)
        logits = out.logits[..., : self.vocab_size].float()  # (B, last, V)
        if self.mask_id < self.vocab_size:
            logits[..., self.mask_id] = float("-inf")
        return cast(torch.Tensor, logits)
