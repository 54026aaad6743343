"""The rows of the teacher data (Sequences: prompt, answer, soft labels) and what building them
from the target's calls shares, generated (teacher.continue_batch) or read (prefill.prefill_batch):
a question through the chat template, left padding, a call's features of the target layers a
drafter reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..nets.dflash import context_features


@dataclass
class Sequences:
    """Prompts and the target's continuations, with its soft labels where kept."""

    ids: torch.Tensor  # (M, P + L) int64
    soft_ids: torch.Tensor | None = None  # (M, L, k) int32: the k most likely next ids at each position
    soft_p: torch.Tensor | None = None  # (M, L, k) fp16: their probabilities under p

    def __len__(self) -> int:
        return len(self.ids)

    def tensors(self) -> dict[str, torch.Tensor]:
        soft = {"soft_ids": self.soft_ids, "soft_p": self.soft_p}
        return {"ids": self.ids, **{k: t for k, t in soft.items() if t is not None}}

    def cpu(self) -> Sequences:
        return Sequences(**{k: t.cpu() for k, t in self.tensors().items()})

    @staticmethod
    def cat(parts: list[Sequences]) -> Sequences:
        soft = parts[0].soft_ids is not None
        return Sequences(torch.cat([p.ids for p in parts]),
                         torch.cat([p.soft_ids for p in parts]) if soft else None,  # type: ignore[misc]
                         torch.cat([p.soft_p for p in parts]) if soft else None)  # type: ignore[misc]


def call_features(out: Any, layer_ids: Sequence[int], mask: torch.Tensor | None = None) -> torch.Tensor | None:
    """A call's outputs of layers `layer_ids` (B, t, F) fp16 on the host, zero where mask (B, t) is 0."""
    if not layer_ids:
        return None
    feats = context_features(out.hidden_states, layer_ids)
    return (feats if mask is None else feats * mask[..., None]).half().cpu()


def templated(tokenizer: Any, question: str) -> list[int]:
    """A question through the chat template, up to the assistant's turn -> its ids."""
    return list(tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                              tokenize=True, return_dict=False))


def left_padded(encoded: list[list[int]], tokenizer: Any, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of at most `length` ids -> (ids (Q, length) left-padded with the pad id, pad (Q,))."""
    fill = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[fill] * (length - len(e)) + e for e in encoded], dtype=torch.long)
    return ids, torch.tensor([length - len(e) for e in encoded], dtype=torch.long)
