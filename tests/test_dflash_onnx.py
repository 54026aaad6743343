"""`--method dflash` on exported graphs (issue 23 item 1, ONNX half): `specdiff export` writes a
target graph that also outputs the hidden states a DFlash drafter reads and a DFlash step graph
(its context K/V in and out, the target's embedding and head inside), each validated against
PyTorch; on ONNX Runtime every draft's q equals the torch drafter's on the same positions
(a context cache that skips a position misses it), greedy output is ar's, batched or not, and a
sampled run is the torch run's token for token; refusals, each one line; the CLI."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from click.testing import CliRunner

from specdiff import generate, load_drafter, load_target
from specdiff.artifacts import open_artifacts
from specdiff.errors import LoadError, UsageError
from specdiff.exporters.export import export
from specdiff.exporters.tensorrt import profile_shapes, triples_for
from specdiff.generation import plan
from specdiff.graphs import Limits, spec_from_model
from specdiff.methods import dflash as dflash_method
from specdiff.methods.dflash import DFlashDrafts
from specdiff.runtimes import load_models
from specdiff.runtimes.models import GraphDFlashDrafter, GraphTarget
from specdiff_cli.main import cli

from dflash_runs import MAX_NEW, PROMPTS, Recording, SkipsOne, checked_against

pytest_plugins = ["exported"]


@pytest.fixture(scope="module")
def graphs(onnx_dflash):
    return load_models("onnxruntime", onnx_dflash)


@pytest.fixture(scope="module")
def torch_models(tiny, tiny_dflash):
    return load_target(str(tiny.gpt2)), load_drafter(str(tiny_dflash))


def test_the_export_records_the_features_and_validates_both_graphs(onnx_dflash):
    m = json.loads((onnx_dflash / "manifest.json").read_text())
    target, drafter = m["components"]["target"], m["components"]["drafter"]
    assert (target["model"]["feature_layers"], target["model"]["features"]) == ([1, 2], 64)
    assert drafter["model"] | {"name": None} == {
        "kind": "dflash", "name": None, "vocab_size": 300, "mask_id": 319, "block_size": 8,
        "target_layer_ids": [0, 1], "num_target_layers": 2, "head_rows": 320, "layers": 1, "kv_heads": 2,
        "head_dim": 8, "features": 64, "defaults": {"gamma": 7}}
    assert [t["name"] for t in target["io"]["outputs"]][-1] == "features"
    assert [t["name"] for t in drafter["io"]["inputs"]] == [
        "block_ids", "start", "context", "context_mask", "past_context.0.key", "past_context.0.value"]
    assert drafter["io"]["outputs"][0]["dims"] == ["batch", 7, 320]  # the block's 7 draft slots
    for component, families in ((target, {"logits", "present", "features"}), (drafter, {"logits", "present_context"})):
        v = component["validation"]
        assert v["passed"] and set(v["max_abs_diff"]) == families and max(v["max_abs_diff"].values()) < 1e-4
    assert any("left-padded" in case for case in drafter["validation"]["cases"])


@torch.no_grad()
def test_each_graph_draft_is_the_torch_drafters_on_the_same_positions(graphs, torch_models, monkeypatch):
    """Through ragged batched generations on ONNX Runtime (rows refilled as others finish, the
    first context fed in chunks of at most max_step rows), every draft's q == the torch drafter
    called alone on the torch target's hidden states of positions 0 .. start - 1; a context cache
    that skips one position misses it by far."""
    target, drafter = torch_models
    generate(["warm"], target=target, drafter=drafter, method="dflash", max_new_tokens=2)  # binds the drafter
    gaps: list[float] = []
    monkeypatch.setattr(DFlashDrafts, "__call__", checked_against(target, drafter, gaps))
    graphs["drafter"].max_step = 5  # the prompts' first contexts go in several calls
    found = []
    try:
        for contexts in (Recording, SkipsOne):
            monkeypatch.setattr(dflash_method, "RowContexts", contexts)
            gaps.clear()
            generate(PROMPTS[:7], target=graphs["target"], drafter=graphs["drafter"], method="dflash",
                     max_new_tokens=MAX_NEW, batch_size=3, temperature=1.0, seed=3, gamma=7)
            found.append((max(gaps), len(gaps)))
    finally:
        graphs["drafter"].max_step = None
    (gap, drafts), (broken, _) = found
    assert gap <= 1e-4 and broken > 1e-2 and drafts > 20, found


@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_on_graphs_equals_ar(graphs, torch_models, batch_size):
    ref = generate(PROMPTS, target=torch_models[0], method="ar", max_new_tokens=MAX_NEW)
    got = generate(PROMPTS, target=graphs["target"], drafter=graphs["drafter"], method="dflash",
                   max_new_tokens=MAX_NEW, batch_size=batch_size, gamma=3)
    assert [o.tokens for o in got.outputs] == [o.tokens for o in ref.outputs]
    assert got.metrics.drafter_calls > 0 and graphs["target"].captured == ()


def test_a_sampled_run_on_graphs_is_the_torch_run(graphs, torch_models):
    """The same seed, the same tokens: the graphs' p and q equal torch's (to 1e-6), so every draw
    and every acceptance test comes out the same; drafts are accepted."""
    options = {"method": "dflash", "max_new_tokens": MAX_NEW, "batch_size": 3, "temperature": 1.0, "seed": 11,
               "gamma": 7}
    on_torch = generate(PROMPTS[:12], target=torch_models[0], drafter=torch_models[1], **options)
    on_graphs = generate(PROMPTS[:12], target=graphs["target"], drafter=graphs["drafter"], **options)
    assert [o.tokens for o in on_graphs.outputs] == [o.tokens for o in on_torch.outputs]
    assert on_graphs.metrics.accepted == on_torch.metrics.accepted > 0


def test_a_target_graph_without_the_drafters_layers_is_refused(onnx_pair, graphs):
    plain = load_models("onnxruntime", onnx_pair)["target"]
    assert isinstance(plain, GraphTarget) and isinstance(graphs["drafter"], GraphDFlashDrafter)
    with pytest.raises(UsageError, match=r"outputs no hidden states; the drafter reads \[1, 2\]: export the target"):
        plan(target=plain, drafter=graphs["drafter"], method="dflash")


def test_a_dflash_drafter_alone_is_not_exported(tiny_dflash, tmp_path):
    with pytest.raises(UsageError, match="export it together with its `target`"):
        export(tmp_path / "out", drafter=str(tiny_dflash))
    assert list(tmp_path.iterdir()) == []


def test_a_manifest_whose_target_lacks_the_features_is_refused(onnx_dflash, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(onnx_dflash, copy)
    m = json.loads((copy / "manifest.json").read_text())
    del m["components"]["target"]["model"]["feature_layers"]
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(LoadError, match=r"DFlash drafter reads the target's hidden states \[1, 2\]"):
        open_artifacts(copy)


def test_tensorrt_profiles_of_the_dflash_graph_follow_the_target(onnx_dflash):
    """The drafter's context rows are the target's cached tokens: its profile's axes are the
    target's (held rows up to max_seq - 1, new rows up to max_step, the mask their sum)."""
    model = json.loads((onnx_dflash / "manifest.json").read_text())["components"]["drafter"]["model"]
    limits = Limits(max_batch=3, max_seq=65, max_step=64)
    shapes = profile_shapes(spec_from_model("drafter", model), triples_for("drafter", model, limits))
    assert shapes["block_ids"] == ((1, 8), (1, 8), (3, 8))
    assert shapes["context"][2] == (3, 64, 64) and shapes["context_mask"][2] == (3, 128)
    assert shapes["past_context.0.key"] == ((1, 2, 0, 8), (1, 2, 32, 8), (3, 2, 64, 8))


