"""Draft trees on exported targets (issue 39 item 3): the target step graph takes additive 4-D
masks (a second one for sliding_attention layers), so an ONNX Runtime target verifies a tree in one
call. Its per-node logits are the torch target's on the same tree (fed whole or in chunks of
max_step tokens; a mask that ignores the ancestors misses them), keep_path leaves its cache as
appending the path would, greedy `tree` output on it is ar's at batch 1 and 3; a model whose
windows count columns is refused at export's record; the CLI and bench run trees on it.
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from specdiff import generate, load_target
from specdiff.exporters.export import export
from specdiff.exporters.onnx import target_graph
from specdiff.runtimes import load_models
from specdiff.runtimes.models import GraphTarget
from specdiff.trees import ancestry
from specdiff_cli.main import cli

from tiny import make_dflash, make_llama, make_qwen3
from tree_runs import MAX_NEW, PROMPTS, TARGETS, windowed_qwen3

pytest_plugins = ["exported"]
SLOW = pytest.mark.slow  # an export of its own and greedy runs: CI's slow step
DEFAULT = ("gpt2", "qwen3-window")  # the others run in the slow step


@pytest.fixture(scope="module")
def exported(tiny, onnx_dflash):
    """name -> (torch target, its graphs {"target", "drafter"} on ONNX Runtime), exported on first
    use (gpt2: the session's DFlash export, batch up to 3)."""
    makers = {"llama": lambda d: make_llama(d, tiny.tokenizer, scale=10, seed=4),
              "qwen3": lambda d: make_qwen3(d, tiny.tokenizer, scale=10, seed=5),
              "qwen3-window": lambda d: windowed_qwen3(d, tiny.tokenizer)}
    found: dict = {}

    def get(name):
        if name not in found:
            if name == "gpt2":
                path, out = tiny.gpt2, onnx_dflash
            else:
                path = makers[name](tiny.root / f"to-{name}")
                drafter = make_dflash(tiny.root / f"to-{name}-dflash", path, scale=10, seed=6)
                out = export(tiny.root / f"to-{name}-export", target=str(path), drafter=str(drafter), max_batch=3)
            found[name] = load_target(str(path)), load_models("onnxruntime", out)
        return found[name]
    return get


def _params(cases):
    """(name, ...) cases, those of the targets outside DEFAULT marked slow."""
    return [case if case[0] in DEFAULT else pytest.param(*case, marks=SLOW) for case in cases]


def _rows(V):
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, V, (1, n), generator=gen) for n in (9, 17, 4)]  # longer than the window (6)


TOKENS = [11, 12, 13, 14, 15]
PARENT = torch.tensor([[-1, 0, 0, 1, 3, 2]] * 3)  # two branches: 0-1-3-4 and 0-2-5
NEW = torch.tensor([6, 6, 4])  # the last row's tree smaller (padding nodes after)
KEPT = [[0, 1, 3, 4], [0, 2, 5], [0]]


def _verify(target, rows):
    """rows joined, one tree each -> (tree logits (3, 6, V), next logits after keep_path (3, 1, V))."""
    target.keep([])
    for r in rows:
        target.join(r[:, :-1])
    tokens = torch.tensor([[r[0, -1].item(), *TOKENS] for r in rows])
    logits = target.extend_tree(tokens, PARENT, NEW)
    target.keep_path(KEPT)
    nxt = target.extend(torch.tensor([[7], [8], [9]]))
    target.keep([])
    return logits, nxt


@pytest.mark.parametrize("name,max_step", _params([(n, None) for n in TARGETS] + [("gpt2", 2), ("qwen3-window", 4)]))
def test_graph_tree_logits_are_the_torch_targets(exported, name, max_step):
    """Three ragged rows (one tree smaller): every real node's logits and, after keep_path, the next
    step's equal the torch target's on the same tree, and the model's on the row, the path and 7 + b
    alone (the cache is that of the path appended as a chain). max_step: fed in chunks."""
    torch_target, graphs = exported(name)
    target = graphs["target"]
    rows = _rows(target.vocab_size)
    target.max_step = max_step
    try:
        got, got_next = _verify(target, rows)
    finally:
        target.max_step = None
    want, want_next = _verify(torch_target, rows)
    model, V = torch_target.model, target.vocab_size
    with torch.no_grad():
        for b, r in enumerate(rows):
            n = int(NEW[b])
            assert torch.allclose(got[b, :n], want[b, :n], atol=1e-4), b
            seq = torch.cat([r[0], torch.tensor([TOKENS[i - 1] for i in KEPT[b][1:]] + [7 + b])])[None]
            assert torch.allclose(got_next[b, 0], model(seq).logits[0, -1, :V], atol=1e-4), b
            assert torch.allclose(got_next[b, 0], want_next[b, 0], atol=1e-4), b


