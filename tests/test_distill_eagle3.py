"""`specdiff distill --method eagle3` (issue 33) on the tiny targets: an unrolled training step is
exactly the chain drafting runs (step k > 1 reads the head's own output, not the target's
features); the unroll changes the loss; the loss falls on a tiny overfit set; the run publishes a
head in the published EAGLE-3 format (d2t / t2d) that `--method eagle3` loads and that decodes
greedily as `ar` does; resume continues exactly; bad options are one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from specdiff import generate, load_drafter, load_target
from specdiff.drafters.eagle3 import Eagle3Drafter
from specdiff.errors import UsageError
from specdiff.training.config import DistillConfig
from specdiff.training.eagle3 import new_head, unrolled, unrolled_loss
from specdiff.training.features import sequence_features
from specdiff.training.reading import corpus, new_draft_vocab
from specdiff.training.teacher import Sequences
from specdiff.vocab import DraftVocab
from specdiff_cli.main import cli
from tiny import TEXT, make_llama

SMALL = ["--method", "eagle3", "--target-layers", "0,1,1", "--unroll", "3", "--gamma", "4", "--num-prompts", "32",
         "--continuation-tokens", "24", "--batch-size", "8", "--lr", "3e-3", "--eval-prompts", "2", "--threads", "1",
         "--loss", "ce"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "prompts.txt"
    path.write_text(TEXT * 8, encoding="utf-8")
    return path


def _run(tiny, prompts, out, *extra):
    args = ["distill", "--target", str(tiny.gpt2), "--prompts", str(prompts), "--out", str(out), *SMALL, *extra]
    return CliRunner().invoke(cli, args)


def test_a_starting_head_named_in_models_yaml_resolves(tiny, prompts, tmp_path):
    """--drafter demo-drafter (a models.yaml name) was read as a directory: "demo-drafter/config.json:
    unreadable config"; it is loaded as generate loads it, and refused as the wrong kind."""
    result = CliRunner().invoke(cli, ["distill", "--target", str(tiny.gpt2), "--prompts", str(prompts), "--out",
                                      str(tmp_path / "out"), "--method", "eagle3", "--drafter", "demo-drafter"])
    assert result.exit_code == 2 and result.stderr == ("specdiff: error: --drafter demo-drafter is not an EAGLE-3 "
                                                       "head, the drafter --method eagle3 trains\n"), result.stderr


@pytest.fixture(scope="module")
def trained(tiny, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("distill") / "eagle3"
    return out, _run(tiny, prompts, out, "--draft-vocab", "64", "--max-steps", "40", "--val-every", "10",
                     "--checkpoint-every", "20")


def _head(target, tmp_path, layers=(0, 1, 1)):
    """A new head for `target`, bound, its weights made less tame than the initialisation's."""
    cfg = DistillConfig(target="t", out=str(tmp_path / "d"), prompts="p", method="eagle3", target_layers=layers)
    drafter = new_head(cfg, target)
    drafter.bind_target(target.model, target.vocab_size)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in drafter.net.named_parameters():
            if p.dim() == 2 and name != "lm_head.weight":
                p.normal_(0, 0.2, generator=g)
    return drafter.eval()


@pytest.mark.parametrize("name, pad", [("gpt2", 0), ("gpt2", 3), ("llama", 2)])
def test_an_unrolled_step_is_exactly_a_drafting_chain(tiny, tmp_path, name, pad):
    """Step k of row i = the chain drafting computes after the context rows 0..i (extend), then
    k - 1 draft steps each feeding its own output back (step), with the teacher's tokens."""
    path = tiny.gpt2 if name == "gpt2" else make_llama(tmp_path / "llama", tiny.tokenizer, scale=10, seed=4)
    target = load_target(str(path))
    drafter = _head(target, tmp_path)
    ids = torch.tensor(target.tokenizer.encode(TEXT)[:30])
    padded = torch.cat([torch.zeros(pad, dtype=torch.long), ids])[None]
    features = sequence_features(target.model, padded, torch.tensor([pad]), drafter.layer_ids).float()
    with torch.no_grad():
        outs = unrolled(drafter, padded, features, torch.tensor([pad]), steps=3)
        context = features[:, pad:]  # the target's features of the unpadded rows (features.py tests them)
        for i in (0, 9, 20):
            cache = drafter.new_cache()
            out = drafter.extend(ids[None, 1:i + 2], context[:, :i + 1], torch.arange(i + 1)[None], cache)[:, -1:]
            for k in range(3):
                if k:
                    out = drafter.step(ids[None, i + 1 + k:i + 2 + k], out, torch.tensor([[i + k]]), cache)
                torch.testing.assert_close(outs[k][0, pad + i], out[0, 0], atol=1e-4, rtol=1e-4)
        fed = drafter.extend(ids[None, 2:22], context[:, :20], torch.arange(1, 21)[None])  # features again at step 2
    assert not torch.allclose(outs[1][0, pad:pad + 20], fed[0], atol=1e-2)  # the check tells them apart


def _overfit_set(target, drafter, width=40):
    """Four windows of TEXT as prompt (8) + answer, with the target's features."""
    tokens = torch.tensor(target.tokenizer.encode(TEXT))
    ids = torch.stack([tokens[s:s + width] for s in (0, 31, 57, 90)])
    features = sequence_features(target.model, ids, torch.zeros(4, dtype=torch.long), drafter.layer_ids)
    return corpus(Sequences(ids), features, None, 8, 1, None)


def test_the_unroll_changes_the_loss_and_the_loss_falls_on_an_overfit_set(tiny, tmp_path):
    target = load_target(str(tiny.gpt2))
    drafter = _head(target, tmp_path)
    data = _overfit_set(target, drafter)
    rows = torch.arange(4)
    one, three = (unrolled_loss(drafter, data, rows, 8, k, ("ce",), "cpu").item() for k in (1, 3))
    assert abs(one - three) > 1e-3
    drafter.train()
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = unrolled_loss(drafter, data, rows, 8, 3, ("ce",), "cpu")
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_cli_run_publishes_an_eagle3_head_that_decodes_as_ar(trained, tiny):
    out, result = trained
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert result.stdout == f"{out}\n"
    report = json.loads((out / "report.json").read_text())
    assert report["method"] == "eagle3" and report["compute"]["steps"] == 40 and report["unroll"] == 3
    assert report["val_loss"]["final"] < report["val_loss"]["initial"]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 64
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 1]
    weights = load_file(str(out / "model.safetensors"))
    assert weights["d2t"].shape == (64,) and int(weights["t2d"].sum()) == 64 and "embed_tokens.weight" not in weights
    drafter = load_drafter(str(out))
    assert isinstance(drafter, Eagle3Drafter)
    target = load_target(str(tiny.gpt2))
    prompts = ["The sea was calm", "def main():"]
    ar = generate(prompts, target=target, method="ar", max_new_tokens=24)
    eagle3 = generate(prompts, target=target, drafter=drafter, method="eagle3", gamma=3, max_new_tokens=24)
    assert eagle3.texts == ar.texts
    assert eagle3.metrics.tau >= 1


