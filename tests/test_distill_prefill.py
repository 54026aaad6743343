"""`specdiff distill --prefill` (issue 35 item 1) on the tiny GPT-2 target with a chat template: a
prefill row's soft labels are the target's own top-k of p at each answer position (one-hot on eos
after the answer's end), as the teacher loop keeps them for the same tokens; its features are the
target's hidden states of those layers; a prefill cache trains a DFlash drafter through the CLI,
resumes, and joins generated data as `--more-data`; bad input is one line and leaves no files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from specdiff import load_target
from specdiff.sampling import Sampling
from specdiff.training.features import sequence_features
from specdiff.training.prefill import prefill_batch, prefill_rows
from specdiff.training.teacher import continue_batch, read_sequences
from specdiff_cli.main import cli
from tiny import TEXT, make_gpt2, with_chat

P, L, K = 48, 24, 8
SENTENCES = [s.strip() + "." for s in TEXT.replace("\n", " ").split(".") if s.strip()]
RUN = ["--method", "dflash", "--chat", "--prompt-tokens", str(P), "--continuation-tokens", str(L),
       "--soft-labels", str(K), "--gamma", "4", "--layers", "1", "--heads", "2", "--target-layers", "0,1",
       "--batch-size", "4", "--anchors", "2", "--eval-prompts", "2", "--threads", "1", "--loss", "ce+kl",
       "--val-every", "1", "--checkpoint-every", "1"]


@pytest.fixture(scope="module")
def chat_gpt2(tiny, tmp_path_factory):
    """The tiny GPT-2 with a chat template, its eos also its pad token (as the smol target pads)."""
    return with_chat(tiny.gpt2, tmp_path_factory.mktemp("chat") / "gpt2-chat", eos_pad=True)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """24 pairs: answers of one sentence (they end: eos) and of many (cut at L tokens)."""
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    rows = [{"prompt": f"What comes after part {i}?",
             "answer": " ".join(SENTENCES[i % len(SENTENCES):][:1 if i % 2 else 6])} for i in range(24)]
    rows[0]["answer"] = "Quoting <|endoftext|> does not end it. " + rows[0]["answer"]  # text, not the eos token
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _direct_p(model, row: torch.Tensor, pad: int, vocab: int) -> torch.Tensor:
    """The target's p (W - pad, V) at every column of one row, run unpadded."""
    with torch.no_grad():
        return model(row[None, pad:]).logits[0, :, :vocab].float().softmax(-1)


def test_soft_labels_are_the_targets_top_k_at_each_answer_position(chat_gpt2, pairs):
    target = load_target(str(chat_gpt2))
    eos, V = target.eos_token_id, target.vocab_size
    ids, pad = prefill_rows(str(pairs), target.tokenizer, P, L, eos)
    assert ids.shape == (24, P + L) and int(pad.min()) > 0
    assert eos not in ids[0, P:].tolist()  # the quoted eos is text (and the long answer is cut at L)
    seqs, feats = prefill_batch(target.model, ids, pad, P, V, None, K, eos)
    assert feats is None and seqs.soft_ids.shape == seqs.soft_p.shape == (24, L, K)
    ended = 0
    for r in range(len(ids)):
        p = _direct_p(target.model, ids[r], int(pad[r]), V)  # column c of the row: p[c - pad]
        answer = ids[r, P:].tolist()
        end = answer.index(eos) if eos in answer else L
        at = P - int(pad[r]) - 1 + torch.arange(min(end + 1, L))  # the columns predicting answer tokens 0..end
        top = p[at].topk(K, dim=-1)
        torch.testing.assert_close(seqs.soft_p[r, :len(at)].float(), top.values, atol=2e-3, rtol=2e-3)
        assert torch.equal(seqs.soft_ids[r, :len(at)].long(), top.indices)
        shifted = p[at + 1].topk(K, dim=-1)  # the control: one column later is another distribution
        assert not torch.allclose(seqs.soft_p[r, :len(at)].float(), shifted.values, atol=2e-3)
        if end + 1 < L:  # after the answer's eos: p one-hot on it, as the teacher loop keeps it
            ended += 1
            assert (seqs.soft_ids[r, end + 1:, 0] == eos).all() and (seqs.soft_p[r, end + 1:, 0] == 1).all()
            assert (seqs.soft_p[r, end + 1:, 1:] == 0).all()
    assert 0 < ended < len(ids)  # both kinds of answer were checked


