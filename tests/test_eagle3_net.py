"""nets/eagle3.py against the reference: a tiny random head in the published format, made once by
SpecForge's own LlamaForCausalLMEagle3 (tests/data/eagle3/README.md), loads strictly and gives the
reference's hidden states and logits, with RoPE as published and under Llama 3.1's rope_scaling,
at the context rows and at chained draft steps that feed their own output back (the reference's test-time-training steps: step k of row i is a chain of k
draft steps after the context rows 0..i)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specdiff.errors import LoadError
from specdiff.nets.dflash import ContextCache
from specdiff.nets.eagle3 import (default_layer_ids, is_eagle3, load_eagle3, read_eagle3_config,
                                  save_eagle3)

DATA = Path(__file__).parent / "data" / "eagle3"
STEPS = 3


@pytest.fixture(scope="module")
def golden():
    return load_file(str(DATA / "golden.safetensors"))


@pytest.fixture(scope="module")
def net():
    return load_eagle3(DATA / "draft")


@pytest.fixture(scope="module", params=["default", "llama3"])
def rope(request, tmp_path_factory, golden, net):
    """(net, golden) for RoPE as published (default), and under Llama 3.1's rope_scaling: the same
    weights, its config.json given the rope_scaling the reference ran with (golden's metadata)."""
    if request.param == "default":
        return net, golden
    path = DATA / "golden-llama3.safetensors"
    with safe_open(str(path), framework="pt") as f:
        scaling = json.loads(f.metadata()["rope_scaling"])
    directory = tmp_path_factory.mktemp("eagle3-llama3")
    config = json.loads((DATA / "draft" / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "rope_scaling": scaling}))
    shutil.copy(DATA / "draft" / "model.safetensors", directory / "model.safetensors")
    return load_eagle3(directory), load_file(str(path))


def chain(net, golden, row: int) -> list[torch.Tensor]:
    """The context rows 0..row (features and the tokens at 0..row), then STEPS - 1 draft steps at
    positions row + 1, ...: each feeds the previous output back -> [out (B, H)] per step."""
    ids, features = golden["ids"], golden["features"]
    cache = ContextCache()
    positions = torch.arange(row + 1)[None].expand(ids.shape[0], -1)
    out = net(net.embed_tokens(ids[:, :row + 1]), net.project(features[:, :row + 1]), positions, cache)[:, -1:]
    outs = [out[:, 0]]
    for k in range(1, STEPS):
        position = torch.full((ids.shape[0], 1), row + k)
        out = net(net.embed_tokens(ids[:, row + k:row + k + 1]), out, position, cache)
        outs.append(out[:, 0])
    return outs


def test_the_config_and_the_buffers_read_as_published(net):
    assert is_eagle3(json.loads((DATA / "draft" / "config.json").read_text()))
    assert net.spec.layer_ids == (0, 2, 3) and net.spec.target_hidden_size == 24
    assert tuple(net.fc.weight.shape) == (32, 72) and tuple(net.lm_head.weight.shape) == (40, 32)
    ids = net.d2t + torch.arange(40)
    assert bool(net.t2d[ids].all()) and int(net.t2d.sum()) == 40


