"""Data for `specdiff distill`: the target's own continuations, and batches shaped like drafting.

Sequence-level distillation: a prompt is a random window of P tokens of a text file (P = the
drafter's context length N), the target continues it by L tokens (greedy, or sampled at a
temperature) in one batched loop over its KV cache, and the drafter learns to predict those L
tokens. The last HELD_OUT of the file's tokens give the held-out prompts (validation loss, tau).

    DIR/data/meta.json                 the settings the cache was made with
    DIR/data/train-00000.safetensors   {"ids": (<= CHUNK, P + L) int64}, one per CHUNK prompts
    DIR/data/val.safetensors           the held-out sequences

Chunks are written as they are generated, so an interrupted run resumes where it stopped.

A training example is a row of N context tokens then gamma draft tokens, all taken from one
sequence at a split inside the continuation (so the draft is what the target itself says next),
masked as an l2r schedule with T steps masks it at a random step s: the first
sum(block_sizes[:s]) draft tokens clean, the rest masked (s = 0: all gamma masked, the oneshot /
first-step case). Optionally a fraction of rows are raw text windows instead.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from tqdm import tqdm

from ..atomic import new_file
from ..drafters.diffusion import block_sizes
from ..errors import UsageError
from ..nets.checkpoint import save_tensors

CHUNK = 64  # prompts per generation batch and cache file
HELD_OUT = 0.1  # share of the prompt file's tokens kept for held-out prompts
SHORT_CONTEXT = 0.125  # share of batches with a shorter context (early in a generation)


@dataclass(frozen=True)
class DataSpec:
    """What the cached sequences depend on; a cache made with other settings is refused."""

    target: str
    prompts: str
    prompt_tokens: int  # P
    continuation_tokens: int  # L
    num_prompts: int
    val_prompts: int
    temperature: float
    seed: int
    banned_id: int | None  # a mask id inside the vocabulary: never generated


def read_tokens(path: str, tokenizer, what: str) -> torch.Tensor:
    """The whole file as one token stream (n,) int64."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {what} file {path}: {e}") from e
    return torch.tensor(tokenizer.encode(text), dtype=torch.long)


def windows(tokens: torch.Tensor, count: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """`count` random windows of `length` tokens -> (count, length)."""
    starts = torch.randint(0, len(tokens) - length + 1, (count,), generator=generator)
    return tokens[starts[:, None] + torch.arange(length)]


@torch.no_grad()
def continue_batch(model, prompts: torch.Tensor, length: int, vocab: int, temperature: float,
                   generator: torch.Generator, banned_id: int | None) -> torch.Tensor:
    """The target's continuation of equal-length prompts (B, P) -> (B, P + length), one batched
    decoding loop over its KV cache (no padding needed)."""
    out = model(input_ids=prompts, use_cache=True)
    ids = [prompts]
    for i in range(length):
        logits = out.logits[:, -1, :vocab].float()  # (B, V) real vocabulary only
        if banned_id is not None:
            logits[:, banned_id] = float("-inf")
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs.cpu(), 1, generator=generator).to(prompts.device)
        else:
            nxt = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        ids.append(nxt)
        if i + 1 < length:
            out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
    return torch.cat(ids, dim=1)


def _generate(target, tokens: torch.Tensor, count: int, spec: DataSpec, stream: int) -> torch.Tensor:
    """`count` prompts drawn from `tokens` and their continuations -> (count, P + L); `stream`
    (0: validation, c + 1: training chunk c) makes each chunk's randomness its own."""
    generator = torch.Generator().manual_seed(spec.seed * 1_000_003 + stream)
    prompts = windows(tokens, count, spec.prompt_tokens, generator)
    return continue_batch(target.model, prompts.to(target.device), spec.continuation_tokens,
                          target.vocab_size, spec.temperature, generator, spec.banned_id).cpu()


def _check_meta(data: Path, spec: DataSpec) -> None:
    meta = data / "meta.json"
    if meta.is_file():
        cached = json.loads(meta.read_text(encoding="utf-8"))
        differ = [k for k, v in asdict(spec).items() if cached.get(k) != v]
        if differ:
            raise UsageError(f"{data} was made with other settings ({', '.join(differ)}); use a new `out`")


def _write_meta(data: Path, spec: DataSpec) -> None:
    data.mkdir(parents=True, exist_ok=True)
    (data / "meta.json").write_text(json.dumps(asdict(spec), indent=2) + "\n", encoding="utf-8")


def _save(path: Path, ids: torch.Tensor) -> None:
    with new_file(path) as tmp:
        save_tensors({"ids": ids.contiguous()}, tmp)


