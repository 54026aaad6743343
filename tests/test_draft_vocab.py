"""Draft vocabularies (specdiff.vocab, issue 34): a drafter's head over N of the target's V ids.

The map itself: EAGLE-3's d2t / t2d and SGLang's hot-id list read and refused as the formats say,
the n most frequent ids with the always-kept ones, and a map counted on another tokenizer of the
same size refused at pairing. Exactness with a map that leaves out tokens the target emits (so
the residual path runs): DFlash greedy output token-identical to ar on the tiny GPT-2 / Llama /
Qwen3 targets, batched, with candidate blocks and gamma auto; diffusion and AR drafters too, and
the exported DFlash and diffusion graphs; one sampled step has the target's distribution (standard
at temperature 1 and 0.7 with top-k, match, select and multi over candidate blocks; the l2r
diffusion schedule and the AR drafter), and three broken couplings of draft and q fail the same
chi-square test: q renormalised over the full head, a draft token outside the map treated as
proposed, and the map applied one id off to q."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from specdiff import generate, load_drafter, load_target
from specdiff.acceptance import match, standard
from specdiff.contracts import Draft
from specdiff.drafters.dflash import DFlashDrafter
from specdiff.errors import IncompatibleModelsError, LoadError
from specdiff.loading import pair_models
from specdiff.methods.dflash import DFlashDrafts
from specdiff.targets.causal import CausalLMTarget
from specdiff.vocab import DraftVocab, fingerprint, from_counts, load_draft_vocab, read_map

import exactness as exact
from tiny import make_dflash, small_dflash_net, target_paths

TARGETS = ("gpt2", "llama", "qwen3")
PROMPTS = ["To be, or not to be", "It was the best of", "def main():", "The sea was calm and", "Call me"]
MAX_NEW = 24
SLOW = pytest.mark.slow  # 6-9 s each: the default suite keeps one case of each test, CI's slow step the rest


def vocab_of(ids: list[int], tokenizer, V: int, built_from: str = "test") -> DraftVocab:
    t = torch.tensor(sorted(set(ids)), dtype=torch.long)
    return DraftVocab(t, V, fingerprint(tokenizer, t, V), built_from)


# --- the map -----------------------------------------------------------------------------------

def test_widen_puts_each_logit_at_its_target_id_and_minus_inf_elsewhere(tiny):
    vocab = vocab_of([3, 7, 250], tiny.tokenizer, 300)
    wide = vocab.widen(torch.tensor([[1.0, 2.0, 3.0]]))
    assert wide.shape == (1, 300)
    assert wide[0, [3, 7, 250]].tolist() == [1.0, 2.0, 3.0]
    assert torch.isneginf(wide).sum() == 297
    assert vocab.d2t.tolist() == [3, 6, 248]  # EAGLE-3: target id = draft id + d2t[draft id]
    assert vocab.outside([3, 4, 250, 299]) == 2


def test_a_map_round_trips_through_its_file_and_eagle3_buffers(tiny, tmp_path):
    vocab = vocab_of(list(range(0, 300, 3)), tiny.tokenizer, 300)
    vocab.save(tmp_path)
    back = load_draft_vocab(tmp_path)
    assert back is not None and torch.equal(back.ids, vocab.ids) and back.fingerprint == vocab.fingerprint
    save_file({"d2t": vocab.d2t, "t2d": vocab.inside}, str(tmp_path / "eagle3.safetensors"))
    assert torch.equal(read_map(tmp_path / "eagle3.safetensors", tiny.tokenizer, 300).ids, vocab.ids)
    torch.save([250, 3, 7], tmp_path / "hot.pt")  # SGLang's --speculative-token-map: any order
    assert read_map(tmp_path / "hot.pt", tiny.tokenizer, 300).ids.tolist() == [3, 7, 250]


@pytest.mark.parametrize("case,message", [
    ("out-of-range", "do not fit"), ("duplicate", "appears twice"), ("t2d-size", "t2d covers"),
    ("t2d-other-ids", "t2d marks"), ("float-list", "1-D list of integer"), ("garbage", "cannot read")])
def test_a_map_that_does_not_fit_is_refused_in_one_line(tiny, tmp_path, case, message):
    d2t = torch.tensor([3, 3, 3])  # ids 3, 4, 5
    t2d = torch.zeros(300, dtype=torch.bool)
    t2d[[3, 4, 5]] = True
    files = {"out-of-range": ("hot.pt", [1, 300]), "duplicate": ("hot.pt", [1, 2, 2]),
             "float-list": ("hot.pt", torch.tensor([1.0, 2.0]))}
    path = tmp_path / "map.safetensors"
    if case in files:
        path = tmp_path / files[case][0]
        torch.save(files[case][1], path)
    elif case == "t2d-size":
        save_file({"d2t": d2t, "t2d": torch.ones(320, dtype=torch.bool)}, str(path))
    elif case == "t2d-other-ids":
        t2d[5], t2d[9] = False, True
        save_file({"d2t": d2t, "t2d": t2d}, str(path))
    else:
        path.write_bytes(b"not a safetensors file")
    with pytest.raises(LoadError, match=message):
        read_map(path, tiny.tokenizer, 300)


def test_the_most_frequent_ids_are_kept_with_the_always_kept_ones(tiny):
    counts = torch.zeros(300, dtype=torch.long)
    counts[[10, 20, 30, 40]] = torch.tensor([5, 9, 7, 1])
    vocab = from_counts(counts, 3, [299], tiny.tokenizer, "counts")
    assert vocab.ids.tolist() == [20, 30, 299]  # 299 (EOS) displaces the least frequent
    assert vocab.coverage == pytest.approx(16 / 22)
    with pytest.raises(LoadError, match="cannot hold"):
        from_counts(counts, 1, [298, 299], tiny.tokenizer, "counts")


def test_a_same_size_map_of_another_tokenizer_is_refused_at_pairing(tiny, tmp_path):
    """SpecForge PR #764: same size, other token strings -> every draft id would be repointed."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = sorted(tiny.tokenizer.get_vocab(), key=tiny.tokenizer.get_vocab().get)
    other = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(
        {w: i for i, w in enumerate(reversed(words))}, unk_token=words[0])))  # the same strings, other ids
    target = load_target(str(tiny.gpt2))
    drafter_dir = make_dflash(tmp_path / "dflash", tiny.gpt2, scale=10, seed=6)
    ids = list(range(250, 300))
    assert len(other) == 300 and other.convert_ids_to_tokens(ids) != tiny.tokenizer.convert_ids_to_tokens(ids)
    vocab_of(ids, other, 300).save(drafter_dir)
    with pytest.raises(IncompatibleModelsError, match="another tokenizer"):
        pair_models(target, load_drafter(str(drafter_dir)))
    vocab_of(ids, tiny.tokenizer, 300).save(drafter_dir)
    pair_models(target, load_drafter(str(drafter_dir)))  # the same ids counted on this target's: accepted


