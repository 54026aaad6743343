"""`specdiff distill --method dflash` (issue 23 item 4) on the tiny GPT-2 target: a training block
scores exactly the logits drafting computes (features of the positions before the anchor, absolute
positions, left padding kept out; one row's several blocks in one pass); the run lowers its
validation loss, publishes a checkpoint in the public DFlash format that loads and drafts
losslessly; resume continues exactly; bad options are one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from specdiff import generate, load_drafter, load_target
from specdiff.drafters.dflash import DFlashDrafter
from specdiff.training.config import DistillConfig
from specdiff.training.dflash import block_logits, new_drafter
from specdiff.sampling import Sampling
from specdiff.nets.checkpoint import save_tensors
from specdiff.training.features import MappedFeatures, sequence_features
from specdiff.training.losses import lk_per_slot
from specdiff.training.teacher import continue_batch
from specdiff_cli.main import cli
from tiny import TEXT, make_llama

SHAPE = ["--layers", "1", "--heads", "2"]  # a new drafter's (a starting --drafter refuses them)
SMALL = ["--method", "dflash", "--gamma", "4", "--num-prompts", "32",
         "--continuation-tokens", "24", "--batch-size", "8", "--anchors", "3", "--lr", "3e-3",
         "--eval-prompts", "2", "--threads", "1", "--loss", "ce"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "prompts.txt"
    path.write_text(TEXT * 8, encoding="utf-8")
    return path


def _run(tiny, prompts, out, *extra, shape=True):
    args = ["distill", "--target", str(tiny.gpt2), "--prompts", str(prompts), "--out", str(out), *SMALL,
            *(SHAPE if shape else []), *extra]
    return CliRunner().invoke(cli, args)


@pytest.fixture(scope="module")
def trained(tiny, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("distill") / "dflash"
    return out, _run(tiny, prompts, out, "--max-steps", "40", "--val-every", "10", "--checkpoint-every", "20")


@pytest.mark.parametrize("pad", [0, 3])
def test_a_training_block_is_exactly_a_drafting_call(tiny, tmp_path, pad):
    torch.manual_seed(0)
    target = load_target(str(tiny.gpt2))
    cfg = DistillConfig(target="t", out=str(tmp_path / "d"), prompts="p", method="dflash", layers=1, heads=2,
                        gamma=4, target_layers=(0, 1))
    drafter = new_drafter(cfg, target)
    drafter.bind_target(target.model)
    ids = torch.tensor(target.tokenizer.encode(TEXT)[:40])
    padded = torch.cat([torch.zeros(pad, dtype=torch.long), ids])[None]
    features = sequence_features(target.model, padded, torch.tensor([pad]), drafter.target_layer_ids).float()
    anchors = torch.tensor([[pad + 30, pad + 7, pad + 19]])
    with torch.no_grad():
        trained = block_logits(drafter, padded, features, torch.tensor([pad]), anchors)  # (1, 3, 4, V)
        out = target.model(ids[None], output_hidden_states=True)
        context = drafter.features(out.hidden_states)  # the unpadded sequence, as the target runs it
        for j, a in enumerate((anchors[0] - pad).tolist()):
            drafted = drafter(ids[a:a + 1], context[:, :a], a)  # (1, 4, V): positions a + 1 .. a + 4
            assert torch.allclose(trained[0, j], drafted[0], atol=1e-4), (pad, a)
    moved = block_logits(drafter, padded, features, torch.tensor([pad]), anchors + 1)
    assert not torch.allclose(moved[0, 0], trained[0, 0], atol=1e-2)  # the check can tell blocks apart


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_features_taken_while_generating_are_those_of_the_sequences(tiny, tmp_path, name):
    """The teacher loop's features (prefill, one step per token, one more for the last) are the
    target's hidden states of the finished rows, padding zero, as features.py computes them."""
    path = tiny.gpt2 if name == "gpt2" else make_llama(tmp_path / "llama", tiny.tokenizer, scale=10, seed=4)
    target = load_target(str(path))
    ids = torch.tensor(target.tokenizer.encode(TEXT))
    pad = torch.tensor([0, 2, 5])
    prompts = torch.stack([ids[i:i + 12] for i in (0, 5, 9)])
    prompts[torch.arange(12) < pad[:, None]] = 0
    seqs, feats = continue_batch(target.model, prompts, 10, target.vocab_size, Sampling(1.0),
                                 torch.Generator().manual_seed(0), None, pad=pad, layer_ids=(0, 1))
    want = sequence_features(target.model, seqs.ids, pad, (0, 1))
    assert feats.shape == want.shape == (3, 22, 2 * target.model.config.hidden_size)
    torch.testing.assert_close(feats.float(), want.float(), atol=2e-3, rtol=2e-3)


