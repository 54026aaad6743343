"""`specdiff export --stored-blocks`: a GGUF target's 4-bit matrices read as stored (issue 50).

The target graph is exported in fp32 as always, then each `MatMul` whose weight is one of the GGUF
file's Q4_0 / Q4_1 matrices becomes ONNX Runtime's `MatMulNBits` over the file's own codes and
scales (plus Q4_1's minimum as an exact fp32 term: specdiff.exporters.blocks). A weight is replaced
only where the blocks dequantize to exactly the graph's fp32 weight (llama.cpp's Q / K row
permutation undone), found by content, not by name. Every other matrix stays fp32, with one note
on stderr: Q8_0 (the tied embedding / head of SmolLM2) because ONNX Runtime's 8-bit `MatMulNBits`
has no fp32 kernel (0.5 s a call for the head, docs/export-onnx-tensorrt.md), other GGUF types
because `MatMulNBits` does not read them. The graph is then validated against PyTorch as any
export is.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable

import numpy as np

from specdiff.errors import UsageError
from specdiff.registry import ModelEntry, Registry

from .blocks import Blocks, block_sums, from_gguf, matmul_nodes, rows

STORED = ("Q4_0", "Q4_1")  # the types written as MatMulNBits (fp32 arithmetic: accuracy level 0)
ACCURACY_LEVEL = 0
NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj"}  # llama.cpp's layer matrices -> HF's (Llama, Qwen2, Mistral)


def gguf_file(target: str, registry: Registry) -> Path:
    """The GGUF file `target` names (a models.yaml target with a `gguf` file, or a .gguf path),
    or a UsageError."""
    from specdiff.gguf import GGUFSource

    entry = registry.entries.get(target)
    if isinstance(entry, ModelEntry) and entry.gguf is not None:
        return GGUFSource(entry.gguf, entry.package, entry.sha256, entry.install).locate()
    path = Path(target).expanduser()
    if entry is None and path.is_file() and path.suffix == ".gguf":
        return path
    raise UsageError(f"`stored_blocks` reads a GGUF target's blocks: '{target}' is neither a .gguf file nor "
                     "a models.yaml target read from a GGUF file")


def stored_weights(path: Path, state: dict[str, Any], config: Any, note: Callable[[str], None]) -> dict[str, Blocks]:
    """{HF weight name: its blocks} for the GGUF file's Q4_0 / Q4_1 layer matrices whose blocks
    dequantize exactly to `state`'s fp32 weight (N, K); `note` says what stays fp32 and why."""
    from gguf import GGUFReader

    found: dict[str, Blocks] = {}
    kept: dict[tuple[str, str], int] = {}  # (GGUF type, why) -> matrices left fp32
    for t in GGUFReader(str(path)).tensors:
        kind, parts = t.tensor_type.name, t.name.split(".")
        if len(t.shape) != 2:
            continue
        name = f"model.layers.{parts[1]}.{NAMES[parts[2]]}.weight" if parts[0] == "blk" and parts[2] in NAMES else None
        heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}.get(parts[-2])
        blocks = _aligned(from_gguf(kind, t.data), state[name].float().numpy(), heads) \
            if kind in STORED and name in state else None
        if blocks is None or name is None:
            why = ("no fp32 kernel in ONNX Runtime's 8-bit MatMulNBits" if kind == "Q8_0" else
                   "not a MatMulNBits type" if kind not in STORED else "not a layer weight it could match")
            kept[kind, why] = kept.get((kind, why), 0) + 1
            continue
        found[name] = blocks
    for (kind, why), count in sorted(kept.items()):
        note(f"{count} {kind} matri{'ces stay' if count > 1 else 'x stays'} fp32 in the graph ({why})")
    return found


def _aligned(blocks: Blocks, weight: np.ndarray, heads: int | None) -> Blocks | None:
    """`blocks` in the row order in which they dequantize to `weight` exactly (as stored, or with
    llama.cpp's rotary permutation of `heads` heads undone), else None."""
    orders = [np.arange(weight.shape[0])]
    if heads:
        n = weight.shape[0]
        permuted = np.arange(n).reshape(heads, 2, n // heads // 2).swapaxes(1, 2).reshape(n)  # GGUF row -> HF row
        orders.append(np.argsort(permuted))
    for order in orders:
        candidate = rows(blocks, order)
        if candidate.shape == weight.shape and np.array_equal(candidate.dequantized(), weight):
            return candidate
    return None


def rewrite(path: Path, blocks: dict[str, Blocks], state: dict[str, Any]) -> dict[str, int]:
    """Replace, in the ONNX graph at `path` (external data in path.data), each MatMul whose
    initializer B (K, N) is W.T of a weight in `blocks` with its stored-block nodes (the block
    sums of an input that several Q4_1 matrices read computed once); -> counts {GGUF type:
    matrices replaced}."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    wanted = {_digest(state[name].float().numpy().T): name for name in blocks}
    weights = {i.name: i for i in graph.initializer if len(i.dims) == 2 and i.data_type == onnx.TensorProto.FLOAT}
    nodes, used = [], set()
    sums: dict[str, str] = {}  # {input: the prefix of its block sums}, computed once (q, k, v read one input)
    replaced: dict[str, int] = {}
    for node in graph.node:
        init = weights.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        name = wanted.get(_digest(numpy_helper.to_array(init))) if init is not None else None
        if name is None:
            nodes.append(node)
            continue
        x, w = node.input[0], blocks[name]
        if w.minimum is not None and x not in sums:
            sums[x] = f"stored.input{len(sums)}"
            new, inits = block_sums(x, w.shape[1], sums[x])
            nodes += new
            graph.initializer.extend(inits)
        new, inits = matmul_nodes(x, node.output[0], w, f"stored.{name}", ACCURACY_LEVEL,
                                  f"{sums[x]}.sums" if x in sums else None)
        nodes += new
        graph.initializer.extend(inits)
        used.add(node.input[1])
        replaced[blocks[name].kind] = replaced.get(blocks[name].kind, 0) + 1
    _replace_nodes(model, nodes, used)
    _save(model, path)
    return replaced


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array, dtype=np.float32).tobytes()).hexdigest() + str(array.shape)


def _replace_nodes(model: Any, nodes: list[Any], unused: set[str]) -> None:
    """The graph's nodes become `nodes`; initializers in `unused` that no node reads any more go."""
    from onnx import helper

    graph = model.graph
    del graph.node[:]
    graph.node.extend(nodes)
    read = {i for n in graph.node for i in n.input}
    keep = [i for i in graph.initializer if i.name not in unused or i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))


def _save(model: Any, path: Path) -> None:
    """Write `model` over `path`, its weights in path.data (the exporter's layout)."""
    import onnx

    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024)
