"""Distillation for sampling and long streaks (SpecDiff-2, DistillSpec): the streak losses have
their formulas' values, every loss trains a tiny drafter, sampled teacher data is reproducible by
seed and mixes its settings by chunk, and the target's soft labels are what it says and survive
the cache."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.functional import softmax

from specdiff.loading import load_drafter, load_target
from specdiff.sampling import Sampling
from specdiff.training.batches import Pattern, make_batch
from specdiff.training.config import DistillConfig
from specdiff.training.distill import distill
from specdiff.training.losses import (LOSSES, ce_streak, expected_streak, loss_function, masked_ce,
                                      reach_weighted_log_q, slots, soft_kl, streak)
from specdiff.training.teacher import DataSpec, build_sequences, continue_batch, read_sequences
from tiny import TEXT

P, L, K = 16, 12, 8


def test_streak_formulas_on_a_hand_computed_case():
    """q = (1/2, 1/2, 1/2): c = 1/2, 1/4, 1/8; a row whose last slot is not scored stops at 2."""
    log_q = torch.full((2, 3), math.log(0.5))
    scored = torch.tensor([[True, True, True], [True, True, False]])
    assert torch.allclose(expected_streak(log_q.masked_fill(~scored, 0), scored), torch.tensor([0.875, 0.75]))
    # w = 1, 1/2, 1/4: -sum w log q = 1.75 log 2
    assert torch.allclose(reach_weighted_log_q(log_q), torch.full((2,), -1.75 * math.log(2)))
    log_q.requires_grad_(True)
    reach_weighted_log_q(log_q).sum().backward()  # the weights are held constant: d/dlog q_j = w_j
    assert torch.allclose(log_q.grad, torch.tensor([[1, 0.5, 0.25]] * 2))


@pytest.fixture(scope="module")
def drafter(tiny):
    return load_drafter(str(tiny.drafter))


@pytest.fixture(scope="module")
def seqs(tiny):
    """Sampled continuations of the tiny target with soft labels: (6, P + L), (6, L, K)."""
    target = load_target(str(tiny.gpt2))
    ids = torch.tensor(target.tokenizer.encode(TEXT * 2))
    prompts = torch.stack([ids[i:i + P] for i in range(0, 60, 10)])
    seqs, _ = continue_batch(target.model, prompts, L, target.vocab_size, Sampling(1.0),
                             torch.Generator().manual_seed(0), None, soft_labels=K)
    return seqs


def _batch(seqs, drafter, seed=0):
    return make_batch(seqs, Pattern(P, 4, 2, drafter.mask_id), 16, torch.Generator().manual_seed(seed), P, context=P)


def test_streak_losses_read_the_drafters_q_at_its_temperature(drafter, seqs):
    b = _batch(seqs, drafter)
    masked = b.xt[:, P:] == drafter.mask_id  # a clean l2r prefix, then the masked slots
    for temperature in (1.0, 0.5):
        q = softmax(drafter.x0_logits(b.xt)[:, P:].float() / temperature, -1)
        q_teacher = q.gather(-1, b.x0[:, P:, None])[..., 0].where(masked, torch.ones(()))  # (B, gamma)
        c = q_teacher.cumprod(1)
        assert torch.allclose(streak(slots(drafter, b), temperature), -(c * masked).sum(1).mean(), atol=1e-5)
        reach = torch.cat([torch.ones(16, 1), c[:, :-1]], 1)
        expected = -(reach * q_teacher.log()).sum(1).mean()
        assert torch.allclose(ce_streak(slots(drafter, b), temperature), expected, atol=1e-5)


def test_kl_is_forward_kl_over_the_soft_labels_and_the_rest(drafter, seqs):
    """KL over k + 1 bins: the k ids kept, and the rest of the vocabulary as one bin."""
    b = _batch(seqs, drafter)
    masked = b.xt[:, P:] == drafter.mask_id
    q = drafter.x0_logits(b.xt, last=4).softmax(-1).double()  # (B, gamma, V)
    p, q_kept = b.soft_p.double(), q.gather(-1, b.soft_ids)
    p_rest, q_rest = 1 - p.sum(-1), 1 - q_kept.sum(-1)
    kl = (p * (p / q_kept).log()).sum(-1) + p_rest * (p_rest / q_rest).log()
    assert torch.allclose(soft_kl(slots(drafter, b)).double(), kl[masked].mean(), atol=1e-5)
    assert 0.1 < p_rest.mean() < 0.9  # top-8 of 300 leaves part of the mass to the rest bin
    raw = make_batch(seqs, Pattern(P, 4, 2, drafter.mask_id), 8, torch.Generator().manual_seed(0), P,
                     torch.arange(200), 1.0, context=P)  # one-hot soft labels: the kl is the CE
    ce = -drafter.x0_logits(raw.xt, last=4).log_softmax(-1).gather(-1, raw.x0[:, P:, None])[..., 0]
    assert torch.allclose(soft_kl(slots(drafter, raw)), ce[raw.xt[:, P:] == drafter.mask_id].mean(), atol=1e-5)


def test_a_sum_of_losses_is_their_sum(drafter, seqs):
    b, cfg = _batch(seqs, drafter), DistillConfig("t", "o", "p", loss="ce+ce-streak", draft_temperature=0.5)
    assert torch.allclose(loss_function(cfg)(drafter, b), masked_ce(slots(drafter, b)) + ce_streak(slots(drafter, b), 0.5))
    calls = []
    hook = drafter.register_forward_hook(lambda *a: calls.append(1))
    loss_function(cfg)(drafter, b)
    hook.remove()
    assert len(calls) == 1  # one drafter pass for the sum (a pass per term doubled training time)


@pytest.mark.parametrize("name", sorted(LOSSES) + ["ce+kl"])
def test_every_loss_decreases_on_a_tiny_batch(tiny, seqs, name):
    drafter = load_drafter(str(tiny.drafter))  # a fresh copy: it is trained
    loss = loss_function(DistillConfig("t", "o", "p", loss=name, draft_temperature=0.7))
    batch = _batch(seqs, drafter, seed=1)
    opt = torch.optim.Adam(drafter.parameters(), lr=3e-3)
    values = []
    for _ in range(15):
        value = loss(drafter, batch)
        opt.zero_grad()
        value.backward()
        opt.step()
        values.append(value.item())
    assert values[-1] < values[0] - 0.1 * abs(values[0]), values


def test_soft_labels_are_the_targets_top_k(tiny, seqs):
    """Recomputed with one forward pass over the finished sequences (the KV-cache loop's p)."""
    target = load_target(str(tiny.gpt2))
    with torch.no_grad():
        p = target.model(seqs.ids).logits[:, P - 1:-1, :target.vocab_size].float().softmax(-1)  # (B, L, V)
    top = p.topk(K, dim=-1)
    assert seqs.soft_ids.dtype == torch.int32 and seqs.soft_p.dtype == torch.float16
    assert torch.allclose(seqs.soft_p.float(), top.values, atol=1e-3)
    assert torch.allclose(p.gather(-1, seqs.soft_ids.long()), top.values, atol=1e-5)  # same ids (ties aside)


def _spec(tiny, prompts, **changes):
    spec = dict(target="tiny", prompts=str(prompts), prompt_tokens=P, continuation_tokens=L, num_prompts=70,
                val_prompts=3, teacher_temperature=[1.0, 0.0], teacher_top_p=[0.9, 1.0], samples_per_prompt=2,
                soft_labels=4, seed=0, banned_id=None)
    return DataSpec(**{**spec, **changes})


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "prompts.txt"
    path.write_text(TEXT * 8, encoding="utf-8")
    return path


def test_sampled_teacher_data_is_reproducible_and_round_trips(tiny, prompts, tmp_path):
    """Two chunks (64 + 6 prompts, 2 samples each): chunk 0 sampled at (1, top-p 0.9), chunk 1
    greedy; the same seed gives the same data, another seed other samples."""
    target = load_target(str(tiny.gpt2))
    train, val, _ = build_sequences(tmp_path / "a", target, _spec(tiny, prompts), progress=False)
    assert train.ids.shape == (140, P + L) and val.ids.shape == (6, P + L) and train.soft_p.shape == (140, L, 4)
    again, _, _ = build_sequences(tmp_path / "b", target, _spec(tiny, prompts), progress=False)
    assert all(torch.equal(x, y) for x, y in zip(train.tensors().values(), again.tensors().values()))
    cached, _, spec = read_sequences(tmp_path / "a")  # the soft labels, as fp16 / int32, from the cache
    assert spec == _spec(tiny, prompts)
    assert all(torch.equal(x, y) for x, y in zip(train.tensors().values(), cached.tensors().values()))
    sampled, greedy = train.ids[:128, P:].view(64, 2, L), train.ids[128:, P:].view(6, 2, L)
    assert torch.equal(greedy[:, 0], greedy[:, 1]) and not torch.equal(sampled[:, 0], sampled[:, 1])
    other, _, _ = build_sequences(tmp_path / "c", target, _spec(tiny, prompts, seed=1), progress=False)
    assert not torch.equal(other.ids, train.ids)


def test_make_batch_carries_the_soft_labels_of_its_slots(drafter, seqs):
    b = _batch(seqs, drafter)
    assert b.soft_ids.shape == (16, 4, K)
    first = b.soft_ids[..., 0]  # the target's most likely token at each draft slot, given the prefix
    found = 0
    for i in range(16):
        for r in range(len(seqs)):
            for s in range(P, P + L - 4 + 1):
                if torch.equal(seqs.ids[r, s - P:s + 4], b.x0[i]):
                    assert torch.equal(seqs.soft_ids[r, s - P:s - P + 4, 0].long(), first[i])
                    found += 1
    assert found >= 16
    raw = make_batch(seqs, Pattern(P, 4, 2, drafter.mask_id), 8, torch.Generator().manual_seed(0), P,
                     torch.arange(200), 1.0, context=P)
    assert torch.equal(raw.soft_ids[..., 0], raw.x0[:, P:]) and torch.all(raw.soft_p[..., 0] == 1)
    assert torch.all(raw.soft_p[..., 1:] == 0)  # raw text rows: one-hot on the text


def test_a_kl_run_on_sampled_data_reports_its_teacher_and_soft_labels(tiny, prompts, tmp_path):
    cfg = DistillConfig(target=str(tiny.gpt2), prompts=str(prompts), out=str(tmp_path / "d"), layers=1, dim=32,
                        heads=2, context=P, gamma=4, steps_per_draft=1, num_prompts=8, continuation_tokens=L,
                        batch_size=8, max_steps=4, eval_prompts=2, loss="kl", soft_labels=4,
                        teacher_temperature=(1.0, 0.8), teacher_top_p=(0.95,), samples_per_prompt=2,
                        eval_temperature=0.7)
    report = distill(cfg)
    assert report["teacher"] == {"temperature": [1.0, 0.8], "top_p": [0.95], "samples_per_prompt": 2}
    assert report["soft_labels"]["k"] == 4 and 0 < report["soft_labels"]["mass_kept"]["mean"] < 1
    assert report["eval"]["sampled"]["temperature"] == 0.7 and report["eval"]["prompts"] == 2
    assert report["val_loss"]["final"] < report["val_loss"]["initial"]
