"""`--method eagle3` on exported graphs (issue 33, ONNX half): `specdiff export` writes a target
graph that also outputs the hidden states an EAGLE-3 head reads and an EAGLE-3 step graph (the
head's own K/V in and out, fused features or its previous output per row, the last row's logits
over its draft vocabulary), each validated against PyTorch; on ONNX Runtime every draft's q equals
the one computed from scratch on the torch models (a graph fed its past one row late misses it),
greedy output is ar's at batch 1 and 3, a sampled run is the torch run's token for token; the same
graphs under (fake) TensorRT engines; refusals, each one line; the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from specdiff import generate, load_drafter, load_target
from specdiff.artifacts import open_artifacts, read_engine
from specdiff.errors import UsageError
from specdiff.exporters.export import export
from specdiff.exporters.tensorrt import profile_shapes, triples_for
from specdiff.generation import plan
from specdiff.graphs import Limits, spec_from_model
from specdiff.methods.eagle3 import Eagle3Drafts
from specdiff.runtimes import load_models
from specdiff.runtimes import tensorrt as rt
from specdiff.runtimes.models import GraphEagle3Drafter, GraphTarget
from specdiff.sampling import Sampling
from specdiff_cli.main import cli

from eagle3_runs import MAX_NEW, PROMPTS, checked_against
from fake_tensorrt import with_fake_engines

pytest_plugins = ["exported"]


@pytest.fixture(scope="module")
def graphs(onnx_eagle3):
    return load_models("onnxruntime", onnx_eagle3)


@pytest.fixture(scope="module")
def torch_models(tiny, tiny_eagle3):
    target, drafter = load_target(str(tiny.gpt2)), load_drafter(str(tiny_eagle3))
    generate(["warm"], target=target, drafter=drafter, method="eagle3", max_new_tokens=2)  # pairs (binds) the head
    return target, drafter


class WrongPast:
    """The drafter graph's runtime fed its past K/V one row late (rolled along the rows)."""

    def __init__(self, runtime):
        self.runtime, self.limits = runtime, runtime.limits

    def run(self, feeds):
        return self.runtime.run({k: v.roll(1, 2) if k.startswith("past_key_values.") else v for k, v in feeds.items()})


def test_the_export_records_the_head_and_validates_both_graphs(onnx_eagle3):
    m = json.loads((onnx_eagle3 / "manifest.json").read_text())
    target, drafter = m["components"]["target"], m["components"]["drafter"]
    assert (target["model"]["feature_layers"], target["model"]["features"]) == ([1, 2, 2], 96)
    assert drafter["model"] | {"name": None} == {
        "kind": "eagle3", "name": None, "vocab_size": 300, "head_rows": 200, "target_layer_ids": [0, 1, 1],
        "hidden_size": 32, "layers": 1, "vocab_rows": 320, "kv_heads": 2, "head_dim": 8, "features": 96,
        "draft_vocab": "draft_vocab.safetensors"}
    assert [t["name"] for t in drafter["io"]["inputs"]] == [
        "input_ids", "features", "hidden", "from_features", "position_ids", "context_mask",
        "past_key_values.0.key", "past_key_values.0.value"]
    assert [(t["name"], t["dims"]) for t in drafter["io"]["outputs"][:2]] == [
        ("logits", ["batch", 1, 200]), ("last_hidden", ["batch", 1, 32])]
    for component, families in ((target, {"logits", "present", "features"}),
                                (drafter, {"logits", "last_hidden", "present"})):
        v = component["validation"]
        assert v["passed"] and set(v["max_abs_diff"]) == families and max(v["max_abs_diff"].values()) < 1e-4
    assert any("left-padded" in case for case in drafter["validation"]["cases"])
    assert any("draft step" in case for case in drafter["validation"]["cases"])


