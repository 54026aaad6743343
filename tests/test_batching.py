"""Batched decoding (issue 12): the output of every method does not depend on the batch size,
greedy and sampled, on GPT-2, GPT-Neo (local attention, window 8, shorter than the sequences) and
Llama-style targets; prompts of very different lengths, rows stopping early (EOS, the context
window) and refilled; outputs in input order; the per-row cache equals each row decoded alone."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from specdiff import generate, load_drafter, load_target, stream
from specdiff.drafters.diffusion import DiffusionProposer
from specdiff.errors import UsageError
from specdiff.generation import plan
from specdiff.sampling import Sampling

from batching_runs import MAX_NEW, PROMPTS
from tiny import make_llama

pytestmark = pytest.mark.filterwarnings("ignore::specdiff.errors.ContextWindowWarning")  # the longest prompt
METHODS = {
    "ar": {"method": "ar"},
    "spec-ar": {"method": "spec-ar", "gamma": 4},
    "specdiff-l2r": {"method": "specdiff", "gamma": 6, "steps": 2, "schedule": "l2r"},
    "specdiff-oneshot": {"method": "specdiff", "gamma": 4, "schedule": "oneshot"},
    "specdiff-confidence": {"method": "specdiff", "gamma": 5, "steps": 3, "schedule": "confidence"},
}


@pytest.fixture(scope="module")
def models(tiny):
    llama = make_llama(tiny.root / "llama", tiny.tokenizer, scale=10, seed=4)
    return {"gpt2": load_target(str(tiny.gpt2)), "neo": load_target(str(tiny.neo)),
            "llama": load_target(str(llama)), "diffusion": load_drafter(str(tiny.drafter)),
            "autoregressive": load_drafter(str(tiny.ar))}


@pytest.fixture(scope="module")
def eos(models):
    """Per target: a token about half of its greedy continuations emit, made its EOS so rows stop
    early, at different steps."""
    chosen = {}
    for name in ("gpt2", "neo", "llama"):
        outputs = generate(PROMPTS, target=models[name], method="ar", max_new_tokens=MAX_NEW, batch_size=1).outputs
        counts = Counter(t for o in outputs for t in set(o.tokens[2:]))
        chosen[name] = min(counts, key=lambda t: abs(counts[t] - len(PROMPTS) / 2))
    return chosen


def _run(models, target, method, batch_size, **options):
    settings = dict(METHODS[method])
    if settings["method"] != "ar":
        settings["drafter"] = models["autoregressive" if method == "spec-ar" else "diffusion"]
    return generate(PROMPTS, target=models[target], max_new_tokens=MAX_NEW, batch_size=batch_size,
                    **settings, **options)


@pytest.mark.parametrize("target", ["gpt2", "neo", "llama"])
def test_batched_greedy_equals_batch_1_for_every_method(models, eos, target, monkeypatch):
    monkeypatch.setattr(models[target], "eos_token_id", eos[target])
    reference = _run(models, target, "ar", 1)
    reasons = Counter(o.metrics.stop_reason for o in reference.outputs)
    assert 2 <= reasons["eos"] <= len(PROMPTS) - 2  # rows stop at different steps
    for method in METHODS:  # batch 1 == ar batch 1: tests/test_greedy_identity.py
        result = _run(models, target, method, 5)
        for i, (got, want) in enumerate(zip(result.outputs, reference.outputs)):
            assert got.tokens == want.tokens, f"{method} batch 5: prompt {i} diverged"
            assert got.metrics.stop_reason == want.metrics.stop_reason


@pytest.mark.parametrize("method,acceptance", [("ar", None), ("spec-ar", "standard"), ("specdiff-l2r", "standard"),
                                               ("specdiff-confidence", "match")])
def test_sampled_output_does_not_depend_on_the_batch_size(models, method, acceptance):
    options = {"temperature": 1.0, "top_k": 20, "seed": 7, "acceptance": acceptance}
    one, four = (_run(models, "neo", method, b, **options) for b in (1, 4))
    assert [o.tokens for o in four.outputs] == [o.tokens for o in one.outputs]
    assert len({tuple(o.tokens[:4]) for o in one.outputs}) > 6  # really sampled, not a fixed string


def test_rows_refill_the_batch_and_outputs_keep_the_input_order(models, eos, monkeypatch):
    target = models["gpt2"]
    monkeypatch.setattr(target, "eos_token_id", eos["gpt2"])
    p = plan(target=target, drafter=models["diffusion"], gamma=4, max_new_tokens=MAX_NEW, batch_size=3)
    rows, streamed, finished = [], {i: [] for i in range(len(PROMPTS))}, []
    for event in stream(PROMPTS, p):
        rows.append(target.rows)
        streamed[event.index] += event.tokens
        if event.output is not None:
            finished.append(event.index)
            assert streamed[event.index] == event.output.tokens and event.output.prompt == PROMPTS[event.index]
    assert max(rows) == 3 and sorted(finished) == list(range(len(PROMPTS)))
    assert finished != sorted(finished)  # rows stopping at EOS left before rows joined earlier
    result = generate(PROMPTS, target=target, drafter=models["diffusion"], gamma=4, max_new_tokens=MAX_NEW,
                      batch_size=3)
    assert [o.prompt for o in result.outputs] == PROMPTS
    assert [o.tokens for o in result.outputs] == [streamed[i] for i in range(len(PROMPTS))]


@pytest.mark.parametrize("name", ["gpt2", "neo", "llama"])
def test_ragged_rows_get_the_logits_of_each_row_alone(models, name):
    """join / ragged extend / per-row rollback / keep (reorder, repeat) against each row decoded
    alone, past the GPT-Neo window; one extend wider than the context window goes row by row."""
    target = models[name]
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 300, (1, n), generator=g) for n in (40, 30, 128)]
    target.keep([])
    for s, n in zip(seqs, (13, 3, 120)):
        target.join(s[:, :n])
    plan_ = [(8, [2, 8, 1], [1, 5, 0]), (6, [6, 6, 6], [6, 2, 3]), (7, [7, 1, 4], [7, 1, 4])]
    for S, new, kept in plan_:
        starts = target.lengths.tolist()
        ids = torch.cat([torch.nn.functional.pad(s[:, a:a + S], (0, S - s[:, a:a + S].shape[1])) for s, a in zip(seqs, starts)])
        logits = target.extend(ids, torch.tensor(new))
        for b, (s, a, n) in enumerate(zip(seqs, starts, new)):
            alone = target.model(s[:, :a + n]).logits[0, a:, :target.vocab_size]
            torch.testing.assert_close(logits[b, :n], alone, atol=1e-4, rtol=1e-4)
        target.rollback(torch.tensor(starts) + torch.tensor(kept))
    assert target.length == 127  # the last extend (123 + 7 columns) had to go row by row
    target.keep([2, 0, 0])
    lengths = target.lengths.tolist()
    logits = target.extend(torch.cat([seqs[b][:, n:n + 1] for b, n in zip([2, 0, 0], lengths)]))
    for b, n in zip([2, 0, 0], lengths):
        torch.testing.assert_close(logits[[2, 0, 0].index(b), 0],
                                   target.model(seqs[b][:, :n + 1]).logits[0, -1, :target.vocab_size],
                                   atol=1e-4, rtol=1e-4)


def test_rows_joined_together_are_stacked_with_one_copy_of_the_cache(models, monkeypatch):
    """A refill stacked each new row onto the cache alone, copying all of it for each (batch 512:
    0.8 s a row, gamma auto's staggered rows 1.5x slower than ar); rows joined one after another
    are stacked together when the cache is next read, each still prefilled alone."""
    from specdiff.targets.rows import RowCache

    target = models["gpt2"]
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 300, (1, n), generator=g) for n in (9, 4, 12, 7)]
    target.keep([])
    stacked: list[int] = []
    stack = RowCache._stack
    monkeypatch.setattr(RowCache, "_stack", lambda self, parts: stacked.append(len(parts)) or stack(self, parts))
    for s in seqs:
        target.join(s)
    assert stacked == []  # the first row is a prefill; the others wait
    logits = target.extend(torch.full((4, 1), 5))
    assert stacked == [4] and target.lengths.tolist() == [10, 5, 13, 8]
    for b, s in enumerate(seqs):
        alone = target.model(torch.cat([s, torch.tensor([[5]])], 1)).logits[0, -1, :target.vocab_size]
        torch.testing.assert_close(logits[b, 0], alone, atol=1e-4, rtol=1e-4)


def test_diffusion_drafts_of_padded_rows_equal_drafts_alone(models):
    """The DDiT's padding mask: a short row drafted beside long ones drafts what it drafts alone."""
    proposer = DiffusionProposer(models["diffusion"], "l2r", 2)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 300, (n,), generator=g) for n in (3, 20, 9)]
    L = max(len(r) for r in rows)
    context = torch.stack([torch.cat([torch.zeros(L - len(r), dtype=torch.long), r]) for r in rows])
    sampling = Sampling(1.0)
    batched = proposer.propose(context, 5, sampling, [torch.Generator().manual_seed(b) for b in range(3)],
                               lengths=torch.tensor([len(r) for r in rows]))
    for b, r in enumerate(rows):
        alone = proposer.propose(r[None], 5, sampling, torch.Generator().manual_seed(b))
        assert torch.equal(batched.tokens[b], alone.tokens[0])
        torch.testing.assert_close(batched.q[b], alone.q[0], atol=1e-5, rtol=1e-5)


