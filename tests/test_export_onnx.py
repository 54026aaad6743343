"""`specdiff export` to ONNX: the manifest, the graphs TensorRT would consume, validation against
PyTorch (and that it really catches a wrong graph), fp16, and the all-or-nothing output directory."""

from __future__ import annotations

import copy
import json

import onnx
import pytest
import torch
from click.testing import CliRunner

from specdiff.exporters import validate as validate_module
from specdiff.exporters.onnx import check_graph, target_graph
from specdiff.exporters.tensorrt import graph_problems
from specdiff.runtimes import load_models
from specdiff.artifacts import file_hashes, identity_of, sha256_file, vocab_sha256
from specdiff.graphs import TOLERANCE, spec_from_model
from specdiff.errors import ExportValidationError
from specdiff.loading import load_drafter, load_target
from specdiff.nets.checkpoint import save_own
from specdiff.nets.dit import DDiT, DiTConfig
from specdiff_cli.main import cli

pytest_plugins = ["exported"]  # fixtures onnx_pair, onnx_neo: each tiny export once per session


def manifest(directory) -> dict:
    return json.loads((directory / "manifest.json").read_text())


def run_cli(args: list[str]):
    return CliRunner().invoke(cli, args)


STAGES = ("specdiff: loading ", "specdiff: exporting the ", "specdiff: validating ")


def error_line(stderr: str) -> str:
    """The one error line of a failed export, after the lines of the stages it started."""
    *stages, last = stderr.splitlines()
    assert all(line.startswith(STAGES) for line in stages), stderr
    return last


@pytest.mark.slow  # an export of its own, about 10 s: CI's slow step
def test_each_stage_says_when_it_starts(tiny, tmp_path):
    """An export prints nothing else for a minute or two on a CPU: each stage says it started."""
    result = run_cli(["export", "--target", str(tiny.gpt2), "--drafter", str(tiny.drafter), "--out",
                      str(tmp_path / "e")])
    assert result.exit_code == 0, result.stderr
    lines = [line.split("'")[0].split(" (")[0] for line in result.stderr.splitlines()]
    assert lines == ["specdiff: loading ", "specdiff: exporting the target graph target.onnx",
                     "specdiff: validating target.onnx against PyTorch", "specdiff: target ",
                     "specdiff: exporting the drafter graph drafter.onnx",
                     "specdiff: validating drafter.onnx against PyTorch", "specdiff: drafter "], result.stderr


def test_manifest_records_sources_tokenizer_io_tools_and_validation(tiny, onnx_pair):
    m = manifest(onnx_pair)
    assert (m["format"], m["dtype"], m["opset"]) == ("specdiff-export", "fp32", 18)
    assert m["limits"] == {"max_batch": 3, "max_seq": 65, "max_step": 64}  # context 128, steps of 64
    assert m["files"] == file_hashes(onnx_pair)
    assert {"target.onnx", "target.onnx.data", "drafter.onnx", "tokenizer/tokenizer.json"} <= set(m["files"])
    assert m["tokenizer"] == {"dir": "tokenizer", "vocab_size": 300, "vocab_sha256": vocab_sha256(tiny.tokenizer)}
    assert m["tools"]["torch"] == torch.__version__ and m["tools"]["onnx"] == onnx.__version__
    target, drafter = m["components"]["target"], m["components"]["drafter"]
    assert target["source"]["files"]["model.safetensors"] == sha256_file(tiny.gpt2 / "model.safetensors")
    assert drafter["source"]["files"]["config.json"] == sha256_file(tiny.drafter / "config.json")
    assert target["source"]["identity"] == identity_of(str(tiny.gpt2), ("target",))[1]  # config + weights
    assert drafter["source"]["identity"] == identity_of(str(tiny.drafter), ("drafter",))[1]
    assert target["model"] | {"name": None} == {
        "name": None, "model_type": "gpt2", "attn_implementation": "sdpa", "vocab_size": 300, "head_rows": 320,
        "max_length": 128, "eos_token_id": 299, "layers": 2, "kv_heads": 2, "head_dim": 16}
    inputs = {t["name"]: t["dims"] for t in target["io"]["inputs"]}
    assert inputs["attention_mask"] == ["batch", 1, "seq_len", "total_len"]  # additive: chains and trees
    assert inputs["past_key_values.1.value"] == ["batch", 2, "past_len", 16]
    for component in (target, drafter):
        v = component["validation"]
        assert v["passed"] and v["runtime"] == "onnxruntime-cpu" and v["tolerance"]["atol"] == TOLERANCE["fp32"][0]
        assert max(v["max_abs_diff"].values()) < 1e-4
    assert any("batch 3" in c and "19" in c for c in target["validation"]["cases"])
    assert any("tree" in c for c in target["validation"]["cases"])  # a draft tree's mask, not only causal ones