# --- greedy identity with a map that leaves out emitted tokens ----------------------------------

@pytest.fixture(scope="module")
def reduced(tiny):
    """Per target: (the target, its DFlash drafter with a draft vocabulary missing a third of the
    tokens ar emits, ar's result)."""
    paths = target_paths(tiny, "dv")
    found = {}
    for name, path in paths.items():
        target = load_target(str(path))
        ref = generate(PROMPTS, target=target, method="ar", max_new_tokens=MAX_NEW)
        emitted = sorted({t for o in ref.outputs for t in o.tokens})
        left_out = set(emitted[::3])
        directory = make_dflash(tiny.root / f"dv-{name}-dflash", path, scale=10, seed=6)
        vocab_of([t for t in range(target.vocab_size) if t not in left_out], target.tokenizer,
                 target.vocab_size).save(directory)
        found[name] = (target, load_drafter(str(directory)), ref)
    return found


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("name", TARGETS)
def test_dflash_with_a_draft_vocabulary_greedy_equals_ar(reduced, name, batch_size):
    target, drafter, ref = reduced[name]
    assert drafter.draft_vocab.outside([t for o in ref.outputs for t in o.tokens]) > 0  # the map misses emitted tokens
    got = generate(PROMPTS, target=target, drafter=drafter, method="dflash", gamma=4, max_new_tokens=MAX_NEW,
                   batch_size=batch_size)
    assert [o.tokens for o in got.outputs] == [o.tokens for o in ref.outputs]
    assert got.metrics.drafted > 0


