"""Width invariance: whether a target's logits depend on how many tokens one call carries.

Greedy speculative decoding gives plain decoding's tokens only if each position of a w-token verify
call has the argmax that plain decoding's one-token calls give there. Exact arithmetic makes the
logits equal; real kernels reduce a w-token call in another order than a one-token call, so they
differ by some gap (docs/lossless.md, "Where exactness ends"). Measured here on any runtime's target,
through the Target contract (prefill / extend / rollback), on one row of real tokens:

    gap      max |logits of one w-token extend - logits of w one-token extends| over the positions
    margin   the smallest top-1 minus top-2 logit of the one-token calls at those positions
    flip     2 gap >= margin: two logits this close could swap, so a greedy token could differ

`flip` false says only that this measurement saw no position that close; a gap of 1e-5 against
margins of 1e-2 and more (fp32 here) is why fp32 greedy rows have stayed identical in every test.
May import: torch and the library's contracts.
"""

from __future__ import annotations

from typing import Any

import torch

from ..contracts import Target

WIDTHS = (5, 9)


@torch.no_grad()
def width_invariance(target: Target, ids: list[int], widths: tuple[int, ...] = WIDTHS) -> dict[str, Any] | None:
    """ids: one row of real tokens (a prompt and its continuation); the first len(ids) - max(widths)
    are the context. -> {"gap", "margin", "flip", "widths"} over the widths, or None when the row is
    too short; the target is left with no rows."""
    context = len(ids) - max(widths)
    if context < 1:
        return None
    row = torch.tensor([ids], device=target.device)
    gap, margin = 0.0, float("inf")
    for w in widths:
        target.prefill(row[:, :context])
        wide = target.extend(row[:, context:context + w])[0]  # (w, V)
        target.rollback(context)
        narrow = torch.cat([target.extend(row[:, context + i:context + i + 1])[0] for i in range(w)])  # (w, V)
        gap = max(gap, (wide.float() - narrow.float()).abs().max().item())
        top2 = narrow.float().topk(2, dim=-1).values
        margin = min(margin, (top2[:, 0] - top2[:, 1]).min().item())
    target.keep([])
    return {"gap": gap, "margin": margin, "flip": 2 * gap >= margin, "widths": list(widths)}
