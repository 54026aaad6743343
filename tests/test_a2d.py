"""dllm's masked-diffusion Qwen3 drafters (A2D MDLM, issue 23 item 3): the published layout loads
strictly with transformers' own Qwen3 class; its logits and the reference sampler's greedy drafts
equal the reference code's (tests/data/qwen3_mdlm_tiny, made by
scripts/goldens/make_qwen3_mdlm_golden.py; a causal mask or visible padding keys fail it); drafting with it is lossless (greedy output identical to ar on a tiny Qwen3 target,
batched or not; tests/test_sampling_exact.py holds its sampled step to the target's distribution);
the models.yaml entry loads from the Hugging Face cache; refusals."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from specdiff import generate, load_drafter, load_target
from specdiff.drafters.a2d import A2DDrafter
from specdiff.drafters.diffusion import DiffusionProposer
from specdiff.errors import IncompatibleModelsError, LoadError
from specdiff.loading import check_pair
from specdiff.sampling import Sampling
from specdiff_cli.main import cli

from tiny import hub_snapshot, make_a2d, make_qwen3

GOLDEN = "tests/data/qwen3_mdlm_tiny"
VOCAB, MASK, PADDING = 250, 250, 4  # the golden's real tokens, its mask (past them), row 1's left padding
TOLERANCE = 1e-4
IDENTITY_TESTED = ("specdiff",)


def word_tokenizer(vocab: int = VOCAB, eos: bool = True) -> PreTrainedTokenizerFast:
    """`vocab` word tokens t0.. with <|endoftext|> last (the golden's vocabulary), or without an
    end-of-sequence token (decoding then always runs max_new_tokens)."""
    words = {f"t{i}": i for i in range(vocab - eos)} | ({"<|endoftext|>": vocab - 1} if eos else {})
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(words, unk_token="t0")),
                                   eos_token="<|endoftext|>" if eos else None)


@pytest.fixture(scope="module")
def golden() -> dict:
    return load_file(f"{GOLDEN}/golden.safetensors")


@pytest.fixture
def published(tmp_path):
    """The golden checkpoint as dllm publishes one: beside it the tokenizer, `<|mask|>` added last."""
    directory = tmp_path / "a2d"
    shutil.copytree(f"{GOLDEN}/draft", directory)
    tokenizer = word_tokenizer()
    tokenizer.add_special_tokens({"mask_token": "<|mask|>"})
    tokenizer.save_pretrained(str(directory))
    return directory


def test_logits_equal_the_references(published, golden):
    drafter = load_drafter(str(published), dtype="fp32")
    assert isinstance(drafter, A2DDrafter)
    assert (drafter.mask_id, drafter.vocab_size) == (MASK, VOCAB)
    with torch.no_grad():
        x0 = drafter.x0_logits(golden["input_ids"], pad=torch.tensor([0, PADDING]))
        gamma = drafter.x0_logits(golden["input_ids"], 8, torch.tensor([0, PADDING]))
    want = golden["logits"][..., :VOCAB]
    assert (x0[0] - want[0]).abs().max() <= TOLERANCE
    assert (x0[1, PADDING:] - want[1, PADDING:]).abs().max() <= TOLERANCE  # padding queries: never read
    assert torch.equal(gamma, x0[:, -8:])


def test_a_causal_mask_or_visible_padding_miss_the_golden(published, golden):
    """The check can fail: the same network run causally (transformers' own mask), or the padded
    row with its padding keys left visible, differ by far more than the tolerance."""
    drafter = load_drafter(str(published), dtype="fp32")
    want = golden["logits"][..., :VOCAB]
    with torch.no_grad():
        causal = drafter.model(golden["input_ids"][:1]).logits[..., :VOCAB]
        visible = drafter.x0_logits(golden["input_ids"][1:])
    assert (causal[0] - want[0]).abs().max() > 0.1
    assert (visible[0, PADDING:] - want[1, PADDING:]).abs().max() > 0.1


def test_confidence_drafts_equal_the_reference_samplers(published, golden):
    """MDLMSampler, greedy, low_confidence, one block of 8 in 4 steps, ids past the vocabulary
    suppressed == DiffusionProposer with the confidence schedule (the shorter prompt left-padded
    here, right-padded there)."""
    proposer = DiffusionProposer(load_drafter(str(published), dtype="fp32"), "confidence", 4)
    prompts = golden["sampler_prompts"]
    draft = proposer.propose(prompts, 8, Sampling(0.0), None, lengths=torch.tensor([12, 12 - PADDING]))
    assert torch.equal(draft.tokens, golden["sampler_drafts"])
    assert draft.calls == 4


def test_a_file_without_the_tied_head_loads_the_same(published, golden):
    state = load_file(str(published / "model.safetensors"))
    del state["lm_head.weight"]
    save_file(state, str(published / "model.safetensors"), metadata={"format": "pt"})
    with torch.no_grad():
        x0 = load_drafter(str(published), dtype="fp32").x0_logits(golden["input_ids"][:1])
    assert (x0[0] - golden["logits"][0, :, :VOCAB]).abs().max() <= TOLERANCE


def _rewrite_config(directory, **fields):
    config = json.loads((directory / "config.json").read_text()) | fields
    (directory / "config.json").write_text(json.dumps(config))


def test_refusals(published, tmp_path):
    with pytest.raises(LoadError, match="not a target"):
        load_target(str(published))
    broken = tmp_path / "broken"
    shutil.copytree(published, broken)
    state = load_file(str(broken / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(broken / "model.safetensors"))
    with pytest.raises(LoadError, match="missing model.layers.1.mlp.up_proj.weight"):
        load_drafter(str(broken))
    shutil.copy(published / "model.safetensors", broken / "model.safetensors")
    _rewrite_config(broken, num_key_value_heads=3)
    with pytest.raises(LoadError, match="num_key_value_heads 3 does not divide"):
        load_drafter(str(broken))
    _rewrite_config(broken, num_key_value_heads=2, vocab_size=200)
    with pytest.raises(LoadError, match="mask_token_id 250 is not an id of the embedding"):
        load_drafter(str(broken))
    maskless = tmp_path / "maskless"
    shutil.copytree(f"{GOLDEN}/draft", maskless)
    word_tokenizer().save_pretrained(str(maskless))
    with pytest.raises(LoadError, match="needs its tokenizer, with a mask token"):
        load_drafter(str(maskless))


def test_export_and_convert_refuse_it_in_one_line(published, tmp_path):
    for args, says in ((["export", "--drafter", str(published), "--out", str(tmp_path / "out")],
                        "`specdiff export` writes DDiT and DFlash drafter graphs only"),
                       (["drafter", "convert", str(published), "--out", str(tmp_path / "out")],
                        "`drafter convert` rewrites DDiT drafters only")):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output
        assert not (tmp_path / "out").exists()


def test_its_target_may_lack_the_added_mask_token_only(published, tmp_path):
    drafter = load_drafter(str(published))
    target = load_target(str(make_qwen3(tmp_path / "target", word_tokenizer())))
    check_pair(target, drafter)  # the drafter's tokenizer has <|mask|> 250 beside the target's 250 tokens
    other = word_tokenizer()
    other.add_special_tokens({"additional_special_tokens": ["<|x|>"]})
    stranger = load_target(str(make_qwen3(tmp_path / "stranger", other)))
    with pytest.raises(IncompatibleModelsError, match="drafter vocabulary has 250 tokens, target's tokenizer 251"):
        check_pair(stranger, drafter)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny Qwen3 target and a random A2D drafter over 8 tokens and no EOS: drafts are often
    accepted, and every prompt runs its 16 tokens."""
    root, tokenizer = tmp_path_factory.mktemp("a2d-pair"), word_tokenizer(8, eos=False)
    target = load_target(str(make_qwen3(root / "target", tokenizer, scale=10, seed=7)))
    drafter = load_drafter(str(make_a2d(root / "drafter", tokenizer, scale=10, seed=8)))
    return target, drafter


@pytest.mark.parametrize("schedule,steps", [("l2r", 2), ("confidence", 3), ("oneshot", 1)])
def test_greedy_output_is_the_targets(pair, schedule, steps):
    target, drafter = pair
    g = torch.Generator().manual_seed(0)
    prompts = [" ".join(f"t{i}" for i in torch.randint(0, 8, (n,), generator=g).tolist()) for n in range(2, 22)]
    ref = generate(prompts, target=target, method="ar", max_new_tokens=16)
    for batch_size in (1, 7):
        got = generate(prompts, target=target, drafter=drafter, method="specdiff", gamma=4, steps=steps,
                       schedule=schedule, max_new_tokens=16, batch_size=batch_size)
        assert [o.tokens for o in got.outputs] == [o.tokens for o in ref.outputs]
        assert sum(o.metrics.accepted for o in got.outputs) > 0  # acceptance is exercised, not only rejection


def test_the_models_yaml_entry_loads_from_the_hub_cache(published, tmp_path, monkeypatch):
    import huggingface_hub.constants

    shutil.copytree(published, hub_snapshot(tmp_path / "hub", "dllm-hub/Qwen3-0.6B-diffusion-mdlm-v0.1"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    drafter = load_drafter("qwen3-0.6b-mdlm")
    assert isinstance(drafter, A2DDrafter) and drafter.source == "qwen3-0.6b-mdlm" and drafter.mask_id == MASK
