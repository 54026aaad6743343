"""`specdiff distill` on the tiny GPT-2 target: it lowers the validation loss, the result loads and
drafts losslessly, resume continues exactly, a tokenizer's own mask token is never proposed, and
the data / loss pieces do what drafting asks of them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

import specdiff
from specdiff.training.batches import Pattern, make_batch
from specdiff.training.config import DistillConfig
from specdiff.training.distill import distill
from specdiff.training.losses import masked_ce, mdlm_elbo, slots
from specdiff.training.teacher import Sequences
from specdiff.errors import DivergedError, IncompatibleModelsError, UsageError
from specdiff.drafters.diffusion import DiffusionProposer
from specdiff.generation import plan
from specdiff.loading import load_drafter, load_target, pair_models
from specdiff.settings import DraftSettings
from specdiff.nets.parameterization import x0_logits
from specdiff.sampling import Sampling
from specdiff_cli.main import cli
from tiny import TEXT, make_gpt2, make_tokenizer

SMALL = ["--layers", "1", "--dim", "32", "--heads", "2", "--context", "16", "--gamma", "4",
         "--steps-per-draft", "2", "--num-prompts", "64", "--continuation-tokens", "32",
         "--batch-size", "16", "--lr", "3e-3", "--eval-prompts", "3", "--threads", "1"]
SMALL_CFG = dict(layers=1, dim=32, heads=2, context=16, gamma=4, steps_per_draft=2, num_prompts=32,
                 continuation_tokens=24, batch_size=16, lr=3e-3, eval_prompts=2)
PROMPTS = ["The sea was calm", "To be, or not", "def main():"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "prompts.txt"
    path.write_text(TEXT * 8, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(tiny, prompts, tmp_path_factory):
    """40 steps through the CLI; -> (output directory, CliRunner result)."""
    out = tmp_path_factory.mktemp("distill") / "drafter"
    args = ["distill", "--target", str(tiny.gpt2), "--prompts", str(prompts), "--out", str(out), *SMALL,
            "--max-steps", "40", "--val-every", "10", "--checkpoint-every", "20"]
    return out, CliRunner().invoke(cli, args)


def test_more_data_adds_another_caches_answers(tiny, prompts, trained, tmp_path):
    base = ["distill", "--target", str(tiny.gpt2), "--prompts", str(prompts), *SMALL]
    made = CliRunner().invoke(cli, [*base, "--out", str(tmp_path / "m"), "--data", str(tmp_path / "more"),
                                    "--data-only", "--seed", "1"])
    assert made.exit_code == 0, made.stderr
    result = CliRunner().invoke(cli, [*base, "--out", str(tmp_path / "d"), "--data", str(trained[0] / "data"),
                                      "--more-data", str(tmp_path / "more"), "--max-steps", "1", "--eval-prompts", "1"])
    assert result.exit_code == 0, result.stderr
    first, then = (json.loads((d / "report.json").read_text()) for d in (trained[0], tmp_path / "d"))
    assert then["compute"]["train_sequences"] == 2 * first["compute"]["train_sequences"] > 0


def test_cli_run_lowers_validation_loss_and_reports(trained):
    out, result = trained
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert result.stdout == f"{out}\n"
    *progress, summary = result.stderr.splitlines()  # not a terminal: one line per validation, no bar
    assert summary.startswith("distill: 40 steps")
    assert [line.split(",")[0] for line in progress] == [f"distill: step {k}/40" for k in (10, 20, 30, 40)]
    report = json.loads((out / "report.json").read_text())
    v = report["val_loss"]
    assert [step for step, _ in v["history"]] == [0, 10, 20, 30, 40]
    assert v["final"] < v["initial"] - 1.0, v  # measured: 5.69 -> 2.51
    assert report["compute"]["steps"] == 40 and report["compute"]["train_tokens"] > 0
    e = report["eval"]
    assert e["prompts"] == 3 and e["greedy"]["tau"] >= 1.0 and e["sampled"]["tau"] >= 1.0
    assert (e["greedy"]["temperature"], e["sampled"]["temperature"]) == (0.0, 1.0)  # --eval-temperature default
    assert e["greedy"]["per_position_acceptance"] != e["sampled"]["per_position_acceptance"]
    assert "at temperature 0 / 1 on 3 held-out prompts" in result.stderr
    assert report["teacher"] == {"temperature": [0.0], "top_p": [1.0], "samples_per_prompt": 1}
    assert report["soft_labels"] is None and report["loss"] == "ce"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000020", "step-0000040"]


def test_result_loads_and_greedy_specdiff_equals_ar(trained, tiny):
    out, _ = trained
    target, drafter = load_target(str(tiny.gpt2)), load_drafter(str(out))
    assert (drafter.vocab_size, drafter.mask_id, drafter.context_length) == (300, 300, 16)
    ar = specdiff.generate(PROMPTS, target=target, method="ar", max_new_tokens=24)
    spec = specdiff.generate(PROMPTS, target=target, drafter=drafter, gamma=4, steps=2, max_new_tokens=24)
    assert [o.tokens for o in spec.outputs] == [o.tokens for o in ar.outputs]
    untrained = specdiff.generate(PROMPTS, target=target, drafter=str(tiny.drafter), gamma=4, steps=2,
                                  max_new_tokens=24)
    assert spec.metrics.tau > untrained.metrics.tau, (spec.metrics.tau, untrained.metrics.tau)


def test_the_drafter_records_what_it_was_trained_for(trained, tiny):
    """gamma 4 at T = 2 (SMALL), l2r: what generate and bench run with it unless told otherwise."""
    out, _ = trained
    assert json.loads((out / "config.json").read_text())["defaults"] == {"gamma": 4, "steps": 2, "schedule": "l2r"}
    assert plan(target=str(tiny.gpt2), drafter=str(out)).draft == DraftSettings(4, 2, "l2r")


def test_resume_continues_exactly(tiny, prompts, tmp_path):
    """Steps 5..10 resumed from the step-5 checkpoint give bit for bit the weights of the
    uninterrupted run, from the cached data (nothing regenerated)."""
    a = tmp_path / "a"
    cfg = DistillConfig(target=str(tiny.gpt2), prompts=str(prompts), out=str(a), max_steps=10,
                        val_every=5, checkpoint_every=5, **SMALL_CFG)
    report_a = distill(cfg)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoints" / "step-0000010")
    (b / "config.json").unlink()
    report_b = distill(DistillConfig(**{**cfg.__dict__, "out": str(b), "resume": True}))
    assert report_b["compute"]["steps"] == 10 and report_b["compute"]["generate_s"] == 0
    assert report_b["val_loss"]["history"] == report_a["val_loss"]["history"]
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    state = torch.load(b / "checkpoints" / "step-0000010" / "state.pt", weights_only=True)
    assert state["step"] == 10 and max(s["step"] for s in state["optimizer"]["state"].values()) == 10


def _resume(tiny, prompts, out, *extra, shape=SMALL):
    return CliRunner().invoke(cli, ["distill", "--target", str(tiny.gpt2), "--prompts", str(prompts), "--out", str(out),
                                    *shape, "--val-every", "10", "--checkpoint-every", "20", "--resume", *extra])


def _damage(checkpoint: Path, fault: str) -> None:
    if fault == "truncated state.pt":
        state = checkpoint / "state.pt"
        state.write_bytes(state.read_bytes()[:200])
    elif fault == "empty":
        shutil.rmtree(checkpoint)
        checkpoint.mkdir()
    else:
        (checkpoint / "config.json").write_text("{", encoding="utf-8")


@pytest.mark.parametrize("fault, why", [("truncated state.pt", "state.pt: cannot be read ("),
                                        ("empty", "config.json: unreadable config: "),
                                        ("broken config.json", "config.json: unreadable config: ")])
def test_resume_sets_an_unreadable_checkpoint_aside_in_one_line(tiny, prompts, trained, tmp_path, fault, why):
    """One rule for a checkpoint a killed run or a full disk left damaged (a truncated state.pt was
    a torch traceback, an empty one skipped silently, a broken config.json an error): the run
    resumes from the newest that reads, one stderr line says which was skipped and why, and the
    damaged one is kept under another name, out of the run's way (its step is written again)."""
    out = tmp_path / "d"
    shutil.copytree(trained[0], out)
    _damage(out / "checkpoints" / "step-0000040", fault)
    result = _resume(tiny, prompts, out, "--max-steps", "40")
    assert result.exit_code == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("specdiff")]
    assert len(said) == 1 and said[0].startswith(f"specdiff: resuming from step-0000020; skipped step-0000040 ({why}")
    assert said[0].endswith("now unreadable-step-0000040")
    assert json.loads((out / "report.json").read_text())["compute"]["steps"] == 40
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names == ["step-0000020", "step-0000040", "unreadable-step-0000040"]


