"""Make tests/data/dflash_tiny/ once, with the REFERENCE DFlash code (z-lab/dflash, dflash/model.py):
a tiny random draft checkpoint in the published format (config.json + model.safetensors, bf16, keys
without a prefix) and the reference's draft logits on fixed inputs, which tests/test_dflash.py
compares with specdiff's own network. Not run by CI; nothing of specdiff is imported here.

    git clone https://github.com/z-lab/dflash /tmp/dflash && git -C /tmp/dflash checkout 44947fb
    python -m venv /tmp/ref457 --system-site-packages
    /tmp/ref457/bin/pip install transformers==4.57.1          # the version the reference pins
    /tmp/ref457/bin/python scripts/goldens/make_dflash_golden.py --reference /tmp/dflash \
        --out tests/data/dflash_tiny

What it does (all weights random, from fixed seeds):
1. A tiny Qwen3 target (transformers' Qwen3ForCausalLM: 6 layers, hidden 32, 4 heads / 2 KV heads,
   head_dim 16, vocabulary 256, untied head); two prompts of 12 random ids, continued greedily by
   the target to 17 tokens; its hidden states over the first 16 (HF `hidden_states`, 7 entries).
2. A draft config.json laid out as the published Qwen3-8B-DFlash-b16 one (architectures
   DFlashDraftModel, auto_map, block_size 16, num_target_layers 6, dflash_config {mask_token_id 255,
   target_layer_ids [1, 3, 4]}: three target features for two draft layers), random weights rounded
   to bf16 and saved as bf16, then loaded back with the reference class's from_pretrained (fp32),
   which must report no missing or unexpected key.
3. The reference loop's draft calls (`dflash_generate`): round 1 at start 12 (context = features of
   positions 0..11, block [token 12, mask x 15] at positions 12..27, a DynamicCache, then
   crop(12)); round 2 at start 16 on the same cache (new context rows 12..15, positions 12..31);
   logits = target lm_head(draft output rows 1..15). Also round 1 with rope_scaling yarn and linear
   (row 0 only).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

VOCAB, MASK, HIDDEN, BLOCK = 256, 255, 32, 16
PROMPT, START2 = 12, 16  # round 1 starts at the first token after the prompt; round 2 four tokens later
TARGET = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=6,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
              rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
ROPE_VARIANTS = {"yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
                 "linear": {"rope_type": "linear", "factor": 2.0}}


def draft_config() -> dict:
    """The published layout (SpecForge configs/qwen3-8b-dflash.json, z-lab's 8B card), scaled down."""
    layers = 2
    return {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": BLOCK,
        "bos_token_id": 1,
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": [1, 3, 4]},
        "dtype": "bfloat16",
        "eos_token_id": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "layer_types": ["full_attention"] * layers,
        "max_position_embeddings": 128,
        "max_window_layers": layers,
        "model_type": "qwen3",
        "num_attention_heads": 4,
        "num_hidden_layers": layers,
        "num_key_value_heads": 2,
        "num_target_layers": TARGET["num_hidden_layers"],
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "transformers_version": transformers.__version__,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }


def randomize(model: torch.nn.Module, seed: int, bf16: bool) -> None:
    """Every parameter from one generator: norms 1 + 0.2 N(0, 1) (so that skipping or adding a
    norm shows), embeddings N(0, 1), other matrices N(0, 1 / fan_in)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g)
            if p.ndim == 1:
                value = 1 + 0.2 * noise
            elif "embed_tokens" in name:
                value = noise
            else:
                value = noise / math.sqrt(p.shape[1])
            p.copy_(value.to(torch.bfloat16).float() if bf16 else value)


def load_reference(path: Path):
    spec = importlib.util.spec_from_file_location("dflash_reference_model", path / "dflash" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def draft_round(ref, draft, target, tokens, features, start, cache):
    """One draft call exactly as dflash_generate makes it -> logits (B, BLOCK - 1, V)."""
    block = torch.full((tokens.shape[0], BLOCK), MASK, dtype=torch.long)
    block[:, 0] = tokens[:, start]
    positions = torch.arange(64)[None]
    out = draft(target_hidden=features, noise_embedding=target.model.embed_tokens(block),
                position_ids=positions[:, cache.get_seq_length(): start + BLOCK], past_key_values=cache,
                use_cache=True, is_causal=False)
    logits = target.lm_head(out[:, 1 - BLOCK:, :])
    cache.crop(start)
    return logits


def reference_arguments(description: str, repository: str, out: str) -> tuple[argparse.Namespace, str]:
    """A golden script's options (--reference: a checkout of `repository`, --out) and the
    checkout's commit."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--reference", type=Path, required=True, help=f"a checkout of {repository}")
    parser.add_argument("--out", type=Path, default=Path(out))
    args = parser.parse_args()
    commit = subprocess.run(["git", "-C", str(args.reference), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    return args, commit


def main() -> None:
    args, commit = reference_arguments(__doc__.splitlines()[0], "z-lab/dflash", "tests/data/dflash_tiny")
    ref = load_reference(args.reference)
    torch.manual_seed(0)

    target = Qwen3ForCausalLM(Qwen3Config(**TARGET)).eval()
    randomize(target, seed=1, bf16=False)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, MASK, (2, PROMPT), generator=g)
    with torch.no_grad():
        while tokens.shape[1] < START2 + 1:  # greedy continuation: the tokens a verify would accept
            nxt = target(tokens).logits[:, -1].argmax(-1)
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        hidden = target(tokens[:, :START2], output_hidden_states=True).hidden_states

    draft_dir = args.out / "draft"
    draft_dir.mkdir(parents=True, exist_ok=True)
    config = draft_config()
    (draft_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    fresh = ref.DFlashDraftModel(Qwen3Config.from_pretrained(draft_dir))
    randomize(fresh, seed=3, bf16=True)
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in fresh.state_dict().items()}
    save_file(state, str(draft_dir / "model.safetensors"), metadata={"format": "pt"})
    draft, info = ref.DFlashDraftModel.from_pretrained(draft_dir, dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), info  # every key of the file is the reference's, and nothing is missing
    draft.eval()

    features = ref.extract_context_feature(hidden, draft.target_layer_ids)  # (2, 16, 3 * HIDDEN)
    with torch.no_grad():
        cache = DynamicCache()
        round1 = draft_round(ref, draft, target, tokens, features[:, :PROMPT], PROMPT, cache)
        round2 = draft_round(ref, draft, target, tokens, features[:, PROMPT:START2], START2, cache)
        cacheless2 = draft_round(ref, draft, target, tokens, features[:, :START2], START2, DynamicCache())
        variants = {}
        for name, scaling in ROPE_VARIANTS.items():
            with tempfile.TemporaryDirectory() as tmp:
                shutil.copy(draft_dir / "model.safetensors", tmp)
                Path(tmp, "config.json").write_text(json.dumps({**copy.deepcopy(config), "rope_scaling": scaling}))
                variant = ref.DFlashDraftModel.from_pretrained(tmp, dtype=torch.float32).eval()
                variants[name] = draft_round(ref, variant, target, tokens[:1], features[:1, :PROMPT], PROMPT,
                                             DynamicCache())

    tensors = {"tokens": tokens, "hidden_states": torch.stack(hidden), "embed_tokens": target.model.embed_tokens.weight,
               "lm_head": target.lm_head.weight, "logits_round1": round1, "logits_round2": round2,
               **{f"logits_{name}": logits for name, logits in variants.items()}}
    metadata = {"reference": f"z-lab/dflash@{commit} dflash/model.py", "transformers": transformers.__version__,
                "torch": torch.__version__, "starts": json.dumps([PROMPT, START2]),
                "rope_variants": json.dumps(ROPE_VARIANTS)}
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(args.out / "golden.safetensors"),
              metadata=metadata)
    print(json.dumps({"reference": commit, "transformers": transformers.__version__,
                      "round2_cached_vs_cacheless": float((round2 - cacheless2).abs().max()),
                      "logit_scale": float(round1.abs().max())}))


if __name__ == "__main__":
    main()