def test_a_mask_that_ignores_the_ancestors_fails_the_same_test(exported, monkeypatch):
    """The negative control: node i sees every node before it (a chain's mask over the tree)."""
    torch_target, graphs = exported("gpt2")
    target = graphs["target"]
    run = GraphTarget._tree_run

    def chain_mask(self, ids, allowed, positions, key_positions, kv):
        S = ids.shape[1]
        allowed[:, :, -S:] = torch.ones(S, S, dtype=torch.bool).tril()
        return run(self, ids, allowed, positions, key_positions, kv)

    monkeypatch.setattr(GraphTarget, "_tree_run", chain_mask)
    rows = _rows(target.vocab_size)
    got, _ = _verify(target, rows)
    want, _ = _verify(torch_target, rows)
    off = [(b, i) for b in range(3) for i in range(int(NEW[b])) if not torch.allclose(got[b, i], want[b, i], atol=1e-4)]
    assert (0, 2) in off and (0, 5) in off and (0, 1) not in off  # the second branch saw the first


@pytest.mark.parametrize("name,batch_size,tree", _params([(n, b, 8) for n in TARGETS for b in (1, 3)]
                                                         + [("gpt2", 3, "auto"), ("qwen3-window", 3, None)]))
def test_greedy_tree_on_graphs_equals_ar(exported, monkeypatch, name, batch_size, tree):
    torch_target, graphs = exported(name)
    verified = []
    extend_tree = GraphTarget.extend_tree
    monkeypatch.setattr(GraphTarget, "extend_tree", lambda self, *a: verified.append(1) or extend_tree(self, *a))
    ref = generate(PROMPTS, target=torch_target, method="ar", max_new_tokens=MAX_NEW)
    got = generate(PROMPTS, target=graphs["target"], drafter=graphs["drafter"], method="dflash",
                   max_new_tokens=MAX_NEW, gamma=4, tree=tree, batch_size=batch_size)
    assert [o.tokens for o in got.outputs] == [o.tokens for o in ref.outputs]
    assert got.metrics.drafter_calls > 0 and bool(verified) == bool(tree)  # None: chains, the windows by columns


@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_specdiff_tree_on_graphs_equals_ar(tiny, onnx_pair, monkeypatch, batch_size):
    """specdiff's trees (best-first over the exported diffusion drafter's T = 1 marginals), verified
    by the exported target: ar's tokens, every verify a tree."""
    graphs = load_models("onnxruntime", onnx_pair)
    verified = []
    extend_tree = GraphTarget.extend_tree
    monkeypatch.setattr(GraphTarget, "extend_tree", lambda self, *a: verified.append(1) or extend_tree(self, *a))
    ref = generate(PROMPTS, target=load_target(str(tiny.gpt2)), method="ar", max_new_tokens=MAX_NEW)
    got = generate(PROMPTS, target=graphs["target"], drafter=graphs["drafter"], method="specdiff", steps=1,
                   max_new_tokens=MAX_NEW, gamma=4, tree=8, batch_size=batch_size)
    assert [o.tokens for o in got.outputs] == [o.tokens for o in ref.outputs]
    assert verified and sum(got.metrics.tree_sizes) == got.metrics.iterations and got.metrics.tree_sizes[8] > 0


def test_a_model_whose_windows_count_columns_records_no_trees(tiny, exported):
    """GPT-Neo's local layers: the export records why (GraphTarget.can_tree says it); a graph
    without the record verifies trees."""
    neo = load_target(str(tiny.neo))
    record = target_graph(neo)[2]
    assert record["no_trees"] == neo.can_tree() and "windowed attention counts cache columns" in record["no_trees"]
    assert exported("gpt2")[1]["target"].can_tree() is None


def test_cli_generates_a_tree_on_onnxruntime(onnx_dflash):
    result = CliRunner().invoke(cli, ["generate", "--runtime", "onnxruntime", "--artifacts", str(onnx_dflash),
                                      "--method", "dflash", "--gamma", "4", "--tree", "8", "--stats",
                                      "--max-new-tokens", "12", "--prompt", "The quick brown fox"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stderr.strip().splitlines()[-1])
    assert (stats["method"], stats["exact"]) == ("dflash", True)


def test_bench_runs_tree_rows_on_the_exported_graphs(tiny, tiny_dflash, onnx_dflash, tmp_path):
    """`bench --artifacts --tree 0,4`: an onnxruntime tree row, its greedy tokens checked against
    eager ar, its acceptance the eager tree row's."""
    result = CliRunner().invoke(cli, [
        "bench", "--target", str(tiny.gpt2), "--drafter", str(tiny_dflash), "--methods", "ar,dflash",
        "--artifacts", str(onnx_dflash), "--gamma", "3", "--tree", "0,4", "--max-new-tokens", "8",
        "--num-prompts", "3", "--truncate-prompt", "--repeats", "1", "--warmup", "0", "--check", "--no-plots",
        "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    rows = {r["label"]: r for r in json.loads((tmp_path / "b" / "bench.json").read_text())["rows"]}
    on_graphs = rows["dflash g=3 tree=4 onnxruntime"]
    assert on_graphs["matches_ar"] and on_graphs["runtime"] == "onnxruntime"
    assert on_graphs["tau"] == rows["dflash g=3 tree=4"]["tau"]
