"""A diffusion drafter in any readable format (SEDD hub, MDLM HF, the project's own) -> the
project's own format (nets/checkpoint.py): the same tensors under the same names, the
parameterisation, mask id, real vocabulary and context length N, the tokenizer when one is
known, and the draft settings the source records (`defaults`; hub formats record none). At fp32 the conversion is lossless; fp16 halves the size (`rotary_emb.inv_freq` stays
fp32). The output directory appears complete or not at all.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..atomic import check_new_directory, new_directory
from ..errors import UsageError
from ..loading import load_diffusion_drafter
from ..nets.checkpoint import save_own
from ..registry import Registry

CONVERT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def convert_drafter(source: str, out: str | Path, *, dtype: str = "fp32", context: int | None = None,
                    registry: Registry | None = None) -> Path:
    """Write the diffusion drafter `source` (models.yaml name, directory or hub id) to `out` in
    the project's format. context: the drafting context length N (default: the source's)."""
    out = Path(out)
    check_new_directory(out)
    if dtype not in CONVERT_DTYPES:
        raise UsageError(f"unknown dtype '{dtype}' (choose from {', '.join(CONVERT_DTYPES)})")
    if context is not None and context < 1:
        raise UsageError(f"`context` must be >= 1, got {context}")
    drafter = load_diffusion_drafter(source, registry=registry)
    backbone = drafter.backbone.to(CONVERT_DTYPES[dtype])
    with new_directory(out) as tmp:
        save_own(tmp, backbone, vocab_size=drafter.vocab_size, mask_id=drafter.mask_id,
                 context_length=context or drafter.context_length,
                 parameterization=drafter.parameterization, tokenizer=drafter.tokenizer,
                 defaults=drafter.defaults, untrained=drafter.untrained,
                 target_embeddings=drafter.target_embeddings)
    return out
