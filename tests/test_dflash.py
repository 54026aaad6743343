"""DFlash drafters as published (nets/dflash.py, drafters/dflash.py): a tiny random checkpoint in
the published format (tests/data/dflash_tiny, made with the reference code: see its README) loads
through load_drafter, and our forward gives the reference's logits within 1e-4 (the issue's
"public-format parity"), with and without the context cache and under yarn / linear RoPE. Each
classic bug (reference doc A6) is a negative control that must fail the same comparison by far.
Then the layer-id rule, the config fallbacks, the refusals, ragged batches and pairing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from specdiff.drafters.dflash import DFlashDrafter
from specdiff.errors import IncompatibleModelsError, LoadError
from specdiff.loading import load_drafter, load_target, pair_models
from specdiff.nets.dflash import build_target_layer_ids, context_features, read_dflash_config
from specdiff.targets.causal import CausalLMTarget

DATA = Path(__file__).parent / "data" / "dflash_tiny"
TOLERANCE = 1e-4  # the target for public-format parity
BROKEN = 1e-2  # a negative control must miss the reference by at least this much (100x the tolerance)
START1, START2, S = 12, 16, 16


@pytest.fixture(scope="module")
def golden() -> dict:
    tensors = load_file(str(DATA / "golden.safetensors"))
    with safe_open(str(DATA / "golden.safetensors"), "pt") as f:
        tensors["meta"] = f.metadata()
    tensors["hidden"] = list(tensors["hidden_states"].unbind(0))
    return tensors


def bound(drafter: DFlashDrafter, golden: dict) -> DFlashDrafter:
    """The drafter reading the tiny target's embedding and head from the golden file."""
    embed = torch.nn.Embedding.from_pretrained(golden["embed_tokens"])
    head = torch.nn.Linear(golden["lm_head"].shape[1], golden["lm_head"].shape[0], bias=False)
    head.weight.data = golden["lm_head"]
    drafter.bind(embed, head)
    return drafter