def _cli(args: list[str]):
    from click.testing import CliRunner

    from specdiff_cli.main import cli

    return CliRunner().invoke(cli, args)


def test_cli_streams_a_batch_in_input_order(tiny, models, eos, monkeypatch):
    """--stream with rows finishing out of order writes what --no-stream and batch 1 write."""
    args = ["generate", "--target", str(tiny.gpt2), "--drafter", str(tiny.drafter), "--gamma", "4", "--raw",
            "--max-new-tokens", "10", "--echo", *[a for p in PROMPTS[:8] for a in ("--prompt", p)]]
    one = _cli([*args, "--batch-size", "1", "--no-stream"])
    streamed = _cli([*args, "--batch-size", "3", "--stream", "--stop", tiny.tokenizer.decode([eos["gpt2"]])])
    stopped = _cli([*args, "--batch-size", "1", "--no-stream", "--stop", tiny.tokenizer.decode([eos["gpt2"]])])
    assert one.exit_code == streamed.exit_code == stopped.exit_code == 0, streamed.output
    assert streamed.stdout == stopped.stdout != one.stdout  # the stop string ended some rows early
    assert one.stdout.count("\n\n") == 7


@pytest.mark.parametrize("value", ["0", "-2"])
def test_cli_refuses_a_bad_batch_size_in_one_line(tiny, value):
    result = _cli(["generate", "--target", str(tiny.gpt2), "--prompt", "x", "--batch-size", value])
    assert result.exit_code == 2 and result.stderr == f"specdiff: error: --batch-size must be an integer >= 1, got {value}\n"


