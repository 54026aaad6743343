"""A fake `tensorrt` module (TensorRT cannot be installed here), for the TensorRT tests
(tests/test_tensorrt_logic.py, tests/test_eagle3_onnx.py).

The fake follows the TensorRT 10/11 Python API the code uses. Its builder records what it is
asked for; its engines execute the ONNX graph they were "built" from with ONNX Runtime, reading
inputs from and writing outputs to the addresses bound with set_tensor_address (host memory: the
tests run on the CPU), and refuse a null address or a shape outside the optimization profile, as
TensorRT does."""

from __future__ import annotations

import ctypes
import enum
import json
import shutil
import types

import numpy as np
import onnxruntime as ort
import torch

from specdiff.artifacts import write_manifest
from specdiff.exporters.tensorrt import build_engines
from specdiff.graphs import TOLERANCE


GPU = "NVIDIA Fake 80GB"
NUMPY = {"FLOAT": np.float32, "HALF": np.float16, "INT64": np.int64, "INT32": np.int32, "BOOL": np.bool_}
ORT_TYPES = {"tensor(float)": "FLOAT", "tensor(float16)": "HALF", "tensor(int64)": "INT64"}


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    atol, rtol = TOLERANCE["fp32"]
    return torch.allclose(a, b, atol=atol, rtol=rtol)


def host_array(address: int, shape, dtype) -> np.ndarray:
    """A writable numpy view of host memory at `address`."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    return np.frombuffer((ctypes.c_char * (count * dtype.itemsize)).from_address(address), dtype, count).reshape(shape)


class FakeContext:
    def __init__(self, engine):
        self.engine, self.shapes, self.addresses, self.results = engine, {}, {}, None

    def set_input_shape(self, name, shape):
        low, _, high = self.engine.profile[name]
        self.results = None
        ok = all(a <= s <= b for a, s, b in zip(low, shape, high))
        self.shapes[name] = tuple(shape) if ok else None
        return ok

    def set_tensor_address(self, name, address):
        self.addresses[name] = address
        return address != 0

    def _read(self, name) -> np.ndarray:
        """An input as the ONNX graph takes it (an INT32 engine input was int64 in the graph)."""
        value = host_array(self.addresses[name], self.shapes[name], NUMPY[self.engine.dtypes[name].name])
        return value.astype(np.int64) if value.dtype == np.int32 else value

    def _run(self):
        if self.results is None:
            feeds = {name: self._read(name) for name in self.engine.inputs}
            self.results = dict(zip(self.engine.outputs, self.engine.session.run(self.engine.outputs, feeds)))
        return self.results

    def get_tensor_shape(self, name):
        return self._run()[name].shape

    def execute_async_v3(self, stream):
        for name, value in self._run().items():
            host_array(self.addresses[name], value.shape, value.dtype)[...] = value
        return True


class FakeEngine:
    def __init__(self, trt, record: dict):
        self.trt, self.profile = trt, {k: tuple(map(tuple, v)) for k, v in record["profile"].items()}
        self.session = ort.InferenceSession(record["onnx"], providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.dtypes = {v.name: trt.DataType[ORT_TYPES[v.type]] for v in self.session.get_inputs() + self.session.get_outputs()}
        if trt.int32_ids:
            self.dtypes["input_ids"] = trt.DataType.INT32
        self.num_io_tensors = len(self.inputs) + len(self.outputs)

    def get_tensor_name(self, i):
        return (self.inputs + self.outputs)[i]

    def get_tensor_mode(self, name):
        return self.trt.TensorIOMode.INPUT if name in self.inputs else self.trt.TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name):
        return self.dtypes[name]

    def create_execution_context(self):
        return FakeContext(self)


def fake_tensorrt(version: str = "10.9.0", parse_errors=(), build_fails=False, int32_ids=False,
                  network_flags=("STRONGLY_TYPED",)):
    trt = types.ModuleType("tensorrt")
    trt.__version__, trt.int32_ids, trt.calls = version, int32_ids, []
    trt.DataType = enum.Enum("DataType", "FLOAT HALF BF16 INT32 INT64 BOOL")
    trt.TensorIOMode = enum.Enum("TensorIOMode", "INPUT OUTPUT")
    trt.NetworkDefinitionCreationFlag = enum.IntEnum("NetworkDefinitionCreationFlag", {"NONE": 0} | {f: 5 for f in network_flags})
    trt.BuilderFlag = enum.Enum("BuilderFlag", "FP16 BF16" if int(version.split(".")[0]) < 11 else "REFIT")
    trt.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, level: None})
    record = {}

    class Parser:
        num_errors = len(parse_errors)

        def __init__(self, network, logger):
            pass

        def parse_from_file(self, path):
            record["onnx"] = path
            return not parse_errors

        def get_error(self, i):
            return parse_errors[i]

    class Config:
        def set_flag(self, flag):
            record.setdefault("builder_flags", []).append(flag.name)

        def add_optimization_profile(self, profile):
            record["profile"] = profile.shapes

    class Profile:
        def __init__(self):
            self.shapes = {}

        def set_shape(self, name, low, opt, high):
            self.shapes[name] = (low, opt, high)

    class Builder:
        def __init__(self, logger):
            pass

        def create_network(self, flags):
            record["network_flags"] = flags
            return object()

        create_builder_config, create_optimization_profile = Config, Profile

        def build_serialized_network(self, network, config):
            trt.calls.append(dict(record))
            return None if build_fails else json.dumps(record).encode()

    class Runtime:
        def __init__(self, logger):
            pass

        def deserialize_cuda_engine(self, plan):
            return FakeEngine(trt, json.loads(plan))

    trt.OnnxParser, trt.Builder, trt.Runtime = Parser, Builder, Runtime
    return trt


def with_fake_engines(export, directory):
    """A copy of an export in `directory` with fake TensorRT 10.9 engines for GPU beside its graphs,
    built from its manifest as `specdiff export --format all` builds them -> (root, manifest, trt)."""
    root = shutil.copytree(export, directory)
    manifest = json.loads((root / "manifest.json").read_text())
    for key in ("format", "format_version", "files"):
        manifest.pop(key)
    trt = fake_tensorrt()
    build_engines(root, manifest, trt, GPU)
    write_manifest(root, manifest)
    return root, manifest, trt
