"""`--compile` (issue 15): the static KV cache (targets.static) and the fixed-shape drafter
(compiled.StaticDenoiser) give the eager path's tokens, greedy for every method, batched and with K
drafts; the chi-square test passes through the compiled loop and fails when the static cache keeps
rejected tokens. Most checks run the same fixed shapes eagerly
(`compile=False`: seconds); the compiled ones build each graph once (about 10 s each here)."""

from __future__ import annotations

import warnings

import pytest
import torch

from specdiff import generate, load_drafter, load_target
from specdiff.compiled import compile_models
from specdiff.errors import IncompatibleModelsError, UsageError
from specdiff.sampling import Sampling
from specdiff.targets.static import StaticTarget

from batching_runs import MAX_NEW, PROMPTS
from cli_checks import invoke
from tiny import make_llama

pytestmark = pytest.mark.filterwarnings("ignore::specdiff.errors.ContextWindowWarning")
METHODS = [{"method": "ar"}, {"method": "spec-ar", "gamma": 4},
           {"method": "specdiff", "gamma": 6, "steps": 2, "schedule": "l2r"},
           {"method": "specdiff", "gamma": 5, "steps": 3, "schedule": "confidence"},
           {"method": "specdiff", "gamma": 4, "drafts": 3, "acceptance": "greedy"}]


@pytest.fixture(scope="module")
def models(tiny):
    llama = make_llama(tiny.root / "llama-static", tiny.tokenizer, scale=10, seed=4)
    return {"gpt2": load_target(str(tiny.gpt2)), "llama": load_target(str(llama)),
            "diffusion": load_drafter(str(tiny.drafter)), "autoregressive": load_drafter(str(tiny.ar))}


def _generate(models, target, drafter, settings, **options):
    kind = "autoregressive" if settings["method"] == "spec-ar" else "diffusion"
    return generate(PROMPTS, target=target, drafter=drafter or models[kind], max_new_tokens=MAX_NEW,
                    **settings, **options)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_static_cache_gives_each_row_the_logits_of_the_row_alone(models, name):
    """join / ragged extend / rollback / keep (reorder, repeat) on the static cache, against each
    row decoded alone, up to the context window's last position."""
    target = StaticTarget.of(models[name], compile=False)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 300, (1, n), generator=g) for n in (40, 30, 128)]
    for s, n in zip(seqs, (13, 3, 120)):
        target.join(s[:, :n])
    steps = [(8, [2, 8, 1], [1, 5, 0]), (6, [6, 6, 6], [6, 2, 3]), (7, [7, 1, 4], [7, 1, 4])]
    for S, new, kept in steps:
        starts = target.lengths.tolist()
        ids = torch.cat([torch.nn.functional.pad(s[:, a:a + S], (0, S - s[:, a:a + S].shape[1]))
                         for s, a in zip(seqs, starts)])
        logits = target.extend(ids, torch.tensor(new))
        for b, (s, a, n) in enumerate(zip(seqs, starts, new)):
            alone = target.model(s[:, :a + n]).logits[0, a:, :target.vocab_size]
            torch.testing.assert_close(logits[b, :n], alone, atol=1e-4, rtol=1e-4)
        target.rollback(torch.tensor(starts) + torch.tensor(kept))
    assert target.length == 127 and target.widths == [8]  # every step padded to the first width
    target.keep([2, 0, 0])
    lengths = target.lengths.tolist()
    logits = target.extend(torch.cat([seqs[b][:, n:n + 1] for b, n in zip([2, 0, 0], lengths)]))
    for row, (b, n) in enumerate(zip([2, 0, 0], lengths)):
        alone = target.model(seqs[b][:, :n + 1]).logits[0, -1, :target.vocab_size]
        torch.testing.assert_close(logits[row, 0], alone, atol=1e-4, rtol=1e-4)


def test_the_cache_holds_the_columns_the_run_needs_and_grows_for_a_longer_row(models):
    """warm_up(length=L) sizes the columns to L + the step width (not the context window); a row
    that outgrows it lifts the cache to the window, exact all the same."""
    target = StaticTarget.of(models["gpt2"], compile=False)
    target.warm_up(2, 5, length=20)
    assert target.keys[0].shape[2] == 25 and target.slots == 2
    seq = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(1))
    target.join(seq[:, :18])
    logits = target.extend(seq[:, 18:23])  # 23 tokens: past the 20 planned
    assert target.keys[0].shape[2] == target.max_length + 5
    torch.testing.assert_close(logits[0], target.model(seq[:, :23]).logits[0, 18:, :target.vocab_size],
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name,settings", [("gpt2", s) for s in METHODS] + [("llama", METHODS[0]), ("llama", METHODS[-1])],
                         ids=lambda x: x if isinstance(x, str) else "-".join(map(str, x.values())))
