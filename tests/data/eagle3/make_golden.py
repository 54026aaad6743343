"""Make tests/data/eagle3 once with the reference EAGLE-3 head, SpecForge's LlamaForCausalLMEagle3
(specforge/modeling/draft/llama3_eagle.py); not part of specdiff and not run by the tests.

The reference files run verbatim, read from a SpecForge checkout (or bare mirror) at --commit:
llama3_eagle.py, draft/base.py, draft/registry.py and modeling/_mask_utils.py. The package
modules they import for training only (flex attention masks, sequence-parallel groups, a
rank-aware print) are stubs here; the SDPA path used below calls none of them. TORCHDYNAMO_DISABLE
turns the reference's @torch.compile decorators into plain calls. Nothing of specdiff is imported.

    python tests/data/eagle3/make_golden.py --reference /path/to/SpecForge[.git] --out tests/data/eagle3
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TORCHDYNAMO_DISABLE"] = "1"

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

COMMIT = "a6b6b0230009d15ec2a97a57384e6f53f0f96946"
VERBATIM = ("specforge/modeling/_mask_utils.py", "specforge/modeling/draft/base.py",
            "specforge/modeling/draft/registry.py", "specforge/modeling/draft/llama3_eagle.py")
STUBS = {
    "specforge/__init__.py": "",
    "specforge/modeling/__init__.py": "",
    "specforge/modeling/draft/__init__.py": "",
    "specforge/utils.py": "def print_with_rank(*args, **kwargs):\n    pass\n",
    "specforge/distributed.py": ("def get_sp_ring_group():\n    raise NotImplementedError\n\n"
                                 "def get_sp_ulysses_group():\n    raise NotImplementedError\n"),
    "specforge/modeling/draft/flex_attention.py": (
        "def _training_only(*args, **kwargs):\n    raise NotImplementedError\n\n"
        "compile_friendly_create_block_mask = compile_friendly_flex_attention = generate_eagle3_mask = _training_only\n"),
}
V, N, H, HT, T, B, STEPS = 64, 40, 32, 24, 7, 2, 3
# Llama 3.1's rope_scaling, with an original length short enough that 3 of the 4 frequencies of
# head_dim 8 are scaled at these positions
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
# laid out as SpecForge's configs/llama3-8B-eagle3.json (transformers 4 field names), plus a
# target_hidden_size other than hidden_size and the layer ids SpecForge reads from eagle_config
CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": H, "initializer_range": 0.02, "intermediate_size": 64, "max_position_embeddings": 64,
    "model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
    "pad_token_id": 0, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "torch_dtype": "float32", "use_cache": True, "vocab_size": V, "draft_vocab_size": N, "target_hidden_size": HT,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 3]},
}


def git_show(reference: Path, commit: str, path: str) -> str:
    git_dir = reference if (reference / "HEAD").is_file() and not (reference / ".git").exists() else reference / ".git"
    return subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def reference_module(reference: Path, commit: str, root: Path):
    for path, text in STUBS.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    for path in VERBATIM:
        (root / path).write_text(git_show(reference, commit, path))
    sys.path.insert(0, str(root))
    import specforge.modeling.draft.llama3_eagle as eagle
    return eagle


def randomize(model, generator):
    """Norms 1 + 0.2 N(0, 1), matrices N(0, 1 / fan_in), the embedding N(0, 1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if p.dim() == 1:
                p.copy_(1 + 0.2 * noise)
            elif name == "embed_tokens.weight":
                p.copy_(noise)
            else:
                p.copy_(noise / p.shape[1] ** 0.5)
        ids = torch.randperm(V, generator=generator)[:N].sort().values
        model.d2t.copy_(ids - torch.arange(N))
        model.t2d.zero_()
        model.t2d[ids] = True


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", type=Path, required=True)
    parser.add_argument("--commit", default=COMMIT)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import LlamaConfig
    with tempfile.TemporaryDirectory() as tmp:
        eagle = reference_module(args.reference, args.commit, Path(tmp))
        config = LlamaConfig(**CONFIG)
        model = eagle.LlamaForCausalLMEagle3(config).eval()
        generator = torch.Generator().manual_seed(7)
        randomize(model, generator)
        draft = args.out / "draft"
        draft.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(draft / "model.safetensors"),
                  metadata={"format": "pt"})
        (draft / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
        for path in (draft / "model.safetensors", draft / "config.json"):
            path.chmod(0o644)

        ids = torch.randint(0, V, (B, T + STEPS - 1), generator=generator)
        features = torch.randn(B, T, 3 * HT, generator=generator)
        import transformers
        metadata = {"reference": f"sgl-project/SpecForge@{args.commit}", "torch": torch.__version__,
                    "transformers": transformers.__version__}
        write(args.out / "golden.safetensors", steps(eagle, model, ids, features), metadata)
        # the same weights under Llama 3.1's RoPE scaling (the published Llama 3.1 heads' rope_scaling)
        scaled = eagle.LlamaForCausalLMEagle3(LlamaConfig(**CONFIG, rope_scaling=LLAMA3)).eval()
        scaled.load_state_dict(model.state_dict())
        write(args.out / "golden-llama3.safetensors", steps(eagle, scaled, ids, features),
              {**metadata, "rope_scaling": json.dumps(LLAMA3)})


def steps(eagle, model, ids, features):
    """The reference's test-time-training steps (see README.md) -> the golden tensors."""
    mask = eagle.prepare_decoder_attention_mask(torch.ones(B, T, dtype=torch.bool), (B, T), features, 0)
    positions = torch.arange(T)[None]
    golden = {"ids": ids, "features": features}
    cache_hidden = [[], []]  # the reference's training-time test: step k row i = a chain of k steps after row i
    with torch.no_grad():
        hidden = model.project_hidden_states(features)
        golden["projected"] = hidden
        for k in range(STEPS):
            embeds = model.embed_input_ids(ids[:, k:k + T])
            hidden = model.backbone(embeds, hidden, cache_hidden, mask, positions, use_cache=False)
            golden[f"out{k}"] = hidden
            golden[f"logits{k}"] = model.compute_logits(hidden)
    return golden


def write(path, golden, metadata):
    save_file({k: v.contiguous() for k, v in golden.items()}, str(path), metadata=metadata)
    path.chmod(0o644)

if __name__ == "__main__":
    main()
