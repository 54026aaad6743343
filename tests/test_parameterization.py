"""The SEDD log-score and MDLM SUBS parameterisations, and the drafter's x0 distribution."""

from __future__ import annotations

import math

import pytest
import torch

from specdiff.drafters.diffusion import DiffusionDrafter, loglinear_sigma
from specdiff.errors import LoadError
from specdiff.nets.dit import DDiT, DiTConfig
from specdiff.nets.parameterization import esigm1_log, get_parameterization, sedd_log_score, subs_log_probs, x0_logits

V_REAL, MASK, ROWS = 12, 12, 15  # real vocabulary 0..11, mask 12, padding rows 13 and 14


def _raw_and_ids(seed: int = 0, B: int = 3, L: int = 7):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(B, L, ROWS, generator=g) * 3
    raw[..., MASK:] += 20  # mass a wrong implementation would put on the mask / padding rows
    ids = torch.randint(0, V_REAL, (B, L), generator=g)
    ids[:, 2:5] = MASK
    ids[0, 0] = MASK
    sigma = torch.tensor([0.01, 0.7, 6.9])[:B]
    return raw, ids, sigma


def test_esigm1_log_both_branches():
    sigma = torch.tensor([1e-4, 0.1, 0.49, 0.5, 2.0, 6.9])
    exact = torch.log(torch.expm1(sigma.double()))
    assert torch.allclose(esigm1_log(sigma).double(), exact, rtol=1e-6, atol=1e-6)


def test_sedd_log_score_formula_and_zero_at_current_token():
    raw, ids, sigma = _raw_and_ids()
    s = sedd_log_score(raw, ids, sigma)
    assert s.shape == raw.shape and s.dtype == torch.float32
    assert torch.all(s.gather(-1, ids[..., None]) == 0)  # the current token's column
    expected = raw.double() - torch.log(torch.expm1(sigma.double()))[:, None, None] - math.log(ROWS - 1)
    other = torch.ones_like(s, dtype=torch.bool).scatter(-1, ids[..., None], False)
    assert torch.allclose(s[other].double(), expected[other], atol=1e-5)


def test_subs_masked_rows_are_distributions_without_the_mask():
    raw, ids, sigma = _raw_and_ids()
    p = subs_log_probs(raw, ids, sigma, MASK).exp()
    masked = ids == MASK
    assert torch.allclose(p[masked].sum(-1), torch.ones(int(masked.sum())), atol=1e-6)
    assert torch.all(p[masked][:, MASK] == 0)
    others = [j for j in range(ROWS) if j != MASK]
    assert torch.allclose(p[masked][:, others], torch.softmax(raw[..., others], -1)[masked], atol=1e-6)


def test_subs_unmasked_rows_are_one_hot():
    raw, ids, sigma = _raw_and_ids()
    p = subs_log_probs(raw, ids, sigma, MASK).exp()
    keep = ids != MASK
    assert torch.equal(p[keep], torch.nn.functional.one_hot(ids[keep], ROWS).float())


@pytest.mark.parametrize("name", ["sedd", "subs"])
def test_x0_at_masked_slots_is_softmax_of_raw_over_real_vocabulary(name):
    raw, ids, sigma = _raw_and_ids()
    logits = x0_logits(name, raw, ids, sigma, MASK, V_REAL)
    assert logits.shape == (*ids.shape, V_REAL)
    masked = ids == MASK
    q = torch.softmax(logits[masked], -1)
    assert torch.allclose(q, torch.softmax(raw[..., :V_REAL], -1)[masked], rtol=1e-5, atol=1e-7)
    assert torch.allclose(q.sum(-1), torch.ones(len(q)), atol=1e-6)


def test_x0_would_differ_if_mask_or_padding_rows_were_kept():
    """The property above is not vacuous: the extra rows carry most of the raw mass."""
    raw, ids, sigma = _raw_and_ids()
    masked = ids == MASK
    assert torch.softmax(raw, -1)[masked][:, MASK:].sum(-1).min() > 0.99


def test_unknown_parameterization():
    with pytest.raises(LoadError, match="unknown parameterization 'score'.*sedd, subs"):
        get_parameterization("score")


def _drafter(parameterization: str, *, zero_adaln_weights: bool) -> DiffusionDrafter:
    cfg = DiTConfig(vocab_size=ROWS, hidden_size=16, n_heads=2, n_blocks=2, cond_dim=8, time_conditioning=True)
    g = torch.Generator().manual_seed(3)
    dit = DDiT(cfg).init_random(g, std=0.3)
    with torch.no_grad():
        for name, p in dit.named_parameters():
            if "adaLN" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
                if zero_adaln_weights and name.endswith("weight"):
                    p.zero_()
    return DiffusionDrafter(dit, vocab_size=V_REAL, mask_id=MASK, context_length=8,
                            parameterization=parameterization).eval()


