"""Exported graphs on ONNX Runtime (CPU): the Target contract against PyTorch, drafts identical to
the PyTorch drafter's, `generate --runtime onnxruntime` token-identical to `--runtime torch`, and
every bad artefact refused with one line."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch
from click.testing import CliRunner

from specdiff.runtimes import load_models
from specdiff.graphs import TOLERANCE
from specdiff.runtimes.onnxruntime import OrtRuntime
from specdiff.drafters.diffusion import DiffusionProposer
from specdiff.errors import LoadError, UsageError
from specdiff.loading import load_drafter, load_target
from specdiff.sampling import Sampling
from specdiff_cli.main import cli
from specdiff.generation import plan
from specdiff.settings import DraftSettings
from tiny import make_tokenizer, with_defaults

pytest_plugins = ["exported"]  # fixtures onnx_pair, onnx_neo: each tiny export once per session

ATOL, RTOL = TOLERANCE["fp32"]
PROMPTS = ["The quick brown fox", "To be, or not to be, that is", "def main():"]


def run_cli(args: list[str]):
    return CliRunner().invoke(cli, args)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, atol=ATOL, rtol=RTOL)


SLOW_EXPORTS = [pytest.param("onnx_neo", "neo", marks=pytest.mark.slow),  # an export each (12-16 s): CI's slow step
                pytest.param("onnx_llama", "tiny_llama_tied", marks=pytest.mark.slow)]


def model_dir(tiny, request, model: str):
    """The torch model a graph was exported from: an attribute of `tiny`, or a fixture's name."""
    return getattr(tiny, model) if hasattr(tiny, model) else request.getfixturevalue(model)


@pytest.mark.parametrize("which, model", [("onnx_pair", "gpt2"), *SLOW_EXPORTS])
def test_graph_target_keeps_the_target_contract(tiny, request, which, model):
    """prefill / extend (verify 5, single steps) / rollback / length, batch 1 and 3, against
    specdiff.contracts.Target."""
    ours = load_models("onnxruntime", request.getfixturevalue(which))["target"]
    ref = load_target(str(model_dir(tiny, request, model)))
    assert (ours.vocab_size, ours.max_length, ours.eos_token_id) == (ref.vocab_size, ref.max_length, ref.eos_token_id)
    ids = torch.randint(0, 300, (3, 40), generator=torch.Generator().manual_seed(0))
    for batch in (1, 3):
        x = ids[:batch]
        assert close(ours.prefill(x[:, :19]), ref.prefill(x[:, :19]))
        for start, stop, keep in ((19, 24, 21), (21, 22, 22), (22, 27, 23), (23, 24, 24)):
            got, want = ours.extend(x[:, start:stop]), ref.extend(x[:, start:stop])
            assert got.dtype == torch.float32 and got.shape == (batch, stop - start, 300) and close(got, want)
            ours.rollback(keep), ref.rollback(keep)
            assert ours.length == ref.length == keep


@pytest.mark.parametrize("which, model", [("onnx_pair", "gpt2"), ("onnx_neo", "neo")])
def test_graph_target_forks_rows_as_the_pytorch_target(tiny, request, which, model):
    """keep with repeats (self-selection's K rows) and back to one row, against CausalLMTarget."""
    ours = load_models("onnxruntime", request.getfixturevalue(which))["target"]
    ref = load_target(str(model_dir(tiny, request, model)))
    ids = torch.randint(0, 300, (3, 30), generator=torch.Generator().manual_seed(0))
    assert close(ours.prefill(ids[:1, :12]), ref.prefill(ids[:1, :12]))
    for t in (ours, ref):
        t.keep([0, 0, 0])
    assert close(ours.extend(ids[:, 12:18]), ref.extend(ids[:, 12:18]))
    for t in (ours, ref):
        t.keep([1]), t.rollback(14)
    assert ours.length == ref.length == 14 and close(ours.extend(ids[1:2, 14:30]), ref.extend(ids[1:2, 14:30]))


def test_chunked_steps_match_one_step(onnx_pair):
    """A runtime with a step limit (TensorRT profiles) feeds long prompts in chunks."""
    whole = load_models("onnxruntime", onnx_pair)["target"]
    chunked = load_models("onnxruntime", onnx_pair)["target"]
    chunked.max_step = 4
    ids = torch.randint(0, 300, (1, 19), generator=torch.Generator().manual_seed(1))
    assert close(chunked.prefill(ids), whole.prefill(ids)) and chunked.length == 19