def test_features_of_rows_that_all_ended_stop_at_their_end(tiny):
    """Every row ends (greedy, eos = the token it says at step 3): the loop stops; the features up to
    there are the hidden states, the rest zeros (never read: anchors stay before each row's eos)."""
    target = load_target(str(tiny.gpt2))
    prompts = torch.tensor(target.tokenizer.encode(TEXT)[:8]).repeat(2, 1)
    run = lambda eos: continue_batch(target.model, prompts, 12, target.vocab_size, Sampling(0.0),  # noqa: E731
                                     torch.Generator().manual_seed(0), None, eos_id=eos, layer_ids=(1,))
    plain, _ = run(None)
    eos = int(plain.ids[0, 8 + 3])
    end = 8 + int((plain.ids[0, 8:] == eos).long().argmax())  # the column of its first eos
    seqs, feats = run(eos)
    want = sequence_features(target.model, seqs.ids, torch.zeros(2, dtype=torch.long), (1,))
    torch.testing.assert_close(feats[:, :end].float(), want[:, :end].float(), atol=2e-3, rtol=2e-3)
    assert end < 19 and not feats[:, end:].any()


def test_cli_run_lowers_validation_loss_and_publishes_a_dflash_checkpoint(trained):
    out, result = trained
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert result.stdout == f"{out}\n"
    report = json.loads((out / "report.json").read_text())
    assert report["method"] == "dflash" and report["compute"]["steps"] == 40
    assert report["val_loss"]["final"] < report["val_loss"]["initial"]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 5
    assert config["dflash_config"]["mask_token_id"] == 300  # the first row of the padded head past the tokenizer


def test_the_result_drafts_losslessly(trained, tiny):
    out, _ = trained
    drafter = load_drafter(str(out))
    assert isinstance(drafter, DFlashDrafter)
    target = load_target(str(tiny.gpt2))
    prompts = ["The sea was calm", "def main():"]
    ar = generate(prompts, target=target, method="ar", max_new_tokens=24)
    dflash = generate(prompts, target=target, drafter=drafter, method="dflash", max_new_tokens=24)
    assert dflash.texts == ar.texts
    assert dflash.metrics.tau >= 1


def test_lk_is_minus_log_the_acceptance_probability_of_speculative_sampling():
    """alpha = E_{x ~ q} min(1, p(x) / q(x)) over the whole vocabulary, p supported on the soft
    labels (no tail); a draft closer to p is accepted more and scores lower."""
    g = torch.Generator().manual_seed(0)
    log_q = torch.randn(3, 7, generator=g).log_softmax(-1)
    ids = torch.tensor([[0, 3, 5], [6, 1, 2], [4, 0, 1]])
    p = torch.rand(3, 3, generator=g)
    p = p / p.sum(-1, keepdim=True)
    full = torch.zeros(3, 7).scatter(-1, ids, p)
    q = log_q.exp()
    alpha = (q * torch.where(q > 0, full / q, 0).clamp(max=1)).sum(-1)
    torch.testing.assert_close(lk_per_slot(log_q, ids, p), -alpha.log())
    closer = (0.5 * q + 0.5 * full).log()
    assert (lk_per_slot(closer, ids, p) < lk_per_slot(log_q, ids, p)).all()


def test_a_run_with_the_lk_loss_learns(tiny, prompts, tmp_path):
    result = _run(tiny, prompts, tmp_path / "d", "--loss", "kl+lk", "--soft-labels", "8", "--max-steps", "12",
                  "--val-every", "12", "--eval-prompts", "1")
    assert result.exit_code == 0, result.stderr
    history = json.loads((tmp_path / "d" / "report.json").read_text())["val_loss"]["history"]
    assert history[-1][1] < history[0][1]