def test_resume_with_no_readable_checkpoint_is_one_error_line(tiny, prompts, trained, tmp_path):
    out = tmp_path / "d"
    shutil.copytree(trained[0], out)
    _damage(out / "checkpoints" / "step-0000040", "truncated state.pt")
    _damage(out / "checkpoints" / "step-0000020", "empty")
    result = _resume(tiny, prompts, out, "--max-steps", "40")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"specdiff: error: no checkpoint in {out / 'checkpoints'} can be read: "
                                    "step-0000040: state.pt: cannot be read (")
    assert "; step-0000020: config.json: unreadable config: " in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000020", "step-0000040"]


@pytest.mark.parametrize("args, fragment", [
    (["--layers", "2"], "--layers 2: the checkpoint being resumed ({ckpt}) has 1; leave --layers out or give the same"),
    (["--context", "8"], "--context 8: the checkpoint being resumed ({ckpt}) has 16"),
    (["--gamma", "5"], "--gamma 5: the checkpoint being resumed ({ckpt}) has 4"),
])
def test_resume_refuses_options_the_checkpoint_contradicts(tiny, prompts, trained, tmp_path, args, fragment):
    """--resume kept the checkpoint's shape whatever --layers asked for, silently (exit 0)."""
    out = tmp_path / "d"
    shutil.copytree(trained[0], out)
    result = _resume(tiny, prompts, out, "--max-steps", "41", *args)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr
    assert fragment.format(ckpt=out / "checkpoints" / "step-0000040") in result.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000020", "step-0000040"]


