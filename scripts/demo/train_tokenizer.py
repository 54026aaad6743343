"""Step 3 of the demo build: byte-level BPE tokenizer, and the corpus encoded with it.

    python scripts/demo/train_tokenizer.py --corpus build/demo/corpus --out build/demo/tokenizer \
        --data build/demo/data

Trains a GPT-2-style byte-level BPE (no prefix space) on train.txt, 4094 learned tokens, then
appends the two special tokens as the LAST ids: <|endoftext|> = 4094 (eos, document separator) and
<|mask|> = 4095 (the diffusion drafter's mask token). Saves it as a transformers
PreTrainedTokenizerFast (save_pretrained) and writes train.bin / val.bin (uint16 token ids, one
<|endoftext|> after every document) and stats.json (sizes, wall time) under --data.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOT, MASK = "<|endoftext|>", "<|mask|>"
VOCAB_SIZE = 4096
CONTEXT = 256


def train_bpe(documents: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE with vocab_size - 2 learned ids, then EOT and MASK as the last two."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 2, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(documents, trainer=trainer)
    tok.add_special_tokens([EOT, MASK])
    assert tok.token_to_id(EOT) == vocab_size - 2 and tok.token_to_id(MASK) == vocab_size - 1
    return tok


def encode(tok: PreTrainedTokenizerFast, documents: list[str]) -> np.ndarray:
    """Token ids of the documents, each followed by <|endoftext|>: (N,) uint16."""
    ids = []
    for doc in tok(documents, add_special_tokens=False)["input_ids"]:
        ids += doc + [tok.eos_token_id]
    return np.asarray(ids, dtype=np.uint16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="directory with train.txt and val.txt")
    ap.add_argument("--out", type=Path, required=True, help="tokenizer directory")
    ap.add_argument("--data", type=Path, required=True, help="directory for train.bin / val.bin")
    ap.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = ap.parse_args()
    t0 = time.time()
    docs = {s: (args.corpus / f"{s}.txt").read_text(encoding="utf-8").split(EOT) for s in ("train", "val")}
    tok = PreTrainedTokenizerFast(tokenizer_object=train_bpe(docs["train"], args.vocab_size), eos_token=EOT,
                                  mask_token=MASK, model_max_length=CONTEXT)
    tok.save_pretrained(args.out)
    t_bpe = time.time() - t0
    args.data.mkdir(parents=True, exist_ok=True)
    stats = {"vocab_size": len(tok), "eos_token_id": tok.eos_token_id, "mask_token_id": tok.mask_token_id,
             "bpe_wall_s": round(t_bpe, 1)}
    for split, documents in docs.items():
        ids = encode(tok, documents)
        ids.tofile(args.data / f"{split}.bin")
        chars = sum(map(len, documents))
        stats[split] = {"documents": len(documents), "tokens": int(ids.size),
                        "chars_per_token": round(chars / ids.size, 3)}
    stats["wall_s"] = round(time.time() - t0, 1)
    (args.data / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