def test_mapped_features_read_the_rows_of_their_files(tmp_path):
    parts = [torch.randn(n, 3, 2).half() for n in (4, 1, 5)]
    for i, t in enumerate(parts):
        save_tensors({"features": t}, tmp_path / f"{i}.safetensors")
    mapped = MappedFeatures([tmp_path / f"{i}.safetensors" for i in range(2)]) + MappedFeatures([tmp_path / "2.safetensors"])
    rows = torch.tensor([9, 0, 4, 4, 5, 3])
    assert len(mapped) == 10 and torch.equal(mapped[rows], torch.cat(parts)[rows])


def test_more_data_and_a_starting_drafter(tiny, prompts, trained, tmp_path):
    """--more-data trains on both caches' answers (validation: --data's); --drafter starts from a
    DFlash drafter: its first validation loss is the one it ended with on the same data."""
    out, _ = trained
    more = tmp_path / "more"
    assert _run(tiny, prompts, tmp_path / "m", "--data", str(more), "--data-only", "--seed", "1").exit_code == 0
    result = _run(tiny, prompts, tmp_path / "b", "--data", str(out / "data"), "--more-data", str(more),
                  "--drafter", str(out), "--resume", "--max-steps", "2", shape=False)  # nothing to resume yet
    assert result.exit_code == 0, result.stderr
    first, then = (json.loads((d / "report.json").read_text()) for d in (out, tmp_path / "b"))
    assert then["compute"]["train_sequences"] == 2 * first["compute"]["train_sequences"] == 64
    assert then["val_loss"]["history"][0][1] == pytest.approx(first["val_loss"]["final"], abs=1e-4)


@pytest.mark.parametrize("args, fragment", [
    (["--more-data", "{tmp}/none"], "not a complete teacher data cache"),
    (["--more-data", "{other}"], "made with other continuation_tokens"),
    (["--drafter", "{trained}", "--gamma", "3"], "drafts blocks of 5"),
    (["--drafter", "{trained}", "--target-layers", "0"], "drop --target-layers"),
])
def test_bad_more_data_or_drafter_is_one_line(tiny, prompts, trained, tmp_path, args, fragment):
    other = tmp_path / "other"
    if "{other}" in args:
        assert _run(tiny, prompts, tmp_path / "o", "--data", str(other), "--data-only",
                    "--continuation-tokens", "20").exit_code == 0
    args = [a.format(tmp=tmp_path, other=other, trained=trained[0]) for a in args]
    result = _run(tiny, prompts, tmp_path / "x", "--data", str(trained[0] / "data"), *args, shape=False)
    assert result.exit_code != 0 and fragment in result.stderr and len(result.stderr.strip().splitlines()) == 1, \
        result.stderr


def test_a_starting_drafter_is_named_as_generate_names_it(tiny, prompts, trained, tmp_path, monkeypatch):
    """--drafter was read as a directory only (a models.yaml name: "demo-drafter/config.json:
    unreadable config") and the messages about it named the --out folder as the drafter."""
    from tiny import make_dflash

    registry = tmp_path / "models.yaml"
    registry.write_text(f"models:\n  - {{name: my-dflash, kind: drafter, path: {trained[0]}}}\n"
                        f"  - {{name: my-diffusion, kind: drafter, path: {tiny.drafter}}}\n")
    monkeypatch.setenv("SPECDIFF_MODELS", str(registry))
    other = make_dflash(tmp_path / "for-ar", tiny.ar, block_size=4, target_layer_ids=(0,))  # a 1-layer target's
    for drafter, fragment in (("my-dflash", "--gamma 3: my-dflash drafts blocks of 5"),
                              ("my-diffusion", "--drafter my-diffusion is not a DFlash drafter, the drafter "
                                               "--method dflash trains"),
                              (str(other), f"DFlash drafter '{other}' was made for a target of 1 layers")):
        result = _run(tiny, prompts, tmp_path / "x", "--data", str(trained[0] / "data"), "--drafter", drafter,
                      "--gamma", "3", shape=False)
        assert result.exit_code != 0 and result.stderr.count("\n") == 1 and fragment in result.stderr, result.stderr


