"""Unit properties of warping and the acceptance rules (exactness itself: test_sampling_exact)."""

import pytest
import torch

from specdiff.acceptance import RULES, greedy, leading_true, match, standard
from specdiff.errors import UsageError
from specdiff.sampling import Sampling

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])


def test_greedy_probs_are_one_hot_on_the_argmax():
    assert Sampling().probs(LOGITS).tolist() == [1, 0, 0, 0, 0]


def test_top_k_keeps_k_tokens():
    p = Sampling(1.0, top_k=2).probs(LOGITS)
    assert (p > 0).tolist() == [True, True, False, False, False]
    torch.testing.assert_close(p[:2], LOGITS[:2].softmax(0))


def test_top_p_keeps_the_smallest_set_reaching_p():
    full = LOGITS.softmax(0)  # [0.53, 0.20, 0.12, 0.07, 0.03]
    p = Sampling(1.0, top_p=0.6).probs(LOGITS)
    assert (p > 0).tolist() == [True, True, False, False, False]
    assert Sampling(1.0, top_p=full[0].item() * 0.5).probs(LOGITS).tolist() == [1, 0, 0, 0, 0]


def sorted_nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The set top-p keeps, by its definition: sort, keep while the mass above is below top_p."""
    sorted_p, order = probs.sort(-1, descending=True)
    keep = (sorted_p.cumsum(-1) - sorted_p) < top_p
    keep[..., 0] = True
    return torch.zeros_like(keep).scatter(-1, order, keep)


@pytest.mark.parametrize("scale", [0.3, 3.0, 30.0])  # flat: the full sort; peaked: the top 256 hold it
def test_top_p_from_the_largest_values_is_the_sorted_definition_row_by_row(scale):
    """A 49,152-token vocabulary (SmolLM2's): rows whose set needs 256, 4,096 or every value keep
    the set a full sort keeps, and a row alone keeps what it keeps in a batch of such rows."""
    logits = torch.randn(6, 3, 49152, generator=torch.Generator().manual_seed(int(scale * 10))) * scale
    for top_p in (0.5, 0.95):
        got = Sampling(1.0, top_p=top_p).probs(logits)
        assert torch.equal(got > 0, sorted_nucleus(logits.softmax(-1), top_p))
        torch.testing.assert_close(got.sum(-1), torch.ones(6, 3))
        assert torch.equal(Sampling(1.0, top_p=top_p).probs(logits[4:5, 1:2]), got[4:5, 1:2])


def test_top_p_keeps_every_token_tied_with_the_last_one_kept():
    probs = torch.tensor([0.4, 0.2, 0.2, 0.1, 0.1])
    torch.testing.assert_close(Sampling(1.0, top_p=0.5).probs(probs.log()), torch.tensor([0.5, 0.25, 0.25, 0, 0]))


def test_temperature_scales_logits():
    torch.testing.assert_close(Sampling(0.5).probs(LOGITS), (LOGITS / 0.5).softmax(0))


@pytest.mark.parametrize("kwargs", [{"temperature": -0.1}, {"temperature": float("nan")}, {"top_p": 0.0},
                                    {"top_p": 1.5}, {"top_k": -1}])
def test_bad_sampling_parameters_are_refused(kwargs):
    with pytest.raises(UsageError):
        Sampling(**kwargs)


def test_leading_true():
    ok = torch.tensor([[True, True, False, True], [False, True, True, True], [True] * 4])
    assert leading_true(ok).tolist() == [2, 0, 4]


def _one_hot(ids, V=5):
    return torch.nn.functional.one_hot(torch.tensor(ids), V).float()


def test_greedy_rule_accepts_the_matching_prefix_then_corrects():
    p = _one_hot([[1, 2, 3, 4]])  # target argmax at each of gamma + 1 positions
    n, y = greedy(torch.tensor([[1, 2, 0]]), None, p)
    assert (n.item(), y.item()) == (2, 3)
    n, y = greedy(torch.tensor([[1, 2, 3]]), None, p)
    assert (n.item(), y.item()) == (3, 4)  # all accepted: the bonus token


def test_standard_rule_with_p_equal_q_accepts_everything():
    g = torch.Generator().manual_seed(0)
    q = torch.rand(64, 3, 5, generator=g).softmax(-1)
    p = torch.cat([q, q[:, :1]], dim=1)
    draft = torch.multinomial(q.reshape(-1, 5), 1, generator=g).reshape(64, 3)
    n, _ = standard(draft, q, p, g)
    assert (n == 3).all()


def test_standard_rule_never_accepts_a_token_the_target_rules_out():
    q = torch.full((100, 2, 5), 0.2)
    p = _one_hot([[0, 0, 0]]).repeat(100, 1, 1)
    draft = torch.ones(100, 2, dtype=torch.long)  # p(1) = 0
    n, y = standard(draft, q, p, torch.Generator().manual_seed(0))
    assert (n == 0).all() and (y == 0).all()  # residual max(0, p - q) is all on token 0


def test_match_rule_with_a_deterministic_target_is_greedy():
    p = _one_hot([[1, 2, 3]])
    n, y = match(torch.tensor([[1, 4]]), None, p, torch.Generator().manual_seed(0))
    assert (n.item(), y.item()) == (1, 2)


def _rows(seed: int, B: int = 6, g: int = 3, V: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """B rows of a draft (B, g), its q (B, g, V) and p (B, g + 1, V), flat enough to reject often."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(B, g, V, generator=gen), -1)
    p = torch.softmax(torch.randn(B, g + 1, V, generator=gen), -1)
    return torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(B, g), q, p


@pytest.mark.parametrize("name", sorted(RULES))
def test_a_rule_over_rows_with_their_own_generators_draws_what_each_row_draws_alone(name):
    """Verify applies a rule to a whole batch with one generator per row: each row's (n, y) must
    be what it gets alone from its generator (a batch's outputs = its rows' alone). The control:
    one generator shared by the batch gives other draws."""
    rule, (draft, q, p) = RULES[name], _rows(0)
    seeds = range(10, 10 + len(draft))
    n, y = rule(draft, q, p, [torch.Generator().manual_seed(s) for s in seeds])
    alone = [rule(draft[b:b + 1], q[b:b + 1], p[b:b + 1], torch.Generator().manual_seed(s)) for b, s in enumerate(seeds)]
    assert n.tolist() == [int(a[0][0]) for a in alone] and y.tolist() == [int(a[1][0]) for a in alone]
    if name != "greedy":
        shared_n, shared_y = rule(draft, q, p, torch.Generator().manual_seed(10))
        assert (shared_n.tolist(), shared_y.tolist()) != (n.tolist(), y.tolist())
