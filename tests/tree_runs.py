"""The runs of the draft-tree tests (tests/test_trees.py) that tests/test_tree_auto.py and
tests/test_trees_onnx.py repeat: the prompts, the targets (one a Qwen3 with sliding-window
layers), and the comparison of two results."""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from tiny import TEXT

WORDS = TEXT.split()
PROMPTS = [" ".join(WORDS[i: i + 2 + i % 6]) for i in range(0, 24, 2)]  # 12 prompts, 2-7 words
MAX_NEW = 24
TARGETS = ("gpt2", "llama", "qwen3", "qwen3-window")


def windowed_qwen3(directory, tokenizer):
    """A random Qwen3 whose second and third layers attend a sliding window of 6 positions."""
    torch.manual_seed(7)
    eos = tokenizer.eos_token_id
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                      bos_token_id=eos, eos_token_id=eos, initializer_range=0.2, tie_word_embeddings=False,
                      use_sliding_window=True, sliding_window=6, max_window_layers=1)
    Qwen3ForCausalLM(cfg).save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


def differing(result, ref) -> list[int]:
    return [i for i, (got, want) in enumerate(zip(result.outputs, ref.outputs)) if got.tokens != want.tokens]