@torch.no_grad()
def test_each_graph_draft_is_the_chain_computed_from_scratch(graphs, torch_models, monkeypatch):
    """Sampled at batch 3 with ragged rows (contexts fed in chunks of at most 5 rows, carried across
    steps): every q of the graphs == the from-scratch one on the torch models; the same run with
    the head's graph fed its past one row late misses it by far."""
    target, drafter = torch_models
    head = graphs["drafter"]
    found = []
    runtime = head.runtime
    try:
        head.max_step = 5
        for fed in (runtime, WrongPast(runtime)):
            head.runtime = fed
            gaps: list[float] = []
            monkeypatch.setattr(Eagle3Drafts, "__call__", checked_against(target, drafter, Sampling(1.0), gaps, 0))
            result = generate(PROMPTS[:6], target=graphs["target"], drafter=head, method="eagle3", max_new_tokens=16,
                              batch_size=3, gamma=3, temperature=1.0, seed=2)
            found.append((max(gaps), len(gaps), result.metrics.drafter_calls))
    finally:
        head.runtime, head.max_step = runtime, None
    (gap, drafts, calls), (broken, _, _) = found
    assert gap <= 1e-4 and broken > 1e-2 and drafts > 15 and calls > 0, found


@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_on_graphs_equals_ar(graphs, torch_models, batch_size):
    ref = generate(PROMPTS, target=torch_models[0], method="ar", max_new_tokens=MAX_NEW)
    got = generate(PROMPTS, target=graphs["target"], drafter=graphs["drafter"], method="eagle3",
                   max_new_tokens=MAX_NEW, batch_size=batch_size, gamma=3)
    assert [o.tokens for o in got.outputs] == [o.tokens for o in ref.outputs]
    assert got.metrics.drafter_calls > 0 and graphs["target"].captured == ()


def test_a_sampled_run_on_graphs_is_the_torch_run(graphs, torch_models):
    """The same seed, the same tokens: the graphs' p and q equal torch's, so every draw and every
    acceptance test comes out the same."""
    options = {"method": "eagle3", "max_new_tokens": MAX_NEW, "batch_size": 3, "temperature": 1.0, "seed": 11,
               "gamma": 3}
    on_torch = generate(PROMPTS[:9], target=torch_models[0], drafter=torch_models[1], **options)
    on_graphs = generate(PROMPTS[:9], target=graphs["target"], drafter=graphs["drafter"], **options)
    assert [o.tokens for o in on_graphs.outputs] == [o.tokens for o in on_torch.outputs]
    assert on_graphs.metrics.accepted == on_torch.metrics.accepted


def test_the_graph_drafter_scores_only_its_last_output(graphs):
    with pytest.raises(RuntimeError, match="scores the output of the last call only"):
        graphs["drafter"].logits(torch.zeros(1, 1, 32))


def test_a_target_graph_without_the_heads_layers_is_refused(onnx_pair, graphs):
    plain = load_models("onnxruntime", onnx_pair)["target"]
    assert isinstance(plain, GraphTarget) and isinstance(graphs["drafter"], GraphEagle3Drafter)
    with pytest.raises(UsageError, match=r"outputs no hidden states; the drafter reads \[1, 2, 2\]: export the target"):
        plan(target=plain, drafter=graphs["drafter"], method="eagle3")


def test_an_eagle3_head_alone_is_not_exported(tiny_eagle3, tmp_path):
    with pytest.raises(UsageError, match="EAGLE-3 drafter .* drafts from its target's hidden states: export it "
                                         "together with its `target`"):
        export(tmp_path / "out", drafter=str(tiny_eagle3))
    assert list(tmp_path.iterdir()) == []


def test_tensorrt_profiles_of_the_eagle3_graph_follow_the_target(onnx_eagle3):
    """The head's context rows are the target's cached tokens: its profile's axes are the target's."""
    model = json.loads((onnx_eagle3 / "manifest.json").read_text())["components"]["drafter"]["model"]
    limits = Limits(max_batch=3, max_seq=65, max_step=64)
    shapes = profile_shapes(spec_from_model("drafter", model), triples_for("drafter", model, limits))
    assert shapes["features"] == ((1, 1, 96), (1, 9, 96), (3, 64, 96))
    assert shapes["context_mask"][2] == (3, 128) and shapes["past_key_values.0.key"][2] == (3, 2, 64, 8)


