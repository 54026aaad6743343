"""Tiny models built in code and saved exactly as hub models are (save_pretrained), so tests load
them through the same code path as real checkpoints."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (AutoTokenizer, GPT2Config, GPT2LMHeadModel, GPTNeoConfig, GPTNeoForCausalLM, LlamaConfig,
                          LlamaForCausalLM, PreTrainedTokenizerFast)

EOS = "<|endoftext|>"
TEXT = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with one step.
To be, or not to be, that is the question: whether it is nobler in the mind to suffer the slings
and arrows of outrageous fortune, or to take arms against a sea of troubles. All the world is a
stage, and all the men and women merely players. In the beginning was the word. It was the best of
times, it was the worst of times. Call me Ishmael. The sea was calm and the sky was grey and blue.
def main():\n    print("hello world")\n    return 0\nfor i in range(10): total += i * 2
"""


def make_tokenizer(directory: Path, vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on TEXT, with <|endoftext|> as its last id."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([TEXT] * 4, trainer)
    tok.add_special_tokens([EOS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS)
    fast.save_pretrained(str(directory))
    return fast


def _save(model, tokenizer, directory: Path) -> Path:
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


def make_gpt2(directory: Path, tokenizer, *, seed: int = 0, layers: int = 2, dim: int = 32,
              heads: int = 2, n_positions: int = 128, pad_to: int = 64, scale: float = 1.0) -> Path:
    """A random GPT-2 whose head is padded to a multiple of `pad_to` rows (like 50257 -> 50304)."""
    torch.manual_seed(seed)
    vocab = -(-len(tokenizer) // pad_to) * pad_to
    eos = tokenizer.eos_token_id
    cfg = GPT2Config(vocab_size=vocab, n_positions=n_positions, n_embd=dim, n_layer=layers, n_head=heads,
                     bos_token_id=eos, eos_token_id=eos, initializer_range=0.02 * scale)
    return _save(GPT2LMHeadModel(cfg), tokenizer, directory)


def make_gpt_neo(directory: Path, tokenizer, *, seed: int = 0, dim: int = 32, heads: int = 2,
                 window: int = 8, n_positions: int = 128, scale: float = 1.0) -> Path:
    """A random GPT-Neo alternating global and local (windowed) attention."""
    torch.manual_seed(seed)
    eos = tokenizer.eos_token_id
    cfg = GPTNeoConfig(vocab_size=len(tokenizer), hidden_size=dim, num_layers=2, num_heads=heads,
                       attention_types=[[["global", "local"], 1]], window_size=window,
                       max_position_embeddings=n_positions, bos_token_id=eos, eos_token_id=eos,
                       initializer_range=0.02 * scale)
    return _save(GPTNeoForCausalLM(cfg), tokenizer, directory)


def make_llama(directory: Path, tokenizer, *, seed: int = 0, dim: int = 32, heads: int = 4,
               n_positions: int = 128, scale: float = 1.0, tied: bool = False) -> Path:
    """A random Llama-style model: rotary positions, RMSNorm, grouped-query attention (2 KV heads);
    tied: the head shares the embedding (as SmolLM2's does)."""
    torch.manual_seed(seed)
    eos = tokenizer.eos_token_id
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=dim, intermediate_size=2 * dim, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=2, max_position_embeddings=n_positions,
                      bos_token_id=eos, eos_token_id=eos, initializer_range=0.02 * scale, tie_word_embeddings=tied)
    return _save(LlamaForCausalLM(cfg), tokenizer, directory)


def as_trained(drafter: Path) -> Path:
    """Drop the `untrained` mark `drafter init` writes: the suite's random drafters stand in for
    trained ones, whose runs say nothing on stderr (test_defaults checks the warning itself)."""
    config = json.loads((drafter / "config.json").read_text())
    config.pop("untrained", None)
    (drafter / "config.json").write_text(json.dumps(config))
    return drafter


def with_defaults(drafter: Path, out: Path, defaults) -> str:
    """A copy of the drafter directory whose config.json records these draft `defaults`."""
    shutil.copytree(drafter, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "defaults": defaults}))
    return str(out)