@pytest.mark.parametrize("options", [{"drafts": 3}, {"gamma": "auto"}], ids=["drafts-3", "gamma-auto"])
def test_candidate_blocks_and_gamma_auto_with_a_draft_vocabulary_greedy_equal_ar(reduced, options):
    target, drafter, ref = reduced["qwen3"]
    got = generate(PROMPTS, target=target, drafter=drafter, method="dflash", max_new_tokens=MAX_NEW, batch_size=2,
                   **{"gamma": 4, **options})
    assert [o.tokens for o in got.outputs] == [o.tokens for o in ref.outputs]


def test_the_reduced_head_drafts_only_inside_the_map(reduced):
    target, drafter, _ = reduced["gpt2"]
    drafts = generate(PROMPTS, target=target, drafter=drafter, method="dflash", gamma=4, temperature=1.0,
                      max_new_tokens=MAX_NEW, seed=3)
    assert drafts.metrics.drafted > 0
    assert drafter.score(torch.zeros(1, drafter.hidden_size)).shape == (1, drafter.draft_vocab.size)


@pytest.mark.parametrize("kind,method", [("drafter", "specdiff"), ("ar", "spec-ar")])
def test_diffusion_and_ar_drafters_with_a_draft_vocabulary_greedy_equal_ar(tiny, reduced, tmp_path, kind, method):
    import shutil

    target, _, ref = reduced["gpt2"]
    directory = shutil.copytree(getattr(tiny, kind), tmp_path / kind)
    emitted = sorted({t for o in ref.outputs for t in o.tokens})
    vocab = vocab_of([t for t in range(300) if t not in emitted[::3]], tiny.tokenizer, 300)
    vocab.save(directory)
    drafter = load_drafter(str(directory))
    assert drafter.draft_vocab.size == vocab.size
    tree = {"tree": 8, **({"steps": 1} if method == "specdiff" else {})}  # its tree ranked over the map's rows
    for batch_size, options in ((1, {}), (3, {}), (3, tree)):
        got = generate(PROMPTS, target=target, drafter=drafter, method=method, gamma=4, max_new_tokens=MAX_NEW,
                       batch_size=batch_size, **options)
        assert [o.tokens for o in got.outputs] == [o.tokens for o in ref.outputs]
        assert not options or got.metrics.tree_sizes[8] > 0


# --- the target's distribution -----------------------------------------------------------------

def likeliest_left_out(target_model) -> list[int]:
    """Every id of the V = 8 vocabulary but the target's likeliest first token and V - 1."""
    likeliest = int(target_model(exact.CONTEXT).logits[0, -1].argmax())
    return [t for t in range(exact.V - 1) if t != likeliest]