def test_drafts_match_the_pytorch_drafter(tiny, onnx_pair):
    graph = load_models("onnxruntime", onnx_pair)["drafter"]
    torch_drafter = load_drafter(str(tiny.drafter))
    context = torch.randint(0, 300, (3, 21), generator=torch.Generator().manual_seed(2))
    for schedule, steps in (("l2r", 3), ("confidence", 2)):
        ours = DiffusionProposer(graph, schedule, steps).propose(context, 7, Sampling(), None)
        want = DiffusionProposer(torch_drafter, schedule, steps).propose(context, 7, Sampling(), None)
        assert torch.equal(ours.tokens, want.tokens) and torch.equal(ours.q, want.q)
    ids = torch.cat([context, torch.full((3, 7), graph.mask_id)], dim=1)[:, -23:]
    assert close(graph.x0_logits(ids), torch_drafter.x0_logits(ids))


@pytest.mark.parametrize("method", ["ar", "specdiff --gamma 5", "specdiff --gamma 5 --drafts 3"])  # 3 rows forked
@pytest.mark.parametrize("which, model", [("onnx_pair", "gpt2"), *SLOW_EXPORTS])
def test_generate_on_onnxruntime_is_token_identical_to_torch(tiny, request, method, which, model):
    artifacts = request.getfixturevalue(which)
    common = ["generate", "--method", *method.split(), "--max-new-tokens", "24", "--jsonl",
              *[a for p in PROMPTS for a in ("--prompt", p)]]
    drafter = [] if which != "onnx_neo" else ["--drafter", str(tiny.drafter)]  # neo: ORT target + torch drafter
    torch_run = run_cli([*common, "--target", str(model_dir(tiny, request, model)), "--drafter", str(tiny.drafter)])
    ort_run = run_cli([*common, "--runtime", "onnxruntime", "--artifacts", str(artifacts), *drafter])
    assert torch_run.exit_code == 0 and ort_run.exit_code == 0, (torch_run.output, ort_run.output)
    ours, want = ([json.loads(line) for line in r.stdout.splitlines()] for r in (ort_run, torch_run))
    assert [o["text"] for o in ours] == [w["text"] for w in want] and len(ours) == len(PROMPTS)
    for o, w in zip(ours, want):
        assert o["metrics"]["new_tokens"] == w["metrics"]["new_tokens"]
        assert o["metrics"]["accepted_length_histogram"] == w["metrics"]["accepted_length_histogram"]


@pytest.mark.slow  # two tiny exports, 15-40 s
def test_onnxruntime_without_artifacts_exports_once_into_the_user_cache(tiny, tmp_path, monkeypatch):
    """The first run exports into $SPECDIFF_CACHE/onnx, later ones reuse it; a damaged entry is
    exported again, saying so; ar exports the target alone; every output is torch's."""
    monkeypatch.setenv("SPECDIFF_CACHE", str(tmp_path / "cache"))
    common = ["generate", "--target", str(tiny.gpt2), "--drafter", str(tiny.drafter), "--max-new-tokens", "16",
              *[a for p in PROMPTS for a in ("--prompt", p)]]
    want = run_cli([*common, "--method", "specdiff", "--gamma", "5"]).stdout
    runs = [run_cli([*common, "--method", "specdiff", "--gamma", "5", "--runtime", "onnxruntime"]) for _ in range(2)]
    assert [r.exit_code for r in runs] == [0, 0] and [r.stdout for r in runs] == [want, want], runs[0].stderr
    assert "exporting" in runs[0].stderr and "exporting" not in runs[1].stderr
    entry, = (tmp_path / "cache" / "onnx").iterdir()
    (entry / "drafter.onnx").write_bytes((entry / "drafter.onnx").read_bytes()[:-1])
    again = run_cli([*common, "--method", "specdiff", "--gamma", "5", "--runtime", "onnxruntime"])
    assert again.exit_code == 0 and again.stdout == want and "does not open" in again.stderr
    ar = run_cli([*common, "--method", "ar", "--runtime", "onnxruntime"])
    assert ar.exit_code == 0 and ar.stdout == want  # greedy: ar's text is specdiff's
    assert len(list((tmp_path / "cache" / "onnx").iterdir())) == 2
    manifest = json.loads((next(e for e in (tmp_path / "cache" / "onnx").iterdir() if e != entry)
                           / "manifest.json").read_text())
    assert list(manifest["components"]) == ["target"]


