"""`specdiff export`: a target and/or a drafter -> a checked export directory. A drafter is written
as the graph its kind declares (specdiff.kinds; drafters.EXPORTERS says how). A DFlash or an
EAGLE-3 drafter is exported with its target only: the target's graph then also outputs the hidden
states the drafter reads, and the drafter's graph holds the target's embedding and head (DFlash)
or its embedding, its own or its target's (EAGLE-3). With `stored_blocks` a GGUF target's 4-bit
matrices are read as the file stores them (specdiff.exporters.stored).

    export("out", target="gpt2", drafter="./drafter", fmt="onnx", dtype="fp32")

Everything is written to a temporary directory beside `out` and renamed to it only once every
graph has been exported, checked against its spec, validated against PyTorch (and built into a
TensorRT engine for --format tensorrt | all): the directory is complete or absent. Each stage says
on stderr when it starts (loading, exporting each graph, validating it, building engines) and each
graph when it is done: an export takes a minute or two on a CPU.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, TypeGuard

from specdiff.extras import require
from specdiff.artifacts import TOKENIZER_DIR, vocab_sha256, write_manifest
from specdiff.reading import sha256_file
from specdiff.graphs import TOLERANCE, GraphSpec, Limits
from specdiff.atomic import check_new_directory, new_directory
from specdiff.contracts import Drafter
from specdiff.errors import ExportValidationError, LoadError, UsageError
from specdiff.kinds import kind_of
from specdiff.loading import is_block_checkpoint, load_drafter, load_target, pair_models
from specdiff.registry import Registry, as_registry
from specdiff.requests import check_device_name, check_names
from specdiff.targets.block import BlockDiffusionTarget
from specdiff.targets.causal import CausalLMTarget
from specdiff.vocab import DraftVocab, fingerprint

from .manifest import source_record, tool_versions
from .drafters import EXPORTERS, GraphExporter
from .onnx import Graph, check_graph, export_graph, target_graph
from .stored import ACCURACY_LEVEL, gguf_file, rewrite, stored_weights
from .tensorrt import MAX_OPSET, build_engines
from .validate import Sweep, validate

FORMATS = {"onnx": ("onnx",), "tensorrt": ("tensorrt",), "all": ("onnx", "tensorrt")}
MIN_OPSET = 18  # the dynamo exporter's own opset
DRAFTER_ONLY_CONTEXT = 2048  # shape limits of a drafter exported without its target
MAX_DIM = 2**31 - 1  # the largest dimension of a TensorRT profile


def log(message: str) -> None:
    print(f"specdiff: {message}", file=sys.stderr)


def export(out: str | os.PathLike[str], *, target: str | None = None, drafter: str | None = None, pair: str | None = None,
           fmt: str = "onnx", dtype: str = "fp32", opset: int = 18, max_batch: int = 1,
           max_seq: int | None = None, device: str = "cpu", registry: Registry | None = None,
           stored_blocks: bool = False) -> Path:
    """Export the named models (models.yaml names, directories or hub ids) to `out`; -> out.
    stored_blocks: a GGUF target's Q4_0 / Q4_1 matrices as MatMulNBits over the file's blocks
    (specdiff.exporters.stored; fp32 ONNX only)."""
    if not isinstance(out, (str, os.PathLike)) or not os.fspath(out):
        raise UsageError(f"`out` must be the path of a new directory, got {out!r:.40}")
    registry = as_registry(registry)
    target, drafter = _names(target, drafter, pair, registry)
    out = Path(out)
    check_names(fmt=fmt, dtype=dtype)
    check_device_name(device)
    _check_options(out, fmt, dtype, opset)
    _check_sizes(max_batch=max_batch, max_seq=max_seq)
    gguf = _stored_source(target, fmt, dtype, registry) if stored_blocks else None
    engines = _tensorrt(device) if "tensorrt" in FORMATS[fmt] else None  # (tensorrt, GPU name)
    for module in ("onnx", "onnxscript", "onnxruntime"):
        require(module, "onnx")
    with new_directory(out) as tmp:
        manifest = _export_onnx(tmp, target, drafter, dtype, opset, max_batch, max_seq, device, registry, gguf)
        if engines is not None:
            trt, gpu = engines
            log(f"building TensorRT engines on {gpu}")
            build_engines(tmp, manifest, trt, gpu)
            manifest["tools"]["tensorrt"] = trt.__version__
        if "onnx" not in FORMATS[fmt]:
            _drop_graphs(tmp, manifest)
        write_manifest(tmp, manifest)
    return out


def _stored_source(target: str | None, fmt: str, dtype: str, registry: Registry) -> Path:
    """The GGUF file whose blocks a `stored_blocks` export reads, or a UsageError."""
    if target is None:
        raise UsageError("`stored_blocks` writes a target's matrices: name a `target` (or a `pair`)")
    if fmt != "onnx" or dtype != "fp32":
        raise UsageError("`stored_blocks` writes ONNX Runtime's MatMulNBits into fp32 ONNX graphs "
                         "(`fmt` onnx, `dtype` fp32); TensorRT does not read it")
    return gguf_file(target, registry)


def _names(target: str | None, drafter: str | None, pair: str | None,
           registry: Registry) -> tuple[str | None, str | None]:
    if pair is not None:
        if target or drafter:
            raise UsageError("give `pair`, or `target` / `drafter`, not both")
        entry = registry.pair(pair)
        return entry.target, entry.drafter
    if not target and not drafter:
        raise UsageError("nothing to export: name a `target`, a `drafter` or a `pair`")
    return target, drafter


def _check_options(out: Path, fmt: str, dtype: str, opset: int) -> None:
    check_new_directory(out)
    if fmt not in FORMATS:
        raise UsageError(f"unknown format '{fmt}' (choose from {', '.join(FORMATS)})")
    if dtype not in TOLERANCE:
        raise UsageError(f"unknown dtype '{dtype}' (choose from {', '.join(TOLERANCE)})")
    top = MAX_OPSET if "tensorrt" in FORMATS[fmt] else 23
    if not (_is_int(opset) and MIN_OPSET <= opset <= top):
        why = " (TensorRT imports opsets up to 20)" if top == MAX_OPSET else ""
        raise UsageError(f"`opset` must be an integer in {MIN_OPSET}..{top}{why}, got {opset!r:.40}")


def _check_sizes(**sizes: int | None) -> None:
    """Shape limits are dimensions of a TensorRT profile (32-bit): a larger one was accepted,
    recorded, and overflowed where the profile was set (a traceback after the export)."""
    for name, value in sizes.items():
        if (value is not None or name == "max_batch") and not (_is_int(value) and 1 <= value <= MAX_DIM):
            raise UsageError(f"`{name}` must be an integer from 1 to {MAX_DIM} (a 32-bit dimension), got {value!r}")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _tensorrt(device: str) -> tuple[Any, str]:
    """(tensorrt module, GPU name): engines are built on the GPU they will run on."""
    import torch

    trt = require("tensorrt", "tensorrt")
    if not torch.cuda.is_available():
        raise LoadError("TensorRT engines are built on a CUDA GPU and none is visible here "
                        "(use `fmt` onnx on this machine)")
    index = torch.device(device).index if device.startswith("cuda") else None
    return trt, torch.cuda.get_device_name(index or 0)


def _check_causal(target: str | None, drafter: str | None, registry: Registry) -> None:
    """Graphs are causal LM step functions and masked-diffusion denoisers: a block-diffusion model
    exported as a causal LM ran on ONNX Runtime as one (wrong text, exit 0). Read from config.json,
    before any weights load."""
    for name, kinds, role in ((target, ("target",), "target"), (drafter, ("drafter", "target"), "drafter")):
        if name and is_block_checkpoint(name, kinds, registry):
            raise UsageError(f"{role} '{name}' is a block-diffusion (SDAR) model: `specdiff export` writes causal LM "
                             "and masked-diffusion graphs only; run it with the torch runtime "
                             f"(`{role}` '{name}', `runtime` torch)")


def _load(target: str | None, drafter: str | None, device: str, dtype: str,
          registry: Registry) -> tuple[CausalLMTarget | BlockDiffusionTarget | None, Any, Any]:
    """-> (target, drafter, the tokenizer of the export)."""
    _check_causal(target, drafter, registry)
    log(f"loading {' and '.join(repr(name) for name in (target, drafter) if name)}")
    t = load_target(target, device=device, dtype=dtype, registry=registry) if target else None
    d = load_drafter(drafter, device=device, dtype=dtype, registry=registry) if drafter else None
    if d is not None:
        exporter = _exporter(d, drafter)
        if exporter.alone and t is None:
            raise UsageError(exporter.alone.format(name=drafter) + ": export it together with its `target` (or the `pair`)")
    if t is not None and d is not None:
        pair_models(t, d)
    tokenizer = t.tokenizer if t is not None else d.tokenizer if d is not None else None  # _names: one is given
    if tokenizer is None:
        raise UsageError(f"drafter '{drafter}' carries no tokenizer: export it together with its `target`")
    return t, d, tokenizer


def _exporter(drafter: Drafter, name: str | None) -> GraphExporter:
    """How the loaded drafter's graph is written: its kind's graph, or why its kind has none."""
    kind = kind_of(drafter)
    if kind is None or kind.graph is None:
        raise UsageError(f"'{name}' is {kind.no_graph if kind else 'not a drafter specdiff exports'}")
    return EXPORTERS[kind.graph.name]


def _export_onnx(tmp: Path, target: str | None, drafter: str | None, dtype: str, opset: int, max_batch: int,
                 max_seq: int | None, device: str, registry: Registry, gguf: Path | None = None) -> dict[str, Any]:
    t, d, tokenizer = _load(target, drafter, device, dtype, registry)
    tokenizer.save_pretrained(str(tmp / TOKENIZER_DIR))
    context = t.max_length if t is not None else DRAFTER_ONLY_CONTEXT
    limits = Limits.for_context(context, max_batch, max_seq)
    components = {}
    module: Graph
    if t is not None:
        assert target is not None  # what t was loaded from
        module, spec, record = target_graph(t, _exporter(d, drafter).features(d) if d is not None else ())
        store = _storing(gguf, t.model) if gguf is not None else None
        components["target"] = _component(tmp, "target", module, spec, record, dtype, opset, store=store)
        components["target"]["source"] = source_record(target, ("target",), registry)
    if d is not None:
        assert drafter is not None  # what d was loaded from
        exporter = _exporter(d, drafter)
        module, spec, record = exporter.build(d, t)
        if d.draft_vocab is not None:  # record["draft_vocab"], hashed with the graphs
            _fingerprinted(d.draft_vocab, tokenizer).save(tmp)
        components["drafter"] = _component(tmp, "drafter", module, spec, record, dtype, opset,
                                           (getattr(d, "mask_id", None), exporter.sweep))
        components["drafter"]["source"] = source_record(drafter, ("drafter", "target"), registry)
    return {"dtype": dtype, "opset": opset, "limits": limits.to_json(), "tools": tool_versions(),
            "tokenizer": {"dir": TOKENIZER_DIR, "vocab_size": len(tokenizer), "vocab_sha256": vocab_sha256(tokenizer)},
            "components": components}


def _fingerprinted(vocab: DraftVocab, tokenizer: Any) -> DraftVocab:
    """A map that records no fingerprint (an EAGLE-3 head's d2t) gets the one of the tokenizer
    exported beside it: the runtime reads only maps that say what they were built for."""
    if vocab.fingerprint:
        return vocab
    return replace(vocab, fingerprint=fingerprint(tokenizer, vocab.ids, vocab.vocab_size))


def _storing(gguf: Path, model: Any) -> Callable[[Path], dict[str, Any]]:
    """graph path -> the manifest's `stored_blocks` record, once the graph reads `gguf`'s blocks."""
    def store(path: Path) -> dict[str, Any]:
        state = model.state_dict()
        replaced = rewrite(path, stored_weights(gguf, state, model.config, log), state)
        log(f"{path.name} reads {sum(replaced.values())} matrices of {gguf.name} as stored blocks")
        return {"gguf": gguf.name, "gguf_sha256": sha256_file(gguf), "matrices": replaced,
                "op": "com.microsoft.MatMulNBits", "accuracy_level": ACCURACY_LEVEL}
    return store


def _component(tmp: Path, kind: str, module: Graph, spec: GraphSpec, record: dict[str, Any], dtype: str, opset: int,
               drafter: tuple[int | None, Sweep] | None = None,
               store: Callable[[Path], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Export (a target whose blocks are `store`d: rewritten), check against the spec, validate
    against PyTorch (a drafter graph: its mask id and sweep); -> the manifest record."""
    path = tmp / f"{kind}.onnx"
    log(f"exporting the {kind} graph {path.name} ({dtype}, opset {opset})")
    start = time.perf_counter()
    export_graph(module, spec, dtype, path, opset)
    if store is not None:
        record["stored_blocks"] = store(path)
    took = time.perf_counter() - start
    problems = check_graph(path, spec, dtype)
    if problems:
        raise ExportValidationError(path.name, problems, len(spec.inputs) + len(spec.outputs))
    log(f"validating {path.name} against PyTorch")
    validation = validate(module, spec, path, dtype, *drafter) if drafter else validate(module, spec, path, dtype)
    size = sum(p.stat().st_size for p in tmp.glob(f"{kind}.onnx*"))
    verdict = "skipped: " + validation["skipped"] if validation["passed"] is None else \
        f"max |diff| {validation['max_abs_diff']} over {validation['checks']} checks"
    log(f"{kind} '{record['name']}' -> {path.name} ({size / 2**20:.1f} MiB, {dtype}) in {took:.1f}s; validation {verdict}")
    return {"graph": path.name, "engine": None, "model": record, "io": spec.to_json(dtype),
            "export_s": round(took, 2), "bytes": size, "validation": validation}


def _drop_graphs(tmp: Path, manifest: dict[str, Any]) -> None:
    """--format tensorrt keeps the engines only."""
    for kind, component in manifest["components"].items():
        for path in tmp.glob(f"{kind}.onnx*"):
            path.unlink()
        component["graph"] = None