def test_a_prefill_of_generated_answers_keeps_the_teacher_loops_labels_and_features(chat_gpt2, pairs):
    """The same tokens through continue_batch (greedy, eos) and through prefill_batch: equal soft
    labels and features; the features are the target's hidden states (features.py), zero on padding."""
    target = load_target(str(chat_gpt2))
    eos, V = target.eos_token_id, target.vocab_size
    ids, pad = prefill_rows(str(pairs), target.tokenizer, P, L, eos)
    ids, pad = ids[:6], pad[:6]
    generated, gen_feats = continue_batch(target.model, ids[:, :P], L, V, Sampling(0.0),
                                          torch.Generator().manual_seed(0), None, K, pad, eos, layer_ids=(0, 1))
    seqs, feats = prefill_batch(target.model, generated.ids, pad, P, V, None, K, eos, (0, 1))
    assert torch.equal(seqs.ids, generated.ids) and torch.equal(seqs.soft_ids, generated.soft_ids)
    torch.testing.assert_close(seqs.soft_p.float(), generated.soft_p.float(), atol=2e-3, rtol=2e-3)
    want = sequence_features(target.model, generated.ids, pad, (0, 1))
    assert feats.shape == want.shape == (6, P + L, 2 * target.model.config.hidden_size)
    torch.testing.assert_close(feats.float(), want.float(), atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(feats.float(), gen_feats.float(), atol=2e-3, rtol=2e-3)
    assert (feats[0, :int(pad[0])] == 0).all()
    other = sequence_features(target.model, generated.ids, pad, (1, 0))  # the control: other layers' order
    assert not torch.allclose(feats.float(), other.float(), atol=1e-2)


def _distill(model, out, *extra):
    return CliRunner().invoke(cli, ["distill", "--target", str(model), "--out", str(out), *RUN, *extra])


def test_a_prefill_cache_trains_a_dflash_drafter_and_resumes(chat_gpt2, pairs, tmp_path):
    out = tmp_path / "run"
    first = _distill(chat_gpt2, out, "--prefill", "--prompts", str(pairs), "--max-steps", "2")
    assert first.exit_code == 0, first.output
    train, val, spec = read_sequences(out / "data")
    assert spec.prefill and spec.prompts == str(pairs.resolve())
    assert (spec.num_prompts, spec.val_prompts, len(train), len(val)) == (22, 2, 22, 2)
    assert train.soft_p.shape == (22, L, K) and (out / "data" / "features-0-1" / "train-00000.safetensors").is_file()
    again = _distill(chat_gpt2, out, "--prefill", "--prompts", str(pairs), "--max-steps", "4", "--resume")
    assert again.exit_code == 0, again.output
    report = json.loads((out / "report.json").read_text())
    assert report["compute"]["steps"] == 4 and report["val_loss"]["history"][0][0] == 0
    other = _distill(chat_gpt2, out, "--prefill", "--prompts", str(pairs), "--max-steps", "4", "--resume",
                     "--soft-labels", "4")
    assert other.exit_code != 0 and "other settings (soft_labels)" in other.output


def test_a_prefill_part_joins_generated_data(chat_gpt2, pairs, tmp_path):
    part = tmp_path / "part"
    made = _distill(chat_gpt2, tmp_path / "unused", "--prefill", "--prompts", str(pairs), "--data", str(part),
                    "--data-only")
    assert made.exit_code == 0, made.output
    questions = tmp_path / "questions.txt"
    questions.write_text("".join(f"Say part {i} again.\n" for i in range(20)), encoding="utf-8")
    run = _distill(chat_gpt2, tmp_path / "run", "--prompts", str(questions), "--num-prompts", "8",
                   "--more-data", str(part), "--max-steps", "2")
    assert run.exit_code == 0, run.output
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["compute"]["train_sequences"] == 8 + 22


@pytest.mark.parametrize("content, extra, message", [
    (None, (), "cannot read prefill file"),
    ('{"prompt": "q", "answer": "a"}\nnot json\n', (), 'line 2: not a JSON object with string "prompt" and "answer"'),
    ('{"prompt": "q"}\n', (), 'line 1: not a JSON object with string "prompt" and "answer"'),
    ('[1, 2]\n', (), 'line 1: not a JSON object'),
    ('{"prompt": "q", "answer": "a"}\n' * 3, ("--prompt-tokens", "2"), "no question in"),
    ('{"prompt": "q", "answer": "a"}\n', (), "needs at least 2 usable question / answer pairs"),
])
def test_bad_prefill_input_is_one_line_and_no_files(chat_gpt2, tmp_path, content, extra, message):
    path = tmp_path / "pairs.jsonl"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    out = tmp_path / "run"
    result = _distill(chat_gpt2, out, "--prefill", "--prompts", str(path), "--max-steps", "1", *extra)
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists() or not any(p.is_file() for p in out.rglob("*"))


@pytest.mark.parametrize("extra, message", [((), "--prefill needs --chat"),
                                            (("--chat", "--samples-per-prompt", "2"), "--samples-per-prompt 2")])
def test_prefill_needs_chat_and_one_answer(chat_gpt2, pairs, tmp_path, extra, message):
    args = ["distill", "--target", str(chat_gpt2), "--out", str(tmp_path / "r"), "--prefill", "--prompts", str(pairs)]
    result = CliRunner().invoke(cli, [*args, *extra])
    assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output, result.output


def test_prefill_sh_makes_resumable_parts_until_the_corpus_ends(tiny, tmp_path):
    """scripts/smol/prefill.sh as written (P 96, L 128, top-32, layers 1, 14, 27, a DFlash shape of 9
    heads) on a tiny 28-layer GPT-2 with a chat template: parts of PREFILL_ROWS rows, the last one
    shorter, then it stops; a second run skips the finished parts."""
    root = Path(__file__).resolve().parents[1]
    model = with_chat(make_gpt2(tmp_path / "gpt2-28-plain", tiny.tokenizer, layers=28, dim=36, n_positions=256,
                                scale=10), tmp_path / "gpt2-28", eos_pad=True)
    work = tmp_path / "work"
    work.mkdir()
    rows = [{"prompt": f"Part {i}?", "answer": " ".join(SENTENCES[i % len(SENTENCES):][:1 + i % 4])} for i in range(30)]
    (work / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "specdiff").write_text(f'#!/bin/sh\nexec {sys.executable} -c "import sys; sys.argv[0] = \'specdiff\'; '
                                      'from specdiff_cli.main import main; main()" "$@"\n')
    (bin_dir / "specdiff").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(root),
           "PREFILL_TARGET": str(model), "PREFILL_ROWS": "12", "OMP_NUM_THREADS": "1"}
    script = [str(root / "scripts" / "smol" / "prefill.sh"), str(work), "4"]
    done = subprocess.run(script, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the corpus ends before part 3" in done.stderr
    sizes = []
    for i in range(3):
        train, val, spec = read_sequences(work / "prefill" / f"part-{i:02d}")
        features = work / "prefill" / f"part-{i:02d}" / "features-1-14-27"
        assert spec.prefill and spec.chat and train.soft_p.shape[1:] == (128, 32)
        assert (features / "val.safetensors").is_file() and (features / "train-00000.safetensors").is_file()
        sizes.append((len(train), len(val)))
    assert sizes == [(11, 1), (11, 1), (5, 1)]
    stamp = (work / "prefill" / "part-00" / "val.safetensors").stat().st_mtime_ns
    again = subprocess.run(script, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (work / "prefill" / "part-00" / "val.safetensors").stat().st_mtime_ns == stamp


def test_a_prefill_cache_trains_a_diffusion_drafter(chat_gpt2, pairs, tmp_path):
    """The diffusion drafter's path (data.prepare, the mask id banned from the soft labels) takes a
    prefill too."""
    out = tmp_path / "diffusion"
    args = ["distill", "--target", str(chat_gpt2), "--out", str(out), "--chat", "--prefill", "--prompts", str(pairs),
            "--prompt-tokens", str(P), "--continuation-tokens", str(L), "--soft-labels", str(K), "--loss", "ce+kl",
            "--layers", "1", "--dim", "32", "--heads", "2", "--context", "16", "--gamma", "4", "--batch-size", "4",
            "--max-steps", "2", "--val-every", "1", "--eval-prompts", "2", "--threads", "1"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    train, _, spec = read_sequences(out / "data")
    assert spec.prefill and spec.banned_id is None and len(train) == 22