@pytest.mark.parametrize("which", ["onnx_pair", pytest.param("onnx_neo", marks=pytest.mark.slow)])  # 9 s: slow step
def test_graphs_are_what_tensorrt_needs(which, request):
    directory = request.getfixturevalue(which)
    m = manifest(directory)
    for kind, component in m["components"].items():
        path = directory / component["graph"]
        model = onnx.load(str(path), load_external_data=False)
        assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) <= 20
        assert not {"If", "Loop", "Scan"} & {n.op_type for n in model.graph.node}
        assert graph_problems(path) == []
        assert check_graph(path, spec_from_model(kind, component["model"]), "fp32") == []
        onnx.checker.check_model(str(path))
    names = [i.name for i in onnx.load(str(directory / "target.onnx"), load_external_data=False).graph.input]
    assert names[:4] == ["input_ids", "attention_mask", "position_ids", "past_key_values.0.key"]


def test_check_graph_reports_a_wrong_signature(onnx_pair):
    component = manifest(onnx_pair)["components"]["target"]
    spec = spec_from_model("target", {**component["model"], "kv_heads": 3})
    problems = check_graph(onnx_pair / "target.onnx", spec, "fp16")
    assert any("element type" in p for p in problems) and any("dims" in p for p in problems)


def test_validation_collects_every_mismatch_before_raising(tiny, onnx_pair):
    """The exported graph against a module whose weights differ slightly: the real sweep fails,
    and one error lists the mismatches of every case."""
    target = load_target(str(tiny.gpt2))
    module, spec, _ = target_graph(target)
    wrong = copy.deepcopy(module)
    with torch.no_grad():
        wrong.model.transformer.h[1].mlp.c_proj.bias[0] += 0.05  # only logits change
    with pytest.raises(ExportValidationError) as info:
        validate_module.validate(wrong, spec, onnx_pair / "target.onnx", "fp32")
    e = info.value
    assert len(e.mismatches) > 4 and all(case.name in " ".join(e.mismatches) for case in validate_module.TARGET_SWEEP)
    assert "\n" not in str(e) and str(e).startswith(f"target.onnx disagrees with PyTorch in {len(e.mismatches)} of")
    assert validate_module.validate(module, spec, onnx_pair / "target.onnx", "fp32")["passed"]


@pytest.fixture(scope="module")
def sedd_drafter(tiny, tmp_path_factory):
    """A time-conditioned drafter with the SEDD parameterisation: its graph takes sigma."""
    cfg = DiTConfig(vocab_size=301, hidden_size=32, n_heads=2, n_blocks=1, cond_dim=64, time_conditioning=True)
    directory = tmp_path_factory.mktemp("sedd")
    save_own(directory, DDiT(cfg).init_random(torch.Generator().manual_seed(4)), vocab_size=300, mask_id=300,
             context_length=16, parameterization="sedd", tokenizer=tiny.tokenizer)
    return directory


