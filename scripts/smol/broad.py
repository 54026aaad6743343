"""Broad prompts from the target itself (Magpie, arXiv 2406.08464) and the target's answers to them.

    python scripts/smol/broad.py prompts [--parts N] [--first F]   # raw user turns, part by part
    python scripts/smol/broad.py select                            # filtered, de-duplicated set + card
    python scripts/smol/broad.py answers [--parts N] [--first F]   # the target's answers, part by part

An instruct model given its chat template up to the start of a user turn writes a user's turn, in
the distribution it was tuned on. SmolLM2-135M-Instruct from the bare turn start at temperature 1
writes mostly nonsense; with an opening word (OPENERS, one list per category) at temperature 0.8,
top-p 0.95 it writes plausible requests. Each row draws a system prompt (SYSTEMS) and a category's
opening word from the part's own seed, so parts are independent samples and any number can be made.

Where it lives (committed: small, expensive to make; a new machine resumes instead of regenerating):
    prompts/broad/raw-NN.jsonl.gz       part NN's samples: {"system", "category", "text", "ended"}
    prompts/broad/prompts.jsonl.gz      `select`'s set: {"prompt", "category"}, filtered and
                                        de-duplicated against each other and the held-out sets
    prompts/broad/stats.json            what `select` kept and dropped, categories, distinct n-grams
    prompts/broad/answers-NN.jsonl.gz   the target's answers to prompts NN*PER_PART...: {"prompt",
                                        "answer", "temperature", "ids"} (ids: the answer's token ids)

Teacher data need not be exact (only the verify must be): rows are drawn from the target's top
TOP_K ids (temperature, then top-p within them; greedy takes the argmax), batches of B rows drop
each row as it says <|im_end|> (the cache keeps only live rows), and the prompt's logits are
computed at its last position only. Resumable by part: a part is written whole (atomic rename) and a
written part is skipped. Run it niced on one core; it shows progress per part (tqdm).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "prompts" / "broad"
TARGET = "smollm2-135m-instruct"
HELD_OUT_SETS = ("smol-general.jsonl", "smol-heldout.jsonl")
TOP_K = 64
TURN = "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{opener}"
SYSTEMS = (
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    "You are a helpful assistant.",
    "You are a friendly assistant who answers questions clearly and briefly.",
    "You are a knowledgeable tutor who explains things step by step.",
    "You are a creative writing assistant.",
    "You are an expert programmer who helps users with code in many languages.",
    "You are a practical assistant who gives useful everyday advice.",
    "You are a math and science assistant.",
)
OPENERS: dict[str, tuple[str, ...]] = {
    "explain": ("Explain", "What is", "What are", "Why do", "Why is", "Describe", "What does"),
    "how-to": ("How do I", "How can I", "How to", "What is the best way to", "Steps to"),
    "advice": ("I", "I'm", "My", "Can you help me", "Should I", "What should I do"),
    "creative": ("Write a story", "Write a poem", "Write a short", "Write a letter", "Imagine",
                 "Compose", "Create a"),
    "summarise": ("Summarize", "Summarise", "Rewrite", "Give me a summary of", "Paraphrase"),
    "reasoning": ("Calculate", "If a", "Solve", "What is the sum of", "How many", "A train"),
    "code": ("Write a function", "Write a JavaScript", "Write a SQL query", "In C++,", "Write a Java",
             "How do I write a", "Fix this code", "Write a Bash"),
    "facts": ("Who was", "When did", "Where is", "What is the capital of", "Which", "Tell me about"),
    "lists": ("List", "Give me", "Name", "Give me 5", "What are some", "Suggest"),
    "compare": ("Compare", "What is the difference between", "Is it better to", "Can you"),
}
CATEGORIES = tuple(OPENERS)
SETTINGS = ((0.0, 1.0), (0.7, 0.95), (1.0, 0.95))  # answers: (temperature, top-p), batch by batch
PER_PART = 512  # answers a part


def load_model() -> tuple[Any, Any, int]:
    """The target's torch model (fp32, eval), its tokenizer and the <|im_end|> id."""
    from specdiff.loading import load_target
    target = load_target(TARGET)
    tok = target.tokenizer
    return target.model, tok, int(tok.convert_tokens_to_ids("<|im_end|>"))


def draw(logits: torch.Tensor, temperature: float, top_p: float, g: torch.Generator) -> torch.Tensor:
    """logits (B, V) -> ids (B,): greedy at temperature 0, else from the TOP_K most likely ids,
    warped by temperature, then top-p within them."""
    if temperature == 0:
        return logits.argmax(-1)
    top, ids = logits.topk(TOP_K, dim=-1)  # (B, K) descending
    p = (top / temperature).softmax(-1)
    keep = p.cumsum(-1) - p < top_p  # the smallest prefix holding top_p (the first always kept)
    p = torch.where(keep, p, torch.zeros_like(p))
    return ids.gather(1, torch.multinomial(p, 1, generator=g))[:, 0]