def test_context_rows_match_the_reference(rope):
    net, golden = rope
    ids, features = golden["ids"], golden["features"]
    T = features.shape[1]
    with torch.no_grad():
        hidden = net.project(features)
        torch.testing.assert_close(hidden, golden["projected"], rtol=1e-5, atol=1e-5)
        out = net(net.embed_tokens(ids[:, :T]), hidden, torch.arange(T)[None].expand(2, -1))
        torch.testing.assert_close(out, golden["out0"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(net.logits(out), golden["logits0"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("row", [0, 3, 6])
def test_chained_draft_steps_match_the_reference(rope, row):
    net, golden = rope
    with torch.no_grad():
        outs = chain(net, golden, row)
    for k, out in enumerate(outs):
        torch.testing.assert_close(out, golden[f"out{k}"][:, row], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(net.logits(out), golden[f"logits{k}"][:, row], rtol=1e-5, atol=1e-5)


def test_padding_rows_are_no_key(net, golden):
    """A left-padded row (valid False) changes nothing of the real rows after it, and stays finite."""
    ids, features = golden["ids"][:, :4], golden["features"][:, :4]
    pad_ids, pad_features = torch.cat([ids[:, :1], ids], 1), torch.cat([features[:, :1] * 5, features], 1)
    valid = torch.tensor([[False, True, True, True, True]] * 2)
    with torch.no_grad():
        plain = net(net.embed_tokens(ids), net.project(features), torch.arange(4)[None].expand(2, -1))
        padded = net(net.embed_tokens(pad_ids), net.project(pad_features),
                     torch.tensor([[0, 0, 1, 2, 3]] * 2), ContextCache(), valid)
    torch.testing.assert_close(padded[:, 1:], plain, rtol=1e-5, atol=1e-5)
    assert bool(torch.isfinite(padded).all())  # the padding row attends to itself


def test_save_then_load_gives_the_same_head(net, golden, tmp_path):
    save_eagle3(tmp_path, net)
    again = load_eagle3(tmp_path)
    assert again.spec == net.spec
    for (name, a), (_, b) in zip(net.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


def test_eagles_pickled_release_reads_the_same(net, tmp_path):
    shutil.copy(DATA / "draft" / "config.json", tmp_path / "config.json")
    torch.save(load_file(str(DATA / "draft" / "model.safetensors")), tmp_path / "pytorch_model.bin")
    again = load_eagle3(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), again.state_dict().values()))
    torch.save({"fc.weight": [1, 2]}, tmp_path / "pytorch_model.bin")  # not tensors only
    with pytest.raises(LoadError, match="pytorch_model.bin: not a state dict of tensors"):
        load_eagle3(tmp_path)


def test_a_head_without_its_embedding_loads_without_one(tmp_path):
    shutil.copy(DATA / "draft" / "config.json", tmp_path / "config.json")
    state = load_file(str(DATA / "draft" / "model.safetensors"))
    del state["embed_tokens.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    assert load_eagle3(tmp_path).embed_tokens is None


def test_a_head_over_the_whole_vocabulary_may_omit_its_map(tmp_path):
    config = {**json.loads((DATA / "draft" / "config.json").read_text()), "draft_vocab_size": 64}
    (tmp_path / "config.json").write_text(json.dumps(config))
    state = load_file(str(DATA / "draft" / "model.safetensors"))
    del state["d2t"], state["t2d"]
    state["lm_head.weight"] = torch.zeros(64, 32)
    save_file(state, str(tmp_path / "model.safetensors"))
    net = load_eagle3(tmp_path)
    assert not net.d2t.any() and bool(net.t2d.all())
    del state["lm_head.weight"]  # a head over 40 of them may not
    state["lm_head.weight"] = torch.zeros(40, 32)
    (tmp_path / "config.json").write_text(json.dumps({**config, "draft_vocab_size": 40}))
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(LoadError, match=r"missing d2t \(40,\); missing t2d \(64,\)"):
        load_eagle3(tmp_path)


def test_a_mismatched_checkpoint_is_one_load_error_naming_every_tensor(tmp_path):
    shutil.copy(DATA / "draft" / "config.json", tmp_path / "config.json")
    state = load_file(str(DATA / "draft" / "model.safetensors"))
    del state["midlayer.hidden_norm.weight"]
    state["fc.weight"] = state["fc.weight"][:, :48].contiguous()
    state["extra.weight"] = torch.zeros(2)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(LoadError, match=r"missing midlayer\.hidden_norm\.weight \(32,\); unexpected extra\.weight; "
                                        r"shape of fc\.weight: expected \(32, 72\), found \(32, 48\)"):
        load_eagle3(tmp_path)


@pytest.mark.parametrize("change, message", [
    ({"num_hidden_layers": 2}, "num_hidden_layers 2: only one-layer heads"),
    ({"fc_norm": True}, "fc_norm is not supported"),
    ({"draft_vocab_size": 65}, "draft_vocab_size must be an integer in 1..vocab_size"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]}}, "must be three integers"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "rope_scaling type 'yarn' is not supported"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 3], "use_mtp_layernorm": True}},
     "eagle_config.use_mtp_layernorm is not supported"),
])
def test_unsupported_configs_are_refused_naming_the_field(tmp_path, change, message):
    config = {**json.loads((DATA / "draft" / "config.json").read_text()), **change}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoadError, match=message):
        read_eagle3_config(tmp_path)


def test_the_default_layer_rule_is_the_references():
    assert default_layer_ids(32) == (1, 15, 28)  # EAGLE: the inputs of layers 2, 16, 29
    assert default_layer_ids(36) == (1, 17, 32)


def test_the_scaled_golden_is_not_the_unscaled_one(net):
    """The llama3 case is sensitive: RoPE without its scaling misses the reference's outputs."""
    golden = load_file(str(DATA / "golden-llama3.safetensors"))
    T = golden["features"].shape[1]
    with torch.no_grad():
        out = net(net.embed_tokens(golden["ids"][:, :T]), net.project(golden["features"]), torch.arange(T)[None])
    assert float((out - golden["out0"]).abs().max()) > 0.1
