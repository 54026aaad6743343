"""Building draft vocabularies (issue 34 item 2): `specdiff distill --method dflash --draft-vocab N`
counts the target's answers in the teacher data, trains the reduced head (the loss taken against p
restricted to the map) and publishes the map with the drafter; resuming with another N is refused;
`specdiff drafter convert --draft-vocab N --frequencies DATA` cuts a trained DFlash, diffusion or AR
drafter's head without retraining; the results draft losslessly; bad requests are one line."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from specdiff import generate, load_drafter, load_target
from specdiff.training.reading import restricted
from specdiff.training.vocab import answer_counts
from specdiff.vocab import DraftVocab, fingerprint, load_draft_vocab
from specdiff_cli.main import cli
from tiny import TEXT

PROMPTS = ["To be, or not to be", "It was the best of", "def main():", "Call me"]
SMALL = ["--method", "dflash", "--layers", "1", "--heads", "2", "--gamma", "4", "--num-prompts", "32",
         "--continuation-tokens", "24", "--batch-size", "8", "--anchors", "3", "--lr", "3e-3",
         "--eval-prompts", "2", "--threads", "1", "--loss", "ce+kl", "--soft-labels", "8"]


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("dv-distill")
    prompts = root / "prompts.txt"
    prompts.write_text(TEXT * 8, encoding="utf-8")
    out = root / "dflash"
    args = ["distill", "--target", str(tiny.gpt2), "--prompts", str(prompts), "--out", str(out), *SMALL,
            "--draft-vocab", "64", "--max-steps", "20", "--val-every", "10", "--checkpoint-every", "10"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, (result.stderr, result.exception)
    return out, args


def test_distill_trains_and_publishes_a_reduced_head(tiny, trained):
    out, _ = trained
    vocab = load_draft_vocab(out)
    assert vocab is not None and vocab.size == 64 and bool(vocab.inside[tiny.tokenizer.eos_token_id])
    report = json.loads((out / "report.json").read_text())
    assert report["draft_vocab"]["size"] == 64 and 0 < report["draft_vocab"]["coverage"] <= 1
    assert report["val_loss"]["final"] < report["val_loss"]["initial"]
    counts, n = answer_counts(out / "data", 300, tiny.tokenizer.eos_token_id)
    assert n == int(counts.sum()) and vocab.coverage == pytest.approx(float(counts[vocab.ids].sum()) / n)
    target = load_target(str(tiny.gpt2))
    drafter = load_drafter(str(out))
    ref = generate(PROMPTS, target=target, method="ar", max_new_tokens=20)
    got = generate(PROMPTS, target=target, drafter=drafter, method="dflash", max_new_tokens=20, batch_size=2)
    assert [o.tokens for o in got.outputs] == [o.tokens for o in ref.outputs]


def test_resuming_with_another_draft_vocabulary_is_refused(trained):
    out, args = trained
    cut = args[:args.index("--draft-vocab")] + args[args.index("--draft-vocab") + 2:]
    result = CliRunner().invoke(cli, [*cut, "--draft-vocab", "32", "--resume", "--max-steps", "30"])
    assert result.exit_code != 0 and "the checkpoint being resumed was trained with" in result.stderr
    assert result.stderr.count("\n") == 1
    # omitted, it keeps the checkpoint's map (as every setting a resumed run leaves unset)
    result = CliRunner().invoke(cli, [*cut, "--resume", "--max-steps", "20"])
    assert result.exit_code == 0, (result.stderr, result.exception)
    vocab = load_draft_vocab(out)
    assert vocab is not None and vocab.size == 64


def test_the_loss_is_taken_against_p_restricted_to_the_map(tiny):
    ids = torch.tensor([2, 5, 9])
    vocab = DraftVocab(ids, 300, fingerprint(tiny.tokenizer, ids, 300))
    labels, soft = restricted(vocab, torch.tensor([5, 7]), (torch.tensor([[9, 7, 2]]), torch.tensor([[0.5, 0.3, 0.1]])))
    assert labels.tolist() == [1, -1]
    assert soft is not None and soft[0].tolist() == [[2, 0, 0]]
    assert soft[1][0].tolist() == pytest.approx([0.5 / 0.7, 0.0, 0.1 / 0.7])


@pytest.mark.parametrize("kind", ["dflash", "drafter", "ar"])
def test_convert_cuts_a_trained_drafters_head_without_retraining(tiny, trained, tmp_path, kind):
    out, _ = trained
    source = {"dflash": out, "drafter": tiny.drafter, "ar": tiny.ar}[kind]
    result = CliRunner().invoke(cli, ["drafter", "convert", str(source), "--target", str(tiny.gpt2),
                                      "--draft-vocab", "40", "--frequencies", str(out / "data"), "--dtype", "fp16",
                                      "--out", str(tmp_path / "cut")])
    assert result.exit_code == 0, (result.stderr, result.exception)
    vocab = load_draft_vocab(tmp_path / "cut")
    assert vocab is not None and vocab.size == 40 and "most frequent" in vocab.built_from
    target = load_target(str(tiny.gpt2))
    drafter = load_drafter(str(tmp_path / "cut"), dtype="fp32")
    method = {"dflash": "dflash", "drafter": "specdiff", "ar": "spec-ar"}[kind]
    ref = generate(PROMPTS, target=target, method="ar", max_new_tokens=16)
    got = generate(PROMPTS, target=target, drafter=drafter, method=method, gamma=3, max_new_tokens=16)
    assert [o.tokens for o in got.outputs] == [o.tokens for o in ref.outputs]
    assert got.metrics.outside_vocab is not None  # counted, for --stats and bench.json


@pytest.mark.parametrize("args,message", [
    (["--draft-vocab", "40"], "go together"),
    (["--draft-vocab", "40", "--frequencies", "no-such-dir"], "not a teacher-data directory nor a counts file"),
    (["--draft-vocab", "0", "--frequencies", "DATA"], "must be >= 1"),
])
def test_a_bad_conversion_request_is_one_line(tiny, trained, tmp_path, args, message):
    out, _ = trained
    args = [str(out / "data") if a == "DATA" else a for a in args]
    result = CliRunner().invoke(cli, ["drafter", "convert", str(out), "--target", str(tiny.gpt2), *args,
                                      "--out", str(tmp_path / "cut")])
    assert result.exit_code != 0 and message in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "cut").exists()


def test_a_counts_file_gives_the_map_its_data_gives(tiny, trained, tmp_path):
    from specdiff.training.vocab import build_vocab, save_counts

    out, _ = trained
    counts, n = answer_counts(out / "data", 300, tiny.tokenizer.eos_token_id)
    save_counts(tmp_path / "counts.safetensors", counts, tiny.tokenizer, f"{n} answer tokens")
    from_data = build_vocab(out / "data", 40, tiny.tokenizer)
    from_file = build_vocab(tmp_path / "counts.safetensors", 40, tiny.tokenizer)
    assert torch.equal(from_data.ids, from_file.ids) and from_file.coverage == pytest.approx(from_data.coverage)
    shuffled = type(tiny.tokenizer).from_pretrained(str(tiny.tokenizer_dir))
    shuffled.add_tokens(["<extra>"])  # one more token: another vocabulary
    from specdiff.errors import UsageError
    with pytest.raises(UsageError, match="counts must be 301 integers"):
        build_vocab(tmp_path / "counts.safetensors", 40, shuffled)


@pytest.mark.parametrize("form", ["eagle3", "sglang", "another-target"])
def test_convert_reads_a_map_made_elsewhere(tiny, trained, tmp_path, form):
    from safetensors.torch import save_file

    out, _ = trained
    ids = torch.tensor(sorted({*range(0, 300, 2), tiny.tokenizer.eos_token_id}))
    if form == "sglang":
        path = tmp_path / "hot.pt"
        torch.save(ids.tolist(), path)
    else:
        V = 300 if form == "eagle3" else 320  # another target's t2d: refused
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[ids] = True
        path = tmp_path / "eagle3.safetensors"
        save_file({"d2t": ids - torch.arange(len(ids)), "t2d": t2d}, str(path))
    result = CliRunner().invoke(cli, ["drafter", "convert", str(out), "--target", str(tiny.gpt2), "--vocab-map",
                                      str(path), "--out", str(tmp_path / "cut")])
    if form == "another-target":
        assert result.exit_code != 0 and "t2d covers 320" in result.stderr and not (tmp_path / "cut").exists()
        return
    assert result.exit_code == 0, (result.stderr, result.exception)
    vocab = load_draft_vocab(tmp_path / "cut")
    assert vocab is not None and torch.equal(vocab.ids, ids)


@pytest.mark.parametrize("holds_mask, other_target, message", [
    (True, False, "the map holds id 4095, the drafter's mask id, which it never drafts"),
    (False, True, "drafter vocabulary has 4096 tokens"),
    (False, False, None),
])
def test_convert_refuses_a_map_every_run_would_refuse(tiny, tmp_path, holds_mask, other_target, message):
    """--vocab-map wrote drafters that every later run refused: a map holding the demo drafter's
    mask id (4095, a token of its tokenizer), a map counted on another target's tokenizer."""
    hot = tmp_path / "hot.pt"
    torch.save([*range(0, 200, 2), *([4095] if holds_mask else [])], hot)
    cut = tmp_path / "cut"
    result = CliRunner().invoke(cli, ["drafter", "convert", "demo-drafter", "--vocab-map", str(hot), "--out", str(cut),
                                      *(["--target", str(tiny.gpt2)] if other_target else [])])
    if message is None:
        assert result.exit_code == 0, result.stderr
        assert load_drafter(str(cut)).draft_vocab.size == 100
        return
    assert result.exit_code != 0 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert not cut.exists()


def test_distill_refuses_to_start_from_a_diffusion_drafter_with_a_map(tiny, trained, tmp_path):
    import shutil

    out, _ = trained
    drafter = shutil.copytree(tiny.drafter, tmp_path / "drafter")
    shutil.copy(out / "draft_vocab.safetensors", drafter)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(TEXT * 8, encoding="utf-8")
    result = CliRunner().invoke(cli, ["distill", "--target", str(tiny.gpt2), "--prompts", str(prompts), "--drafter",
                                      str(drafter), "--out", str(tmp_path / "out"), "--max-steps", "2",
                                      "--num-prompts", "16", "--continuation-tokens", "16", "--threads", "1"])
    assert result.exit_code != 0 and "has a draft vocabulary" in result.stderr and result.stderr.count("\n") == 1
