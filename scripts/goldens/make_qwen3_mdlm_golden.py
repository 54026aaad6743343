"""Make tests/data/qwen3_mdlm_tiny/ once, with the REFERENCE A2D-Qwen3 code (ZHZisZZ/dllm:
dllm/pipelines/a2d/models/qwen3/modeling_qwen3.py and the MDLMSampler of dllm/core/samplers/):
a tiny random masked-diffusion Qwen3 in the published layout of dllm-hub/Qwen3-0.6B-diffusion-mdlm-v0.1
(config.json + model.safetensors) and the reference's logits and greedy drafts on fixed inputs, which
tests/test_a2d.py compares with specdiff's drafter. Not run by CI; nothing of specdiff is imported.

    git clone --no-checkout https://github.com/ZHZisZZ/dllm /tmp/dllm
    git -C /tmp/dllm sparse-checkout set dllm && git -C /tmp/dllm checkout --detach ca17675
    python -m venv /tmp/ref4570 --system-site-packages
    /tmp/ref4570/bin/pip install transformers==4.57.0          # the version the reference pins
    /tmp/ref4570/bin/python scripts/goldens/make_qwen3_mdlm_golden.py --reference /tmp/dllm \
        --out tests/data/qwen3_mdlm_tiny

The reference files run unmodified, imported from the checkout by file path; the `dllm` package's
own __init__ (which pulls in its training and data stack) is bypassed by registering bare `dllm`
and `dllm.core` packages over the checkout's folders, so `dllm.core.samplers` imports as shipped.

What it does (weights random, from fixed seeds; MASK = 250 past a 250-token vocabulary, 256 rows,
as `<|mask|>` 151669 lies past Qwen3's 151669 tokens in 151936 rows):
1. A2DQwen3LMHeadModel (2 layers, hidden 32, 4 heads / 2 KV heads, head_dim 16, tied embedding
   and head as in Qwen3-0.6B; the random recipe of make_dflash_golden.py with the embedding
   scaled by 1/4, else its logits reach 26 and every draft is one token) saved in bf16 under the
   stock Qwen3 keys, `lm_head.weight` included (equal to the embedding), then loaded back with
   from_pretrained in fp32, which must report no missing or unexpected key.
2. Its logits on two rows of 20: 12 random ids + 8 masks; 4 padding ids (attention mask 0, the
   reference's default positions 0..19) + 8 random ids + 8 masks.
3. MDLMSampler's greedy drafts (temperature 0, low_confidence remasking, one block of 8, 4 steps,
   the ids past the vocabulary suppressed) after prompts of 12 and 8 ids (the shorter one
   right-padded with EOS, as the sampler does).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

from make_dflash_golden import randomize, reference_arguments  # the DFlash golden's recipe and options

VOCAB, MASK, ROWS, EOS = 250, 250, 256, 249  # real tokens 0..249 (EOS last), the mask, embedding rows
PROMPT, PADDING, GAMMA, STEPS = 12, 4, 8, 4
EMBED_SCALE = 0.25  # a power of two: the bf16 values stay exact
SHAPE = dict(vocab_size=ROWS, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rope_theta=1000000.0,
             rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=EOS, eos_token_id=EOS)


def load_reference(repo: Path) -> tuple[types.ModuleType, types.ModuleType]:
    """-> (modeling_qwen3, dllm.core.samplers.mdlm) from the checkout, unmodified."""
    for name, folder in (("dllm", repo / "dllm"), ("dllm.core", repo / "dllm" / "core")):
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    path = repo / "dllm/pipelines/a2d/models/qwen3/modeling_qwen3.py"
    spec = importlib.util.spec_from_file_location("a2d_qwen3_reference", path)
    modeling = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(modeling)
    return modeling, importlib.import_module("dllm.core.samplers.mdlm")


def make_checkpoint(modeling: types.ModuleType, directory: Path) -> torch.nn.Module:
    """The tiny model saved as published (bf16, lm_head kept) and loaded back strictly (fp32)."""
    fresh = modeling.A2DQwen3LMHeadModel(modeling.A2DQwen3Config(**SHAPE))
    randomize(fresh, seed=5, bf16=True)
    with torch.no_grad():  # a tied N(0, 1) table puts logits near 26 and every draft on one token
        fresh.model.embed_tokens.weight.mul_(EMBED_SCALE)
    fresh.save_pretrained(directory)  # the config the reference writes (model_type a2d-qwen3)
    config = json.loads((directory / "config.json").read_text())
    config.update(architectures=["A2DQwen3LMHeadModel"], dtype="bfloat16")
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in fresh.state_dict().items()}
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    model, info = modeling.A2DQwen3LMHeadModel.from_pretrained(directory, dtype=torch.float32,
                                                               output_loading_info=True)
    assert not any(info.values()), info
    return model.eval()


def forward_case(model: torch.nn.Module, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Two rows of 20 ids (the second left-padded) -> the reference forward's logits."""
    ids = torch.full((2, PROMPT + GAMMA), MASK)
    ids[0, :PROMPT] = torch.randint(0, EOS, (PROMPT,), generator=g)
    ids[1, :PADDING] = EOS
    ids[1, PADDING:PROMPT] = torch.randint(0, EOS, (PROMPT - PADDING,), generator=g)
    attention = torch.ones_like(ids)
    attention[1, :PADDING] = 0
    with torch.no_grad():
        logits = model(ids, attention_mask=attention).logits
    return {"input_ids": ids, "attention_mask": attention, "logits": logits}


