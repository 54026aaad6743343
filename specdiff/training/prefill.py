"""A prefill of the teacher data (`specdiff distill --chat --prefill`): rows whose answers are given
(a JSONL file of {"prompt": question, "answer": text}), read by the target in one forward pass
instead of generated: its soft labels at every answer position and its features of the layers a
drafter reads, as the teacher loop (teacher.continue_batch) keeps them for tokens it generated.
teacher.py writes them into the same cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import torch

from ..errors import UsageError
from .sequences import Sequences, call_features, left_padded, templated

PREFILL_ROWS = 16  # prefill rows through the target at once (their logits: rows * (L + 1) * V floats)


def read_pairs(path: str) -> list[tuple[str, str]]:
    """A JSONL file of {"prompt": question, "answer": text} lines (blank lines skipped) -> pairs."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read prefill file {path}: {e}") from e
    pairs = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not (isinstance(row, dict) and isinstance(row.get("prompt"), str) and isinstance(row.get("answer"), str)):
            raise UsageError(f'{path} line {n}: not a JSON object with string "prompt" and "answer"')
        pairs.append((row["prompt"], row["answer"]))
    return pairs


def prefill_rows(path: str, tokenizer: Any, prompt_tokens: int, length: int,
                 eos_id: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The pairs of a prefill file -> (ids (Q, P + L), pad (Q,)): each question through the chat
    template, left-padded to P (longer ones left out), then its answer's first L tokens, followed
    by eos to L tokens where it is shorter (a generated answer that ended); an answer's text is
    never read as special tokens (a docstring quoting "<|im_end|>" does not end it)."""
    pairs = read_pairs(path)
    kept = [(q, a) for q, a in ((templated(tokenizer, q), a) for q, a in pairs) if len(q) <= prompt_tokens]
    if not kept:
        raise UsageError(f"no question in {path} fits {prompt_tokens} tokens through the chat template"
                         if pairs else f"{path} holds no question / answer pair")
    ids, pad = left_padded([q for q, _ in kept], tokenizer, prompt_tokens)
    fill = eos_id if eos_id is not None else 0
    answers = [tokenizer.encode(a, add_special_tokens=False, split_special_tokens=True)[:length] for _, a in kept]
    tails = torch.tensor([a + [fill] * (length - len(a)) for a in answers], dtype=torch.long)
    return torch.cat([ids, tails], dim=1), pad


def prefill_split(rows: int, num_prompts: int) -> tuple[int, int]:
    """A prefill file's usable rows -> (training rows: its first, at most num_prompts; held-out
    rows: its last, up to 64, a tenth of them)."""
    val = max(1, min(64, rows // 10))
    if rows - val < 1:
        raise UsageError(f"a prefill file needs at least 2 usable question / answer pairs, it has {rows}")
    return min(num_prompts, rows - val), val


@torch.no_grad()
def prefill_batch(model: Any, ids: torch.Tensor, pad: torch.Tensor, prompt_tokens: int, vocab: int,
                  banned_id: int | None, soft_labels: int = 0, eos_id: int | None = None,
                  layer_ids: Sequence[int] = ()) -> tuple[Sequences, torch.Tensor | None]:
    """Rows (B, P + L) already answered, left-padded by pad (B,), read by the target in one
    forward pass -> (Sequences of them with, where soft_labels = k, p's k most likely ids and
    probabilities at each answer position (B, L, k), as continue_batch keeps them: temperature 1,
    banned_id never, one-hot on eos_id after a row's first eos; the outputs of layers `layer_ids`
    (B, P + L, len(layer_ids) * H) fp16, zeros on padding, else None)."""
    B, W = ids.shape
    L = W - prompt_tokens
    mask = (torch.arange(W, device=ids.device) >= pad.to(ids.device)[:, None]).long()
    out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp_min(0),
                use_cache=False, output_hidden_states=bool(layer_ids), logits_to_keep=L + 1)
    seqs = Sequences(ids.cpu())
    if soft_labels:
        logits = out.logits[:, :L, :vocab].float()  # (B, L, V): column P - 1 + j predicts answer token j
        top = _answer_p(logits, ids[:, prompt_tokens:], banned_id, eos_id).topk(min(soft_labels, vocab), dim=-1)
        seqs.soft_ids, seqs.soft_p = top.indices.int().cpu(), top.values.half().cpu()
    return seqs, call_features(out, layer_ids, mask)


def _answer_p(logits: torch.Tensor, answers: torch.Tensor, banned_id: int | None, eos_id: int | None) -> torch.Tensor:
    """logits (B, L, V) of the answers (B, L) -> p (B, L, V): banned_id never, one-hot on eos_id at
    each position after the row's first eos (continue_batch's rule)."""
    if banned_id is not None:
        logits[..., banned_id] = float("-inf")
    if eos_id is not None:
        is_eos = (answers == eos_id).long()
        ended = (is_eos.cumsum(1) - is_eos) > 0  # (B, L): an eos before this position
        logits[ended] = float("-inf")
        logits[..., eos_id] = torch.where(ended, 0.0, logits[..., eos_id])
    return logits.softmax(-1)