def make_qwen3(directory: Path, tokenizer, *, seed: int = 0, dim: int = 32, heads: int = 4, layers: int = 3,
               n_positions: int = 128, scale: float = 1.0) -> Path:
    """A random Qwen3: per-head q/k norms, grouped-query attention (2 KV heads), untied head."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    eos = tokenizer.eos_token_id
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=dim, intermediate_size=2 * dim, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=2, head_dim=dim // heads,
                      max_position_embeddings=n_positions, bos_token_id=eos, eos_token_id=eos,
                      initializer_range=0.02 * scale, tie_word_embeddings=False)
    return _save(Qwen3ForCausalLM(cfg), tokenizer, directory)


def make_dflash(directory: Path, target: Path, *, block_size: int = 8, layers: int = 1,
                target_layer_ids: tuple[int, ...] = (0, 1), seed: int = 0, scale: float = 1.0) -> Path:
    """A random DFlash drafter for the target saved at `target`, in the published format
    (nets.dflash.save_dflash: config.json with dflash_config, model.safetensors under no prefix; no
    tokenizer): Qwen3 draft layers of the target's hidden size, reading its layers
    `target_layer_ids`; its mask token is the last row of the target's head."""
    from transformers import AutoConfig, Qwen3Config

    from specdiff.nets.dflash import DFlashNet, DFlashSpec, save_dflash

    config = AutoConfig.from_pretrained(str(target))
    hidden, rows = config.hidden_size, config.vocab_size
    torch.manual_seed(seed)
    draft = Qwen3Config(vocab_size=rows, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                        max_position_embeddings=getattr(config, "max_position_embeddings", 128),
                        initializer_range=0.02 * scale)
    net = DFlashNet(draft, len(target_layer_ids))
    with torch.no_grad():
        for name, p in net.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.02 * scale)
    directory.mkdir(parents=True)
    save_dflash(directory, net, DFlashSpec(block_size, rows - 1, target_layer_ids, config.num_hidden_layers))
    return directory


CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")  # a minimal chat template


def with_chat(model: Path, directory: Path, *, eos_pad: bool = False) -> Path:
    """A copy of `model` in `directory` whose tokenizer has CHAT as its chat template (eos_pad: its
    eos also its pad token, as SmolLM2 pads)."""
    shutil.copytree(model, directory)
    tok = AutoTokenizer.from_pretrained(str(directory))
    tok.chat_template = CHAT
    if eos_pad:
        tok.pad_token = tok.eos_token
    tok.save_pretrained(str(directory))
    return directory


def target_paths(tiny, prefix: str) -> dict[str, Path]:
    """The drafter tests' three targets: the tiny GPT-2, a Llama and a Qwen3 made in directories
    named with `prefix`, so that modules never rebuild each other's."""
    return {"gpt2": tiny.gpt2, "llama": make_llama(tiny.root / f"{prefix}-llama", tiny.tokenizer, scale=10, seed=4),
            "qwen3": make_qwen3(tiny.root / f"{prefix}-qwen3", tiny.tokenizer, scale=10, seed=5)}


def dflash_pairs(tiny, prefix: str, paths: dict[str, Path] | None = None) -> dict:
    """The DFlash tests' targets, loaded, each beside a random DFlash drafter made for it (key
    "<name>-dflash"): target_paths(tiny, prefix) (or `paths`)."""
    from specdiff import load_drafter, load_target

    paths = paths or target_paths(tiny, prefix)
    found = {}
    for name, path in paths.items():
        found[name] = load_target(str(path))
        found[f"{name}-dflash"] = load_drafter(str(make_dflash(tiny.root / f"{prefix}-{name}-dflash", path,
                                                               scale=10, seed=6)))
    return found