def sampler_case(model: torch.nn.Module, mdlm: types.ModuleType, g: torch.Generator) -> dict[str, torch.Tensor]:
    """MDLMSampler's greedy drafts of GAMMA tokens after prompts of PROMPT and PROMPT - PADDING ids."""
    prompts = [torch.randint(0, EOS, (n,), generator=g) for n in (PROMPT, PROMPT - PADDING)]
    tokenizer = types.SimpleNamespace(mask_token_id=MASK, bos_token_id=EOS, eos_token_id=EOS)  # all it reads
    sampler = mdlm.MDLMSampler(model=model, tokenizer=tokenizer)
    canvas = sampler.sample(prompts, mdlm.MDLMSamplerConfig(
        max_new_tokens=GAMMA, block_size=GAMMA, steps=STEPS, temperature=0.0, remasking="low_confidence",
        suppress_tokens=list(range(VOCAB, ROWS))))
    drafts = torch.stack([canvas[i, len(p):len(p) + GAMMA] for i, p in enumerate(prompts)])
    prompt_ids = torch.full((2, PROMPT), EOS)
    for i, p in enumerate(prompts):
        prompt_ids[i, PROMPT - len(p):] = p  # stored left-padded
    return {"sampler_prompts": prompt_ids, "sampler_drafts": drafts}


def main() -> None:
    args, commit = reference_arguments(__doc__.splitlines()[0], "ZHZisZZ/dllm", "tests/data/qwen3_mdlm_tiny")
    modeling, mdlm = load_reference(args.reference)
    torch.manual_seed(0)
    (args.out / "draft").mkdir(parents=True, exist_ok=True)
    model = make_checkpoint(modeling, args.out / "draft")
    g = torch.Generator().manual_seed(6)
    tensors = {**forward_case(model, g), **sampler_case(model, mdlm, g)}
    metadata = {"reference": f"ZHZisZZ/dllm@{commit} modeling_qwen3.py + core/samplers/mdlm.py",
                "transformers": transformers.__version__, "torch": torch.__version__,
                "sampler": json.dumps({"max_new_tokens": GAMMA, "block_size": GAMMA, "steps": STEPS,
                                       "temperature": 0.0, "remasking": "low_confidence",
                                       "suppress_tokens": [VOCAB, ROWS]})}
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(args.out / "golden.safetensors"),
              metadata=metadata)
    print(json.dumps({"reference": commit, "transformers": transformers.__version__,
                      "logit_scale": float(tensors["logits"].abs().max()),
                      "drafts": tensors["sampler_drafts"].tolist()}))


if __name__ == "__main__":
    main()