def test_resume_keeps_the_checkpoints_settings_where_none_are_given(tiny, prompts, trained, tmp_path):
    out = tmp_path / "d"
    shutil.copytree(trained[0], out)
    unshaped = [a for i, a in enumerate(SMALL) if a not in ("--layers", "--dim", "--heads", "--context", "--gamma")
                and SMALL[i - 1] not in ("--layers", "--dim", "--heads", "--context", "--gamma")]
    result = _resume(tiny, prompts, out, "--max-steps", "41", shape=unshaped)
    assert result.exit_code == 0, result.stderr
    assert json.loads((out / "config.json").read_text())["defaults"]["gamma"] == 4  # not the default 8
    assert json.loads((out / "report.json").read_text())["gamma"] == 4


def test_out_directory_in_use_needs_resume(tiny, prompts, trained):
    out, _ = trained
    with pytest.raises(specdiff.SpecdiffError, match="not an empty directory"):
        distill(DistillConfig(target=str(tiny.gpt2), prompts=str(prompts), out=str(out), **SMALL_CFG))


@pytest.fixture(scope="module")
def masked_target(tmp_path_factory):
    """A tiny GPT-2 whose tokenizer has its own <|mask|> as last id (301 tokens, head 320 rows)."""
    root = tmp_path_factory.mktemp("masktok")
    tok = make_tokenizer(root / "tok", vocab_size=300)
    tok.add_special_tokens({"additional_special_tokens": ["<|mask|>"]})
    return make_gpt2(root / "target", tok, scale=10), len(tok)