@torch.no_grad()
def prefilled(model: Any, prefix: list[int], rows: list[list[int]], pad: int) -> tuple[Any, Any, torch.Tensor]:
    """The shared prefix read once at batch 1, its cache repeated for every row, then each row's own
    ids, left-padded after the prefix (padding masked, positions counted over real ids) -> (the
    last call's output (logits at the last position only), its cache, mask (B, len(prefix) + P))."""
    B, P = len(rows), max(len(r) for r in rows)
    cache = model(input_ids=torch.tensor([prefix]), use_cache=True, logits_to_keep=1).past_key_values
    cache.batch_repeat_interleave(B)
    ids = torch.tensor([[pad] * (P - len(r)) + r for r in rows])  # (B, P)
    own = (torch.arange(P) >= torch.tensor([P - len(r) for r in rows])[:, None]).long()  # (B, P)
    mask = torch.cat([own.new_ones(B, len(prefix)), own], dim=1)
    out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1)[:, -P:],
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out, out.past_key_values, mask


@torch.no_grad()
def continue_rows(model: Any, prefix: list[int], rows: list[list[int]], length: int, eos: int, temperature: float,
                  top_p: float, g: torch.Generator, pad: int) -> list[tuple[list[int], bool]]:
    """Each row (prefix + its ids) continued by at most `length` ids, stopping at eos -> (new ids
    without eos, ended): one id a step for the rows still live; a finished row leaves the batch and
    the KV cache."""
    B = len(rows)
    out, cache, mask = prefilled(model, prefix, rows, pad)
    live = torch.arange(B)
    new: list[list[int]] = [[] for _ in rows]
    ended = [False] * B
    for step in range(length):
        nxt = draw(out.logits[:, -1].float(), temperature, top_p, g)  # (b,)
        stop = nxt == eos
        for b, t, s in zip(live.tolist(), nxt.tolist(), stop.tolist()):
            ended[b] = ended[b] or s
            if not s:
                new[b].append(t)
        if stop.all() or step + 1 == length:
            break
        if stop.any():
            keep = (~stop).nonzero()[:, 0]
            cache.batch_select_indices(keep)
            live, nxt, mask = live[keep], nxt[keep], mask[keep]
        mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
        out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=mask.sum(1, keepdim=True) - 1,
                    past_key_values=cache, use_cache=True)
        cache = out.past_key_values
    return list(zip(new, ended))


