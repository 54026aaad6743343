"""GGUF files as llama.cpp writes them (the gguf package's writer, Q / K rows permuted for its rotary
layout, the embedding Q8_0-quantized), for the GGUF loading and cache tests (tests/test_gguf.py,
tests/test_cache_repair.py). Import it after pytest.importorskip("gguf")."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch

from tiny import make_llama

CHAT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """HF's q / k rows -> llama.cpp's (its convert script's permutation; the loader undoes it)."""
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def q8_0(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(quantized bytes, what they dequantize to)."""
    q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    return q, gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0).reshape(w.shape)


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q / k rows -> HF's (permute undone)."""
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def write_gguf(model, tokenizer, path: Path, metadata: dict | None = None,
               layers: str | None = None) -> dict[str, torch.Tensor]:
    """The model as a GGUF file -> the weights a reader must find (the embedding as Q8_0 restores it);
    `metadata` {key: (value, GGUFValueType)} replaces fields of the header (malformed files);
    `layers`: the GGML type of the layers' matrices (e.g. "Q4_1"; default fp32)."""
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
            heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}.get(cpp)
            if heads:
                t = permute(t, heads)
            if layers is None or t.ndim == 1:
                w.add_tensor(f"blk.{i}.{cpp}.weight", np.ascontiguousarray(t))
                continue
            kind = gguf.GGMLQuantizationType[layers]
            q = gguf.quants.quantize(np.ascontiguousarray(t), kind)
            w.add_tensor(f"blk.{i}.{cpp}.weight", q, raw_shape=q.shape, raw_dtype=kind)
            restored = gguf.quants.dequantize(q, kind).reshape(t.shape)
            restored = unpermute(restored, heads) if heads else restored
            expected[f"model.layers.{i}.{hf}.weight"] = torch.from_numpy(np.ascontiguousarray(restored))
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


def llama_gguf_files(tiny, root: Path) -> tuple[Path, dict[str, torch.Tensor], Path]:
    """A tiny Llama over tiny's tokenizer written in `root` as a GGUF file -> (GGUF file, the weights
    it holds, the HF directory of those weights)."""
    model_dir = make_llama(root / "hf", tiny.tokenizer, scale=10)
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir)
    expected = write_gguf(model, tiny.tokenizer, root / "tiny.Q8_0.gguf")
    model.load_state_dict(expected)
    model.save_pretrained(root / "reference")
    tiny.tokenizer.save_pretrained(root / "reference")
    return root / "tiny.Q8_0.gguf", expected, root / "reference"