@pytest.mark.slow  # the demo pair's export, 20-40 s
def test_onnxruntime_without_artifacts_or_pair_runs_the_default_pair_with_its_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDIFF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECDIFF_PAIR", "demo")
    args = ["generate", "--prompt", "Hello there", "--max-new-tokens", "8", "--stats"]
    torch_run, ort_run = run_cli(args), run_cli([*args, "--runtime", "onnxruntime"])
    assert torch_run.exit_code == ort_run.exit_code == 0, ort_run.stderr
    assert ort_run.stdout == torch_run.stdout
    settings = [json.loads(r.stderr.strip().splitlines()[-1])["settings"] for r in (torch_run, ort_run)]
    runtimes = [s.pop("runtime") for s in settings]  # --stats names the runtime and where it came from
    assert runtimes == [{"value": "torch", "from": "default"}, {"value": "onnxruntime", "from": "option"}]
    assert settings[0] == settings[1] and any(v["from"] == "pair" for v in settings[1].values())


def test_runtime_refuses_a_mask_that_does_not_span_past_and_new(onnx_pair):
    target = load_models("onnxruntime", onnx_pair)["target"]
    target.prefill(torch.tensor([[1, 2, 3]]))
    feeds = {"input_ids": torch.tensor([[4]]), "attention_mask": torch.ones(1, 3, dtype=torch.long),
             "position_ids": torch.tensor([[3]]), **dict(zip(target._past_names, target.kv))}
    with pytest.raises(UsageError, match="covers 3 positions"):
        target.runtime.run(feeds)


def test_missing_backends_name_their_extra(onnx_pair, monkeypatch):
    with pytest.raises(LoadError, match=r"this onnxruntime has no CUDA provider .*'onnxruntime-gpu>=.*-e '\.\[gpu\]'"):
        OrtRuntime(onnx_pair / "target.onnx", "cuda")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now fails
    result = run_cli(["generate", "--runtime", "onnxruntime", "--artifacts", str(onnx_pair), "--prompt", "x"])
    assert result.exit_code == 1
    assert result.stderr == ("specdiff: error: onnxruntime is not installed: pip install 'onnx>=1.17' "
                             "'onnxruntime>=1.20' 'onnxscript>=0.2' (or pip install -e '.[onnx]' from a checkout)\n")


def test_install_hint_outside_an_installed_specdiff_is_the_checkout_form(monkeypatch):
    from importlib import metadata

    from specdiff import extras

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(extras.metadata, "requires", not_installed)
    assert extras.install_hint("onnx") == "pip install -e '.[onnx]' from a checkout"


@pytest.fixture
def broken(onnx_pair, tmp_path):
    """A fresh copy of the exported pair to damage."""
    return shutil.copytree(onnx_pair, tmp_path / "copy")


def _foreign(d):
    (d / "manifest.json").write_text(json.dumps({"format": "optimum", "files": {}}))


def _newer(d):
    m = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps({**m, "format_version": 99}))


def _corrupt(d):
    data = bytearray((d / "target.onnx.data").read_bytes())
    data[100] ^= 0xFF
    (d / "target.onnx.data").write_bytes(bytes(data))


def _bad_defaults(d):
    m = json.loads((d / "manifest.json").read_text())
    m["components"]["drafter"]["model"]["defaults"] = {"gamma": 0}
    (d / "manifest.json").write_text(json.dumps(m))


def _manifest_edit(edit):
    """A damage that edits manifest.json in place: edit(manifest) -> None."""
    def damage(d):
        m = json.loads((d / "manifest.json").read_text())
        edit(m)
        (d / "manifest.json").write_text(json.dumps(m))
    return damage


def _consistently(**change):
    """Target model record changed and its IO signature rewritten to match: only the graph can tell."""
    from specdiff.graphs import spec_from_model

    def edit(m):
        c = m["components"]["target"]
        c["model"].update(change)
        c["io"] = spec_from_model("target", c["model"]).to_json(m["dtype"])
    return _manifest_edit(edit)