def test_static_shapes_give_the_eager_greedy_tokens(models, name, settings):
    """Every method at batch 4 (rows refilled, idle slots, rows dropped) over the static cache and
    the fixed-shape drafter (run eager): token-identical to the eager loop at batch 1."""
    reference = _generate(models, models[name], None, settings, batch_size=1)
    target, drafter = compile_models(models[name], models["diffusion"], compile=False)
    got = _generate(models, target, None if settings["method"] == "spec-ar" else drafter, settings, batch_size=4)
    assert [o.tokens for o in got.outputs] == [o.tokens for o in reference.outputs]


def test_compiled_steps_give_the_eager_tokens_and_compile_before_decoding():
    """torch.compile for real, target and drafter (the V = 8 models of the chi-square test below,
    at its shapes: batch 16, gamma 3, so that both tests share the compiled graphs): specdiff's
    greedy tokens equal eager on 20 prompts; every graph is built in the warm-up (no shape is new
    once decoding starts), and the warm-up is reported apart from decoding time."""
    from exactness import v8_drafters, v8_gpt2, v8_tokenizer

    from specdiff.generation import GenerationResult, iter_generate, plan
    from specdiff.targets.causal import CausalLMTarget

    g = torch.Generator().manual_seed(0)
    prompts = [" ".join(f"t{int(i)}" for i in torch.randint(0, 8, (int(n),), generator=g))
               for n in torch.randint(1, 8, (20,), generator=g)]
    target, drafter = CausalLMTarget(v8_gpt2(0, 60.0), v8_tokenizer()), v8_drafters()["diffusion"]
    settings = {"method": "specdiff", "gamma": 3, "steps": 2, "max_new_tokens": 8, "batch_size": 16}
    eager = generate(prompts, target=target, drafter=drafter, **settings)
    p = plan(target=target, drafter=drafter, compile=True, **settings)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outputs = list(iter_generate(prompts, p))
    assert not [w for w in caught if "lru_cache" in str(w.message)]  # Dynamo's, printed to every user
    assert [o.tokens for o in outputs] == [o.tokens for o in eager.outputs]
    assert 1 < GenerationResult(outputs).metrics.tau < 4  # drafts both accepted and rejected
    assert len(p.target.step.shapes) == 1 and p.target.slots == 16 and len(p.drafter.backbone.step.shapes) == 1
    assert p.warmup_s > sum(o.metrics.wall_s for o in outputs)  # compiling dwarfs these steps


class KeepsRejected(StaticTarget):
    """A broken static cache: rollback leaves the lengths where they are, so rejected draft tokens
    stay in a row's context (rollback by moving positions, forgotten)."""

    def rollback(self, lengths):
        pass


@pytest.mark.parametrize("n", [300, pytest.param(4000, marks=pytest.mark.power)])
def test_compiled_sampling_has_the_target_distribution_and_a_cache_that_keeps_rejected_tokens_fails(n):
    """The chi-square test of tests/test_sampling_exact.py through the batched loop on the
    compiled static cache (rows padded, batch 16); the same loop over a cache that does not roll
    back fails it."""
    from exactness import (P_BROKEN, P_EXACT, batched_cells, chi_square_pvalue, exact_joint, make_proposer, v8_drafters,
                           v8_gpt2, v8_tokenizer)

    from specdiff.targets.causal import CausalLMTarget

    model, sampling = v8_gpt2(0, 60.0), Sampling(1.0)
    target, drafter = compile_models(CausalLMTarget(model, v8_tokenizer()), v8_drafters()["diffusion"])
    proposer = make_proposer({"diffusion": drafter}, "diffusion", "l2r", 2)
    joint = exact_joint(model, sampling)
    assert chi_square_pvalue(batched_cells(target, proposer, sampling, n), joint) > P_EXACT
    broken = KeepsRejected(model, v8_tokenizer(), compile=False)
    assert chi_square_pvalue(batched_cells(broken, proposer, sampling, 150), joint) < P_BROKEN


def test_models_the_static_cache_cannot_run_exactly_are_refused_in_one_line(tiny, models):
    with pytest.raises(IncompatibleModelsError, match="'gpt_neo' runs eager only"):
        generate("x", target=str(tiny.neo), method="ar", compile=True)
    with pytest.raises(UsageError, match="`compile` must be True or False"):
        generate("x", target=models["gpt2"], method="ar", compile="yes")
    result = invoke(["generate", "--target", str(tiny.gpt2), "--prompt", "x", "--compile", "--runtime", "onnxruntime"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "--compile is for the torch runtime" in result.stderr


def test_bench_puts_a_compiled_row_beside_each_eager_row_of_specdiffs_own_loop():
    from specdiff.tools.bench import variants

    rows = variants(["ar", "specdiff", "hf-prompt-lookup"], gammas=[4], batch_sizes=[1, 8], runtimes=("torch", "compiled"))
    labels = [v.label for v in rows]
    assert "ar compiled" in labels and "ar b=8 compiled" in labels and "specdiff g=4 T=4 l2r b=8 compiled" in labels
    assert "hf-prompt-lookup g=4" in labels and not any(v.compiled for v in rows if v.method.startswith("hf"))
    assert len([v for v in rows if v.compiled]) == len([v for v in rows if not v.compiled and v.method in ("ar", "specdiff")])