@pytest.fixture(scope="module")
def drafter(golden) -> DFlashDrafter:
    loaded = load_drafter(str(DATA / "draft"))
    assert isinstance(loaded, DFlashDrafter)
    return bound(loaded, golden)


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def copy_draft(tmp_path: Path, **changes) -> Path:
    """The tiny checkpoint with config.json fields changed (None deletes a field)."""
    directory = tmp_path / "draft"
    shutil.copytree(DATA / "draft", directory)
    config = json.loads((directory / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (directory / "config.json").write_text(json.dumps(config))
    return directory


# --- parity with the reference ---------------------------------------------------------------

def test_the_published_format_loads_exactly(drafter):
    assert (drafter.block_size, drafter.mask_id, drafter.target_layer_ids) == (16, 255, [1, 3, 4])
    assert (drafter.num_target_layers, drafter.vocab_rows) == (6, 256)
    assert drafter.net.fc.weight.dtype == torch.float32  # bf16 on disk, fp32 by default on the CPU
    state = load_file(str(DATA / "draft" / "model.safetensors"))
    assert set(state) == set(drafter.net.state_dict())  # no prefix, nothing else
    assert all(torch.equal(state[k].float(), v) for k, v in drafter.net.state_dict().items())


@torch.no_grad()
def test_logits_match_the_reference(drafter, golden):
    features = drafter.features(golden["hidden"])
    tokens = golden["tokens"]
    round1 = drafter(tokens[:, START1], features[:, :START1], START1)
    assert round1.shape == (2, S - 1, 256) and round1.dtype == torch.float32
    assert diff(round1, golden["logits_round1"]) <= TOLERANCE
    cache = drafter.new_cache()  # the reference's loop: round 1, then round 2 on the same cache
    assert diff(drafter(tokens[:, START1], features[:, :START1], START1, cache), golden["logits_round1"]) <= TOLERANCE
    round2 = drafter(tokens[:, START2], features[:, START1:START2], START2, cache)
    assert cache.length == START2 and diff(round2, golden["logits_round2"]) <= TOLERANCE
    cacheless = drafter(tokens[:, START2], features[:, :START2], torch.tensor([START2, START2]))
    assert diff(cacheless, golden["logits_round2"]) <= TOLERANCE


@pytest.mark.parametrize("variant", ["yarn", "linear"])
@torch.no_grad()
def test_rope_scaling_matches_the_reference(tmp_path, golden, variant):
    scaling = json.loads(golden["meta"]["rope_variants"])[variant]
    drafter = bound(load_drafter(str(copy_draft(tmp_path, rope_scaling=scaling))), golden)
    features = drafter.features(golden["hidden"])
    logits = drafter(golden["tokens"][:1, START1], features[:1, :START1], START1)
    assert diff(logits, golden[f"logits_{variant}"]) <= TOLERANCE
    assert diff(logits, golden["logits_round1"][:1]) > BROKEN  # the scaling is not a no-op here


def _net_logits(drafter: DFlashDrafter, golden: dict, context: torch.Tensor, positions: torch.Tensor,
                anchor_at: int = START1, cache=None) -> torch.Tensor:
    """The network called directly (for the broken variants), block [token, mask x 15]."""
    return _hidden(drafter, golden, context, positions, anchor_at, cache)[:, 1:] @ golden["lm_head"].T


def _hidden(drafter: DFlashDrafter, golden: dict, context: torch.Tensor, positions: torch.Tensor,
            anchor_at: int = START1, cache=None) -> torch.Tensor:
    block = torch.full((2, S), drafter.mask_id)
    block[:, 0] = golden["tokens"][:, anchor_at]
    x = golden["embed_tokens"][block]
    return drafter.net(x, context, positions[None].expand(2, -1), cache)


def broken_variants(drafter: DFlashDrafter, golden: dict) -> dict[str, float]:
    """Max |logits - reference| of each classic bug (reference doc A6)."""
    hidden, ids, ref = golden["hidden"], drafter.target_layer_ids, golden["logits_round1"]
    good = drafter.features(hidden)
    block = torch.arange(START1, START1 + S)

    def run(context: torch.Tensor, context_positions: torch.Tensor, block_positions: torch.Tensor = block) -> float:
        return diff(_net_logits(drafter, golden, context, torch.cat([context_positions, block_positions])), ref)

    out = {
        "layer ids off by one (hidden_states[i])": run(context_features(hidden, [i - 1 for i in ids])[:, :START1],
                                                       torch.arange(START1)),
        "layer ids off by one (hidden_states[i + 2])": run(context_features(hidden, [i + 1 for i in ids])[:, :START1],
                                                           torch.arange(START1)),
        "context includes the anchor position": run(good[:, :START1 + 1], torch.arange(START1 + 1)),
        "context ends one position early": run(good[:, :START1 - 1], torch.arange(START1 - 1)),
        "block positions restart at 0": run(good[:, :START1], torch.arange(START1), torch.arange(S)),
        "context positions restart at 0 (cached round 2)": _cached_round2_restarting(drafter, golden, good),
    }
    layers = list(drafter.net.layers)
    originals = [layer.self_attn.key_values for layer in layers]
    try:  # context rows through the layer's input_layernorm (the block's rows are normed already)
        for layer, original in zip(layers, originals):
            layer.self_attn.key_values = (lambda rows, cos, sin, layer=layer, original=original:
                                          original(layer.input_layernorm(rows) if rows.shape[1] != S else rows, cos, sin))
        out["context through input_layernorm"] = run(good[:, :START1], torch.arange(START1))
    finally:
        for layer in layers:
            del layer.self_attn.key_values
    tied = _hidden(drafter, golden, good[:, :START1], torch.arange(START1 + S))[:, 1:] @ golden["embed_tokens"].T
    out["head = the embedding (tied)"] = diff(tied, ref)
    return out


def _cached_round2_restarting(drafter: DFlashDrafter, golden: dict, good: torch.Tensor) -> float:
    cache = drafter.new_cache()
    drafter(golden["tokens"][:, START1], good[:, :START1], START1, cache)
    positions = torch.cat([torch.arange(START2 - START1), torch.arange(START2, START2 + S)])
    return diff(_net_logits(drafter, golden, good[:, START1:START2], positions, START2, cache), golden["logits_round2"])


@torch.no_grad()
def test_each_classic_bug_fails_the_comparison(drafter, golden):
    """Negative controls: the comparison above would see each of these."""
    misses = broken_variants(drafter, golden)
    assert len(misses) == 8
    assert {name: value for name, value in misses.items() if value <= BROKEN} == {}
    good = drafter.features(golden["hidden"])  # and the unbroken path through the same helper passes
    assert diff(_net_logits(drafter, golden, good[:, :START1], torch.arange(START1 + S)),
                golden["logits_round1"]) <= TOLERANCE


# --- the config ------------------------------------------------------------------------------

def test_the_layer_id_rule_on_the_published_examples():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B / 4B DFlash b16
    assert build_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]
    assert build_target_layer_ids(36, 1) == [18]
    assert build_target_layer_ids(7, 3) == [1, 2, 4]  # Python's round, half to even: 2.5 -> 2


def test_a_config_without_layer_ids_takes_the_rule(tmp_path):
    directory = copy_draft(tmp_path, dflash_config={"mask_token_id": 255})
    assert read_dflash_config(directory)[1].target_layer_ids == (1, 3)  # rule(6 target, 2 draft layers)
    with pytest.raises(LoadError, match=r"model\.safetensors.*shape of fc\.weight: expected \(32, 64\), found \(32, 96\)"):
        load_drafter(str(directory))  # the tiny file's fc reads 3 features, the rule names 2


@torch.no_grad()
def test_top_level_mask_and_layer_ids_are_read(tmp_path, golden, drafter):
    directory = copy_draft(tmp_path, dflash_config=None, mask_token_id=255, target_layer_ids=[1, 3, 4])
    moved = bound(load_drafter(str(directory)), golden)
    assert (moved.mask_id, moved.target_layer_ids) == (255, [1, 3, 4])
    features = moved.features(golden["hidden"])
    assert diff(moved(golden["tokens"][:, START1], features[:, :START1], START1), golden["logits_round1"]) <= TOLERANCE
    nested = read_dflash_config(copy_draft(tmp_path / "b", mask_token_id=7))[1]
    assert nested.mask_token_id == 255  # dflash_config wins over a top-level field


@pytest.mark.parametrize("changes, field", [
    (dict(layer_types=["full_attention", "sliding_attention"], sliding_window=8, use_sliding_window=True), "layer_types"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "rope_scaling type 'dynamic'"),
    (dict(dflash_config={"mask_token_id": 255, "target_layer_ids": [1, 3, 4], "attention_sink_bias": True}),
     "dflash_config.attention_sink_bias"),
    (dict(dflash_config={"mask_token_id": 255, "target_layer_ids": [1, 3, 4], "swa_window_size": 2048}),
     "dflash_config.swa_window_size"),
    (dict(dflash_config={"target_layer_ids": [1, 3, 4]}), "mask_token_id"),
    (dict(dflash_config={"mask_token_id": 256, "target_layer_ids": [1, 3, 4]}), "mask_token_id 256"),
    (dict(dflash_config={"mask_token_id": 255, "target_layer_ids": [1, 3, 6]}), "target_layer_ids"),
    (dict(dflash_config={"mask_token_id": 255}, num_target_layers=None), "num_target_layers"),
    (dict(block_size=1), "block_size"),
    (dict(model_type="llama"), "model_type"),
    (dict(num_key_value_heads=3), "num_key_value_heads"),
])
def test_unsupported_configs_are_refused_naming_file_and_field(tmp_path, changes, field):
    directory = copy_draft(tmp_path, **changes)
    with pytest.raises(LoadError) as e:
        load_drafter(str(directory))
    assert str(directory / "config.json") in str(e.value) and field in str(e.value)


def test_weights_that_do_not_match_are_one_error_naming_the_file(tmp_path):
    directory = copy_draft(tmp_path)
    state = load_file(str(directory / "model.safetensors"))
    del state["layers.1.self_attn.k_norm.weight"]
    state["lm_head.weight"] = torch.zeros(256, 32)
    state["fc.weight"] = state["fc.weight"][:, :64].contiguous()
    save_file(state, str(directory / "model.safetensors"))
    with pytest.raises(LoadError) as e:
        load_drafter(str(directory))
    message = str(e.value)
    assert message.startswith(str(directory / "model.safetensors"))
    assert all(part in message for part in ("missing layers.1.self_attn.k_norm.weight", "unexpected lm_head.weight",
                                            "shape of fc.weight: expected (32, 96), found (32, 64)"))
    (directory / "model.safetensors").unlink()
    with pytest.raises(LoadError, match="model.safetensors: missing"):
        load_drafter(str(directory))


def test_a_mask_embedding_override_is_refused(tmp_path):
    directory = copy_draft(tmp_path)
    torch.save(torch.zeros(32), directory / "mask_embedding.pt")
    with pytest.raises(LoadError, match="mask_embedding.pt: a mask embedding override is not supported"):
        load_drafter(str(directory))


def test_a_dflash_draft_is_not_a_target():
    with pytest.raises(LoadError, match="a DFlash draft .* not a target"):
        load_target(str(DATA / "draft"))


def test_a_narrow_dtype_keeps_rope_frequencies_in_fp32(golden):
    drafter = load_drafter(str(DATA / "draft"), dtype="bf16")
    assert drafter.net.fc.weight.dtype == torch.bfloat16
    assert drafter.net.rotary_emb.inv_freq.dtype == torch.float32
    reference = load_drafter(str(DATA / "draft")).net.rotary_emb.inv_freq
    assert torch.equal(drafter.net.rotary_emb.inv_freq, reference)


# --- batches and the target ------------------------------------------------------------------

@torch.no_grad()
def test_a_ragged_batch_drafts_each_row_as_alone(drafter, golden):
    """Row 1 starts two positions earlier: its context is left-padded and masked; rounds on one
    cache too."""
    features, tokens = drafter.features(golden["hidden"]), golden["tokens"]
    short = START1 - 2
    context = features[:, :START1].clone()
    context[1] = torch.cat([torch.zeros(2, context.shape[2]), features[1, :short]])
    valid = torch.ones(2, START1, dtype=torch.bool)
    valid[1, :2] = False
    anchor, start = torch.stack([tokens[0, START1], tokens[1, short]]), torch.tensor([START1, short])
    cache = drafter.new_cache()
    both = drafter(anchor, context, start, cache, valid)
    alone = drafter(tokens[1:, short], features[1:, :short], short)
    assert diff(both[:1], golden["logits_round1"][:1]) <= 1e-5 and diff(both[1:], alone) <= 1e-5
    anchor2 = torch.stack([tokens[0, START2], tokens[1, START1]])
    context2 = torch.stack([features[0, START1:START2], torch.cat([torch.zeros(2, context.shape[2]),
                                                                   features[1, short:START1]])])
    valid2 = torch.tensor([[True] * 4, [False, False, True, True]])
    round2 = drafter(anchor2, context2, torch.tensor([START2, START1]), cache, valid2)
    assert diff(round2[:1], golden["logits_round2"][:1]) <= 1e-5
    assert diff(round2[1:], drafter(tokens[1:, START1], features[1:, :START1], START1)) <= 1e-5


def word_tokenizer(size: int) -> PreTrainedTokenizerFast:
    """A tokenizer of `size` ids (byte-level BPE has at least 257, more than the tiny head's 256 rows)."""
    words = models.WordLevel({f"w{i}": i for i in range(size - 1)} | {"<unk>": size - 1}, unk_token="<unk>")
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(words), unk_token="<unk>", eos_token="<unk>")