def _target_model(**change):
    return _manifest_edit(lambda m: m["components"]["target"]["model"].update(change))


def _other_tokenizer(d):
    shutil.rmtree(d / "tokenizer")
    make_tokenizer(d / "tokenizer", vocab_size=290)


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "manifest.json").unlink(), "has no manifest.json: not a `specdiff export` directory"),
    (_foreign, 'not a specdiff export manifest (no "format": "specdiff-export")'),
    (_newer, "export format version 99"),
    (_corrupt, "sha256 of target.onnx.data does not match manifest.json (corrupt or modified file"),
    (lambda d: (d / "drafter.onnx").unlink(), "file(s) listed in manifest.json are missing: drafter.onnx"),
    (_other_tokenizer, "this tokenizer is not the one the models were exported with"),
    (_bad_defaults, "malformed manifest: components.drafter.model.defaults: gamma must be an integer >= 1, got 0"),
    # manifest values the graphs contradict: each was a KeyError or an onnxruntime traceback
    (_manifest_edit(lambda m: m.update(dtype="fp64")), "malformed manifest: dtype: unknown dtype 'fp64'"),
    (_target_model(layers=3), "components.target.io.inputs[7] is nothing; the model record and dtype make it "
                              "past_key_values.2.key (batch, 2, past_len, 16) fp32"),
    (_manifest_edit(lambda m: m["components"]["drafter"]["model"].update(mask_id=10**6)),
     "components.drafter.model.mask_id 1000000 is outside the vocabulary (0 .. 300)"),
    (_target_model(eos_token_id=10**6), "components.target.model.eos_token_id 1000000 is outside the vocabulary"),
    (_consistently(layers=3), "target.onnx: the graph's input past_key_values.2.key is absent; the manifest says"),
    (_consistently(kv_heads=4), "the graph's input past_key_values.0.key is fp32 (?, 2, ?, 16); the manifest says "
                                "fp32 (?, 4, ?, 16) (re-export)"),
    (_manifest_edit(lambda m: m["components"]["target"].update(graph="../elsewhere.onnx")),
     "components.target.graph: '../elsewhere.onnx' is not among the hashed files"),
    (_manifest_edit(lambda m: m["files"].pop("drafter.onnx")),
     "components.drafter.graph: 'drafter.onnx' is not among the hashed files"),
])
def test_bad_artefacts_are_refused_with_one_line(broken, damage, message):
    damage(broken)
    result = run_cli(["generate", "--runtime", "onnxruntime", "--artifacts", str(broken), "--prompt", "x"])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith("specdiff: error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr, result.stderr


def test_an_onnxruntime_failure_while_running_is_one_load_error(onnx_pair, monkeypatch):
    """A graph that fails inside onnxruntime (an id past its embedding, say) raised onnxruntime's
    own exception."""
    runtime = load_models("onnxruntime", onnx_pair)["drafter"].runtime  # input_ids only

    def fail(binding):
        raise RuntimeError("Error in execution: invalid index found, index = 1000000\nmore detail")
    monkeypatch.setattr(runtime, "session", type("S", (), {"io_binding": runtime.session.io_binding,
                                                           "run_with_iobinding": staticmethod(fail)})())
    with pytest.raises(LoadError, match=r"onnxruntime failed running .*drafter.onnx: Error in execution: invalid "
                                        r"index found, index = 1000000$"):
        runtime.run({"input_ids": torch.zeros(1, 1, dtype=torch.int64)})


def test_a_manifest_without_recorded_settings_still_loads(broken):
    """Exports made before drafters recorded their draft settings have no `defaults`."""
    m = json.loads((broken / "manifest.json").read_text())
    assert m["components"]["drafter"]["model"].pop("defaults") == {}  # tiny.drafter records none
    (broken / "manifest.json").write_text(json.dumps(m))
    assert load_models("onnxruntime", broken)["drafter"].defaults == {}


def test_recorded_settings_travel_through_the_manifest_to_the_graph_drafter(tiny, tmp_path):
    recorded = {"gamma": 3, "steps": 2, "schedule": "l2r"}
    out = tmp_path / "export"
    export = run_cli(["export", "--drafter", with_defaults(tiny.drafter, tmp_path / "d", recorded), "--out", str(out)])
    assert export.exit_code == 0, export.output
    assert json.loads((out / "manifest.json").read_text())["components"]["drafter"]["model"]["defaults"] == recorded
    graph = load_models("onnxruntime", out)["drafter"]
    assert plan(target=str(tiny.gpt2), drafter=graph).draft == DraftSettings(**recorded)
    result = run_cli(["generate", "--runtime", "onnxruntime", "--artifacts", str(out), "--target", str(tiny.gpt2),
                      "--prompt", "The sea", "--max-new-tokens", "4", "--stats"])
    settings = json.loads(result.stderr)["settings"]
    assert {k: settings[k] for k in recorded} == {k: {"value": v, "from": "drafter"} for k, v in recorded.items()}


@pytest.mark.parametrize("args, message", [
    (["--runtime", "tensorrt"], "--runtime tensorrt needs --artifacts DIR"),  # onnxruntime: the user cache
    (["--artifacts", "{dir}"], "--artifacts needs --runtime onnxruntime or tensorrt"),
    (["--runtime", "onnxruntime", "--artifacts", "{dir}", "--target", "gpt2"], "drop --target"),
    (["--runtime", "tensorrt", "--artifacts", "{dir}"], "--runtime tensorrt runs on a CUDA GPU"),
    (["--runtime", "onnxruntime", "--artifacts", "{dir}", "--dtype", "fp16"],  # was dropped: ran the export's fp32
     "--dtype fp16 does not apply to target"),
])
def test_runtime_options_are_checked(onnx_pair, args, message):
    result = run_cli(["generate", "--prompt", "x", *[a.format(dir=onnx_pair) for a in args]])
    assert result.exit_code == 2 and message in result.stderr and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.parametrize("which, model", [("onnx_pair", "gpt2"), ("onnx_neo", "neo")])
def test_batched_decoding_on_onnxruntime_equals_torch_batch_1(tiny, request, which, model):
    """Ragged rows on the graphs (2-D mask, per-row positions, re-aligned past) and, for the
    drafter graph, which has no padding mask, rows of each padding drafted apart: every prompt's
    tokens equal torch's at batch 1, for ar and specdiff."""
    from specdiff import generate

    ort = load_models("onnxruntime", request.getfixturevalue(which))
    prompts = ["x", "The quick brown fox jumps over the lazy dog. A journey of a thousand miles", "To be", "def",
               "Call me Ishmael. The sea was calm"]
    drafter = ort.get("drafter") or load_drafter(str(tiny.drafter))
    torch_target = load_target(str(model_dir(tiny, request, model)))
    for method in ("ar", "specdiff"):
        options = {"method": method, "max_new_tokens": 20, **({"gamma": 5, "steps": 2} if method == "specdiff" else {})}
        want = generate(prompts, target=torch_target, drafter=load_drafter(str(tiny.drafter)), batch_size=1, **options)
        got = generate(prompts, target=ort["target"], drafter=drafter, batch_size=4, **options)
        assert [o.tokens for o in got.outputs] == [o.tokens for o in want.outputs], method


def test_bench_runs_ar_and_specdiff_on_the_exported_graphs_beside_eager(tiny, onnx_pair, tmp_path):
    """`bench --artifacts`: onnxruntime rows of ar and specdiff (batch 1 and 3), their greedy tokens
    checked against eager ar, acceptance from the loop (no hooks on a graph)."""
    result = run_cli(["bench", "--target", str(tiny.gpt2), "--drafter", str(tiny.drafter), "--methods", "ar,specdiff",
                      "--artifacts", str(onnx_pair), "--batch-size", "1,3", "--gamma", "4", "--max-new-tokens", "8",
                      "--num-prompts", "3", "--truncate-prompt", "--repeats", "1", "--warmup", "0", "--check", "--no-plots",
                      "--out", str(tmp_path / "bench")])
    assert result.exit_code == 0, result.output
    rows = {r["label"]: r for r in json.loads((tmp_path / "bench" / "bench.json").read_text())["rows"]}
    for label in ("ar onnxruntime", "ar b=3 onnxruntime", "specdiff g=4 T=4 l2r onnxruntime"):
        assert rows[label]["matches_ar"] and rows[label]["runtime"] == "onnxruntime"
    assert rows["specdiff g=4 T=4 l2r onnxruntime"]["tau"] == rows["specdiff g=4 T=4 l2r"]["tau"]


@pytest.mark.slow  # one tiny export
def test_bench_runtime_without_artifacts_exports_into_the_cache_and_probes_its_width_invariance(tiny, tmp_path,
                                                                                             monkeypatch):
    monkeypatch.setenv("SPECDIFF_CACHE", str(tmp_path / "cache"))
    result = run_cli(["bench", "--target", str(tiny.gpt2), "--drafter", str(tiny.drafter), "--methods", "ar,specdiff",
                      "--runtime", "onnxruntime", "--gamma", "4", "--max-new-tokens", "12", "--num-prompts", "2",
                      "--truncate-prompt", "--repeats", "1", "--warmup", "0", "--check", "--no-plots",
                      "--out", str(tmp_path / "bench")])
    assert result.exit_code == 0, result.output
    assert "exporting" in result.stderr and len(list((tmp_path / "cache" / "onnx").iterdir())) == 1
    report = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert {"ar onnxruntime", "specdiff g=4 T=4 l2r onnxruntime"} <= {r["label"] for r in report["rows"]}
    assert report["check"]["passed"] and set(report["width_invariance"]) == {"torch", "onnxruntime"}
    assert not report["width_invariance"]["onnxruntime"]["flip"] and report["width_invariance"]["onnxruntime"]["gap"] < 1e-3


@pytest.mark.parametrize("kind", ["target", "drafter"])
def test_bench_refuses_graphs_of_another_model_with_the_same_tokenizer(tiny, onnx_pair, tmp_path, kind):
    """Graphs exported from another model with the same tokenizer were timed against the bench's
    own and reported a speed-up, exit 0 without --check (issue 25, fault 6): refused in one line,
    before any timing, by the identity (config + weights) the manifest records."""
    from specdiff.tools.drafter_init import init_drafter
    from tiny import as_trained, make_gpt2

    models = {"target": tiny.gpt2, "drafter": tiny.drafter}
    if kind == "target":
        models["target"] = make_gpt2(tmp_path / "other", tiny.tokenizer, scale=10, seed=5)
    else:
        models["drafter"] = as_trained(init_drafter(str(tiny.gpt2), tmp_path / "other", layers=1, dim=32, heads=2,
                                                    context=16, seed=5))
    result = run_cli(["bench", "--target", str(models["target"]), "--drafter", str(models["drafter"]),
                      "--methods", "ar,specdiff", "--artifacts", str(onnx_pair), "--num-prompts", "1",
                      "--max-new-tokens", "4", "--repeats", "1", "--warmup", "0", "--no-plots",
                      "--out", str(tmp_path / "b")])
    assert result.exit_code == 1 and result.stdout == "" and "Traceback" not in result.output
    exported_from = tiny.gpt2 if kind == "target" else tiny.drafter
    assert result.stderr.startswith(f"specdiff: error: {onnx_pair}: its {kind} was exported from '{exported_from}', "
                                    f"not from '{models[kind]}': their config or weights differ")
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "b").exists()