@pytest.mark.parametrize("kind,sampling", [("diffusion", "t1"), pytest.param("ar", "t0.7-top3", marks=SLOW)])
def test_diffusion_and_ar_steps_with_a_draft_vocabulary_have_the_target_distribution(kind, sampling):
    """The l2r diffusion schedule (T = 2) and the AR drafter under the standard rule, with a map
    that leaves out the target's likeliest first token."""
    from specdiff.drafters.autoregressive import ARDrafter, ARProposer
    from specdiff.drafters.diffusion import DiffusionDrafter, DiffusionProposer
    from specdiff.nets.dit import DDiT, DiTConfig

    model = exact.v8_gpt2(0, 60.0)
    vocab = vocab_of(likeliest_left_out(model), exact.v8_tokenizer(), exact.V)
    if kind == "diffusion":
        backbone = DDiT(DiTConfig(vocab_size=exact.V + 1, hidden_size=16, n_heads=2, n_blocks=1, cond_dim=8,
                                  time_conditioning=False)).init_random(torch.Generator().manual_seed(3), std=0.3)
        proposer = DiffusionProposer(DiffusionDrafter(backbone, vocab_size=exact.V, mask_id=exact.V, context_length=8,
                                                      draft_vocab=vocab).eval(), "l2r", 2)
    else:
        proposer = ARProposer(ARDrafter(exact.v8_gpt2(9, 10.0), exact.v8_tokenizer(), draft_vocab=vocab))
    s = exact.SAMPLINGS[sampling]
    draft = proposer.propose(exact.CONTEXT.repeat(500, 1), exact.GAMMA, s, torch.Generator().manual_seed(0))
    assert bool(vocab.inside[draft.tokens].all()) and not bool(draft.q[..., ~vocab.inside].any())  # q = 0 outside
    cells, n = exact.speculative_samples(model, proposer, standard, s, seed=11)
    assert exact.chi_square_pvalue(cells, exact.exact_joint(model, s)) > exact.P_EXACT
    assert 0.05 < (n > 0).float().mean() < 0.95



@pytest.fixture(scope="module")
def small():
    """The V = 8 target of test_sampling_exact and DFlash drafters over one net: with the full head,
    with a map that leaves out the target's likeliest first token, and with that map one id off."""
    from specdiff.nets.dflash import DFlashSpec

    target = CausalLMTarget(exact.v8_gpt2(0, 60.0), exact.v8_tokenizer(), "v8")
    net = small_dflash_net(exact.V)
    ids = likeliest_left_out(target.model)  # also leaves out V - 1: room to shift the map by one
    drafters = {}
    for name, vocab in (("full", None), ("map", ids), ("shifted", [t + 1 for t in ids])):
        spec = DFlashSpec(exact.GAMMA + 1, exact.V - 1, (0,), 1)
        drafters[name] = DFlashDrafter(net, spec, draft_vocab=None if vocab is None else
                                       vocab_of(vocab, target.tokenizer, exact.V))
        pair_models(target, drafters[name])
    return target, drafters


class Coupled:
    """A draft step whose tokens come from one drafter's DFlashDrafts and whose q from another's
    (the same one: the step under test; two: a broken coupling)."""

    def __init__(self, target, sampling, tokens_from, q_from):
        self.tokens = DFlashDrafts(target, tokens_from, sampling)
        self.q = DFlashDrafts(target, q_from, sampling)
        self.layers = self.tokens.layers

    def __call__(self, batch, g):
        told = self.q(batch, g) if self.q.drafter is not self.tokens.drafter else None
        drawn = self.tokens(batch, g)
        return drawn if told is None else [Draft(d.tokens, t.q, 1) for d, t in zip(drawn, told)]


@torch.no_grad()
def samples(target, step, sampling, seed, rule=standard):
    g = torch.Generator().manual_seed(seed)
    ctx, tokens, q = exact.drafted_once(target, step, g)
    logits = target.model(torch.cat([ctx, tokens], 1)).logits[:, exact.CONTEXT.shape[1] - 1:]
    n, y = rule(tokens, q, sampling.target_probs(logits, ctx, tokens), g)
    return exact.first_tokens(target.model, tokens, n, y, sampling, g), n, tokens


@pytest.mark.parametrize("sampling,rule", [("t1", standard), pytest.param("t0.7-top3", standard, marks=SLOW),
                                           pytest.param("t1", match, marks=SLOW)],
                         ids=["t1-standard", "t0.7-top3-standard", "t1-match"])