def test_mask_token_inside_vocabulary_is_never_proposed(masked_target, prompts, tmp_path):
    path, n_tok = masked_target
    out = tmp_path / "d"
    distill(DistillConfig(target=str(path), prompts=str(prompts), out=str(out), mask_token="<|mask|>",
                          max_steps=3, **SMALL_CFG))
    drafter = load_drafter(str(out))
    assert (drafter.mask_id, drafter.vocab_size, drafter.config.vocab_size) == (n_tok - 1, n_tok, n_tok)
    data = load_file(str(out / "data" / "train-00000.safetensors"))["ids"]
    assert not (data[:, 16:] == drafter.mask_id).any()  # the target was not let to say it
    with torch.no_grad():
        drafter.backbone.output_layer.linear.bias[drafter.mask_id] = 1e4  # the raw head wants the mask
    context = torch.tensor([[5, 6, 7, 8, 9]])
    draft = DiffusionProposer(drafter, "l2r", 2).propose(context, 4, Sampling(1.0), torch.Generator().manual_seed(0))
    assert not (draft.tokens == drafter.mask_id).any() and torch.all(draft.q[..., drafter.mask_id] == 0)
    xt = torch.cat([context, torch.full((1, 4), drafter.mask_id)], dim=1)
    raw = drafter(xt, torch.zeros(1))
    assert raw[0, 5:].argmax(-1).eq(drafter.mask_id).all()  # not vacuous: the mask would win
    for name in ("subs", "sedd"):
        logits = x0_logits(name, raw, xt, torch.ones(1), drafter.mask_id, drafter.vocab_size)
        assert torch.all(logits[0, 5:, drafter.mask_id] == float("-inf"))
    target = load_target(str(path))
    ar = specdiff.generate(PROMPTS[:2], target=target, method="ar", max_new_tokens=12)
    spec = specdiff.generate(PROMPTS[:2], target=target, drafter=drafter, gamma=4, steps=2, max_new_tokens=12)
    assert spec.texts == ar.texts  # check_pair accepted the pair


def test_batches_have_the_l2r_drafting_pattern():
    seqs = torch.arange(3 * 40).view(3, 40)  # P = 8 prompt tokens, L = 32
    pattern = Pattern(context=8, gamma=6, steps=3, mask_id=-1)
    b = make_batch(Sequences(seqs), pattern, 64, torch.Generator().manual_seed(0), prompt_tokens=8, context=8)
    assert b.x0.shape == (64, 14) and torch.equal(b.xt[:, :8], b.x0[:, :8])
    assert torch.all(b.x0.diff(dim=1) == 1) and torch.all(b.x0[:, 8] % 40 >= 8)  # draft inside the continuation
    committed = (b.xt[:, 8:] != -1).sum(dim=1)
    assert set(committed.tolist()) == {0, 2, 4}  # blocks of 2: before step 1, 2, 3
    assert torch.all((b.xt[:, 8:] != -1) == (torch.arange(6) < committed[:, None]))  # a clean prefix
    raw = torch.arange(1000, 1100)
    r = make_batch(Sequences(seqs), pattern, 16, torch.Generator().manual_seed(0), 8, raw, 1.0, context=8)
    assert torch.all(r.x0 >= 1000) and torch.all(r.x0.diff(dim=1) == 1)