def write_part(path: Path, records: list[dict[str, Any]]) -> None:
    """records -> path (jsonl.gz), whole or not at all (a temporary beside it, renamed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def read_part(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def prompts_part(model: Any, tok: Any, eos: int, part: int, size: int, batch: int) -> list[dict[str, Any]]:
    """`size` user turns sampled with part's seed: each row a system prompt and a category's opener."""
    g = torch.Generator().manual_seed(1_000 + part)
    records: list[dict[str, Any]] = []
    for _ in tqdm(range(0, size, batch), desc=f"raw-{part:02d}", unit="batch", file=sys.stderr):
        system = int(torch.randint(len(SYSTEMS), (1,), generator=g))  # one a batch: its prefix read once
        picks = []
        for _ in range(batch):
            category = CATEGORIES[int(torch.randint(len(CATEGORIES), (1,), generator=g))]
            openers = OPENERS[category]
            picks.append((category, openers[int(torch.randint(len(openers), (1,), generator=g))]))
        prefix = tok.encode(TURN.format(system=SYSTEMS[system], opener=""))
        rows = [tok.encode(o) for _, o in picks]
        done = continue_rows(model, prefix, rows, 48, eos, 0.8, 0.95, g, tok.pad_token_id or 0)
        for (c, o), (new, ended) in zip(picks, done):
            records.append({"system": system, "category": c, "text": o + tok.decode(new), "ended": ended})
    return records


def cmd_prompts(args: argparse.Namespace) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    model, tok, eos = load_model()
    for part in range(args.first, args.parts):
        path = OUT / f"raw-{part:02d}.jsonl.gz"
        if path.exists():
            continue
        t0 = time.time()
        records = prompts_part(model, tok, eos, part, args.size, args.batch)
        write_part(path, records)
        print(f"{path.name}: {len(records)} samples in {time.time() - t0:.0f} s", file=sys.stderr)


def cmd_select(args: argparse.Namespace) -> None:
    """Every raw part -> prompts.jsonl.gz (kept turns, in part order) and stats.json."""
    from specdiff.resources import data_path
    from specdiff.training.prompts import NearDuplicates, diversity, usable
    index = NearDuplicates()
    held_out = [json.loads(line)["prompt"] for name in HELD_OUT_SETS
                for line in data_path("prompts", name).read_text(encoding="utf-8").splitlines()]
    for q in held_out:  # in the index first: a training prompt near one of them is dropped
        index.add(q)
    kept: list[dict[str, Any]] = []
    dropped: dict[str, int] = {}
    parts = sorted(OUT.glob("raw-*.jsonl.gz"))
    if not parts:
        sys.exit(f"broad.py select: no raw part in {OUT}: run `broad.py prompts` first")
    for path in tqdm(parts, desc="select", unit="part", file=sys.stderr):
        for r in read_part(path):
            text = r["text"].strip()
            why = "unfinished" if not r["ended"] else usable(text)
            if why is None and not index.add(text):
                why = "duplicate"
            if why is None:
                kept.append({"prompt": text, "category": r["category"]})
            else:
                dropped[why] = dropped.get(why, 0) + 1
    write_part(OUT / "prompts.jsonl.gz", kept)
    stats = {"parts": [p.name for p in parts], "samples": len(kept) + sum(dropped.values()), "kept": len(kept),
             "dropped": dropped, "opener_categories": _counts(r["category"] for r in kept),
             "diversity": diversity([r["prompt"] for r in kept])}
    (OUT / "stats.json").write_text(json.dumps(stats, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(stats), file=sys.stderr)


def _counts(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def answers_part(model: Any, tok: Any, eos: int, prompts: list[str], part: int, batch: int,
                 length: int) -> list[dict[str, Any]]:
    """The target's answers to prompts through its chat template, batch b drawn with SETTINGS[b % 3]
    (the part's seed), shortest prompts batched together."""
    g = torch.Generator().manual_seed(2_000 + part)
    templated = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False) for q in prompts]
    n = len(os.path.commonprefix(templated))  # the system turn and the user turn's start, read once
    order = sorted(range(len(prompts)), key=lambda i: len(templated[i]))
    records: list[dict[str, Any]] = [{} for _ in prompts]
    for b, start in enumerate(tqdm(range(0, len(order), batch), desc=f"answers-{part:02d}", unit="batch",
                                   file=sys.stderr)):
        rows = order[start:start + batch]
        temperature, top_p = SETTINGS[b % len(SETTINGS)]
        done = continue_rows(model, list(templated[0][:n]), [list(templated[i][n:]) for i in rows], length, eos,
                             temperature, top_p, g, tok.pad_token_id or 0)
        for i, (new, ended) in zip(rows, done):
            records[i] = {"prompt": prompts[i], "answer": tok.decode(new), "temperature": temperature,
                          "top_p": top_p, "ended": ended, "ids": new}
    return records


def cmd_answers(args: argparse.Namespace) -> None:
    if not (OUT / "prompts.jsonl.gz").is_file():
        sys.exit(f"broad.py answers: {OUT / 'prompts.jsonl.gz'} is missing: run `broad.py select` first")
    prompts = [r["prompt"] for r in read_part(OUT / "prompts.jsonl.gz")]
    model, tok, eos = load_model()
    for part in range(args.first, min(args.parts, -(-len(prompts) // PER_PART))):
        path = OUT / f"answers-{part:02d}.jsonl.gz"
        if path.exists():
            continue
        t0, c0 = time.time(), time.process_time()
        records = answers_part(model, tok, eos, prompts[part * PER_PART:(part + 1) * PER_PART], part, args.batch,
                               args.length)
        write_part(path, records)
        tokens, cpu = sum(len(r["ids"]) for r in records), time.process_time() - c0
        print(f"{path.name}: {len(records)} answers, {tokens} tokens in {time.time() - t0:.0f} s, {cpu:.0f} s of "
              f"CPU ({tokens / cpu * 3600 / 1e6:.2f}M tokens a core-hour)", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prompts", help="sample raw user turns, part by part")
    p.add_argument("--parts", type=int, default=32)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--size", type=int, default=2048, help="samples a part")
    p.add_argument("--batch", type=int, default=128)
    p.set_defaults(run=cmd_prompts)
    p = sub.add_parser("select", help="filter and de-duplicate the raw parts into prompts.jsonl.gz")
    p.set_defaults(run=cmd_select)
    p = sub.add_parser("answers", help="the target's answers to the selected prompts, part by part")
    p.add_argument("--parts", type=int, default=64)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--length", type=int, default=256, help="answer tokens at most")
    p.set_defaults(run=cmd_answers)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    args.run(args)


if __name__ == "__main__":
    main()
