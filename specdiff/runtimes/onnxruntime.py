"""ONNX Runtime: an exported graph run with IO binding. Inputs are torch tensors bound by pointer
(made contiguous first: a rolled-back cache slice is copied here), outputs are allocated by ONNX
Runtime on the same device and handed back zero-copy through DLPack. The CPU provider runs with
explicit intra-op threads, no spinning and every graph optimisation; on CUDA (onnxruntime-gpu) the
same binding code binds device pointers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.utils.dlpack

from specdiff.artifacts import Artifacts
from specdiff.errors import LoadError, UsageError

from specdiff.extras import install_hint, require
from specdiff.graphs import check_step_inputs

# ONNX Runtime's type names -> the manifest's dtype names (graphs.TensorSpec)
ORT_TYPES = {"tensor(float)": "fp32", "tensor(float16)": "fp16", "tensor(bfloat16)": "bf16", "tensor(int64)": "int64"}
# ONNX TensorProto element types, as IOBinding.bind_input accepts them.
ELEMENT_TYPES = {torch.float32: 1, torch.uint8: 2, torch.int8: 3, torch.int32: 6, torch.int64: 7,
                 torch.bool: 9, torch.float16: 10, torch.bfloat16: 16}


def providers(ort: Any, device: torch.device) -> list[str | tuple[str, dict[str, int]]]:
    """The provider list for `device`; CUDA needs the onnxruntime-gpu build."""
    if device.type == "cpu":
        return ["CPUExecutionProvider"]
    if device.type != "cuda":
        raise UsageError(f"onnxruntime runs on cpu or cuda, not {device.type}")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise LoadError(f"this onnxruntime has no CUDA provider (CPU build): {install_hint('gpu')}, "
                        "in place of onnxruntime")
    return [("CUDAExecutionProvider", {"device_id": device.index or 0}), "CPUExecutionProvider"]


def session_options(ort: Any, threads: int) -> Any:
    """ort.SessionOptions for `threads` intra-op threads, no spinning, every graph optimisation."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


class OrtRuntime:
    """One ONNX graph in an InferenceSession. run({name: tensor}) -> {output name: tensor}."""

    limits = None  # ONNX Runtime serves any shape the graph allows

    def __init__(self, path: Path, device: torch.device | str = "cpu", threads: int | None = None):
        ort = require("onnxruntime", "onnx")
        self.device = torch.device(device)
        options = session_options(ort, threads or torch.get_num_threads())
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers(ort, self.device))
        except Exception as e:  # onnxruntime raises its own pybind exception types (Fail, NotImplemented, ...)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise LoadError(f"onnxruntime cannot run {path} on {self.device.type}: {first}") from e
        self.path = path
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._where = (self.device.type, self.device.index or 0)

    def check_io(self, io: dict[str, Any]) -> None:
        """The graph's inputs and outputs are the manifest's (names, dtypes, fixed dims): the
        manifest is not hashed, and a runtime that trusted it fed names the graph lacks."""
        graph = {"inputs": self.session.get_inputs(), "outputs": self.session.get_outputs()}
        for side, records in io.items():
            have = {t.name: (ORT_TYPES.get(t.type, t.type), [d if isinstance(d, int) else None for d in t.shape])
                    for t in graph[side]}
            want = {t["name"]: (_dtype_name(t["dtype"]), [d if isinstance(d, int) else None for d in t["dims"]])
                    for t in records}
            if have != want:
                name = next(n for n in [*want, *have] if have.get(n) != want.get(n))
                raise LoadError(f"{self.path}: the graph's {side[:-1]} {name} is {_shown(have.get(name))}; "
                                f"the manifest says {_shown(want.get(name))} (re-export)")

    def run(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        check_step_inputs(inputs)
        binding = self.session.io_binding()
        bound = [inputs[name].to(self.device).contiguous() for name in self.input_names]  # alive until run ends
        for name, t in zip(self.input_names, bound):
            binding.bind_input(name, *self._where, ELEMENT_TYPES[t.dtype], tuple(t.shape), t.data_ptr())
        for name in self.output_names:
            binding.bind_output(name, *self._where)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # inputs written on torch's stream
        try:
            self.session.run_with_iobinding(binding)
        except RuntimeError as e:  # onnxruntime's own failures (its pybind types derive from RuntimeError)
            raise LoadError(f"onnxruntime failed running {self.path}: {_first_line(e)}") from e
        if self.device.type == "cuda":
            binding.synchronize_outputs()
        return {name: torch.utils.dlpack.from_dlpack(value) for name, value in zip(self.output_names, binding.get_outputs())}


def _dtype_name(dtype: str) -> str:
    return "fp32" if dtype == "float32" else dtype


def _shown(record: tuple[str, list[int | None]] | None) -> str:
    if record is None:
        return "absent"
    dtype, dims = record
    return f"{dtype} ({', '.join('?' if d is None else str(d) for d in dims)})"


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def open_graph(art: Artifacts, kind: str, device: torch.device | str) -> OrtRuntime:
    """The ONNX graph of component `kind` ("target" | "drafter") of an opened export, checked
    against the manifest's IO signature."""
    graph = art.record(kind).get("graph")
    if graph is None:
        raise LoadError(f"{art.root} holds no ONNX graph for the {kind} (exported with `fmt` tensorrt)")
    runtime = OrtRuntime(art.path(graph), device)
    runtime.check_io(art.record(kind)["io"])
    return runtime