def test_losses_score_exactly_what_drafting_reads(tiny):
    drafter = load_drafter(str(tiny.drafter))
    g = torch.Generator().manual_seed(0)
    seqs = torch.randint(0, 300, (4, 40), generator=g)
    b = make_batch(Sequences(seqs), Pattern(16, 6, 3, drafter.mask_id), 8, g, prompt_tokens=16, context=16)
    logits = slots(drafter, b).logits  # what every loss reads: drafting's x0 logits, bit for bit, differentiable
    assert torch.equal(logits, drafter.x0_logits(b.xt, last=6)) and logits.requires_grad
    masked = b.xt[:, 16:] == drafter.mask_id
    reference = drafter.x0_logits(b.xt)[:, 16:]
    assert torch.allclose(logits.softmax(-1)[masked], reference.softmax(-1)[masked], atol=1e-6)
    ce = -logits.log_softmax(-1).gather(-1, b.x0[:, 16:, None])[..., 0]  # (B, gamma)
    assert torch.allclose(masked_ce(slots(drafter, b)), ce[masked].mean(), atol=1e-5)
    per_row = (ce * masked).sum(1) / masked.sum(1)  # MDLM with t = fraction masked: the row mean
    assert torch.allclose(mdlm_elbo(slots(drafter, b)), per_row.mean(), rtol=2e-3)


@pytest.mark.parametrize("args, fragment", [
    (["--gamma", "0"], "--gamma must be >= 1"),
    (["--continuation-tokens", "2"], "must be >= --gamma"),
    (["--drafter", "x", "--layers", "2"], "--drafter fixes the architecture"),
    (["--raw-fraction", "0.5"], "--raw-fraction needs --raw-text"),
    (["--loss", "nope"], "unknown loss 'nope' for method specdiff (choose from ce, mdlm, kl, streak, ce-streak, or a sum such as ce+kl)"),
    (["--loss", "ce+nope"], "unknown loss 'ce+nope'"),
    (["--loss", "kl"], "--soft-labels must be >= 0, and > 0 (e.g. 32) for the kl loss; got 0"),
    (["--teacher-temperature", "1,0.8", "--teacher-top-p", "1,0.9,0.8"], "--teacher-top-p needs one value or one per"),
    (["--teacher-temperature", "1,-1"], "--teacher-temperature and --eval-temperature must be >= 0"),
    (["--teacher-top-p", "0"], "--teacher-top-p must lie in (0, 1], got 0.0"),
    (["--teacher-temperature", "1,x"], "'1,x' is not a comma-separated list of numbers"),
    (["--samples-per-prompt", "0"], "--samples-per-prompt must be >= 1"),
    (["--mask-token", "<|nope|>"], "not a token of the target's tokenizer"),
    (["--context", "0"], "--context must be >= 1, got 0"),  # was the default (32), silently
    (["--layers", "0"], "--layers must be >= 1, got 0"),
    # sizes no memory here holds, refused before anything is loaded (were allocator tracebacks)
    (["--method", "dflash", "--anchors", "100000"], "--anchors 100000, --batch-size 32, --gamma 8: a training "
     "batch's attention over its blocks would take at least"),
    (["--dim", "100000"], "--layers 2, --dim 100000: a new drafter's training state would take at least"),
    (["--num-prompts", str(10**12)], "--num-prompts 1000000000000, --samples-per-prompt 1, --continuation-tokens 64: "
     "the teacher data would take at least"),
    (["--batch-size", str(10**9)], "--batch-size 1000000000, --layers 2, --dim 128, --heads 4, --context 32, --gamma 8: "
     "a training batch's activations"),
])
def test_bad_options_give_one_error_line(tiny, prompts, tmp_path, args, fragment):
    result = CliRunner().invoke(cli, ["distill", "--target", str(tiny.gpt2), "--prompts", str(prompts),
                                      "--out", str(tmp_path / "d"), *args])
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("specdiff: error: "), result.stderr
    assert fragment in result.stderr and result.stdout == ""
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("flag", ["--prompts", "--raw-text"])
@pytest.mark.parametrize("source", ["/dev/zero", "fifo", "huge"])
def test_text_files_distill_cannot_read_whole_are_refused_first(tiny, prompts, tmp_path, monkeypatch, flag, source):
    """--prompts /dev/zero was read whole until memory ran out: a MemoryError traceback (issue 25,
    fault 13). A device or pipe may not end; a regular file is judged by its size, unread."""
    import os

    from specdiff_cli import distill as distill_cli

    monkeypatch.setattr(distill_cli, "MAX_TEXT_BYTES", 2**20)
    path = tmp_path / source
    if source == "fifo":
        os.mkfifo(path)
    elif source == "huge":
        with open(path, "wb") as f:
            f.truncate(2**20 + 1)  # sparse
    else:
        path = Path(source)
    args = ["--prompts", str(path)] if flag == "--prompts" else ["--prompts", str(prompts), "--raw-text", str(path)]
    result = CliRunner().invoke(cli, ["distill", "--target", str(tiny.gpt2), *args, "--out", str(tmp_path / "d")])
    assert result.exit_code == 2 and result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert f"Invalid value for '{flag}': {path} " in result.stderr
    assert ("holds 1.0 MiB; distill reads it whole (at most 1 MiB)" if source == "huge" else "is not a regular file") \
        in result.stderr
    assert not (tmp_path / "d").exists()


