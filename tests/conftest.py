"""Shared fixtures: tiny tokenizer, targets and drafters, built once per session in a temp dir, and
the fixtures several test modules share.

The layout of tests/ (tests/test_layout.py holds it): a test module (test_*.py) holds tests and
is imported by no other module; what several test modules share lives beside them, in
- helper modules, imported by name:
  tiny.py: the tiny models on disk;
  exactness.py: the chi-square machinery over the V = 8 models (imported as `exact`);
  batching_runs.py, dflash_runs.py, eagle3_runs.py, tree_runs.py: the prompts and checks of
    test_batching, test_dflash_method, test_eagle3_method and test_trees that other test modules
    repeat (compiled, on ONNX Runtime, with tree sizes);
  cli_checks.py: the CLI invoked in-process and its one-line errors;
  gguf_files.py: GGUF files as llama.cpp writes them;
  fake_tensorrt.py: a fake `tensorrt` module;
- fixture modules: this one (conftest.py), for every test module; exported.py, a plugin module
  that a test module loads with `pytest_plugins = ["exported"]`: the tiny models' ONNX exports.
A fixture returns what it builds and adds nothing to another's result (`tiny` is the same
whichever fixture ran first).

The default suite's time: tests/durations.json lists the default cases that took longer than
scripts/test_durations.py's limit when it last measured them (seconds, the id pytest prints); this
module marks each `long`, which the default run skips (pyproject addopts) and .ci/run runs as a
step of its own, so `python -m pytest` stays within a few minutes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers.utils import logging as hf_logging

from tiny import as_trained, make_gpt2, make_gpt_neo, make_tokenizer

torch.set_num_threads(1)
os.environ["SPECDIFF_PAIR"] = "demo"  # the suite's default pair, whether or not smol's target is installed
hf_logging.disable_progress_bar()
hf_logging.set_verbosity_error()
LONG = set(json.loads((Path(__file__).parent / "durations.json").read_text(encoding="utf-8")))


@pytest.fixture(scope="session", autouse=True)
def tuned_records(tmp_path_factory) -> None:
    """`specdiff tune` records of the user's own (the user cache's tuned/) stay out of the suite's
    runs, in-process and in the processes it starts."""
    os.environ["SPECDIFF_TUNED"] = str(tmp_path_factory.mktemp("tuned"))


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks `long` the cases tests/durations.json lists (see the module docstring)."""
    for item in items:
        if item.nodeid in LONG:
            item.add_marker(pytest.mark.long)


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


@pytest.fixture(scope="module")
def target():
    """The V = 8 target of the chi-square tests (exactness.py), a GPT-2 model."""
    import exactness as exact

    return exact.v8_gpt2(0, 60.0)


@pytest.fixture(scope="module")
def drafters() -> dict:
    """The V = 8 drafters of the chi-square tests: diffusion, ar and a2d (exactness.v8_drafters)."""
    import exactness as exact

    return exact.v8_drafters()


@pytest.fixture(scope="module")
def v8_dflash() -> tuple:
    """The V = 8 target (a CausalLMTarget) and a DFlash drafter over it (exactness.v8_dflash)."""
    import exactness as exact

    return exact.v8_dflash()


@pytest.fixture(scope="module")
def llama_gguf(tiny, tmp_path_factory):
    """(GGUF file, the weights it holds, the HF directory of those weights): a tiny Llama as llama.cpp
    writes it (gguf_files.py; a module asking for it skips first without the gguf package)."""
    from gguf_files import llama_gguf_files

    return llama_gguf_files(tiny, tmp_path_factory.mktemp("gguf"))