def test_a_dflash_step_with_a_draft_vocabulary_has_the_target_distribution(small, sampling, rule):
    target, drafters = small
    s = exact.SAMPLINGS[sampling]
    cells, n, tokens = samples(target, Coupled(target, s, drafters["map"], drafters["map"]), s, seed=11, rule=rule)
    assert not bool(torch.isin(tokens, torch.tensor([t for t in range(exact.V)
                                                    if t not in drafters["map"].draft_vocab.ids])).any())
    assert exact.chi_square_pvalue(cells, exact.exact_joint(target.model, s)) > exact.P_EXACT
    assert 0.05 < (n > 0).float().mean() < 0.95  # sensitive: drafts neither always rejected nor always taken


BROKEN = {"q-over-the-full-head": ("map", "full"), "out-of-map-token-proposed": ("full", "map"),
          "map-one-id-off": ("map", "shifted")}


@pytest.mark.parametrize("sampling", ["t1", pytest.param("t0.7-top3", marks=SLOW)])
@pytest.mark.parametrize("broken", [pytest.param(b, marks=[] if b == "out-of-map-token-proposed" else SLOW)
                                    for b in sorted(BROKEN)])
def test_a_broken_coupling_of_map_and_q_fails_the_same_test(small, broken, sampling):
    target, drafters = small
    s = exact.SAMPLINGS[sampling]
    tokens_from, q_from = BROKEN[broken]
    cells, _, _ = samples(target, Coupled(target, s, drafters[tokens_from], drafters[q_from]), s, seed=11)
    assert exact.chi_square_pvalue(cells, exact.exact_joint(target.model, s)) < exact.P_BROKEN