def test_time_budget_stops_early_with_a_complete_drafter(tiny, prompts, tmp_path):
    out = tmp_path / "d"
    report = distill(DistillConfig(target=str(tiny.gpt2), prompts=str(prompts), out=str(out), max_steps=10**6,
                                   time_budget=0.05, **SMALL_CFG))
    assert 0 <= report["compute"]["steps"] < 10**6 and report["compute"]["train_s"] < 5
    assert load_drafter(str(out)).context_length == 16


@pytest.mark.parametrize("option, value", [("lr", "nan"), ("lr", "inf"), ("draft_temperature", "nan"),
                                           ("eval_temperature", "inf"), ("time_budget", "inf"),
                                           ("raw_fraction", "nan")])
def test_non_finite_float_options_are_refused_before_any_work(tiny, prompts, tmp_path, option, value):
    flag = f"--{option.replace('_', '-')}"
    result = CliRunner().invoke(cli, ["distill", "--target", str(tiny.gpt2), "--prompts", str(prompts),
                                      "--out", str(tmp_path / "d"), flag, value])
    assert result.exit_code == 2 and result.stdout == "", (result.exit_code, result.stderr)
    assert result.stderr == f"specdiff: error: Invalid value for '{flag}': '{value}' is not a finite number\n"
    cfg = dict(SMALL_CFG, target="no-such-target", prompts=str(prompts), out=str(tmp_path / "d"))
    with pytest.raises(UsageError, match=f"^{option} must be a finite number, got {value}$"):
        distill(DistillConfig(**{**cfg, option: float(value)}))  # the library names its parameter
    assert not (tmp_path / "d").exists()


