"""TensorRT: an engine built from an exported ONNX graph (specdiff.exporters.tensorrt), run with
set_input_shape / set_tensor_address / execute_async_v3 on torch's current CUDA stream.

An engine file is a specdiff header and the serialized plan:
    b"specdiff-tensorrt-engine\\n" + one JSON line {tensorrt, gpu, dtype, limits, profile} + plan
An engine only runs with the TensorRT version and on the GPU it was built for; a mismatch is
refused with one line before TensorRT sees the plan. A zero-size tensor (an empty past,
past_len 0) is still bound to a valid, non-null address.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from specdiff.artifacts import Artifacts, read_engine
from specdiff.errors import LoadError, UsageError
from specdiff.extras import require
from specdiff.graphs import Limits, check_step_inputs

TRT_DTYPES = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "INT64": torch.int64,
              "INT32": torch.int32, "INT8": torch.int8, "UINT8": torch.uint8, "BOOL": torch.bool}


def check_engine(meta: dict[str, Any], path: Path, trt_version: str, gpu: str) -> None:
    """Refuse an engine built with another TensorRT version or for another GPU."""
    if meta.get("tensorrt") != trt_version or meta.get("gpu") != gpu:
        raise LoadError(f"{path}: engine built with TensorRT {meta.get('tensorrt')} for {meta.get('gpu')}; "
                        f"this machine has TensorRT {trt_version} and {gpu}: export again with `fmt` tensorrt here")


def torch_dtypes(trt: Any) -> dict[Any, torch.dtype]:
    """{trt.DataType member: torch dtype} for the members this TensorRT has."""
    return {getattr(trt.DataType, name): dtype for name, dtype in TRT_DTYPES.items() if hasattr(trt.DataType, name)}


class TrtRuntime:
    """One engine and its execution context. run({name: tensor}) -> {output name: tensor}."""

    def __init__(self, trt: Any, plan: bytes, meta: dict[str, Any], device: torch.device | str,
                 expected: list[str] | None = None):
        self.device = torch.device(device)
        self.limits = Limits(**meta["limits"])
        self.engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(plan)
        if self.engine is None:
            raise LoadError("TensorRT could not deserialize the engine (see the TensorRT log above)")
        self.context = self.engine.create_execution_context()
        dtypes = torch_dtypes(trt)
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = {n: self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self.inputs = {n: dtypes[self.engine.get_tensor_dtype(n)] for n in names if is_input[n]}
        self.outputs = {n: dtypes[self.engine.get_tensor_dtype(n)] for n in names if not is_input[n]}
        missing = sorted(set(expected or ()) - set(names))
        if missing:
            raise LoadError(f"engine lacks the graph's tensors {', '.join(missing[:3])}: export it again")
        self._scratch = torch.zeros(1, device=self.device)  # the address of every empty tensor

    def _bind(self, name: str, t: torch.Tensor) -> None:
        """Bind t by pointer; an empty tensor gets the scratch address (TensorRT refuses null)."""
        if not self.context.set_tensor_address(name, t.data_ptr() if t.numel() else self._scratch.data_ptr()):
            raise LoadError(f"TensorRT refused the address of {name} {tuple(t.shape)}")

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0

    def run(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        check_step_inputs(inputs)
        bound = {n: inputs[n].to(self.device, dtype).contiguous() for n, dtype in self.inputs.items()}
        for name, t in bound.items():
            if not self.context.set_input_shape(name, tuple(t.shape)):
                raise UsageError(f"{name} of shape {tuple(t.shape)} is outside the engine's profile "
                                 f"({self.limits}); export again with larger `max_batch` / `max_seq`")
            self._bind(name, t)
        out = {n: torch.empty(tuple(self.context.get_tensor_shape(n)), dtype=dtype, device=self.device)
               for n, dtype in self.outputs.items()}
        for name, t in out.items():
            self._bind(name, t)
        if not self.context.execute_async_v3(self._stream()):
            raise LoadError("TensorRT failed to execute the engine (see the TensorRT log above)")
        return out


def gpu_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device)


def open_graph(art: Artifacts, kind: str, device: torch.device | str) -> TrtRuntime:
    """The TensorRT engine of component `kind` of an opened export, checked against this machine."""
    device = torch.device(device)
    if device.type != "cuda":
        raise UsageError("`runtime` tensorrt runs on a CUDA GPU: add `device` cuda")
    trt = require("tensorrt", "tensorrt")
    component = art.record(kind)
    engine = component.get("engine")
    if engine is None:
        raise LoadError(f"{art.root} holds no TensorRT engine for the {kind} (export with `fmt` tensorrt or all)")
    path = art.path(engine["file"])
    meta, plan = read_engine(path)
    check_engine(meta, path, trt.__version__, gpu_name(device))
    expected = [t["name"] for t in component["io"]["inputs"] + component["io"]["outputs"]]
    return TrtRuntime(trt, plan, meta, device, expected)