# --- exported graphs ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exported(tiny, reduced):
    """tiny.gpt2 + its reduced DFlash drafter through `specdiff export` -> (artifacts, torch drafter)."""
    from click.testing import CliRunner

    from specdiff_cli.main import cli

    _, drafter, _ = reduced["gpt2"]
    out = tiny.root / "dv-export"
    result = CliRunner().invoke(cli, ["export", "--target", str(tiny.gpt2), "--drafter",
                                      str(tiny.root / "dv-gpt2-dflash"), "--max-batch", "3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, drafter


@pytest.mark.slow  # the export: 8 s, CI's slow step
def test_the_export_writes_the_reduced_head_and_its_map(exported):
    import json

    out, drafter = exported
    record = json.loads((out / "manifest.json").read_text())["components"]["drafter"]
    N = drafter.draft_vocab.size
    assert record["model"]["head_rows"] == N and record["model"]["draft_vocab"] == "draft_vocab.safetensors"
    assert record["io"]["outputs"][0]["dims"] == ["batch", 7, N]
    assert record["validation"]["passed"] and max(record["validation"]["max_abs_diff"].values()) < 1e-4
    assert torch.equal(load_draft_vocab(out).ids, drafter.draft_vocab.ids)


@pytest.mark.slow
def test_on_onnxruntime_a_reduced_drafter_drafts_as_in_torch(exported, reduced):
    from specdiff.runtimes import load_models

    out, drafter = exported
    target, _, ref = reduced["gpt2"]
    graphs = load_models("onnxruntime", out)
    assert graphs["drafter"].draft_vocab.size == drafter.draft_vocab.size
    greedy = generate(PROMPTS, target=graphs["target"], drafter=graphs["drafter"], method="dflash", gamma=4,
                      max_new_tokens=MAX_NEW, batch_size=3)
    assert [o.tokens for o in greedy.outputs] == [o.tokens for o in ref.outputs]
    options = dict(method="dflash", gamma=4, max_new_tokens=MAX_NEW, temperature=1.0, seed=5)
    on_graphs = generate(PROMPTS, target=graphs["target"], drafter=graphs["drafter"], **options)
    in_torch = generate(PROMPTS, target=target, drafter=drafter, **options)
    assert [o.tokens for o in on_graphs.outputs] == [o.tokens for o in in_torch.outputs]
    assert on_graphs.metrics.accepted == in_torch.metrics.accepted


@pytest.mark.slow
def test_a_missing_map_beside_the_graph_is_refused(exported, tmp_path):
    import shutil

    from specdiff.runtimes import load_models

    out, _ = exported
    copy = shutil.copytree(out, tmp_path / "copy")
    (copy / "draft_vocab.safetensors").unlink()
    with pytest.raises(LoadError):
        load_models("onnxruntime", copy)


@pytest.mark.slow  # an export: CI's slow step
def test_a_diffusion_drafter_with_a_map_on_onnxruntime_drafts_as_in_torch(tiny, reduced, tmp_path):
    import shutil

    from click.testing import CliRunner

    from specdiff.runtimes import load_models
    from specdiff_cli.main import cli

    target, _, ref = reduced["gpt2"]
    directory = shutil.copytree(tiny.drafter, tmp_path / "drafter")
    emitted = sorted({t for o in ref.outputs for t in o.tokens})
    vocab_of([t for t in range(300) if t not in emitted[::3]], tiny.tokenizer, 300).save(directory)
    out = tmp_path / "export"
    result = CliRunner().invoke(cli, ["export", "--target", str(tiny.gpt2), "--drafter", str(directory),
                                      "--max-batch", "3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    graphs = load_models("onnxruntime", out)
    assert graphs["drafter"].draft_vocab is not None
    options = dict(method="specdiff", gamma=4, steps=2, max_new_tokens=MAX_NEW)
    greedy = generate(PROMPTS, target=graphs["target"], drafter=graphs["drafter"], batch_size=3, **options)
    assert [o.tokens for o in greedy.outputs] == [o.tokens for o in ref.outputs]
    sampled = dict(options, temperature=1.0, seed=5)
    on_graphs = generate(PROMPTS, target=graphs["target"], drafter=graphs["drafter"], **sampled)
    in_torch = generate(PROMPTS, target=target, drafter=load_drafter(str(directory)), **sampled)
    assert [o.tokens for o in on_graphs.outputs] == [o.tokens for o in in_torch.outputs]


@pytest.mark.parametrize("rule,iid", [pytest.param("select", False, marks=SLOW), ("multi", True)])
def test_candidate_blocks_with_a_draft_vocabulary_have_the_target_distribution(small, rule, iid):
    """K = 3 candidate blocks drawn over the map's rows (select: the argmax block then draws;
    multi: i.i.d. draws, recursive rejection reading their q), verified as _verify_selected does."""
    from specdiff import selection

    target, drafters = small
    s = exact.SAMPLINGS["t1"]
    g = torch.Generator().manual_seed(11)
    _, tokens, q = exact.drafted_once(target, DFlashDrafts(target, drafters["map"], s, 3, iid=iid), g)  # (N, 3, gamma)
    assert not bool((q[..., ~drafters["map"].draft_vocab.inside] > 0).any())
    ctx = exact.CONTEXT.repeat_interleave(3, 0).repeat(exact.N, 1)
    flat = tokens.reshape(exact.N * 3, exact.GAMMA)
    seqs, inverse = torch.cat([ctx, flat], 1).unique(dim=0, return_inverse=True)
    with torch.no_grad():
        logits = target.model(seqs).logits[inverse, exact.CONTEXT.shape[1] - 1:]
    p = s.target_probs(logits, ctx, flat).reshape(exact.N, 3, exact.GAMMA + 1, exact.V)
    n, y, k = selection.RULES[rule](tokens, q, p, g)
    cells = exact.first_tokens(target.model, tokens[torch.arange(exact.N), k], n, y, s, g)
    assert exact.chi_square_pvalue(cells, exact.exact_joint(target.model, s)) > exact.P_EXACT
    assert 0.05 < (n > 0).float().mean() < 0.95
