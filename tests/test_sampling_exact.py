"""Distribution exactness of speculative sampling, by a statistical test on a tiny vocabulary.

A tiny target (V = 8) and deliberately different ("adversarial") drafters. From one context, N
rows each run one speculative step batched exactly as the decoding loop runs it (the same
proposer, warping and acceptance functions), giving e = accepted draft tokens + the emitted token.
The first three generated tokens are e[:3], completed by plain target sampling where the step
emitted fewer (that is what the next steps would do, and plain sampling is the reference). Their
empirical joint distribution over 8^3 cells is compared with the exact one, enumerated from the
target, by a chi-square test. A deliberately broken rule must fail the same test.
"""

import pytest
import torch
from scipy.stats import chisquare
from tokenizers import Tokenizer, models
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from specdiff.acceptance import leading_true, match, standard
from specdiff.drafters.autoregressive import ARDrafter, ARProposer
from specdiff.drafters.diffusion import DiffusionDrafter, DiffusionProposer
from specdiff.nets.dit import DDiT, DiTConfig
from specdiff.sampling import Sampling, penalize, sample, seen_tokens

V, GAMMA, DEPTH, N = 8, 3, 3, 60_000
CONTEXT = torch.tensor([[1, 5, 2]])
P_EXACT, P_BROKEN = 1e-3, 1e-8  # thresholds on the chi-square p-value


def _tokenizer():
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(V)}, unk_token="t0"))
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _gpt2(seed, sharpness):
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                       tie_word_embeddings=False)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)  # peaked distributions: a sensitive test
    return model


@pytest.fixture(scope="module")
def target():
    return _gpt2(0, 60.0)


@pytest.fixture(scope="module")
def drafters():
    diffusion = DDiT(DiTConfig(vocab_size=V + 1, hidden_size=16, n_heads=2, n_blocks=1, cond_dim=8,
                               time_conditioning=False)).init_random(torch.Generator().manual_seed(3), std=0.3)
    return {"diffusion": DiffusionDrafter(diffusion, vocab_size=V, mask_id=V, context_length=8).eval(),
            "ar": ARDrafter(_gpt2(9, 10.0), _tokenizer())}


@torch.no_grad()
def _p(target, ids, sampling):
    """Warped target distribution after every prefix of ids (B, L) -> (B, L, V), with a
    repetition penalty applied by transformers' own processor, prefix by prefix."""
    logits = target(ids).logits
    if sampling.repetition_penalty != 1:
        hf = RepetitionPenaltyLogitsProcessor(sampling.repetition_penalty)
        logits = torch.stack([hf(ids[:, :j + 1], logits[:, j].clone()) for j in range(ids.shape[1])], 1)
    return sampling.probs(logits)


@torch.no_grad()
def exact_joint(target, sampling):
    """P(first DEPTH generated tokens) over V**DEPTH cells, by enumeration."""
    joint = torch.ones(1)
    prefixes = CONTEXT
    for _ in range(DEPTH):
        p = _p(target, prefixes, sampling)[:, -1]  # (V**d, V)
        joint = (joint[:, None] * p).reshape(-1)
        prefixes = torch.cat([prefixes.repeat_interleave(V, 0), torch.arange(V).repeat(len(prefixes))[:, None]], 1)
    return joint


@torch.no_grad()
def speculative_samples(target, proposer, rule, sampling, seed, verify_p=None):
    """N samples of the first DEPTH tokens through one batched speculative step
    -> (cell ids (N,), accepted draft tokens per row (N,)). verify_p(logits, context, draft) -> p:
    how the decoding loop turns the verify call's logits into p (Sampling.target_probs)."""
    g = torch.Generator().manual_seed(seed)
    ctx = CONTEXT.repeat(N, 1)
    draft = proposer.propose(ctx, GAMMA, sampling, g)  # (N, gamma), (N, gamma, V)
    logits = target(torch.cat([ctx, draft.tokens], 1)).logits[:, CONTEXT.shape[1] - 1:]  # (N, gamma+1, V)
    p = (verify_p or sampling.target_probs)(logits, ctx, draft.tokens)
    n, y = rule(draft.tokens, draft.q, p, g)
    return first_tokens(target, draft.tokens, n, y, sampling, g), n


@torch.no_grad()
def first_tokens(target, tokens, n, y, sampling, g):
    """A step's outcome, tokens (N, gamma) of which n (N,) were accepted, then y (N,) -> the cell
    ids (N,) of the first DEPTH tokens, completed by plain target sampling."""
    ctx = CONTEXT.repeat(N, 1)
    emitted = torch.cat([tokens, y[:, None]], 1)  # row i: tokens[:n_i] then y at index n_i
    emitted[torch.arange(N), n] = y
    seqs = torch.cat([ctx, emitted], 1)
    for d in range(DEPTH):  # positions the step did not emit: plain target sampling
        col = CONTEXT.shape[1] + d
        missing = n < d
        if missing.any():
            nxt = sample(_p(target, seqs[missing, :col], sampling)[:, -1], g)
            seqs[missing, col] = nxt
    firsts = seqs[:, CONTEXT.shape[1]: CONTEXT.shape[1] + DEPTH]
    return (firsts * V ** torch.arange(DEPTH - 1, -1, -1)).sum(1)


