"""KV-cache rollback: after extend + rollback + extend, logits equal a from-scratch forward pass."""

import pytest
import torch

from specdiff import load_drafter, load_target
from specdiff.drafters.autoregressive import ARProposer
from specdiff.sampling import Sampling


@pytest.mark.parametrize("model", ["gpt2", "neo"])
def test_rollback_matches_full_forward(tiny, model):
    target = load_target(str(getattr(tiny, model)))
    ids = torch.randint(0, target.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    target.prefill(ids[:, :10])
    target.extend(ids[:, 10:25])  # 15 speculative tokens, most of them "rejected" below
    target.rollback(13)
    assert target.length == 13
    got = target.extend(ids[:, 13:40])  # past the local-attention window of GPT-Neo (8)
    full = target.model(ids).logits[..., : target.vocab_size]
    torch.testing.assert_close(got, full[:, 13:40], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model", ["gpt2", "neo"])
def test_forked_rows_match_full_forwards(tiny, model):
    """keep([0, 0, 0]) forks the cached row into K rows, keep([k]) keeps one (self-selection): each
    row's logits, and the kept row after a rollback, equal from-scratch forward passes."""
    target = load_target(str(getattr(tiny, model)))
    ids = torch.randint(0, target.vocab_size, (3, 40), generator=torch.Generator().manual_seed(0))
    ids[:, :12] = ids[0, :12]  # a shared context, three different continuations
    target.prefill(ids[:1, :12])
    full = target.model(ids).logits[..., : target.vocab_size]
    target.keep([0, 0, 0])
    torch.testing.assert_close(target.extend(ids[:, 12:20]), full[:, 12:20], atol=1e-5, rtol=1e-5)
    target.keep([2])
    target.rollback(15)
    got = target.extend(ids[2:, 15:40])  # past the local-attention window of GPT-Neo (8)
    torch.testing.assert_close(got, full[2:, 15:40], atol=1e-5, rtol=1e-5)


def test_rollback_to_longer_length_is_a_no_op(tiny):
    target = load_target(str(tiny.gpt2))
    target.prefill(torch.tensor([[1, 2, 3]]))
    target.rollback(5)
    assert target.length == 3


def test_padded_head_is_cut_to_the_tokenizer(tiny):
    target = load_target(str(tiny.gpt2))
    assert target.model.config.vocab_size == 320 and target.vocab_size == 300
    logits = target.prefill(torch.tensor([[5, 6, 7]]))
    assert logits.shape == (1, 3, 300)


def test_ar_drafter_cache_reuse_equals_fresh_drafts(tiny):
    """The AR drafter keeps its cache across calls; drafts must equal drafts from an empty cache."""
    drafter = load_drafter(str(tiny.ar))
    kept, greedy = ARProposer(drafter), Sampling()
    g = torch.Generator().manual_seed(1)
    ctx = torch.randint(0, 300, (1, 12), generator=g)
    for step in range(6):
        fresh = ARProposer(drafter).propose(ctx, 4, greedy, None)
        reused = kept.propose(ctx, 4, greedy, None)
        assert torch.equal(fresh.tokens, reused.tokens)
        torch.testing.assert_close(fresh.q, reused.q)
        # the next context keeps a prefix of the draft and appends a different token
        keep = step % 3
        ctx = torch.cat([ctx, reused.tokens[:, :keep], torch.tensor([[(step * 37) % 300]])], dim=1)