def test_diverged_run_writes_no_drafter(tiny, prompts, tmp_path):
    out = tmp_path / "d"
    args = ["distill", "--target", str(tiny.gpt2), "--prompts", str(prompts), "--out", str(out), *SMALL,
            "--lr", "1e30", "--max-steps", "5", "--checkpoint-every", "1"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and result.stdout == "", (result.exit_code, result.stderr, result.exception)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("specdiff: error: training diverged at step ")
    assert not out.exists()
    out.mkdir()  # an empty directory given by the user stays, empty
    with pytest.raises(DivergedError, match="training diverged"):
        distill(DistillConfig(target=str(tiny.gpt2), prompts=str(prompts), out=str(out),
                              **dict(SMALL_CFG, lr=1e30, max_steps=5)))
    assert out.is_dir() and list(out.iterdir()) == []


def test_from_target_shares_the_targets_embedding_and_head_and_does_not_store_them(tiny, prompts, tmp_path):
    """--from-target: rows 0..V-1 of the drafter's token embedding and head are the target's
    (GPT-2, dim 32), frozen through training and a resume while the blocks learn; they are not
    in model.safetensors; loaded alone the drafter refuses to draft, paired with the target it
    has them again and drafts losslessly; a width other than the target's is refused."""
    out = tmp_path / "a"
    cfg = DistillConfig(target=str(tiny.gpt2), prompts=str(prompts), out=str(out), max_steps=6,
                        val_every=3, checkpoint_every=3, **SMALL_CFG, from_target=True)
    distill(cfg)
    stored = load_file(str(out / "model.safetensors"))
    shutil.rmtree(out / "checkpoints" / "step-0000006")
    (out / "config.json").unlink()
    distill(DistillConfig(**{**cfg.__dict__, "resume": True, "max_steps": 9}))
    assert json.loads((out / "config.json").read_text())["target_embeddings"] is True
    after = load_file(str(out / "model.safetensors"))
    assert {"vocab_embed.embedding", "output_layer.linear.weight"}.isdisjoint(after)
    assert after["vocab_embed.embedding_rest"].shape == (1, 32)  # the mask row only
    assert not torch.equal(after["blocks.0.attn_qkv.weight"], stored["blocks.0.attn_qkv.weight"])

    alone = load_drafter(str(out))
    with pytest.raises(UsageError, match="reads its token embedding and output head from its target"):
        alone.x0_logits(torch.zeros(1, 6, dtype=torch.long))
    target, paired = load_target(str(tiny.gpt2)), load_drafter(str(out))
    pair_models(target, paired)
    V = paired.vocab_size
    assert torch.equal(paired.backbone.vocab_embed.embedding[:V], target.model.get_input_embeddings().weight[:V])
    assert torch.equal(paired.backbone.output_layer.linear.weight[:V], target.model.get_output_embeddings().weight[:V])
    ar = specdiff.generate(PROMPTS, target=target, method="ar", max_new_tokens=24)
    spec = specdiff.generate(PROMPTS, target=target, drafter=str(out), gamma=4, steps=2, max_new_tokens=24)
    assert [o.tokens for o in spec.outputs] == [o.tokens for o in ar.outputs]
    wide = load_target(str(make_gpt2(tmp_path / "wide", tiny.tokenizer, dim=64)))
    with pytest.raises(IncompatibleModelsError, match="width 32"):
        pair_models(wide, load_drafter(str(out)))
    with pytest.raises(UsageError, match="the target's hidden size 32"):
        distill(DistillConfig(**{**cfg.__dict__, "out": str(tmp_path / "b"), "dim": 64, "resume": False}))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


DAMAGED_DATA = {"meta.json": ("meta.json", lambda p: p.write_text("{", encoding="utf-8"),
                              "meta.json: damaged: Expecting property name enclosed in double quotes; the settings "
                              "the teacher data in {data} was made with are unknown: delete {data} and make it again"),
                "no meta.json": ("meta.json", Path.unlink, "meta.json: No such file or directory; the settings"),
                "truncated chunk": ("train-00000.safetensors", truncate,
                                    "train-00000.safetensors: damaged teacher data (")}


@pytest.mark.parametrize("flag", ["--data", "--more-data"])
@pytest.mark.parametrize("damage", sorted(DAMAGED_DATA))
def test_damaged_teacher_data_is_one_line_naming_the_file(tiny, prompts, trained, tmp_path, damage, flag):
    """A bad meta.json or a truncated chunk was a traceback (JSONDecodeError, SafetensorError) on every run."""
    data = tmp_path / "data"
    shutil.copytree(trained[0] / "data", data)
    name, spoil, fragment = DAMAGED_DATA[damage]
    spoil(data / name)
    where = ["--data", str(data)] if flag == "--data" else ["--data", str(trained[0] / "data"), "--more-data", str(data)]
    result = CliRunner().invoke(cli, ["distill", "--target", str(tiny.gpt2), "--prompts", str(prompts), "--out",
                                      str(tmp_path / "d"), *SMALL, "--max-steps", "1", *where])
    assert result.exit_code in (1, 2) and result.stderr.count("\n") == 1, result.stderr
    assert str(data / fragment.format(data=data)) in result.stderr
    assert (flag == "--more-data") == result.stderr.startswith(f"specdiff: error: --more-data {data}: not a complete")