def test_cli_generates_with_dflash_on_onnxruntime(onnx_dflash):
    result = CliRunner().invoke(cli, ["generate", "--runtime", "onnxruntime", "--artifacts", str(onnx_dflash),
                                      "--method", "dflash", "--stats", "--max-new-tokens", "12",
                                      "--prompt", "The quick brown fox"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stderr.strip().splitlines()[-1])
    assert (stats["method"], stats["exact"], stats["settings"]["gamma"]) == ("dflash", True, {"value": 7, "from": "drafter"})


def test_bench_runs_dflash_on_the_exported_graphs_beside_eager(tiny, tiny_dflash, onnx_dflash, tmp_path):
    """`bench --artifacts` with a DFlash export: an onnxruntime dflash row, its greedy tokens checked
    against eager ar, its acceptance the eager row's."""
    result = CliRunner().invoke(cli, [
        "bench", "--target", str(tiny.gpt2), "--drafter", str(tiny_dflash), "--methods", "ar,dflash",
        "--artifacts", str(onnx_dflash), "--gamma", "3", "--max-new-tokens", "8", "--num-prompts", "3",
        "--truncate-prompt", "--repeats", "1", "--warmup", "0", "--check", "--no-plots", "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    rows = {r["label"]: r for r in json.loads((tmp_path / "b" / "bench.json").read_text())["rows"]}
    on_graphs = rows["dflash g=3 onnxruntime"]
    assert on_graphs["matches_ar"] and on_graphs["runtime"] == "onnxruntime"
    assert on_graphs["tau"] == rows["dflash g=3"]["tau"]


@pytest.mark.slow  # 11 s: CI's slow step
def test_an_fp16_export_validates_and_drafts(tiny, tmp_path):
    """fp16 graphs of a tied-head Llama (SmolLM2's shape) and a DFlash drafter over it: both pass
    the fp16 validation on ONNX Runtime's CPU provider and decode with drafts, chains and trees."""
    from tiny import make_dflash, make_llama

    llama = make_llama(tmp_path / "llama", tiny.tokenizer, scale=10, seed=3, tied=True)
    out = export(tmp_path / "out", target=str(llama), drafter=str(make_dflash(tmp_path / "d", llama, scale=10, seed=6)),
                 dtype="fp16")
    m = json.loads((out / "manifest.json").read_text())
    assert all(m["components"][kind]["validation"]["passed"] for kind in ("target", "drafter"))
    graphs = load_models("onnxruntime", out)
    for tree in (None, 4):
        result = generate(PROMPTS[:4], target=graphs["target"], drafter=graphs["drafter"], method="dflash",
                          max_new_tokens=8, batch_size=2, gamma=3, tree=tree)
        assert result.metrics.drafter_calls > 0 and result.metrics.new_tokens > 0
    target = graphs["target"]  # ragged rows, one tree with padding nodes: fp16 masks leave no row all masked
    target.keep([])
    for n in (9, 3):
        target.join(torch.arange(n)[None] + 5)
    logits = target.extend_tree(torch.full((2, 5), 7), torch.tensor([[-1, 0, 0, 1, 1]] * 2), torch.tensor([5, 3]))
    target.keep_path([[0, 1, 3], [0]])
    assert logits.isfinite().all() and target.extend(torch.tensor([[8], [9]])).isfinite().all()


@pytest.mark.slow  # two tiny exports: CI's slow step
def test_bench_drafts_a_dflash_also_drafter_over_a_target_graph_with_features(tiny, tmp_path, monkeypatch):
    """`bench --drafter DDIT --also-drafter DFLASH --runtime onnxruntime` (the default job's rows): the
    pair's export (a diffusion drafter: no hidden states) comes first, yet the rows run over the
    export whose target outputs the features the DFlash drafter reads: greedy checked against ar
    on each row, dflash's tau as eager's. Without that choice dflash is refused after exporting.
    Only that target graph is opened (each is the whole target's weights)."""
    from tiny import make_dflash

    from specdiff.runtimes import onnxruntime as ort_backend

    opened: list[str] = []
    open_graph = ort_backend.open_graph

    def counted(art, kind, device):
        opened.append(kind)
        return open_graph(art, kind, device)

    monkeypatch.setattr(ort_backend, "open_graph", counted)
    monkeypatch.setenv("SPECDIFF_CACHE", str(tmp_path / "cache"))
    dflash = make_dflash(tmp_path / "dflash", tiny.gpt2, target_layer_ids=(0, 1, 1), scale=10)
    result = CliRunner().invoke(cli, [
        "bench", "--target", str(tiny.gpt2), "--drafter", str(tiny.drafter), "--also-drafter", str(dflash),
        "--methods", "ar,specdiff,dflash", "--gamma", "3", "--max-new-tokens", "8", "--num-prompts", "3",
        "--truncate-prompt", "--repeats", "1", "--warmup", "0", "--check", "--no-plots", "--runtime", "onnxruntime",
        "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    rows = {r["label"]: r for r in json.loads((tmp_path / "b" / "bench.json").read_text())["rows"]}
    assert rows["dflash g=3 onnxruntime"]["tau"] == rows["dflash g=3"]["tau"]
    assert all(r["matches_ar"] for r in rows.values() if r["method"] != "ar")
    assert {r["runtime"] for r in rows.values() if r["method"] == "specdiff"} == {"torch", "onnxruntime"}
    assert sorted(opened) == ["drafter", "drafter", "target"]
