"""A GGUF target's stored blocks on ONNX Runtime (issue 50, `specdiff export --stored-blocks`):
the blocks read as GGUF defines them, MatMulNBits over them against x @ W.T in fp64, and a tiny
Llama written with Q4_1 layers exported both ways: logits within a measured tolerance of the fp32
graph's, greedy text identical."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from click.testing import CliRunner

gguf = pytest.importorskip("gguf")
pytest.importorskip("onnxruntime")
from gguf_files import write_gguf  # noqa: E402  (it imports gguf)

from specdiff.errors import UsageError  # noqa: E402
from specdiff.exporters.blocks import Blocks, from_gguf, matmul_nodes, split8  # noqa: E402
from specdiff.exporters.export import export  # noqa: E402
from specdiff.graphs import axis_sizes, past_names, present_names, spec_from_model  # noqa: E402
from specdiff.runtimes.onnxruntime import OrtRuntime  # noqa: E402
from specdiff_cli.main import cli  # noqa: E402
from tiny import make_llama  # noqa: E402

KINDS = ("Q4_0", "Q4_1", "Q8_0")


def quantized(kind: str, n: int = 64, k: int = 96, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(GGUF bytes (n, k/32 * block bytes), what GGUF dequantizes them to (n, k))."""
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.1 + 0.03
    q = gguf.quants.quantize(w, gguf.GGMLQuantizationType[kind])
    return q, gguf.quants.dequantize(q, gguf.GGMLQuantizationType[kind]).reshape(n, k)


@pytest.mark.parametrize("kind", KINDS)
def test_blocks_are_the_weights_gguf_defines(kind):
    q, w = quantized(kind)
    blocks = from_gguf(kind, q)
    assert blocks.shape == w.shape and np.array_equal(blocks.dequantized(), w)


def test_q8_0_split_into_two_4_bit_halves_is_exact():
    blocks = from_gguf("Q8_0", quantized("Q8_0")[0])
    hi, lo = split8(blocks)
    assert np.array_equal(hi.dequantized() + lo.dequantized(), blocks.dequantized())


def product(blocks: Blocks, x: np.ndarray) -> np.ndarray:
    """x (1, S, K) @ W.T through matmul_nodes on ONNX Runtime, one thread."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    n, k = blocks.shape
    nodes, inits = matmul_nodes("x", "y", blocks, "w")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S", n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return np.asarray(ort.InferenceSession(model.SerializeToString(), options).run(None, {"x": x})[0])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("width", [1, 5])
def test_matmul_nbits_is_x_times_the_dequantized_weights(kind, width):
    """Measured: at most 9.7e-7 here (x ~ N(0, 1), |out| up to 3.2), fp32 rounding of a 96-term sum."""
    q, w = quantized(kind)
    x = np.random.default_rng(1).standard_normal((1, width, w.shape[1])).astype(np.float32)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.abs(product(from_gguf(kind, q), x) - exact).max() < 1e-5


def test_accuracy_level_4_is_refused():
    with pytest.raises(ValueError, match="accuracy_level"):
        matmul_nodes("x", "y", from_gguf("Q4_0", quantized("Q4_0")[0]), "w", accuracy_level=4)


@pytest.fixture(scope="module")
def exports(tiny, tmp_path_factory):
    """(GGUF file of a tiny Llama with Q4_1 layers, its fp32 export, its stored-blocks export)."""
    from transformers import LlamaForCausalLM

    root = tmp_path_factory.mktemp("stored")
    model = LlamaForCausalLM.from_pretrained(make_llama(root / "hf", tiny.tokenizer, dim=64, scale=10))
    path = root / "tiny.Q4_1.gguf"
    write_gguf(model, tiny.tokenizer, path, layers="Q4_1")
    with pytest.MonkeyPatch.context() as m:
        m.setenv("SPECDIFF_CACHE", str(root / "cache"))
        return path, export(root / "fp32", target=str(path)), export(root / "stored", target=str(path), stored_blocks=True)


def test_the_manifest_records_the_stored_blocks(exports):
    path, _, stored = exports
    import onnx

    record = json.loads((stored / "manifest.json").read_text())["components"]["target"]
    assert record["model"]["stored_blocks"]["matrices"] == {"Q4_1": 14}  # 2 layers x 7 matrices
    assert record["model"]["stored_blocks"]["accuracy_level"] == 0 and record["validation"]["passed"]
    ops = Counter(n.op_type for n in onnx.load(str(stored / "target.onnx"), load_external_data=False).graph.node)
    assert ops["MatMulNBits"] == 14
    assert ops["ReduceSum"] == 8  # block sums once per input: q k v, o, gate up, down in 2 layers


def logits(directory, steps: tuple[int, ...]) -> list[torch.Tensor]:
    """The target graph's logits for a prefill and then steps of the given widths on its cache."""
    record = json.loads((directory / "manifest.json").read_text())["components"]["target"]["model"]
    spec, graph = spec_from_model("target", record), OrtRuntime(directory / "target.onnx", threads=1)
    generator, past, out = torch.Generator().manual_seed(3), [], []
    for n in steps:
        feeds = spec.dummy_inputs(axis_sizes(1, n, past[0].shape[2] if past else 0), "fp32", generator)
        feeds.update(zip(past_names(record["layers"]), past))
        got = graph.run(feeds)
        out.append(got["logits"])
        past = [got[name] for name in present_names(record["layers"])]
    return out


def test_logits_are_the_fp32_graphs_within_rounding(exports):
    """Measured here: at most 1.02e-5 apart with logits up to 7 (widths 1, the one-token kernel,
    and 5 / 7 / 9, the other path)."""
    _, fp32, stored = exports
    for a, b in zip(logits(fp32, (7, 1, 5, 1, 9)), logits(stored, (7, 1, 5, 1, 9))):
        assert (a - b).abs().max() <= 2e-5 * max(1.0, float(a.abs().max()))


def test_greedy_text_is_the_fp32_graphs(exports):
    _, fp32, stored = exports
    common = ["generate", "--method", "ar", "--max-new-tokens", "24", "--jsonl", "--runtime", "onnxruntime",
              *[a for p in ("Hello there", "The quick brown fox", "1, 2, 3,") for a in ("--prompt", p)]]
    runs = [CliRunner().invoke(cli, [*common, "--artifacts", str(d)]) for d in (fp32, stored)]
    assert all(r.exit_code == 0 for r in runs), [r.output for r in runs]
    texts = [[json.loads(line)["text"] for line in r.stdout.splitlines()] for r in runs]
    assert texts[0] == texts[1] and len(texts[0]) == 3


def test_stored_blocks_need_a_gguf_target_and_fp32_onnx(tiny, exports, tmp_path):
    with pytest.raises(UsageError, match="neither a .gguf file nor"):
        export(tmp_path / "a", target=str(tiny.gpt2), stored_blocks=True)
    with pytest.raises(UsageError, match="fp32 ONNX graphs"):
        export(tmp_path / "b", target=str(exports[0]), stored_blocks=True, dtype="fp16")


def test_the_export_cache_keeps_stored_block_exports_apart(exports, monkeypatch):
    from specdiff.exporters.cache import export_key
    from specdiff.registry import as_registry

    monkeypatch.setenv("SPECDIFF_CACHE", str(exports[0].parent / "cache"))
    target, registry = str(exports[0]), as_registry(None)
    assert export_key(target, None, registry, stored_blocks=True) != export_key(target, None, registry)