def _files(data: Path, spec: DataSpec) -> dict[int, Path]:
    """Stream -> its cache file: 0 the held-out sequences, c + 1 training chunk c."""
    n_chunks = -(-spec.num_prompts // CHUNK)
    return {c + 1: data / f"train-{c:05d}.safetensors" for c in range(n_chunks)} | {0: data / "val.safetensors"}


def read_sequences(data: Path) -> tuple[torch.Tensor, torch.Tensor, DataSpec]:
    """A complete cache -> (train (num_prompts, P + L), val (val_prompts, P + L), its settings)."""
    spec = DataSpec(**json.loads((data / "meta.json").read_text(encoding="utf-8")))
    files = _files(data, spec)
    train = torch.cat([load_file(str(files[k]))["ids"] for k in sorted(files) if k])
    return train, load_file(str(files[0]))["ids"], spec


def build_sequences(data: Path, target, spec: DataSpec, progress: bool) -> tuple[torch.Tensor, torch.Tensor, float]:
    """-> (train (num_prompts, P + L), val (val_prompts, P + L), seconds spent generating),
    from the cache in `data` where it has them, else generated by the target and cached."""
    _check_meta(data, spec)
    files = _files(data, spec)
    todo = [k for k, f in files.items() if not f.is_file()]
    start = time.perf_counter()
    if todo:
        tokens = read_tokens(spec.prompts, target.tokenizer, "prompts")
        cut = int(len(tokens) * (1 - HELD_OUT))
        if len(tokens) - cut <= spec.prompt_tokens:
            raise UsageError(f"{spec.prompts} has {len(tokens)} tokens; it needs more than "
                             f"{int(spec.prompt_tokens / HELD_OUT) + 1} for {spec.prompt_tokens}-token prompts")
        _write_meta(data, spec)
        for k in tqdm(todo, disable=not progress, desc="target continuations", unit="chunk", leave=False):
            count = spec.val_prompts if k == 0 else min(CHUNK, spec.num_prompts - (k - 1) * CHUNK)
            _save(files[k], _generate(target, tokens[cut:] if k == 0 else tokens[:cut], count, spec, k))
    seconds = (time.perf_counter() - start) if todo else 0.0
    train, val, _ = read_sequences(data)
    return train, val, seconds


@dataclass(frozen=True)
class Pattern:
    """How drafting looks: N context tokens, gamma slots filled in T l2r steps."""

    context: int  # N
    gamma: int
    steps: int  # T
    mask_id: int

    def committed(self) -> torch.Tensor:
        """Draft tokens already committed before each l2r step: (T,) = 0, b_1, b_1 + b_2, ..."""
        sizes = torch.tensor([0, *block_sizes(self.gamma, self.steps)[:-1]])
        return sizes.cumsum(0)


@dataclass
class Batch:
    x0: torch.Tensor  # (B, n + gamma) clean tokens
    xt: torch.Tensor  # (B, n + gamma) the drafter's input: some draft slots masked
    n: int  # context tokens in this batch


def make_batch(seqs: torch.Tensor, pattern: Pattern, size: int, generator: torch.Generator,
               prompt_tokens: int, raw: torch.Tensor | None = None, raw_fraction: float = 0.0,
               context: int | None = None) -> Batch:
    """`size` examples from sequences (M, P + L): a split s in the continuation, x0 =
    seq[s - n : s + gamma], draft slots masked as at a random l2r step; rows drawn from raw text
    windows with probability raw_fraction. n = `context`, else N (or, in a SHORT_CONTEXT share
    of batches, fewer: drafting early in a generation sees less than N tokens)."""
    n = context or pattern.context
    if context is None and torch.rand((), generator=generator) < SHORT_CONTEXT:
        n = int(torch.randint(1, pattern.context + 1, (), generator=generator))
    width = n + pattern.gamma
    rows = torch.randint(0, len(seqs), (size,), generator=generator)
    splits = torch.randint(prompt_tokens, seqs.shape[1] - pattern.gamma + 1, (size,), generator=generator)
    x0 = seqs[rows[:, None], splits[:, None] - n + torch.arange(width)]  # (B, n + gamma)
    if raw is not None and raw_fraction > 0:
        use_raw = torch.rand(size, generator=generator) < raw_fraction
        x0 = torch.where(use_raw[:, None], windows(raw, size, width, generator), x0)
    starts = pattern.committed()
    committed = starts[torch.randint(0, len(starts), (size,), generator=generator)]  # (B,)
    masked = torch.arange(pattern.gamma) >= committed[:, None]  # (B, gamma)
    xt = x0.clone()
    xt[:, n:] = x0[:, n:].masked_fill(masked, pattern.mask_id)
    return Batch(x0, xt, n)
