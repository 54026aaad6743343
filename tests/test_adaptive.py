"""gamma auto (specdiff.adaptive, issue 24): each step's draft length chosen from the past. Greedy
output stays token-identical to ar whatever lengths are chosen, at any batch size; the controller's
choices follow acceptance and costs (and probe a drafter it stopped using); the cost table is
measured without leaving anything in the target's cache; settings and the CLI say what runs.
The distribution test with chosen lengths, and peeking controllers failing it, are in
tests/test_sampling_exact.py."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner

from specdiff import generate, load_drafter, load_target
from specdiff.adaptive import PROBE, ROWS, Controller, Costs, monotone
from specdiff.acceptance import greedy
from specdiff.contracts import Draft
from specdiff.decoding import Row, decode_ar, decode_speculative, measure_costs, proposer_step
from specdiff.drafters.autoregressive import ARProposer
from specdiff.errors import UsageError
from specdiff.generation import iter_generate, plan
from specdiff.sampling import Sampling
from specdiff_cli.main import cli

from tiny import TEXT

WORDS = TEXT.split()
PROMPTS = [" ".join(WORDS[i: i + 2 + i % 5]) for i in range(0, 60, 3)]  # 20 prompts
MAX_NEW = 24
# the methods whose greedy output, with lengths chosen each step, the tests here hold to ar's
IDENTITY_TESTED = ("specdiff", "spec-ar")


def costs(gamma: int, per_token: float = 0.1, draft: float = 0.05, rows: tuple[int, ...] = (1,)) -> Costs:
    """A cost table: verify 1 + per_token * w, drafting `draft` per token, alike at every row count."""
    verify = tuple(1.0 + per_token * w for w in range(1, gamma + 2))
    return Costs(rows, (verify,) * len(rows), (tuple(draft * g for g in range(1, gamma + 1)),) * len(rows))


@pytest.fixture(scope="module")
def models(tiny):
    return {"gpt2": load_target(str(tiny.gpt2)), "neo": load_target(str(tiny.neo)),
            "diffusion": load_drafter(str(tiny.drafter)), "ar": load_drafter(str(tiny.ar))}


def _run(models, target, batch_size, table=None, *, method, **options):
    """Outputs of `method` on PROMPTS; `table`: the cost table the decoder uses instead of timing one."""
    drafter = {"spec-ar": models["ar"], "specdiff": models["diffusion"]}.get(method)
    p = plan(target=models[target], drafter=drafter, method=method, max_new_tokens=MAX_NEW, batch_size=batch_size,
             **options)
    if table is not None:  # a decoder of its own: the models' kept tables stay as timed
        p = replace(p, decoder=replace(p.decoder, measured={batch_size: table}))
    return list(iter_generate(PROMPTS, p))


def _assert_identical(got, reference, what):
    for i, (o, ref) in enumerate(zip(got, reference)):
        assert o.tokens == ref.tokens, f"{what}: prompt {i} diverged"


@pytest.mark.parametrize("target", ["gpt2", "neo"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_with_gamma_auto_equals_ar(models, target, batch_size):
    """The methods as a user runs them, costs timed by the decoder (the tiny drafters are poor:
    mostly plain steps and probes; the next test makes every length occur)."""
    reference = _run(models, target, 1, method="ar")
    for got, what in ((_run(models, target, batch_size, method="specdiff", gamma="auto", steps=2), "specdiff"),
                      (_run(models, target, batch_size, method="specdiff", gamma="auto", drafts=2), "specdiff K=2"),
                      (_run(models, target, batch_size, method="spec-ar", gamma="auto"), "spec-ar")):
        _assert_identical(got, reference, f"{what} auto, batch {batch_size}")
        assert all(o.metrics.costs is not None and o.metrics.costs.rows == tuple(dict.fromkeys((1, batch_size)))
                   for o in got if o.metrics.iterations)  # rows done at their first token chose nothing


class SlotOracle:
    """A test proposer: the target's own greedy continuation of each row, with slot s wrong, s the
    row's first token mod 5 (s >= gamma: none wrong), so rows accept different lengths and the
    controller learns a different length for each."""

    exact_rules = frozenset({"greedy"})

    def __init__(self, target):
        self.model, self.V = target.model, target.vocab_size

    @torch.no_grad()
    def propose(self, context, gamma, sampling, generator, lengths=None):
        tokens = []
        for b in range(context.shape[0]):
            ids = context[b:b + 1, context.shape[1] - (int(lengths[b]) if lengths is not None else context.shape[1]):]
            start = ids.shape[1]
            for _ in range(gamma):
                ids = torch.cat([ids, self.model(ids).logits[:, -1, :self.V].argmax(-1, keepdim=True)], 1)
            row = ids[0, start:].clone()
            s = int(ids[0, 0]) % 5
            if s < gamma:
                row[s] = (row[s] + 1) % self.V
            tokens.append(row)
        tokens = torch.stack(tokens)  # (B, gamma)
        return Draft(tokens, torch.nn.functional.one_hot(tokens, self.V).float(), calls=1)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_equals_ar_whatever_lengths_are_chosen(models, batch_size):
    target = models["gpt2"]
    encoded = [target.tokenizer.encode(p) for p in PROMPTS]
    refs = [Row(ids, MAX_NEW, target.max_length, None, target.device) for ids in encoded]
    list(decode_ar(target, refs, Sampling()))
    rows = [Row(ids, MAX_NEW, target.max_length, None, target.device) for ids in encoded]
    table = costs(6, per_token=0.1, draft=0.02, rows=(1, batch_size))
    list(decode_speculative(target, SlotOracle(target), rows, Sampling(), greedy, 6, batch_size, costs=table))
    for i, (row, ref) in enumerate(zip(rows, refs)):
        assert row.new_tokens == ref.new_tokens, f"prompt {i} diverged"
    chosen = [sum(row.metrics.lengths[g] for row in rows if g < len(row.metrics.lengths)) for g in range(7)]
    assert sum(1 for n in chosen[1:] if n) >= 3, chosen  # several draft lengths were chosen, not one


def test_the_controller_follows_acceptance_and_costs():
    row = Row([1, 2, 3], 20, 64, None, torch.device("cpu"))
    flat = Controller(costs(4, per_token=0.0, draft=0.0))
    for _ in range(10):
        flat.record(row, 4, 4)
    assert flat.width([row]) == 4  # every slot passes and drafting is free: the longest draft
    dear = Controller(costs(4, per_token=1.0, draft=0.5))
    for _ in range(10):
        dear.record(row, 4, 0)
    assert dear.width([row]) == 0  # nothing passes and width costs: a plain step
    short = Controller(costs(4, per_token=0.05, draft=0.01))
    for _ in range(40):
        short.record(row, 4, 1)  # slot 1 always passes, slot 2 never
    assert short.width([row]) == 1
    near_end = Row([1, 2, 3], 2, 64, None, torch.device("cpu"))  # room 2: at most 1 draft token pays
    assert flat.width([near_end]) == 1


def test_rows_own_history_and_the_pool():
    """A row's estimate leans on its own steps; a new row starts from the run's pool."""
    c = Controller(costs(3, per_token=0.2, draft=0.05))
    good, bad = (Row([1, 2], 20, 64, None, torch.device("cpu")) for _ in range(2))
    for _ in range(30):
        c.record(good, 3, 3)
        c.record(bad, 3, 0)
    assert c.width([good, bad]) >= 1 and c.width([bad]) == 0
    newcomer = Row([1, 2], 20, 64, None, torch.device("cpu"))
    assert c.width([newcomer]) >= 1  # the pool saw half the rows pass everything
    assert c.rows == {}  # the rows that left the batch are forgotten (the newcomer has no step yet)


def test_a_controller_that_stopped_drafting_probes_with_backoff():
    c = Controller(costs(3, per_token=1.0, draft=1.0), probe=4)
    row = Row([1, 2], 500, 600, None, torch.device("cpu"))
    for _ in range(20):
        c.record(row, 1, 0)
    widths = [c.width([row]) for _ in range(4 + 8 + 16)]
    assert [i for i, w in enumerate(widths) if w] == [3, 11, 27]  # after 4, then 8, then 16 plain steps
    assert PROBE >= 8  # a probe costs about one step: rare enough for the 0.95x target


def test_past_the_rows_timed_the_runs_own_steps_correct_the_table():
    """Extrapolated to 512 rows, a table timed at 16 said drafting paid where it took 2x plain
    decoding (the drafter's 512-row call 3x the extrapolation: gamma auto 1.2-1.4x slower than ar).
    Drafting steps that take 10x what the table says turn the batch plain; within the rows timed
    the table alone decides (given it, a run chooses the same lengths again)."""
    table = costs(3, per_token=0.1, draft=0.02, rows=(1, 2))
    c = Controller(table)
    batch = [Row([1, 2], 50, 600, None, torch.device("cpu")) for _ in range(8)]
    for row in batch:
        for _ in range(10):
            c.record(row, 3, 3)  # every slot passes
    assert c.width(batch) == 3 and c.width(batch[:2]) == 3
    c.observe(8, 3, 10 * table.step(8, 3))
    c.observe(8, 0, table.step(8, 0))
    c.observe(2, 3, 100.0)  # timed there: not a correction
    assert c.width(batch) == 0 and c.width(batch[:2]) == 3


def test_costs_interpolate_between_the_measured_row_counts_and_extrapolate_past_them():
    table = Costs((1, 9), ((1.0, 2.0), (3.0, 6.0)), ((0.5,), (2.5,)))
    assert table.step(1, 0) == 1.0 and table.step(9, 1) == 6.0 + 2.5
    assert table.step(5, 1) == pytest.approx(4.0 + 1.5)
    assert table.step(17, 0) == pytest.approx(5.0) and table.step(513, 1) == pytest.approx(258.0 + 128.5)
    assert table.to_dict()["verify_s"] == [[1.0, 2.0], [3.0, 6.0]] and table.gamma_max == 1


def test_measured_costs_are_made_non_decreasing():
    """A wider call timed faster than a narrower one is noise: adjacent violators are pooled."""
    assert monotone([9.0, 11.0, 16.0, 11.0, 12.0]) == pytest.approx((9.0, 11.0, 13.0, 13.0, 13.0))
    assert monotone([1.0, 2.0, 3.0]) == (1.0, 2.0, 3.0) and monotone([3.0, 1.0]) == (2.0, 2.0)


def test_measuring_costs_leaves_the_cache_empty(models):
    target = models["gpt2"]
    step = proposer_step(ARProposer(models["ar"]), Sampling(), target)
    table = measure_costs(target, step, 3, 4)
    assert table.rows == (1, 4) and [len(r) for r in table.verify] == [4, 4] and [len(r) for r in table.draft] == [3, 3]
    assert all(c > 0 for r in (*table.verify, *table.draft) for c in r) and table.measured_s > 0
    assert target.rows == 0


def test_costs_are_timed_at_a_bounded_number_of_rows(models):
    """A batch of 64 (or 512) rows is timed at ROWS rows, not 64: timing is bounded whatever the
    batch. The per-row part of each cost never shrinks with the width (noise, extrapolated to
    many rows, made a wider call cheaper), so extrapolated costs grow with it too."""
    target = models["gpt2"]
    step = proposer_step(ARProposer(models["ar"]), Sampling(), target)
    table = measure_costs(target, step, 3, 64)
    assert table.rows == (1, ROWS) and target.rows == 0
    for per_row in ([many - one for one, many in zip(*t)] for t in (table.verify, table.draft)):
        assert min(per_row) >= 0 and _rising(per_row)
    assert _rising([table.step(512, G) for G in range(4)])


def _rising(xs: list[float]) -> bool:
    return all(b >= a - 1e-12 for a, b in zip(xs, xs[1:]))  # up to rounding


def test_the_timing_is_counted_in_the_run_that_spent_it(models):
    """time_s.costs: what timing the table took, in the first step's rows' wall_s; a run on a
    kept table spent none."""
    run = dict(target=models["gpt2"], drafter=models["ar"], method="spec-ar", gamma="auto", max_new_tokens=6,
               batch_size=4, top_k=7, temperature=0.5)  # settings no other test here uses: nothing timed yet
    first, again = (generate(PROMPTS[:6], **run).outputs for _ in range(2))
    timed = first[0].metrics.costs
    total = sum(o.metrics.costs_s for o in first)
    assert timed is not None and total == pytest.approx(timed.measured_s) and total > 0
    assert sum(o.metrics.costs_s > 0 for o in first) == 4  # the first step's rows share it
    assert all(o.metrics.wall_s >= o.metrics.costs_s for o in first)
    assert first[0].metrics.to_dict()["time_s"]["costs"] == round(first[0].metrics.costs_s, 6)
    assert sum(o.metrics.costs_s for o in again) == 0 and again[0].metrics.costs is timed


def test_sampled_output_with_one_cost_table_is_reproducible(models):
    """A seed gives the same samples again given the same costs and batch (gamma auto); across
    batch sizes the draws may differ (the distribution does not: tests/test_sampling_exact.py)."""
    table = costs(5, per_token=0.3, draft=0.02, rows=(1, 3))
    runs = [_run(models, "gpt2", 3, table, method="specdiff", temperature=1.0, seed=4) for _ in range(2)]
    assert [o.tokens for o in runs[0]] == [o.tokens for o in runs[1]]
    assert len({tuple(o.tokens[:4]) for o in runs[0]}) > 6  # really sampled


def test_an_integer_gamma_is_fixed_and_auto_needs_a_drafting_method(models):
    fixed = plan(target=models["gpt2"], drafter=models["diffusion"], gamma=3)
    assert fixed.draft.adaptive is False and fixed.decoder.costs(1) == (None, 0.0)
    auto = plan(target=models["gpt2"], drafter=models["diffusion"], gamma="auto")
    assert auto.draft.adaptive is True and auto.draft.gamma == 8  # no pair, no recorded gamma: the default cap
    capped = plan(target=models["gpt2"], drafter=models["diffusion"], gamma=5, adaptive=True)
    assert (capped.draft.gamma, capped.draft.adaptive) == (5, True)
    with pytest.raises(UsageError, match="^method 'ar' does not use `gamma`; it reads none of the draft settings$"):
        plan(target=models["gpt2"], method="ar", gamma="auto")  # not: give an integer gamma (ar refuses one too)
    with pytest.raises(UsageError, match="`gamma` must be an integer >= 1 or auto, got 'banana'"):
        plan(target=models["gpt2"], drafter=models["diffusion"], gamma="banana")


def _cli(*args: str):
    return CliRunner().invoke(cli, ["generate", *args])


def test_cli_reports_the_chosen_lengths_and_the_cost_table(tiny):
    result = _cli("--target", str(tiny.gpt2), "--drafter", str(tiny.drafter), "--max-new-tokens", "8", "--jsonl",
                  "--stats", "--prompt", "The sea", "--prompt", "To be")
    assert result.exit_code == 0, result.stderr
    stats = json.loads(result.stderr.strip().splitlines()[-1])
    assert stats["settings"]["adaptive"] == {"value": True, "from": "default"}
    for m in [stats, *(json.loads(line)["metrics"] for line in result.stdout.splitlines())]:
        assert sum(m["draft_length_histogram"]) == m["iterations"]
        assert m["draft_costs"]["rows"] == [1, 2] and len(m["draft_costs"]["verify_s"][0]) == 9  # w = 1..8 + 1
        assert m["time_s"]["control"] >= 0
    fixed = _cli("--target", str(tiny.gpt2), "--drafter", str(tiny.drafter), "--max-new-tokens", "8", "--gamma", "3",
                 "--stats", "--prompt", "The sea")
    stats = json.loads(fixed.stderr.strip().splitlines()[-1])
    lengths = stats["draft_length_histogram"]  # gamma each step, less only where max_new_tokens clips it
    assert "draft_costs" not in stats and len(lengths) == 4 and lengths[3] == max(lengths) > 1


@pytest.mark.parametrize("args,message", [
    (["--gamma", "banana"], "Invalid value for '--gamma': 'banana' is neither an integer nor auto"),
    (["--gamma", "0"], "--gamma must be an integer >= 1 or auto, got 0"),
    (["--method", "ar", "--gamma", "auto"], "method 'ar' does not use --gamma; it reads none of the draft settings"),
])
def test_cli_refuses_a_bad_gamma_in_one_line(tiny, args, message):
    result = _cli("--target", str(tiny.gpt2), "--drafter", str(tiny.drafter), "--prompt", "x", *args)
    assert result.exit_code == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_gamma_auto_on_the_static_cache(models):
    """--compile's static cache (run eagerly here: the same shapes, seconds): timing every width
    pads to the widths it holds, and the output is still ar's."""
    from specdiff.compiled import compile_models

    target, drafter = compile_models(models["gpt2"], models["diffusion"], compile=False)
    reference = generate(PROMPTS, target=models["gpt2"], method="ar", max_new_tokens=MAX_NEW).outputs
    got = generate(PROMPTS, target=target, drafter=drafter, method="specdiff", gamma="auto", steps=2, batch_size=3,
                   max_new_tokens=MAX_NEW).outputs
    _assert_identical(got, reference, "specdiff auto on the static cache, batch 3")
    assert got[0].metrics.costs is not None and target.rows == 0


def test_cost_tables_are_timed_once_per_loaded_models_and_settings(models, monkeypatch):
    """generate() called again with the same loaded models and settings (a library user's
    per-request calls) times nothing; a new batch size or other settings are timed afresh."""
    from specdiff.methods import speculative

    timed = []
    measure = speculative.measure_costs
    monkeypatch.setattr(speculative, "measure_costs", lambda *a, **k: timed.append(a[3]) or measure(*a, **k))
    run = dict(target=models["gpt2"], drafter=models["ar"], method="spec-ar", gamma="auto", max_new_tokens=4,
               temperature=0.9, top_k=5)  # settings no other test here uses: nothing timed yet
    for batch_size in (2, 2, 1, 2):
        generate(PROMPTS[:2], batch_size=batch_size, **run)
    generate(PROMPTS[:2], batch_size=2, **{**run, "top_k": 6})
    assert timed == [2, 1, 2]
