"""The chi-square machinery of the distribution tests (tests/test_sampling_exact.py and the
method, tree, selection, draft-vocabulary, batching and compiled tests that repeat it): a tiny
target (V = 8) and deliberately different drafters; from one context, N rows run one step, and the
empirical joint distribution of the first DEPTH generated tokens over V**DEPTH cells is compared
with the exact one, enumerated from the target. Test modules import it as `exact`; the fixtures
over these models (target, drafters, v8_dflash) are in conftest.py."""

from __future__ import annotations

import itertools

import torch
from scipy.stats import chisquare
from tokenizers import Tokenizer, models
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from specdiff.acceptance import standard
from specdiff.decoding import Row, decode_speculative
from specdiff.drafters.a2d import A2DDrafter
from specdiff.drafters.autoregressive import ARDrafter, ARProposer
from specdiff.drafters.dflash import DFlashDrafter
from specdiff.drafters.diffusion import DiffusionDrafter, DiffusionProposer
from specdiff.loading import pair_models
from specdiff.nets.dflash import DFlashSpec
from specdiff.nets.dit import DDiT, DiTConfig
from specdiff.sampling import Sampling, sample
from specdiff.targets.causal import CausalLMTarget
from specdiff.trees import ancestry, node_q

from tiny import small_dflash_net

V, GAMMA, DEPTH, N = 8, 3, 3, 60_000
CONTEXT = torch.tensor([[1, 5, 2]])
P_EXACT, P_BROKEN = 1e-3, 1e-8  # thresholds on the chi-square p-value


def v8_tokenizer():
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(V)}, unk_token="t0"))
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def v8_gpt2(seed, sharpness):
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                       tie_word_embeddings=False)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)  # peaked distributions: a sensitive test
    return model


def v8_drafters() -> dict:
    """The drafters of the chi-square tests over the V = 8 target: diffusion, ar and a2d, deliberately
    different from it."""
    diffusion = DDiT(DiTConfig(vocab_size=V + 1, hidden_size=16, n_heads=2, n_blocks=1, cond_dim=8,
                               time_conditioning=False)).init_random(torch.Generator().manual_seed(3), std=0.3)
    torch.manual_seed(4)
    a2d = Qwen3ForCausalLM(Qwen3Config(vocab_size=V + 1, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                       max_position_embeddings=32, initializer_range=0.3)).eval()
    return {"diffusion": DiffusionDrafter(diffusion, vocab_size=V, mask_id=V, context_length=8).eval(),
            "ar": ARDrafter(v8_gpt2(9, 10.0), v8_tokenizer()),
            "a2d": A2DDrafter(a2d, mask_id=V, vocab_size=V)}


@torch.no_grad()
def warped_p(target, ids, sampling):
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
        p = warped_p(target, prefixes, sampling)[:, -1]  # (V**d, V)
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
            nxt = sample(warped_p(target, seqs[missing, :col], sampling)[:, -1], g)
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


SAMPLINGS = {"t1": Sampling(1.0), "t0.7-top3": Sampling(0.7, top_k=3), "top-p0.8": Sampling(1.0, top_p=0.8),
             "t1-rep3": Sampling(1.0, repetition_penalty=3.0)}


def make_proposer(drafters, kind, schedule, steps):
    if kind == "ar":
        return ARProposer(drafters["ar"])
    return DiffusionProposer(drafters[kind], schedule, steps)


def batched_cells(target, proposer, sampling, n, seed=0):
    """The first DEPTH tokens after CONTEXT of n rows decoded by the real batched loop, batch 16,
    each CONTEXT row beside a longer row (so it is padded) -> cells (n,)."""
    longer = [3, 0, 6, 1, 4, 2, 7]
    rows = [Row(CONTEXT[0].tolist() if i % 2 == 0 else longer, GAMMA + 2, 16, None, torch.device("cpu"),
                torch.Generator().manual_seed(seed + i)) for i in range(2 * n)]
    for _ in decode_speculative(target, proposer, rows, sampling, standard, GAMMA, batch_size=16):
        pass
    firsts = torch.tensor([row.new_tokens[:DEPTH] for row in rows[::2]])  # (n, DEPTH)
    return (firsts * V ** torch.arange(DEPTH - 1, -1, -1)).sum(1)


# --- DFlash over the V = 8 target ---------------------------------------------------------------