def test_resume_continues_exactly(tiny, prompts, tmp_path):
    """Steps 6..12 resumed from the step-6 checkpoint give bit for bit the weights of the
    uninterrupted run."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert _run(tiny, prompts, a, "--max-steps", "12", "--checkpoint-every", "6").exit_code == 0
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoints" / "step-0000012")
    (b / "config.json").unlink()
    result = _run(tiny, prompts, b, "--max-steps", "12", "--checkpoint-every", "6", "--resume")
    assert result.exit_code == 0, result.stderr
    reports = [json.loads((d / "report.json").read_text()) for d in (a, b)]
    assert reports[0]["val_loss"]["history"] == reports[1]["val_loss"]["history"]
    wa, wb = (load_file(str(d / "model.safetensors")) for d in (a, b))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_resume_sets_an_unreadable_checkpoint_aside(tiny, prompts, trained, tmp_path):
    """The DFlash checkpoints follow distill's one rule (a truncated state.pt was a torch traceback)."""
    out = tmp_path / "d"
    shutil.copytree(trained[0], out)
    state = out / "checkpoints" / "step-0000040" / "state.pt"
    state.write_bytes(state.read_bytes()[:200])
    result = _run(tiny, prompts, out, "--max-steps", "40", "--checkpoint-every", "20", "--resume")
    assert result.exit_code == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("specdiff")]
    assert len(said) == 1 and said[0].startswith("specdiff: resuming from step-0000020; skipped step-0000040 "
                                                 "(state.pt: cannot be read (")
    assert (out / "checkpoints" / "unreadable-step-0000040").is_dir()


@pytest.mark.parametrize("args, has", [(["--layers", "2"], "1"), (["--heads", "1"], "2"), (["--gamma", "3"], "4"),
                                       (["--target-layers", "0,1,1"], None)])
def test_resume_refuses_options_the_checkpoint_contradicts(tiny, prompts, trained, tmp_path, args, has):
    """--resume kept the checkpoint's --target-layers / --layers whatever the options asked for
    (exit 0); a --drafter with nothing to resume yet still starts from the drafter (above)."""
    out = tmp_path / "d"
    shutil.copytree(trained[0], out)
    layers = ",".join(map(str, json.loads((out / "report.json").read_text())["target_layer_ids"]))
    result = _run(tiny, prompts, out, "--max-steps", "41", "--resume", *args)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr
    checkpoint = out / "checkpoints" / "step-0000040"
    assert f"{args[0]} {args[1]}: the checkpoint being resumed ({checkpoint}) has {has or layers}; leave {args[0]} " \
           "out or give the same" in result.stderr


@pytest.mark.parametrize("args, fragment", [
    (["--context", "16"], "--context is not used by --method dflash"),
    (["--target-layers", "0,9"], "the target has 2 layers"),
    (["--loss", "ce-streak"], "unknown loss 'ce-streak' for method dflash"),
    (["--anchors", "0"], "--anchors must be >= 1"),
    (["--dim", "64"], "the target's width 32"),
])
def test_bad_options_give_one_error_line(tiny, prompts, tmp_path, args, fragment):
    result = _run(tiny, prompts, tmp_path / "d", *args)
    assert result.exit_code != 0
    assert fragment in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "d" / "config.json").exists()


def test_target_layers_belong_to_dflash(tiny, prompts, tmp_path):
    args = ["distill", "--target", str(tiny.gpt2), "--prompts", str(prompts), "--out", str(tmp_path / "d"),
            "--target-layers", "1"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0 and "--target-layers is for --method dflash" in result.stderr


def test_a_truncated_features_file_is_one_line_naming_it(tiny, prompts, trained, tmp_path):
    """A truncated features file was a SafetensorError traceback on every run."""
    data = tmp_path / "data"
    shutil.copytree(trained[0] / "data", data)
    [features] = data.glob("features-*/train-00000.safetensors")
    features.write_bytes(features.read_bytes()[:1000])
    result = _run(tiny, prompts, tmp_path / "d", "--data", str(data), "--max-steps", "1")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"specdiff: error: {features}: damaged target features (")
    assert result.stderr.endswith("; delete it, and the next run computes it again\n")
    features.unlink()
    assert _run(tiny, prompts, tmp_path / "d", "--data", str(data), "--max-steps", "1").exit_code == 0