class NaivePositions:
    """A broken target: positions from the cache width, ignoring each row's padding (what a direct
    Hugging Face model call derives); a short row beside long ones sees shifted positions."""

    def __new__(cls, model, tokenizer):
        from specdiff.targets.causal import CausalLMTarget

        class Broken(CausalLMTarget):
            def _run(self, ids, mask, positions, kv):
                C = mask.shape[1] - ids.shape[1]
                return super()._run(ids, mask, torch.arange(C, C + ids.shape[1]).expand_as(ids).clamp_max(15), kv)
        return Broken(model, tokenizer)


@pytest.mark.parametrize("kind,n", [("diffusion", 400), pytest.param("diffusion", 6000, marks=pytest.mark.power),
                                    pytest.param("ar", 6000, marks=pytest.mark.power)])
def test_batched_sampling_has_the_target_distribution_and_naive_positions_fail(kind, n):
    """The chi-square test of tests/test_sampling_exact.py through the batched loop, rows padded
    (n rows, few: each row is a prefill; the slow cases take more); the same loop over a target
    whose positions ignore padding fails it (by a wide margin: 150 rows suffice)."""
    from exactness import (P_BROKEN, P_EXACT, batched_cells, chi_square_pvalue, exact_joint, make_proposer, v8_drafters,
                           v8_gpt2, v8_tokenizer)

    from specdiff.targets.causal import CausalLMTarget

    model, sampling = v8_gpt2(0, 60.0), Sampling(1.0)
    proposer = make_proposer(v8_drafters(), kind, "l2r", 2)
    joint = exact_joint(model, sampling)
    cells = batched_cells(CausalLMTarget(model, v8_tokenizer()), proposer, sampling, n)
    assert chi_square_pvalue(cells, joint) > P_EXACT
    broken = batched_cells(NaivePositions(model, v8_tokenizer()), proposer, sampling, 150)
    assert chi_square_pvalue(broken, joint) < P_BROKEN


@pytest.mark.parametrize("drafts", [2, 4])
@pytest.mark.parametrize("acceptance,temperature", [("greedy", 0.0), ("select", 1.0), ("multi", 1.0)])
def test_self_selection_output_does_not_depend_on_the_batch_size(models, drafts, acceptance, temperature):
    """K candidate drafts per row (each row's cache repeated K times in one verify call): batch 3
    equals batch 1 on ragged prompts, on GPT-Neo's local attention; greedy also equals ar."""
    options = {"temperature": temperature, "seed": 7, "acceptance": acceptance, "drafts": drafts,
               **({"top_k": 20} if temperature else {})}
    one, three = (_run(models, "neo", "specdiff-l2r", b, **options) for b in (1, 3))
    assert [o.tokens for o in three.outputs] == [o.tokens for o in one.outputs]
    if not temperature:
        reference = _run(models, "neo", "ar", 1)
        assert [o.tokens for o in one.outputs] == [o.tokens for o in reference.outputs]


def test_self_selection_batches_fit_the_rows_a_target_takes(models, monkeypatch):
    """A target of at most 4 rows per call (a TensorRT profile) decodes K = 2 two rows at a time,
    with the same output; K above its rows is refused in one line."""
    target, calls = models["neo"], []
    extend = target.extend
    monkeypatch.setattr(target, "extend", lambda ids, new=None: calls.append(ids.shape[0]) or extend(ids, new))
    options = {"drafts": 2, "acceptance": "greedy"}
    want = _run(models, "neo", "specdiff-l2r", 3, **options)
    monkeypatch.setattr(target, "max_rows", 4)
    calls.clear()
    got = _run(models, "neo", "specdiff-l2r", 3, **options)
    assert [o.tokens for o in got.outputs] == [o.tokens for o in want.outputs] and max(calls) == 4
    monkeypatch.setattr(target, "max_rows", 1)
    with pytest.raises(UsageError, match=r"^`drafts` 2 verifies 2 rows per target call; this target takes at most 1$"):
        _run(models, "neo", "specdiff-l2r", 3, **options)