def test_an_export_without_recorded_identity_is_checked_by_its_file_hashes(tiny, onnx_pair, tmp_path):
    """Exports made before `identity` was recorded: the same identity from source.files; a manifest
    that records no source at all is refused (nothing to compare)."""
    from specdiff.artifacts import check_exported_from, open_artifacts

    copy = shutil.copytree(onnx_pair, tmp_path / "old")
    m = json.loads((copy / "manifest.json").read_text())
    del m["components"]["target"]["source"]["identity"]
    (copy / "manifest.json").write_text(json.dumps(m))
    check_exported_from(open_artifacts(copy), "target", str(tiny.gpt2))
    with pytest.raises(LoadError, match="its target was exported from"):
        check_exported_from(open_artifacts(copy), "target", str(tiny.neo))
    del m["components"]["target"]["source"]
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(LoadError, match=r"components.target.source does not record the model"):
        check_exported_from(open_artifacts(copy), "target", str(tiny.gpt2))


def test_bench_refuses_graphs_of_another_tokenizer_in_one_line(onnx_pair, tmp_path):
    result = run_cli(["bench", "--target", "demo-target", "--methods", "ar", "--artifacts", str(onnx_pair),
                      "--num-prompts", "1", "--repeats", "1", "--warmup", "0", "--out", str(tmp_path / "b")])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert "its target was exported from" in result.stderr and "not from 'demo-target'" in result.stderr