def test_resume_continues_exactly(tiny, prompts, tmp_path):
    """Steps 6..12 resumed from the step-6 checkpoint give bit for bit the weights of the
    uninterrupted run (a head over the whole vocabulary: the identity map)."""
    a, b = tmp_path / "a", tmp_path / "b"
    result = _run(tiny, prompts, a, "--max-steps", "12", "--checkpoint-every", "6", "--eval-prompts", "1")
    assert result.exit_code == 0, result.stderr
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoints" / "step-0000012")
    (b / "config.json").unlink()
    result = _run(tiny, prompts, b, "--max-steps", "12", "--checkpoint-every", "6", "--eval-prompts", "1", "--resume")
    assert result.exit_code == 0, result.stderr
    reports = [json.loads((d / "report.json").read_text()) for d in (a, b)]
    assert reports[0]["val_loss"]["history"] == reports[1]["val_loss"]["history"]
    wa, wb = (load_file(str(d / "model.safetensors")) for d in (a, b))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert json.loads((b / "config.json").read_text())["draft_vocab_size"] == 320  # the target's head rows


@pytest.mark.parametrize("args, fragment", [
    (["--unroll", "0"], "--unroll is for --method eagle3 and must be >= 1"),
    (["--target-layers", "0,1"], "an EAGLE-3 head reads three of the target's 2 layers"),
    (["--layers", "2"], "an EAGLE-3 head is one layer"),
    (["--context", "16"], "--context is not used by --method eagle3"),
])
def test_bad_options_give_one_error_line(tiny, prompts, tmp_path, args, fragment):
    result = _run(tiny, prompts, tmp_path / "d", *args, "--max-steps", "1")
    assert result.exit_code != 0
    assert fragment in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "d" / "config.json").exists()


def test_resume_refuses_a_draft_vocabulary_the_checkpoint_contradicts(tiny, prompts, trained, tmp_path):
    out = tmp_path / "d"
    shutil.copytree(trained[0], out)
    result = _run(tiny, prompts, out, "--max-steps", "41", "--resume", "--draft-vocab", "32")
    assert result.exit_code != 0 and "a head of 64 rows" in result.stderr, result.stderr


def test_a_draft_vocabulary_past_the_vocabulary_is_the_whole_map_a_checkpoint_holds(tiny, tmp_path):
    """--draft-vocab 8192 on a 300-token target made a map of all 300 ids; resuming with the same
    option was refused as another size (found running scripts/smol/eagle3_scale.sh on a tiny target)."""
    target = load_target(str(tiny.gpt2))
    held = DraftVocab(torch.arange(target.vocab_size), target.vocab_size, "")
    cfg = lambda n: DistillConfig(target="t", out=str(tmp_path), prompts="p", method="eagle3", draft_vocab=n)  # noqa: E731
    assert new_draft_vocab(cfg(8192), target, held, resumed=True) is None
    with pytest.raises(UsageError, match="a head of 300 rows"):
        new_draft_vocab(cfg(100), target, held, resumed=True)