def make_eagle3(directory: Path, target: Path, *, layer_ids: tuple[int, ...] | None = (0, 1, 1),
               draft_size: int | None = 200, embedding: bool = True, seed: int = 0, scale: float = 1.0) -> Path:
    """A random EAGLE-3 head for the target saved at `target`, in the published format
    (nets.eagle3.save_eagle3: LlamaForCausalLMEagle3, model.safetensors with d2t / t2d; no
    tokenizer): one Llama layer of the target's width, reading its layers `layer_ids` (None: the
    config names none), a draft vocabulary of `draft_size` random ids of the target's tokenizer
    (the EOS among them; None: every row of the target's head, the identity map); `embedding`: a
    copy of the target's input embedding, else none."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from specdiff.nets.eagle3 import Eagle3Net, Eagle3Spec, save_eagle3

    config = AutoConfig.from_pretrained(str(target))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(target))
    hidden, rows = config.hidden_size, config.vocab_size
    generator = torch.Generator().manual_seed(seed)
    if draft_size is None:
        ids = torch.arange(rows)
    else:
        ids = torch.randperm(len(tokenizer) - 1, generator=generator)[:draft_size - 1]
        ids = torch.cat([ids, torch.tensor([tokenizer.eos_token_id])]).unique().sort().values
    layer = LlamaConfig(vocab_size=rows, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=getattr(config, "max_position_embeddings", 128))
    net = Eagle3Net(layer, Eagle3Spec(rows, len(ids), hidden, layer_ids), embedding=embedding)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if p.dim() == 2 and name != "embed_tokens.weight":
                p.normal_(0, 0.02 * scale, generator=generator)
        if net.embed_tokens is not None:
            model = AutoModelForCausalLM.from_pretrained(str(target))
            net.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
        net.d2t.copy_(ids - torch.arange(len(ids)))
        net.t2d[ids] = True
    save_eagle3(directory, net)
    return directory


def small_dflash_net(V: int):
    """A DFlash net of one layer, width 16, over a V-row vocabulary, random (normal 0.3, seed 12):
    an adversarial drafter for the chi-square tests' V = 8 target."""
    from transformers import Qwen3Config

    from specdiff.nets.dflash import DFlashNet

    torch.manual_seed(12)
    net = DFlashNet(Qwen3Config(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                max_position_embeddings=16), 1)
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return net.eval()


def make_a2d(directory: Path, tokenizer, *, seed: int = 0, dim: int = 32, heads: int = 4, layers: int = 2,
             n_positions: int = 128, scale: float = 1.0) -> Path:
    """A random A2D masked-diffusion Qwen3 laid out as dllm publishes one (nets.a2d.save_a2d): a
    tied head, a copy of `tokenizer` with `<|mask|>` added past its tokens, and embedding rows
    rounded up to a multiple of 8 (Qwen3: 151,936 rows for 151,670 tokens)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from specdiff.nets.a2d import save_a2d

    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"mask_token": "<|mask|>"})
    torch.manual_seed(seed)
    eos = tok.eos_token_id
    cfg = Qwen3Config(vocab_size=-(-len(tok) // 8) * 8, hidden_size=dim, intermediate_size=2 * dim,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=2, head_dim=dim // heads,
                      max_position_embeddings=n_positions, bos_token_id=eos, eos_token_id=eos,
                      initializer_range=0.02 * scale, tie_word_embeddings=True)
    save_a2d(directory, Qwen3ForCausalLM(cfg))
    tok.save_pretrained(str(directory))
    return directory


def hub_snapshot(hub: Path, repo: str, commit: str = "0123456789abcdef0123456789abcdef01234567") -> Path:
    """The snapshot folder of `repo` in a Hugging Face cache rooted at `hub`, its refs/main set
    (the caller fills the folder)."""
    folder = hub / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    return folder / "snapshots" / commit