def chi_square_pvalue(cells, joint):
    observed = torch.bincount(cells, minlength=V ** DEPTH).double()
    impossible = joint == 0
    assert observed[impossible].sum() == 0, "tokens outside the warped support were emitted"
    expected = joint[~impossible].double() * len(cells)
    observed = observed[~impossible]
    small = expected < 5  # pool sparse cells so the chi-square approximation holds
    obs = torch.cat([observed[~small], observed[small].sum()[None] if small.any() else observed[:0]])
    exp = torch.cat([expected[~small], expected[small].sum()[None] if small.any() else expected[:0]])
    result = chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item())
    print(f"chi-square {result.statistic:.1f} on {len(obs) - 1} degrees of freedom: p = {result.pvalue:.4g}")
    return result.pvalue


def broken_residual(draft, q, p, generator=None):
    """A classic bug: on rejection, resample from p instead of norm(max(0, p - q))."""
    B, g = draft.shape
    p_x = p[:, :g].gather(-1, draft[..., None])[..., 0]
    q_x = q.gather(-1, draft[..., None])[..., 0]
    n = leading_true(torch.rand(B, g, generator=generator) * q_x < p_x)
    return n, sample(p[torch.arange(B), n], generator)


def always_accept(draft, q, p, generator=None):
    n = torch.full((draft.shape[0],), draft.shape[1])
    return n, sample(p[:, -1], generator)


SAMPLINGS = {"t1": Sampling(1.0), "t0.7-top3": Sampling(0.7, top_k=3), "top-p0.8": Sampling(1.0, top_p=0.8),
             "t1-rep3": Sampling(1.0, repetition_penalty=3.0)}
CASES = [  # (drafter, schedule, steps, rule, sampling)
    ("diffusion", "oneshot", 1, standard, "t1"),
    ("diffusion", "l2r", 2, standard, "t1"),
    ("diffusion", "l2r", 3, standard, "t0.7-top3"),
    ("diffusion", "l2r", 2, standard, "top-p0.8"),
    ("diffusion", "confidence", 3, match, "t1"),
    ("diffusion", "confidence", 2, match, "top-p0.8"),
    ("ar", None, None, standard, "t1"),
    ("ar", None, None, standard, "t0.7-top3"),
    ("ar", None, None, match, "top-p0.8"),
    ("diffusion", "l2r", 2, standard, "t1-rep3"),
    ("ar", None, None, standard, "t1-rep3"),
]


def _proposer(drafters, kind, schedule, steps):
    if kind == "ar":
        return ARProposer(drafters["ar"])
    return DiffusionProposer(drafters["diffusion"], schedule, steps)


@pytest.mark.parametrize("kind,schedule,steps,rule,sampling", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3].__name__}-{c[4]}" for c in CASES])
def test_speculative_step_has_the_target_distribution(target, drafters, kind, schedule, steps, rule, sampling):
    s = SAMPLINGS[sampling]
    cells, n = speculative_samples(target, _proposer(drafters, kind, schedule, steps), rule, s, seed=11)
    pvalue = chi_square_pvalue(cells, exact_joint(target, s))
    print(f"accepted {n.float().mean():.3f} draft tokens per step")
    assert pvalue > P_EXACT
    # the test is only sensitive when drafts are neither always rejected nor always accepted
    assert 0.05 < (n > 0).float().mean() < 0.95


@pytest.mark.parametrize("broken", [broken_residual, always_accept])
@pytest.mark.parametrize("kind,schedule", [("diffusion", "l2r"), ("ar", None)])
def test_a_broken_rule_fails_the_same_test(target, drafters, broken, kind, schedule):
    s = SAMPLINGS["t1"]
    cells, _ = speculative_samples(target, _proposer(drafters, kind, schedule, 2), broken, s, seed=11)
    assert chi_square_pvalue(cells, exact_joint(target, s)) < P_BROKEN


def penalty_without_the_draft(logits, context, draft):
    """A plausible bug: the penalty of every verified position from the context alone, as if the
    draft tokens before it had not been generated."""
    s = SAMPLINGS["t1-rep3"]
    seen = seen_tokens(context, draft[:, :0], logits.shape[-1])  # (B, 1, V)
    return s.probs(penalize(logits, seen.expand(-1, logits.shape[1], -1), s.repetition_penalty))


@pytest.mark.parametrize("kind,schedule", [("diffusion", "l2r"), ("ar", None)])
def test_a_penalty_that_ignores_the_draft_fails_the_same_test(target, drafters, kind, schedule):
    s = SAMPLINGS["t1-rep3"]
    cells, _ = speculative_samples(target, _proposer(drafters, kind, schedule, 2), standard, s, seed=11,
                                   verify_p=penalty_without_the_draft)
    assert chi_square_pvalue(cells, exact_joint(target, s)) < P_BROKEN
