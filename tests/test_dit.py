"""The DDiT backbone: shapes, bidirectionality, sigma conditioning, drafter init round trip."""

import torch

from specdiff import load_drafter
from specdiff.drafters.diffusion import DiffusionProposer, block_sizes
from specdiff.nets.dit import DDiT, DiTConfig, apply_rotary
from specdiff.sampling import Sampling


def _net(**kw):
    cfg = DiTConfig(vocab_size=11, hidden_size=16, n_heads=2, n_blocks=2, cond_dim=8, **kw)
    return DDiT(cfg).init_random(torch.Generator().manual_seed(0), std=0.2).eval()


def test_forward_shape_and_bidirectional_attention():
    net = _net()
    ids = torch.randint(0, 10, (3, 7))
    out = net(ids, torch.zeros(3))
    assert out.shape == (3, 7, 11)
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 10
    assert not torch.allclose(net(changed, torch.zeros(3))[:, 0], out[:, 0])  # sees the future


def test_sigma_matters_only_with_time_conditioning():
    ids = torch.randint(0, 10, (2, 5))
    timed, untimed = _net(time_conditioning=True), _net(time_conditioning=False)
    assert not torch.allclose(timed(ids, torch.zeros(2)), timed(ids, torch.ones(2)))
    torch.testing.assert_close(untimed(ids, torch.zeros(2)), untimed(ids, torch.ones(2)))


def test_rotary_is_half_split_and_relative():
    x = torch.randn(1, 1, 4, 8)
    cos, sin = _net().rotary_emb(4, x.device)
    y = apply_rotary(x, cos, sin)
    a, b = x[..., :4], x[..., 4:]
    torch.testing.assert_close(y, torch.cat([a * cos[:, :4] - b * sin[:, :4], b * cos[:, :4] + a * sin[:, :4]], -1))
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))  # a rotation


def test_block_sizes():
    assert block_sizes(8, 3) == [3, 3, 2]
    assert block_sizes(2, 5) == [1, 1]
    assert sum(block_sizes(13, 4)) == 13


def test_drafter_init_round_trip_and_drafts_on_real_vocab(tiny):
    drafter = load_drafter(str(tiny.drafter))
    assert drafter.vocab_size == 300 and drafter.mask_id == 300 and drafter.config.vocab_size == 301
    ctx = torch.randint(0, 300, (2, 20))
    for schedule, steps in (("l2r", 3), ("oneshot", 1), ("confidence", 2)):
        d = DiffusionProposer(drafter, schedule, steps).propose(ctx, 5, Sampling(1.0), torch.Generator().manual_seed(0))
        assert d.tokens.shape == (2, 5) and d.q.shape == (2, 5, 300) and d.calls == steps
        assert (d.tokens < 300).all()
        torch.testing.assert_close(d.q.sum(-1), torch.ones(2, 5))
        assert (d.q.gather(-1, d.tokens[..., None]) > 0).all()  # each token was drawable from its q
