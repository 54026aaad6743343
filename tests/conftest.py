"""Shared fixtures: tiny tokenizer, targets and drafters, built once per session in a temp dir."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from transformers.utils import logging as hf_logging

from tiny import as_trained, make_gpt2, make_gpt_neo, make_tokenizer

torch.set_num_threads(1)
os.environ["SPECDIFF_PAIR"] = "demo"  # the suite's default pair, whether or not smol's target is installed
hf_logging.disable_progress_bar()
hf_logging.set_verbosity_error()


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> SimpleNamespace:
    """Paths of tiny models sharing one 320-token byte-level BPE tokenizer:
    gpt2 (head padded to a multiple of 64 rows: 320 for 300 tokens), neo, ar (a smaller GPT-2 drafter),
    drafter (a random diffusion drafter from `drafter init`)."""
    from specdiff.tools.drafter_init import init_drafter

    root = tmp_path_factory.mktemp("tiny")
    tok = make_tokenizer(root / "tokenizer", vocab_size=300)
    ns = SimpleNamespace(root=root, tokenizer=tok, tokenizer_dir=root / "tokenizer")
    ns.gpt2 = make_gpt2(root / "gpt2", tok, scale=10)
    ns.neo = make_gpt_neo(root / "neo", tok, scale=10, seed=1)
    ns.ar = make_gpt2(root / "ar", tok, seed=2, layers=1, scale=10)
    ns.drafter = as_trained(init_drafter(str(ns.gpt2), root / "drafter", layers=1, dim=32, heads=2, context=16))
    return ns