def test_greedy_over_tensorrt_engines_equals_ar(tiny, onnx_eagle3, torch_models, tmp_path):
    """Fake TensorRT 10.9 engines (tests/test_tensorrt_logic.py: they run the ONNX graphs) of both
    components decode
    eagle3 with the profile's limits (the head's context in chunks of max_step rows) as ar does."""
    root, _, trt = with_fake_engines(onnx_eagle3, tmp_path / "trt")
    art = open_artifacts(root)
    runtimes = {}
    for kind in ("target", "drafter"):
        meta, engine = read_engine(root / f"{kind}.engine")
        runtimes[kind] = rt.TrtRuntime(trt, engine, meta, "cpu", expected=["input_ids"])
    target = GraphTarget.from_artifacts(art, runtimes["target"], "cpu")
    head = GraphEagle3Drafter.from_artifacts(art, runtimes["drafter"], "cpu")
    head.max_step = 4  # below the prompts' lengths: their contexts go in several calls
    ref = generate(PROMPTS[:6], target=torch_models[0], method="ar", max_new_tokens=12)
    got = generate(PROMPTS[:6], target=target, drafter=head, method="eagle3", max_new_tokens=12, batch_size=3,
                   gamma=3)
    assert [o.tokens for o in got.outputs] == [o.tokens for o in ref.outputs] and got.metrics.drafter_calls > 0


def test_cli_generates_with_eagle3_on_onnxruntime(onnx_eagle3):
    result = CliRunner().invoke(cli, ["generate", "--runtime", "onnxruntime", "--artifacts", str(onnx_eagle3),
                                      "--method", "eagle3", "--stats", "--max-new-tokens", "12",
                                      "--prompt", "The quick brown fox"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stderr.strip().splitlines()[-1])
    assert (stats["method"], stats["exact"]) == ("eagle3", True)


@pytest.mark.slow  # two tiny exports: CI's slow step
def test_bench_runs_dflash_and_eagle3_in_one_run_on_their_own_exports(tiny, tiny_eagle3, tmp_path, monkeypatch):
    """`bench --runtime onnxruntime --also-drafter`: each drafter exported with the target into the
    user cache, each method's graph rows drafting with its own drafter over the first export's
    target graph: greedy checked against ar, tau as eager's; with --artifacts (one drafter's
    export) --also-drafter is one line."""
    from tiny import make_dflash

    monkeypatch.setenv("SPECDIFF_CACHE", str(tmp_path / "cache"))
    dflash = make_dflash(tmp_path / "dflash", tiny.gpt2, target_layer_ids=(0, 1, 1), scale=10)
    common = ["bench", "--target", str(tiny.gpt2), "--drafter", str(dflash), "--also-drafter", str(tiny_eagle3),
              "--methods", "ar,dflash,eagle3", "--gamma", "3", "--max-new-tokens", "8", "--num-prompts", "3",
              "--truncate-prompt", "--repeats", "1", "--warmup", "0", "--check", "--no-plots"]
    result = CliRunner().invoke(cli, [*common, "--runtime", "onnxruntime", "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    rows = {r["label"]: r for r in json.loads((tmp_path / "b" / "bench.json").read_text())["rows"]}
    for method in ("dflash", "eagle3"):
        on_graphs = rows[f"{method} g=3 onnxruntime"]
        assert on_graphs["matches_ar"] and on_graphs["tau"] == rows[f"{method} g=3"]["tau"]
    assert len(list((tmp_path / "cache" / "onnx").iterdir())) == 2
    refused = CliRunner().invoke(cli, [*common, "--artifacts", str(tmp_path / "b"), "--out", str(tmp_path / "c")])
    assert refused.exit_code != 0 and "--also-drafter with --artifacts" in refused.output