def test_backbone_output_independent_of_sigma_when_adaln_weights_are_zero():
    ids = torch.randint(0, V_REAL, (2, 9), generator=torch.Generator().manual_seed(4))
    for zero, same in ((True, True), (False, False)):
        d = _drafter("subs", zero_adaln_weights=zero)
        a, b = d(ids, torch.tensor([0.01, 0.01])), d(ids, torch.tensor([4.0, 4.0]))
        assert torch.equal(a, b) is same


@pytest.mark.parametrize("name", ["sedd", "subs"])
def test_drafter_x0_logits_exact_at_masked_slots(name):
    d = _drafter(name, zero_adaln_weights=False)
    ids = torch.randint(0, V_REAL, (2, 10), generator=torch.Generator().manual_seed(5))
    ids[:, 6:] = MASK
    ids[1, 3] = MASK
    logits = d.x0_logits(ids)
    sigma = loglinear_sigma((ids == MASK).float().mean(1))
    raw = d(ids, sigma)
    masked = ids == MASK
    assert logits.shape == (2, 10, V_REAL) and logits.dtype == torch.float32
    assert torch.allclose(torch.softmax(logits[masked], -1), torch.softmax(raw[..., :V_REAL], -1)[masked],
                          rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["sedd", "subs"])
def test_x0_logits_of_the_last_slots_only(name):
    """Projecting only the draft slots gives the same logits there as projecting every position."""
    d = _drafter(name, zero_adaln_weights=False)
    ids = torch.randint(0, V_REAL, (2, 10), generator=torch.Generator().manual_seed(7))
    ids[:, 6:] = MASK
    ids[0, 7] = 3  # a committed slot among the last four
    last = d.x0_logits(ids, last=4)
    assert last.shape == (2, 4, V_REAL)
    assert torch.allclose(last, d.x0_logits(ids)[:, 6:], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["sedd", "subs"])
def test_x0_independent_of_sigma_when_adaln_weights_are_zero(name):
    ids = torch.randint(0, V_REAL, (1, 10), generator=torch.Generator().manual_seed(6))
    ids[:, 7:] = MASK
    for zero, same in ((True, True), (False, False)):
        d = _drafter(name, zero_adaln_weights=zero)
        q = [torch.softmax(x0_logits(name, d(ids, s), ids, s, MASK, V_REAL)[0, 7:], -1)
             for s in (torch.tensor([0.05]), torch.tensor([3.0]))]
        assert torch.allclose(q[0], q[1], atol=1e-6) is same


def test_subs_is_differentiable():
    """Training through the public x0 path needs SUBS to be out of place."""
    raw = torch.randn(2, 5, 7, requires_grad=True)
    ids = torch.tensor([[6, 1, 6, 2, 6], [0, 6, 6, 6, 3]])
    logp = subs_log_probs(raw, ids, None, mask_id=6)
    logp[ids == 6].logsumexp(-1).sum().backward()
    assert raw.grad is not None and torch.isfinite(raw.grad).all()


class _TorchGraph:
    """A Runtime whose graph is the drafter's own network: what an export of it computes."""

    limits = None

    def __init__(self, drafter: DiffusionDrafter):
        self.drafter = drafter

    def run(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"logits": self.drafter(inputs["input_ids"], inputs["sigma"])}


@pytest.mark.parametrize("name", ["sedd", "subs"])
def test_graph_drafter_x0_logits_are_the_drafters_exactly(name):
    """GraphDrafter (runtimes) and DiffusionDrafter run one chain from ids to x0 logits
    (x0_logits_from): over the same network they agree bit for bit, every slot, not up to a constant."""
    from specdiff.runtimes.models import GraphDrafter

    d = _drafter(name, zero_adaln_weights=False)
    model = {"name": "d", "vocab_size": V_REAL, "mask_id": MASK, "context_length": 8, "parameterization": name,
             "time_conditioning": True}
    graph = GraphDrafter(_TorchGraph(d), model, tokenizer=None, device="cpu")
    ids = torch.randint(0, V_REAL, (3, 10), generator=torch.Generator().manual_seed(8))
    ids[:, 6:] = MASK
    ids[1, 7] = 2  # a committed slot
    assert torch.equal(graph.x0_logits(ids), d.x0_logits(ids))
    assert torch.equal(graph.x0_logits(ids, 4), d.x0_logits(ids)[:, 6:])  # the graph computes all L
