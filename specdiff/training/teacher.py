"""The teacher data of `specdiff distill`: the target's own continuations of prompts, cached.

Sequence-level distillation: a prompt is a random window of P tokens of a text file (P = the
drafter's context length N), the target continues it by L tokens in one batched loop over its KV
cache, and the drafter learns to predict those L tokens. The last HELD_OUT of the file's tokens
give the held-out prompts (validation loss, tau).

Teacher settings (SpecDiff-2 / DistillSpec: a drafter that must be accepted when the target samples
has to learn from the target's samples, not its argmax): each prompt is continued S times
(samples_per_prompt); training chunk c of prompts is continued with teacher setting c mod
(number of settings), a (temperature, top-p) pair; temperature 0 is greedy; the held-out
sequences (validation loss) with the first setting. Soft labels: at every
continuation position the target's own distribution p (temperature 1, no top-p: the p that
sampling at any temperature warps, see docs/lossless.md), top-k truncated: the k most likely ids
(int32) and their probabilities (fp16); the mass the k keep is reported by the distill report.

    DIR/data/meta.json                 the settings the cache was made with
    DIR/data/train-00000.safetensors   {"ids": (<= CHUNK * S, P + L) int64, and with k > 0
                                        "soft_ids": (.., L, k) int32, "soft_p": (.., L, k) fp16},
                                        one per CHUNK prompts
    DIR/data/val.safetensors           the held-out sequences

Chunks are written as they are generated, so an interrupted run resumes where it stopped. A file
that cannot be read is one LoadError naming it: a chunk to delete (the next run makes it again),
or a meta.json damaged or missing beside chunks, whose cache is to be made again.
Batches shaped like drafting are drawn from these sequences by specdiff.training.batches.

A prefill (`prefill`: prompts is a JSONL file of {"prompt": question, "answer": text}) writes
the same cache without generating: each row is the question through the chat template, then the
given answer (its eos, then eos to L tokens, as a generated answer that ended), and one forward
pass of the target gives the soft labels and features of every position (prefill_batch); the
file's rows in order, its last rows held out (prefill_split).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence, Union

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from tqdm import tqdm

from ..atomic import new_file
from ..errors import LoadError, UsageError
from ..hf_cache import returned_cache, with_cache
from ..nets.checkpoint import save_tensors
from ..reading import read_small_text
from ..sampling import Sampling
from ..targets.block import BlockDiffusionTarget
from ..targets.causal import CausalLMTarget
from .prefill import PREFILL_ROWS, prefill_batch, prefill_rows
from .sequences import Sequences, call_features, left_padded, templated

CHUNK = 64  # prompts per generation batch and cache file
HELD_OUT = 0.1  # share of the prompt file's tokens kept for held-out prompts
Teacher = Union[CausalLMTarget, BlockDiffusionTarget]  # a loaded target: its model, tokenizer and sizes are read


@dataclass(frozen=True)
class DataSpec:
    """What the cached sequences depend on; a cache made with other settings is refused."""

    target: str
    prompts: str
    prompt_tokens: int  # P
    continuation_tokens: int  # L
    num_prompts: int
    val_prompts: int
    teacher_temperature: list[float]  # one setting per entry (top-p broadcast when it has one)
    teacher_top_p: list[float]
    samples_per_prompt: int  # S
    soft_labels: int  # k most likely ids of p kept per position; 0: none
    seed: int
    banned_id: int | None  # a mask id inside the vocabulary: never generated
    chat: bool = False  # prompts: the file's lines, one question each, through the chat template
    prefill: bool = False  # prompts: JSONL question / answer pairs; the target reads the answers, none generated

    def teacher(self, stream: int) -> Sampling:
        """The teacher setting of a stream (0: validation, c + 1: training chunk c)."""
        n = len(self.teacher_temperature)
        i = max(0, stream - 1) % n
        return Sampling(self.teacher_temperature[i], top_p=self.teacher_top_p[i % len(self.teacher_top_p)])


def read_tokens(path: str, tokenizer: Any, what: str) -> torch.Tensor:
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
def continue_batch(model: Any, prompts: torch.Tensor, length: int, vocab: int, teacher: Sampling,
                   generator: torch.Generator, banned_id: int | None, soft_labels: int = 0,
                   pad: torch.Tensor | None = None, eos_id: int | None = None,
                   layer_ids: Sequence[int] = ()) -> tuple[Sequences, torch.Tensor | None]:
    """The target's continuation of equal-length prompts (B, P) -> (B, P + length), drawn from
    `teacher` (the target's p warped by its temperature / top-p), one batched decoding loop over
    its KV cache, each draw on the generator's device (a CUDA generator spares the host a (B, V)
    copy and a CPU multinomial a step: 0.44 s at B = 512 on one core); with soft_labels = k, p's k most likely ids and probabilities at each
    continuation position (B, length, k). pad (B,): left padding of each prompt, kept out of
    attention and positions. eos_id: a row that has said it says it again (soft label one-hot on
    it), and the loop stops once every row has. layer_ids: also the outputs of those target layers
    at every position (B, P + length, len(layer_ids) * H) fp16 (zeros on padding and past the stop),
    the features of features.py taken from the same calls (one more step reads the last token), else
    None."""
    B, P = prompts.shape
    pad = torch.zeros(B, dtype=torch.long, device=prompts.device) if pad is None else pad.to(prompts.device)
    mask = (torch.arange(P, device=prompts.device) >= pad[:, None]).long()  # (B, P)
    done = torch.zeros(B, dtype=torch.bool, device=prompts.device)
    out = model(input_ids=prompts, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp_min(0),
                use_cache=True, output_hidden_states=bool(layer_ids))
    ids, soft, feats = [prompts], [], [call_features(out, layer_ids, mask)]
    for i in range(length):
        logits = out.logits[:, -1, :vocab].float()  # (B, V) real vocabulary only
        if banned_id is not None:
            logits[:, banned_id] = float("-inf")
        if eos_id is not None:
            logits[done] = float("-inf")
            logits[done, eos_id] = 0.0  # p one-hot on eos once a row has ended
        if soft_labels:
            soft.append(logits.softmax(-1).topk(min(soft_labels, vocab), dim=-1))
        probs = teacher.probs(logits)
        nxt = teacher.sample(probs.to(generator.device), generator).to(prompts.device)[:, None]  # (B, 1)
        ids.append(nxt)
        if eos_id is not None:
            done |= nxt[:, 0] == eos_id
        if (i + 1 < length or layer_ids) and not done.all():
            mask = torch.cat([mask, mask.new_ones(B, 1)], dim=1)
            out = model(input_ids=nxt, attention_mask=mask, position_ids=mask.sum(1, keepdim=True) - 1,
                        use_cache=True, output_hidden_states=bool(layer_ids), **with_cache(model, returned_cache(out)))
            feats.append(call_features(out, layer_ids))
        elif i + 1 < length and eos_id is not None:  # every row ended: the rest is eos
            return _finished(prompts, ids, soft, length, eos_id), _joined(feats, P + length)
    if not soft:
        return Sequences(torch.cat(ids, dim=1)), _joined(feats, P + length)
    return (Sequences(torch.cat(ids, dim=1), torch.stack([t.indices for t in soft], 1).int(),
                      torch.stack([t.values for t in soft], 1).half()), _joined(feats, P + length))


def _joined(feats: list[Any], width: int) -> torch.Tensor | None:
    """Per-call features -> (B, width, F), zeros past the last call (rows that all ended early)."""
    if feats[0] is None:
        return None
    joined = torch.cat(feats, dim=1)
    return torch.nn.functional.pad(joined, (0, 0, 0, width - joined.shape[1]))[:, :width]


def _finished(prompts: torch.Tensor, ids: list[Any], soft: list[Any], length: int, eos_id: int) -> Sequences:
    """Sequences whose rows all ended early, padded to `length` with eos (soft labels one-hot on it)."""
    B, rest = prompts.shape[0], length - (len(ids) - 1)
    ids = [*ids, prompts.new_full((B, rest), eos_id)]
    if not soft:
        return Sequences(torch.cat(ids, dim=1))
    k = soft[0].indices.shape[-1]
    tail_ids = torch.zeros(B, rest, k, dtype=torch.int32)
    tail_ids[..., 0] = eos_id
    tail_p = torch.zeros(B, rest, k, dtype=torch.float16)
    tail_p[..., 0] = 1
    return Sequences(torch.cat(ids, dim=1),
                     torch.cat([torch.stack([t.indices for t in soft], 1).int().cpu(), tail_ids], 1),
                     torch.cat([torch.stack([t.values for t in soft], 1).half().cpu(), tail_p], 1))


def chat_prompts(path: str, tokenizer: Any, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The file's lines (one question each) through the chat template, left-padded to `length`
    -> (ids (Q, length), pad (Q,)); questions longer than that are left out."""
    try:
        lines = [q.strip() for q in Path(path).read_text(encoding="utf-8").splitlines() if q.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read prompts file {path}: {e}") from e
    encoded = [e for e in (templated(tokenizer, q) for q in lines) if len(e) <= length]
    if not encoded:
        raise UsageError(f"no question in {path} fits {length} tokens through the chat template")
    return left_padded(encoded, tokenizer, length)


def _generate(target: Teacher, prompts: tuple[torch.Tensor, torch.Tensor | None], count: int, spec: DataSpec,
              stream: int, layer_ids: Sequence[int]) -> tuple[Sequences, torch.Tensor | None]:
    """`count` prompts, S continuations of each -> (count * S, P + L), and with layer_ids their
    features (continue_batch): windows of a token stream (prompts = (tokens (n,), None)) or rows of
    chat prompts (prompts = (ids (Q, P), pad (Q,))); `stream` (0: validation, c + 1: training chunk
    c) makes each chunk's randomness its own."""
    generator = torch.Generator().manual_seed(spec.seed * 1_000_003 + stream)
    tokens, pad = prompts
    if pad is None:
        ids = windows(tokens, count, spec.prompt_tokens, generator)
    else:
        rows = torch.randint(0, len(tokens), (count,), generator=generator)
        ids, pad = tokens[rows], pad[rows]
    S = spec.samples_per_prompt
    seqs, feats = continue_batch(target.model, ids.repeat_interleave(S, 0).to(target.device), spec.continuation_tokens,
                                 target.vocab_size, spec.teacher(stream), generator, spec.banned_id, spec.soft_labels,
                                 None if pad is None else pad.repeat_interleave(S, 0),
                                 target.eos_token_id if spec.chat else None, layer_ids)
    return seqs.cpu(), feats


def _prefill(target: Teacher, prompts: tuple[torch.Tensor, torch.Tensor | None], count: int, spec: DataSpec,
             stream: int, layer_ids: Sequence[int]) -> tuple[Sequences, torch.Tensor | None]:
    """_generate's prefill twin: `count` answered rows (prompts = (ids (Q, P + L), pad (Q,)), the
    chunk's in order: stream c + 1 reads rows c * CHUNK ..., stream 0 the first) through
    prefill_batch, PREFILL_ROWS at a time -> (count, P + L) and their features."""
    ids, pad = prompts
    assert pad is not None
    start = max(0, stream - 1) * CHUNK
    ids, pad = ids[start:start + count], pad[start:start + count]
    parts = [prefill_batch(target.model, ids[i:i + PREFILL_ROWS].to(target.device), pad[i:i + PREFILL_ROWS],
                           spec.prompt_tokens, target.vocab_size, spec.banned_id, spec.soft_labels,
                           target.eos_token_id if spec.chat else None, layer_ids)
             for i in range(0, count, PREFILL_ROWS)]
    feats = None if parts[0][1] is None else torch.cat([f for _, f in parts])  # type: ignore[misc]
    return Sequences.cat([seqs for seqs, _ in parts]), feats


def _check_meta(data: Path, spec: DataSpec) -> None:
    """Refuse a cache made with other settings, or whose settings are unknown (meta.json damaged, or
    missing beside cached files)."""
    if os.path.lexists(data / "meta.json") or any(f.is_file() for f in _files(data, spec).values()):
        cached = {"prefill": False, **_read_meta(data)}  # older caches: generated
        differ = [k for k, v in asdict(spec).items() if cached.get(k) != v]
        if differ:
            raise UsageError(f"{data} was made with other settings ({', '.join(differ)}); use a new `out`")


def _read_meta(data: Path) -> dict[str, Any]:
    """meta.json's settings; a LoadError naming it, and what to do, where they cannot be read."""
    meta = data / "meta.json"
    try:
        settings = json.loads(read_small_text(meta))
        if not isinstance(settings, dict):
            raise ValueError("not a JSON object")
    except OSError as e:
        why = e.strerror or str(e)
    except ValueError as e:  # not UTF-8, not JSON
        why = f"damaged: {str(e).split(':')[0]}"
    else:
        return settings
    raise LoadError(f"{meta}: {why}; the settings the teacher data in {data} was made with are unknown: delete "
                    f"{data} and make it again")


def _write_meta(data: Path, spec: DataSpec) -> None:
    data.mkdir(parents=True, exist_ok=True)
    with new_file(data / "meta.json") as tmp:
        tmp.write_text(json.dumps(asdict(spec), indent=2) + "\n", encoding="utf-8")


def _save(path: Path, seqs: Sequences) -> None:
    with new_file(path) as tmp:
        save_tensors({k: t.contiguous() for k, t in seqs.tensors().items()}, tmp)


def _load(path: Path) -> Sequences:
    """A cache file's sequences; a LoadError naming it, and what to do, where it cannot be read."""
    try:
        return Sequences(**load_file(str(path)))
    except (OSError, SafetensorError, TypeError) as e:  # missing, truncated, other tensors
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise LoadError(f"{path}: damaged teacher data ({why}); delete it, and a run with this `data` makes it "
                        "again") from e


def _files(data: Path, spec: DataSpec) -> dict[int, Path]:
    """Stream -> its cache file: 0 the held-out sequences, c + 1 training chunk c."""
    n_chunks = -(-spec.num_prompts // CHUNK)
    return {c + 1: data / f"train-{c:05d}.safetensors" for c in range(n_chunks)} | {0: data / "val.safetensors"}


def read_sequences(data: Path) -> tuple[Sequences, Sequences, DataSpec]:
    """A complete cache -> (train (num_prompts * S, P + L), val (val_prompts * S, P + L), its settings);
    a LoadError naming a file that cannot be read."""
    if not data.is_dir():
        raise LoadError(f"{data}: no such directory")
    meta = _read_meta(data)
    try:
        spec = DataSpec(**meta)
    except TypeError as e:  # keys of another version
        raise LoadError(f"{data / 'meta.json'}: not the settings of teacher data ({e})") from e
    files = _files(data, spec)
    train = Sequences.cat([_load(files[k]) for k in sorted(files) if k])
    return train, _load(files[0]), spec


SHARED = ("target", "prompt_tokens", "continuation_tokens", "soft_labels", "chat", "banned_id")  # more_data agrees


def more_sequences(dirs: Sequence[str], spec: DataSpec) -> list[tuple[Path, Sequences, Sequences]]:
    """(directory, train, val) of each complete cache in `dirs`, made like `spec` in SHARED."""
    out = []
    for name in dirs:
        data = Path(name)
        try:
            train, val, other = read_sequences(data)
        except (LoadError, TypeError) as e:
            raise UsageError(f"`more_data` {name}: not a complete teacher data cache ({e})") from e
        differ = [k for k in SHARED if getattr(other, k) != getattr(spec, k)]
        if differ:
            raise UsageError(f"`more_data` {name} was made with other {', '.join(differ)} than `data`")
        out.append((data, train, val))
    return out


def build_sequences(data: Path, target: Teacher, spec: DataSpec, progress: bool,
                    features: tuple[Path, Sequence[int]] | None = None) -> tuple[Sequences, Sequences, float]:
    """-> (train (num_prompts * S, P + L), val (val_prompts * S, P + L), seconds spent generating),
    from the cache in `data` where it has them, else generated by the target and cached. features
    (directory, layer_ids): what is generated also leaves the outputs of those target layers there,
    under its chunk's file name ({"features": (rows, P + L, F) fp16}, features.py's cache), written
    before the chunk itself."""
    _check_meta(data, spec)
    files = _files(data, spec)
    todo = [k for k, f in files.items() if not f.is_file()]
    start = time.perf_counter()
    if todo:
        train_prompts, val_prompts = _prompt_source(spec, target)
        _write_meta(data, spec)
        for k in tqdm(todo, disable=not progress, desc="target continuations", unit="chunk", leave=False):
            count = spec.val_prompts if k == 0 else min(CHUNK, spec.num_prompts - (k - 1) * CHUNK)
            make = _prefill if spec.prefill else _generate
            seqs, feats = make(target, val_prompts if k == 0 else train_prompts, count, spec, k,
                               features[1] if features else ())
            if features and feats is not None:
                features[0].mkdir(parents=True, exist_ok=True)
                with new_file(features[0] / files[k].name) as tmp:
                    save_tensors({"features": feats}, tmp)
            _save(files[k], seqs)
    seconds = (time.perf_counter() - start) if todo else 0.0
    train, val, _ = read_sequences(data)
    return train, val, seconds


Prompts = tuple[torch.Tensor, "torch.Tensor | None"]


def _prompt_source(spec: DataSpec, target: Teacher) -> tuple[Prompts, Prompts]:
    """(training, held-out) prompt sources: the file's last HELD_OUT share (of its tokens, or of
    its questions with `chat`) is held out; with `prefill`, its answered rows: the first
    num_prompts and the last val_prompts (prefill_split)."""
    if spec.prefill:
        ids, pad = prefill_rows(spec.prompts, target.tokenizer, spec.prompt_tokens, spec.continuation_tokens,
                                target.eos_token_id)
        return (ids[:spec.num_prompts], pad[:spec.num_prompts]), (ids[-spec.val_prompts:], pad[-spec.val_prompts:])
    if spec.chat:
        ids, pad = chat_prompts(spec.prompts, target.tokenizer, spec.prompt_tokens)
        cut = int(len(ids) * (1 - HELD_OUT))
        if cut == 0 or cut == len(ids):
            raise UsageError(f"{spec.prompts}: {len(ids)} usable questions; it needs at least {int(1 / HELD_OUT) + 1}")
        return (ids[:cut], pad[:cut]), (ids[cut:], pad[cut:])
    tokens = read_tokens(spec.prompts, target.tokenizer, "prompts")
    cut = int(len(tokens) * (1 - HELD_OUT))
    if len(tokens) - cut <= spec.prompt_tokens:
        raise UsageError(f"{spec.prompts} has {len(tokens)} tokens; it needs more than "
                         f"{int(spec.prompt_tokens / HELD_OUT) + 1} for {spec.prompt_tokens}-token prompts")
    return (tokens[:cut], None), (tokens[cut:], None)
