"""TensorRT engines built from the exported ONNX graphs.

Written from NVIDIA's documentation (TensorRT could not be installed where this was written; the
logic below is tested against a fake `tensorrt` module):
    Builder -> network -> OnnxParser.parse_from_file (external weights beside the graph) -> builder
    config -> one optimization profile, min/opt/max for every input derived from (batch, seq, past)
    triples so attention_mask's length is always past + seq (NVIDIA/TensorRT#1808) ->
    build_serialized_network -> engine file with a header naming the TensorRT version and GPU.
TensorRT 11 builds strongly typed networks only (no FP16/BF16 builder flags): the ONNX graph must
already be in the engine's dtype. The STRONGLY_TYPED flag is set whenever the dtypes agree (an
opt-in on 10.x, accepted and ignored on 11.x); TensorRT 10 can still lower an fp32 graph with the
(deprecated) FP16/BF16 builder flags.
Graphs for TensorRT: opset <= 20 and no If / Loop / Scan nodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdiff.graphs import GraphSpec, Limits, graph_kind, spec_from_model
from specdiff.artifacts import write_engine
from specdiff.errors import ExportValidationError, LoadError, UsageError
from specdiff.extras import install_hint
from specdiff.kinds import drafter_graph

MAX_OPSET = 20
CONTROL_FLOW = ("If", "Loop", "Scan")
BUILDER_FLAGS = {"fp16": "FP16", "bf16": "BF16"}


def graph_problems(path: Path) -> list[str]:
    """Why TensorRT would refuse or mishandle an ONNX graph: opset too new, control-flow nodes."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    problems = [f"opset {opset} > {MAX_OPSET}"] if opset > MAX_OPSET else []
    found = sorted({n.op_type for n in model.graph.node if n.op_type in CONTROL_FLOW})
    return problems + [f"{op} node(s) in the graph" for op in found]


def version_major(version: str) -> int:
    return int(version.split(".")[0])


def network_settings(trt: Any, onnx_dtype: str, engine_dtype: str) -> tuple[int, list[Any]]:
    """-> (network creation flags, builder flags) for building an `engine_dtype` engine from an
    `onnx_dtype` graph with this TensorRT."""
    major = version_major(trt.__version__)
    if major < 10:
        raise LoadError(f"TensorRT {trt.__version__} is too old: specdiff builds with TensorRT 10 or 11 "
                        f"({install_hint('tensorrt')})")
    if onnx_dtype == engine_dtype:
        strong = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)  # 11.x: ignored, may go
        return (0 if strong is None else 1 << int(strong)), []
    if major >= 11:
        raise UsageError(f"TensorRT {major} builds strongly typed networks only: export the ONNX graph "
                         f"with `dtype` {engine_dtype} (it is {onnx_dtype})")
    if onnx_dtype != "fp32" or engine_dtype not in BUILDER_FLAGS:
        raise UsageError(f"cannot build a {engine_dtype} engine from a {onnx_dtype} graph")
    return 0, [getattr(trt.BuilderFlag, BUILDER_FLAGS[engine_dtype])]


def profile_shapes(spec: GraphSpec, triples: dict[str, dict[str, int]]) -> dict[str, tuple[Any, ...]]:
    """{input name: (min shape, opt shape, max shape)} from the min / opt / max axis sizes."""
    shapes = {level: spec.shapes(triples[level]) for level in ("min", "opt", "max")}
    return {name: (shapes["min"][name], shapes["opt"][name], shapes["max"][name]) for name in spec.input_names}


def triples_for(kind: str, model: dict[str, Any], limits: Limits) -> dict[str, dict[str, int]]:
    """A drafter graph that reads the target's cached rows (DFlash's context) has the target's axes."""
    graph = graph_kind(kind, model)
    if graph == "target" or drafter_graph(graph).target_axes:
        return limits.target_triples()
    return limits.drafter_triples(model["context_length"])


def build_engine(trt: Any, onnx_path: Path, spec: GraphSpec, triples: dict[str, dict[str, int]], onnx_dtype: str,
                 engine_dtype: str) -> bytes:
    """Parse, configure one optimization profile, build; -> the serialized plan."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network_flags, builder_flags = network_settings(trt, onnx_dtype, engine_dtype)
    network = builder.create_network(network_flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)] or ["no detail"]
        raise LoadError(f"TensorRT cannot parse {onnx_path.name}: {errors[0]}")
    config = builder.create_builder_config()
    for flag in builder_flags:
        config.set_flag(flag)
    profile = builder.create_optimization_profile()
    for name, (low, opt, high) in profile_shapes(spec, triples).items():
        profile.set_shape(name, low, opt, high)
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise LoadError(f"TensorRT failed to build an engine from {onnx_path.name} (see its log above)")
    return bytes(plan)


def build_engines(root: Path, manifest: dict[str, Any], trt: Any, gpu: str) -> None:
    """An engine beside each component's ONNX graph; records it in the manifest."""
    dtype, limits = manifest["dtype"], Limits(**manifest["limits"])
    for kind, component in manifest["components"].items():
        graph = root / component["graph"]
        problems = graph_problems(graph)
        if problems:
            raise ExportValidationError(f"{graph.name} (for TensorRT)", problems, len(CONTROL_FLOW) + 1)
        spec, triples = spec_from_model(kind, component["model"]), triples_for(kind, component["model"], limits)
        plan = build_engine(trt, graph, spec, triples, dtype, dtype)
        meta = {"tensorrt": trt.__version__, "gpu": gpu, "dtype": dtype, "limits": limits.to_json(),
                "profile": {name: [list(s) for s in shapes] for name, shapes in profile_shapes(spec, triples).items()}}
        write_engine(root / f"{kind}.engine", plan, meta)
        component["engine"] = {"file": f"{kind}.engine", **meta}