def test_pairing_binds_a_target_with_the_layers_it_reads():
    tokenizer = word_tokenizer(200)
    shape = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, max_position_embeddings=128)
    drafter = load_drafter(str(DATA / "draft"))
    model = Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=6, **shape)).eval()
    target = CausalLMTarget(model, tokenizer, "tiny-qwen3")
    pair_models(target, drafter)
    with torch.no_grad():  # the method's round: a target call with hidden states, then one draft call
        out = model(torch.tensor([[5, 6, 7, 8]]), output_hidden_states=True)
        logits = drafter(torch.tensor([9]), drafter.features(out.hidden_states), 4)
    assert logits.shape == (1, S - 1, 256) and torch.isfinite(logits).all()
    wide = word_tokenizer(300)
    for layers, width, words, why in ((4, 32, tokenizer, "made for a target of 6 layers"),
                                      (6, 64, tokenizer, "embedding of shape"),
                                      (6, 32, wide, "target head of 256 rows")):
        rows = max(256, len(words))
        other = Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=layers, **{**shape, "hidden_size": width,
                                                                           "vocab_size": rows}))
        with pytest.raises(IncompatibleModelsError, match=why):
            pair_models(CausalLMTarget(other, words, "other"), drafter)
    unbound = load_drafter(str(DATA / "draft"))
    with pytest.raises(IncompatibleModelsError, match="bind it first"):
        unbound(torch.tensor([9]), torch.zeros(1, 4, 96), 4)


def test_the_published_drafters_models_yaml_names_load_from_the_hub_cache(tmp_path, monkeypatch):
    """models.yaml names z-lab's drafters by hub id: from the Hugging Face cache alone (offline),
    the entry loads through the published-format loader (a tiny checkpoint under the real id; the
    real one needs network once)."""
    import huggingface_hub.constants

    from specdiff.drafters.dflash import DFlashDrafter
    from specdiff.loading import load_drafter
    from tiny import hub_snapshot, make_dflash, make_qwen3, make_tokenizer

    target = make_qwen3(tmp_path / "qwen3", make_tokenizer(tmp_path / "tok", vocab_size=300))
    for repo in ("z-lab/Qwen3-8B-DFlash-b16", "z-lab/Qwen3-4B-DFlash-b16"):
        make_dflash(hub_snapshot(tmp_path / "hub", repo), target)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    for entry in ("qwen3-8b-dflash", "qwen3-4b-dflash"):
        drafter = load_drafter(entry)
        assert isinstance(drafter, DFlashDrafter) and drafter.source == entry and drafter.block_size == 8
