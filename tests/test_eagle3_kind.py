"""The EAGLE-3 kind (specdiff.kinds.eagle3): detected by its config.json, loaded strictly, paired
with a target by its hidden width, vocabulary and layers (one line each), bound to the target's
embedding when it has none; declared with no compiled twin and with its graph, and refused as a target."""

import pytest
import torch

from specdiff import load_drafter, load_target
from specdiff.drafters.eagle3 import Eagle3Drafter
from specdiff.errors import IncompatibleModelsError, LoadError
from specdiff.kinds import get_kind, kind_of
from specdiff.loading import pair_models
from tiny import make_eagle3, make_llama, make_qwen3


@pytest.fixture(scope="module")
def llama(tiny):
    return make_llama(tiny.root / "eagle3-kind-llama", tiny.tokenizer, seed=4)


@pytest.fixture(scope="module")
def head(tiny, llama):
    return make_eagle3(tiny.root / "eagle3-kind-head", llama, seed=1)


def test_a_head_is_detected_and_loaded_as_its_kind(head):
    drafter = load_drafter(str(head))
    assert isinstance(drafter, Eagle3Drafter) and kind_of(drafter) is get_kind("eagle3")
    assert drafter.draft_vocab is None and drafter.layer_ids == (0, 1, 1)  # the map waits for its target
    kind = get_kind("eagle3")
    assert kind.compiling is None and kind.graph is not None and kind.graph.name == "eagle3"


def test_pairing_binds_the_draft_vocabulary_over_the_targets_ids(llama, head):
    target, drafter = load_target(str(llama)), load_drafter(str(head))
    pair_models(target, drafter)
    vocab = drafter.draft_vocab
    assert vocab is not None and vocab.vocab_size == target.vocab_size
    assert torch.equal(vocab.ids, drafter.net.d2t + torch.arange(vocab.size))
    assert target.tokenizer.eos_token_id in vocab.ids.tolist()
    pair_models(target, drafter)  # again: the map records no fingerprint, its V is checked


def test_a_head_over_the_whole_padded_head_keeps_the_identity(tiny):
    """GPT-2's head has 320 rows for 300 tokens: the identity map over all of them is no draft
    vocabulary (a method keeps the first 300 rows of its logits), not a refusal."""
    target = load_target(str(tiny.gpt2))
    drafter = load_drafter(str(make_eagle3(tiny.root / "eagle3-kind-whole", tiny.gpt2, draft_size=None)))
    assert drafter.identity and drafter.vocab_rows == 320 and target.vocab_size == 300
    pair_models(target, drafter)
    assert drafter.bound and drafter.draft_vocab is None


def test_a_head_without_an_embedding_reads_its_targets(tiny, llama):
    target = load_target(str(llama))
    drafter = load_drafter(str(make_eagle3(tiny.root / "eagle3-kind-noembed", llama, embedding=False)))
    assert drafter.net.embed_tokens is None
    pair_models(target, drafter)
    tokens = torch.tensor([[3, 5]])
    assert torch.equal(drafter.embed(tokens), target.model.get_input_embeddings()(tokens))


def test_the_default_layers_need_four_target_layers(tiny, llama):
    target = load_target(str(llama))  # 2 layers: 1, 0, -2
    drafter = load_drafter(str(make_eagle3(tiny.root / "eagle3-kind-default", llama, layer_ids=None)))
    with pytest.raises(IncompatibleModelsError, match=r"reads target layers \[1, 0, -2\]; this target has 2"):
        pair_models(target, drafter)


def test_another_hidden_width_is_refused_in_one_line(tiny, head):
    qwen = make_qwen3(tiny.root / "eagle3-kind-qwen48", tiny.tokenizer, dim=48)
    with pytest.raises(IncompatibleModelsError, match="reads target hidden states of width 32 .*this target's are 48"):
        pair_models(load_target(str(qwen)), load_drafter(str(head)))


def test_layers_past_the_target_are_refused(tiny, llama):
    drafter = load_drafter(str(make_eagle3(tiny.root / "eagle3-kind-deep", llama, layer_ids=(0, 1, 5))))
    with pytest.raises(IncompatibleModelsError, match=r"reads target layers \[0, 1, 5\]; this target has 2"):
        pair_models(load_target(str(llama)), drafter)


def test_a_larger_target_vocabulary_is_refused(llama, head):
    drafter = load_drafter(str(head))
    drafter.vocab_rows = 200  # as if made for a 200-id target (config.json vocab_size)
    with pytest.raises(IncompatibleModelsError, match="made for a target vocabulary of 200 ids"):
        pair_models(load_target(str(llama)), drafter)


def test_a_head_is_not_a_target(head):
    with pytest.raises(LoadError, match="an EAGLE-3 draft head .*not a target"):
        load_target(str(head))


def test_the_published_heads_models_yaml_names_load_from_the_hub_cache(tmp_path, monkeypatch, tiny, llama):
    """models.yaml names the EAGLE authors' heads by hub id: from the Hugging Face cache alone
    (offline), each loads as an EAGLE-3 drafter (tiny checkpoints under the real ids; the real ones
    need network once). Their own releases write architectures LlamaForCausalLM with a
    draft_vocab_size and pickled weights: detected and read (weights_only) as SpecForge's layout."""
    import json

    import huggingface_hub.constants
    from safetensors.torch import load_file

    from tiny import hub_snapshot

    for repo in ("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"):
        folder = make_eagle3(hub_snapshot(tmp_path / "hub", repo), llama, seed=2)
        torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLM"]}))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    for entry in ("llama-3.1-8b-eagle3", "llama-3.3-70b-eagle3"):
        drafter = load_drafter(entry)
        assert isinstance(drafter, Eagle3Drafter) and drafter.source == entry and drafter.layer_ids == (0, 1, 1)
    target = load_target(str(llama))
    pair_models(target, drafter)  # the head ships no tokenizer: its target's is its own
    assert drafter.draft_vocab is not None and drafter.draft_vocab.size == 200