def test_fp16_time_conditioned_drafter(sedd_drafter, tmp_path):
    out = tmp_path / "fp16"
    result = run_cli(["export", "--drafter", str(sedd_drafter), "--dtype", "fp16", "--out", str(out)])
    assert result.exit_code == 0, result.output
    component = manifest(out)["components"]["drafter"]
    assert component["validation"]["passed"] and component["validation"]["tolerance"]["atol"] == TOLERANCE["fp16"][0]
    assert [t["name"] for t in component["io"]["inputs"]] == ["input_ids", "sigma"]
    assert check_graph(out / "drafter.onnx", spec_from_model("drafter", component["model"]), "fp16") == []
    models = load_models("onnxruntime", out)
    assert "target" not in models
    ids = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(5))
    ids[:, 12:] = 300
    reference = load_drafter(str(sedd_drafter), dtype="fp16")
    atol, rtol = TOLERANCE["fp16"]
    assert torch.allclose(models["drafter"].x0_logits(ids)[:, 12:], reference.x0_logits(ids)[:, 12:], atol=atol, rtol=rtol)


def test_failed_validation_leaves_no_directory(tiny, tmp_path, monkeypatch):
    monkeypatch.setitem(TOLERANCE, "fp32", (0.0, 0.0))  # nothing matches exactly
    out = tmp_path / "never"
    result = run_cli(["export", "--drafter", str(tiny.drafter), "--out", str(out)])
    error = error_line(result.stderr)
    assert result.exit_code == 1 and error.startswith("specdiff: error: drafter.onnx disagrees with PyTorch")
    assert list(tmp_path.iterdir()) == []  # neither the directory nor its temporary twin


@pytest.mark.parametrize("args, code, message", [
    (["--out", "{tmp}/x"], 2, "nothing to export"),
    (["--drafter", "{ar}", "--out", "{tmp}/x"], 2, "a causal LM is exported as a --target"),
    (["--target", "{gpt2}", "--format", "all", "--opset", "21", "--out", "{tmp}/x"], 2, "--opset must be an integer in 18..20"),
    (["--target", "{gpt2}", "--max-seq", "100", "--out", "{tmp}/x"], 2, "leaves no room"),
    # a TensorRT profile's dimensions are 32-bit: larger limits were recorded, then overflowed (issue 25, fault 13)
    (["--target", "{gpt2}", "--max-batch", str(10**20), "--out", "{tmp}/x"], 2,
     "--max-batch must be an integer from 1 to 2147483647 (a 32-bit dimension), got 100000000000000000000"),
    (["--drafter", "{drafter}", "--max-seq", str(2**31), "--out", "{tmp}/x"], 2, "--max-seq must be an integer from 1"),
    (["--target", "{gpt2}", "--max-batch", "0", "--out", "{tmp}/x"], 2, "--max-batch must be an integer from 1"),
    (["--target", "{gpt2}", "--out", "{tmp}/full"], 2, "exists and is not an empty directory"),
    # a block-diffusion target exported as a causal LM ran on ONNX Runtime as one: wrong text, exit 0
    (["--pair", "demo-block", "--out", "{tmp}/x"], 2, "target 'demo-block-target' is a block-diffusion (SDAR) "
     "model: `specdiff export` writes causal LM and masked-diffusion graphs only; run it with the torch runtime"),
    (["--drafter", "demo-block-drafter", "--out", "{tmp}/x"], 2, "drafter 'demo-block-drafter' is a block-diffusion"),
])
def test_export_refuses_bad_requests_with_one_line(tiny, tmp_path, args, code, message):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    fill = {"tmp": tmp_path, "ar": tiny.ar, "gpt2": tiny.gpt2, "drafter": tiny.drafter}
    result = run_cli(["export", *[a.format(**fill) for a in args]])
    assert result.exit_code == code and message in error_line(result.stderr), result.stderr
    assert not (tmp_path / "x").exists()
