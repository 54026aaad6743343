"""The TensorRT code paths against a fake `tensorrt` module (TensorRT cannot be installed here).

The fake (tests/fake_tensorrt.py) follows the TensorRT 10/11 Python API the code uses, its engines
running the ONNX graphs they were "built" from on ONNX Runtime in host memory. So profile
derivation, version and dtype handling, name and dtype mapping, binding (empty past included) and
the whole decode loop over TrtRuntime are exercised for real."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from click.testing import CliRunner

from specdiff.exporters.tensorrt import build_engine, network_settings, profile_shapes
from specdiff.runtimes import tensorrt as rt
from specdiff.artifacts import open_artifacts, read_engine
from specdiff.graphs import Limits, drafter_spec, spec_from_model, target_spec
from specdiff.runtimes.models import GraphTarget
from specdiff.errors import LoadError, UsageError
from specdiff.generation import generate
from specdiff.loading import load_target
from specdiff_cli.main import cli

from fake_tensorrt import GPU, close, fake_tensorrt, with_fake_engines

pytest_plugins = ["exported"]  # fixture onnx_pair: the tiny pair exported once per session


@pytest.fixture
def engines(onnx_pair, tmp_path):
    """A copy of the exported pair with fake TensorRT 10.9 engines for GPU, and its manifest."""
    return with_fake_engines(onnx_pair, tmp_path / "trt")


def test_profiles_come_from_consistent_triples():
    limits = Limits.for_context(128, max_batch=3)
    assert (limits.max_seq, limits.max_step) == (65, 64)
    spec = target_spec(layers=2, heads=2, head_dim=16, head_rows=320)
    shapes = profile_shapes(spec, limits.target_triples())
    for level in range(3):
        ids, mask, past = (shapes[n][level] for n in ("input_ids", "attention_mask", "past_key_values.1.value"))
        assert mask == (ids[0], 1, ids[1], past[2] + ids[1]) and past[:2] == (ids[0], 2) and mask[3] <= 128
    assert shapes["past_key_values.0.key"][0] == (1, 2, 0, 16)  # prefill: an empty past
    assert shapes["input_ids"][2] == (3, 64) and shapes["attention_mask"][2] == (3, 1, 64, 128)
    drafter = profile_shapes(drafter_spec(301, True), limits.drafter_triples(16))
    assert drafter == {"input_ids": ((1, 1), (1, 24), (3, 80)), "sigma": ((1,), (1,), (3,))}
    neo = Limits.for_context(2048)  # gpt-neo-2.7B's defaults: 64-token steps up to 1985 tokens
    assert (neo.max_seq, neo.max_step) == (1985, 64)
    with pytest.raises(UsageError, match="at most 1985"):
        Limits.for_context(2048, max_seq=2048)


@pytest.mark.parametrize("version, network_flags, onnx_dtype, engine_dtype, flags, builder_flags", [
    ("10.9.0", ("STRONGLY_TYPED",), "fp16", "fp16", 1 << 5, []),
    ("10.9.0", ("STRONGLY_TYPED",), "fp32", "fp32", 1 << 5, []),
    ("10.9.0", ("STRONGLY_TYPED",), "fp32", "fp16", 0, ["FP16"]),
    ("10.9.0", ("STRONGLY_TYPED",), "fp32", "bf16", 0, ["BF16"]),
    ("11.0.0", ("STRONGLY_TYPED",), "bf16", "bf16", 1 << 5, []),  # accepted and ignored by 11.x
    ("12.0.0", (), "fp16", "fp16", 0, []),  # a TensorRT that dropped the flag: strongly typed anyway
])
def test_network_settings_by_version(version, network_flags, onnx_dtype, engine_dtype, flags, builder_flags):
    trt = fake_tensorrt(version, network_flags=network_flags)
    got_flags, got_builder = network_settings(trt, onnx_dtype, engine_dtype)
    assert got_flags == flags and [f.name for f in got_builder] == builder_flags


@pytest.mark.parametrize("version, onnx_dtype, engine_dtype, error, message", [
    ("11.1.0", "fp32", "fp16", UsageError, "TensorRT 11 builds strongly typed networks only: export the ONNX graph with `dtype` fp16"),
    ("10.9.0", "fp16", "bf16", UsageError, "cannot build a bf16 engine from a fp16 graph"),
    ("8.6.1", "fp16", "fp16", LoadError, "TensorRT 8.6.1 is too old"),
])
def test_network_settings_refusals(version, onnx_dtype, engine_dtype, error, message):
    with pytest.raises(error, match=message):
        network_settings(fake_tensorrt(version), onnx_dtype, engine_dtype)


def test_engines_record_version_gpu_and_profile(engines):
    root, manifest, trt = engines
    target = manifest["components"]["target"]
    meta, plan = read_engine(root / "target.engine")
    assert (meta["tensorrt"], meta["gpu"], meta["dtype"]) == ("10.9.0", GPU, "fp32")
    assert target["engine"]["file"] == "target.engine" and meta["limits"] == manifest["limits"]
    call = trt.calls[0]
    assert call["onnx"] == str(root / "target.onnx") and call["network_flags"] == 1 << 5 and "builder_flags" not in call
    spec = spec_from_model("target", target["model"])
    assert call["profile"] == profile_shapes(spec, Limits(**manifest["limits"]).target_triples())
    assert json.loads(plan)["onnx"] == call["onnx"]
    assert open_artifacts(root).component("drafter")["engine"]["file"] == "drafter.engine"


def test_parse_and_build_failures_are_one_line(onnx_pair):
    spec, triples = target_spec(2, 2, 16, 320), Limits.for_context(128).target_triples()
    bad = fake_tensorrt(parse_errors=["In node 3 (importIf): UNSUPPORTED_NODE", "second"])
    with pytest.raises(LoadError, match=r"cannot parse target.onnx: In node 3 \(importIf\): UNSUPPORTED_NODE$"):
        build_engine(bad, onnx_pair / "target.onnx", spec, triples, "fp32", "fp32")
    with pytest.raises(LoadError, match="failed to build an engine from target.onnx"):
        build_engine(fake_tensorrt(build_fails=True), onnx_pair / "target.onnx", spec, triples, "fp32", "fp32")


@pytest.mark.parametrize("version, gpu, message", [
    ("10.9.0", GPU, None),
    ("10.10.0", GPU, "engine built with TensorRT 10.9.0 for NVIDIA Fake 80GB; this machine has TensorRT 10.10.0"),
    ("10.9.0", "NVIDIA H100", "this machine has TensorRT 10.9.0 and NVIDIA H100"),
])
def test_engines_for_another_tensorrt_or_gpu_are_refused(engines, monkeypatch, version, gpu, message):
    root = engines[0]
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(version))
    monkeypatch.setattr(rt, "gpu_name", lambda device: gpu)
    monkeypatch.setattr(rt, "TrtRuntime", lambda trt, plan, meta, device, expected: ("runtime", meta["gpu"]))
    art = open_artifacts(root)
    if message is None:
        assert rt.open_graph(art, "target", "cuda") == ("runtime", GPU)
        return
    with pytest.raises(LoadError, match=message):
        rt.open_graph(art, "target", "cuda")
    result = CliRunner().invoke(cli, ["generate", "--runtime", "tensorrt", "--artifacts", str(root),
                                      "--device", "cuda", "--prompt", "x"])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1 and message in result.stderr


def test_engine_without_header_is_refused(tmp_path):
    (tmp_path / "plain.engine").write_bytes(b"\x00serialized plan")
    with pytest.raises(LoadError, match="not a specdiff TensorRT engine"):
        read_engine(tmp_path / "plain.engine")


@pytest.mark.parametrize("int32_ids", [False, True])
def test_decoding_over_the_engine_matches_torch(tiny, engines, int32_ids):
    """TrtRuntime under GraphTarget: empty past bound to a non-null address, ids cast to the
    engine's dtype, outputs sized from the context; greedy output token for token torch's."""
    root, manifest, _ = engines
    meta, plan = read_engine(root / "target.engine")
    trt = fake_tensorrt(int32_ids=int32_ids)
    assert rt.torch_dtypes(trt)[trt.DataType.HALF] is torch.float16 and rt.torch_dtypes(trt)[trt.DataType.INT32] is torch.int32
    runtime = rt.TrtRuntime(trt, plan, meta, "cpu", expected=["input_ids", "present.1.value"])
    assert runtime.inputs["input_ids"] is (torch.int32 if int32_ids else torch.int64)
    art = open_artifacts(root)
    ours, ref = GraphTarget.from_artifacts(art, runtime, "cpu"), load_target(str(tiny.gpt2))
    assert (ours.max_length, ours.max_step) == (65, 64)
    ids = torch.randint(0, 300, (1, 19), generator=torch.Generator().manual_seed(3))
    assert close(ours.prefill(ids), ref.prefill(ids))
    assert runtime.context.shapes["past_key_values.0.key"] == (1, 2, 0, 16)  # an empty past ...
    assert runtime.context.addresses["past_key_values.0.key"] == runtime._scratch.data_ptr() != 0  # ... not at 0
    ours.rollback(7), ref.rollback(7)
    assert close(ours.extend(ids[:, 7:12]), ref.extend(ids[:, 7:12])) and ours.length == 12
    prompts = ["The quick brown fox", "Call me"]
    assert generate(prompts, target=ours, max_new_tokens=20).texts == \
        generate(prompts, target=ref, max_new_tokens=20).texts


def test_shapes_outside_the_profile_are_refused(engines):
    root, _, _ = engines
    meta, plan = read_engine(root / "target.engine")
    target = GraphTarget.from_artifacts(open_artifacts(root), rt.TrtRuntime(fake_tensorrt(), plan, meta, "cpu"), "cpu")
    with pytest.raises(UsageError, match=r"input_ids of shape \(4, 3\) is outside the engine's profile"):
        target.prefill(torch.zeros(4, 3, dtype=torch.long))  # --max-batch 3


def test_missing_tensorrt_names_its_extra(tiny, onnx_pair, tmp_path, monkeypatch):
    runner = CliRunner()
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    line = ("specdiff: error: tensorrt is not installed: pip install 'onnx>=1.17' 'onnxscript>=0.2' 'tensorrt>=10' "
            "(or pip install -e '.[tensorrt]' from a checkout)\n")
    result = runner.invoke(cli, ["export", "--target", str(tiny.gpt2), "--format", "tensorrt", "--out", str(tmp_path / "e")])
    assert (result.exit_code, result.stderr) == (1, line) and list(tmp_path.iterdir()) == []
    result = runner.invoke(cli, ["generate", "--runtime", "tensorrt", "--device", "cuda", "--artifacts",
                                 str(onnx_pair), "--prompt", "x"])
    assert (result.exit_code, result.stderr) == (1, line)
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt())
    if not torch.cuda.is_available():
        result = runner.invoke(cli, ["export", "--target", str(tiny.gpt2), "--format", "all", "--out", str(tmp_path / "e")])
        assert result.exit_code == 1 and "TensorRT engines are built on a CUDA GPU and none is visible" in result.stderr