def v8_dflash() -> tuple:
    """The V = 8 target (a CausalLMTarget) and a DFlash drafter (block of 4: gamma 3) over it."""
    model = v8_gpt2(0, 60.0)
    target = CausalLMTarget(model, v8_tokenizer(), "v8")
    net = small_dflash_net(V)
    drafter = DFlashDrafter(net.eval(), DFlashSpec(GAMMA + 1, V - 1, (0,), 1))
    pair_models(target, drafter)
    return target, drafter


def drafted_once(target, step, g):
    """N rows of CONTEXT, drafted by `step` (a DFlashDrafts) in one batched call over the
    prefilled target, every row drawing from g -> (context (N, L), tokens (N, [K,] gamma),
    q (N, gamma, V))."""
    ctx = CONTEXT.repeat(N, 1)
    prompt, device = CONTEXT[0].tolist(), target.device  # read once: a device lookup walks the model
    rows = [Row(prompt, 8, target.max_length, None, device, g) for _ in range(N)]
    target.capture(step.layers)
    try:
        target.prefill(ctx[:, :-1])
        drafts = step(rows, [GAMMA] * N)
    finally:
        target.capture(())
    return ctx, torch.cat([d.tokens for d in drafts]), torch.cat([d.q for d in drafts])


# --- one tree step ------------------------------------------------------------------------------

@torch.no_grad()
def samples_over(model, shape, sampling, rule, g, sampled=True, sizes=None, peek=None):
    """N samples of the first DEPTH tokens after CONTEXT through one tree step
    over a drafted tree `shape` (any drafter's: trees.Tree, q per node), its tokens, or every
    row's children drawn i.i.d. from their q with `g` (sampled: what trees.sampled_children does
    per row, here for all rows in one draw), verified by `rule` (tokens, parent, p, q, generator);
    p after every path looked up from the target's p after all V + V^2 + V^3 paths (model: the
    HF model). sizes(shape) -> (N,): row b's tree cut to its first sizes[b] nodes; peek(tokens,
    parent, p, q, sizes, generator) -> sizes: a broken controller that changes them after seeing
    the step. -> (cell ids (N,), accepted depth (N,))."""
    R, G = N, GAMMA
    q = node_q([shape], len(shape.tokens) + 1)  # (1, S, V)
    drawn = sample(q[0, 1:].expand(R, -1, -1), g) if sampled else shape.tokens.expand(R, -1)  # (R, S - 1)
    tokens = torch.cat([CONTEXT[0, -1:].expand(R, 1), drawn], 1)  # (R, S)
    parent = torch.cat([torch.tensor([-1]), shape.parent + 1])[None].expand(R, -1)
    prefixes = [torch.zeros(1, 0, dtype=torch.long)] + [torch.tensor(list(itertools.product(range(V), repeat=d)))
                                                        for d in range(1, G + 1)]
    table = torch.cat([warped_p(model, torch.cat([CONTEXT.expand(len(x), -1), x], 1), sampling)[:, -1]
                       for x in prefixes])  # p after every path, by (offset of its length) + its base-V code
    offset = [sum(V ** e for e in range(d)) for d in range(G + 1)]
    paths = [ancestry(parent[0].tolist(), i)[1:] for i in range(tokens.shape[1])]
    codes = torch.stack([offset[len(path)] + sum(tokens[:, j] * V ** (len(path) - 1 - k) for k, j in enumerate(path))
                         if path else torch.zeros(R, dtype=torch.long) for path in paths], 1)  # (R, S)
    p, q = table[codes], q.expand(R, -1, -1)
    if sizes is not None:
        chosen = sizes(shape)
        parent = cut(parent, chosen if peek is None else peek(tokens, parent, p, q, chosen, g))
    node, y = rule(tokens, parent, p, q, g)
    at = torch.tensor([path + [0] * (G - len(path)) for path in paths])[node]  # (R, G) each row's path, padded
    depth = torch.tensor([len(path) for path in paths])[node]
    return first_tokens(model, tokens.gather(1, at), depth, y, sampling, g), depth


def cut(parent: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """parent (R, S) in verify numbering, each row's tree cut to its first sizes[b] nodes: the
    others get parent -2, which no rule reaches (trees._fed's padding)."""
    return torch.where(torch.arange(parent.shape[1])[None] > sizes[:, None], torch.full_like(parent, -2), parent)
