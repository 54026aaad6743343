"""Input values that used to pass validation and then crash: extreme sampling values, a model that
produces NaN, seeds outside torch's range, prompts and JSONL that cannot be encoded or written back
as JSON, malformed models.yaml and export manifests, the meta device. Each is either a defined
result or one line on stderr (see cli_checks.assert_one_line_error)."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM

from specdiff.errors import RegistryError, SpecdiffError, UsageError
from specdiff.registry import load_registry
from specdiff.sampling import Sampling
from specdiff_cli.main import cli
from specdiff_cli.prompts import PromptRecord, format_record
from cli_checks import assert_one_line_error, invoke

NEG_INF = float("-inf")
LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, NEG_INF], [0.0, 3.0, 1.0, 3.0 - 1e-3, -2.0]])  # (2, 5)


def generate(tiny, *args, input=None):
    return invoke(["generate", "--target", str(tiny.gpt2), "--max-new-tokens", "6", *args], input)


# 3. sampling values that pass validation give a distribution, never a NaN


@pytest.mark.parametrize("sampling", [Sampling(1e-40), Sampling(1e-300), Sampling(1e-40, top_k=2),
                                      Sampling(1.0, top_p=1e-300), Sampling(1e-40, top_p=1e-300)])
def test_tiny_temperature_or_top_p_is_the_argmax(sampling):
    probs = sampling.probs(LOGITS)
    assert probs.tolist() == [[1, 0, 0, 0, 0], [0, 1, 0, 0, 0]]
    assert sampling.sample(probs, torch.Generator().manual_seed(0)).tolist() == [0, 1]


@pytest.mark.parametrize("temperature", [1e30, 1e300, 3.5e38])
def test_huge_temperature_is_uniform_over_the_finite_logits(temperature):
    probs = Sampling(temperature).probs(LOGITS)
    torch.testing.assert_close(probs, torch.tensor([[0.25] * 4 + [0.0], [0.2] * 5]))
    torch.testing.assert_close(Sampling(temperature, top_k=2).probs(LOGITS)[0], torch.tensor([0.5, 0.5, 0, 0, 0]))


@pytest.mark.parametrize("logit", [float("nan"), float("inf")])
def test_non_finite_logits_are_one_error(logit):
    bad = LOGITS.clone()
    bad[1, 2] = logit
    for sampling in (Sampling(), Sampling(1.0), Sampling(0.7, top_k=2, top_p=0.5)):
        with pytest.raises(SpecdiffError, match="non-finite logits"):
            sampling.probs(bad)
    with pytest.raises(SpecdiffError, match="non-finite logits"):
        Sampling(1.0).probs(torch.full((5,), NEG_INF))  # no token possible


@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1e-300])
def test_non_finite_or_negative_temperature_is_refused(value):
    with pytest.raises(UsageError, match="`temperature` must be a finite number >= 0"):
        Sampling(value)


@pytest.mark.parametrize("args", [["--temperature", "1e-40"], ["--temperature", "1", "--top-p", "1e-300"]])
def test_tiny_temperature_and_top_p_decode_as_greedy(tiny, args):
    for drafter in ([], ["--drafter", str(tiny.drafter)], ["--drafter", str(tiny.ar)]):
        greedy = generate(tiny, *drafter, "--prompt", "The sea")
        result = generate(tiny, *drafter, *args, "--prompt", "The sea")
        assert result.exit_code == 0 and result.stderr == "", result.stderr
        assert result.stdout == greedy.stdout


def test_huge_temperature_runs(tiny):
    result = generate(tiny, "--drafter", str(tiny.drafter), "--temperature", "1e300", "--prompt", "The sea")
    assert result.exit_code == 0 and result.stderr == "" and result.stdout.count("\n") == 1


@pytest.fixture(scope="module")
def nan_target(tiny, tmp_path_factory):
    """A copy of the tiny target whose final layer norm is NaN: every logit is NaN."""
    path = tmp_path_factory.mktemp("nan") / "target"
    shutil.copytree(tiny.gpt2, path)
    model = AutoModelForCausalLM.from_pretrained(str(path))
    with torch.no_grad():
        model.transformer.ln_f.weight.fill_(float("nan"))
    model.save_pretrained(str(path))
    return path


@pytest.mark.parametrize("args", [[], ["--temperature", "1"], ["--temperature", "0.8", "--top-k", "5", "--top-p", "0.9"]])
def test_a_model_producing_nan_is_one_line(tiny, nan_target, args):
    result = invoke(["generate", "--target", str(nan_target), "--drafter", str(tiny.drafter), *args, "--prompt", "Hi"])
    assert_one_line_error(result, 1, "a model produced non-finite logits (NaN or infinite)")


# 5. seeds outside torch's range, 11. the meta device


@pytest.mark.parametrize("seed", [str(2**64), str(2**63), "-1"])
def test_seed_out_of_range_is_refused_before_any_output(tiny, seed):
    assert_one_line_error(generate(tiny, f"--seed={seed}", "--prompt", "a", "--prompt", "b"), 2,
                          "seed must be an integer from 0 to 2**63 - 1, got ")


def test_largest_seed_serves_every_prompt(tiny):
    result = generate(tiny, f"--seed={2**63 - 1}", "--temperature", "1", "--prompt", "a", "--prompt", "b")
    assert result.exit_code == 0 and result.stdout.count("\n") == 2


def test_drafter_init_refuses_a_seed_out_of_range(tiny, tmp_path):
    result = invoke(["drafter", "init", "--target", str(tiny.gpt2), "--out", str(tmp_path / "d"), f"--seed={2**64}"])
    assert_one_line_error(result, 2, "seed must be an integer from 0 to 2**63 - 1")
    assert not (tmp_path / "d").exists()


def test_meta_device_is_refused(tiny):
    assert_one_line_error(generate(tiny, "--device", "meta", "--prompt", "a"), 2, "device 'meta'")


# 6. prompts that cannot be encoded, JSONL that could not be written back


JSONL = {  # stdin -> message
    "lone surrogate prompt": ('{"prompt": "\\ud800"}\n', "stdin line 1: not valid Unicode (lone surrogate '\\ud800')"),
    "lone surrogate field": ('{"prompt": "a"}\n{"prompt": "a", "x": ["\\udc00"]}\n', "stdin line 2: not valid Unicode"),
    "lone surrogate key": ('{"prompt": "a", "\\udfff": 1}\n', "stdin line 1: not valid Unicode"),
    "float overflow": ('{"prompt": "a", "n": 1e999999}\n', "stdin line 1: number 1e999999 is out of range"),
    "huge integer": ('{"prompt": "a", "n": ' + "1" * 100_000 + "}\n", "stdin line 1: integer of 100000 digits is too long"),
    "deep nesting": ('{"prompt": "a", "n": ' + "[" * 100000 + "}\n", "stdin line 1: nested too deeply"),
    "NaN": ('{"prompt": "a", "n": NaN}\n', "stdin line 1: NaN is not a JSON number"),
    "Infinity": ('{"prompt": "a", "n": Infinity}\n', "stdin line 1: Infinity is not a JSON number"),
    "-Infinity": ('{"prompt": "a", "n": [-Infinity]}\n', "stdin line 1: -Infinity is not a JSON number"),
}


@pytest.mark.parametrize("case", JSONL, ids=list(JSONL))
def test_jsonl_that_cannot_be_written_back_is_one_line(tiny, tmp_path, case):
    stdin, message = JSONL[case]
    assert_one_line_error(generate(tiny, "--jsonl", input=stdin), 2, message)


@pytest.mark.parametrize("prompt, message", [
    ("ok \udcff\udcfe", "--prompt 1 is not valid UTF-8 (byte 0xff at character 3)"),  # argv bytes b"ok \xff\xfe"
    ("\ud83d", "--prompt 1 is not valid Unicode (lone surrogate '\\ud83d' at character 0)"),
])
def test_prompt_that_is_not_utf8_is_one_line(tiny, prompt, message):
    assert_one_line_error(generate(tiny, "--prompt", prompt), 2, message)


@pytest.mark.parametrize("args, message", [
    (["--chat", "--system", "be \udcff"], "--system is not valid UTF-8 (byte 0xff at character 3)"),
    (["--chat", "--system", "\ud800"], "--system is not valid Unicode (lone surrogate '\\ud800' at character 0)"),
    (["--stop", "a", "--stop", "\udcfe"], "--stop string 2 is not valid UTF-8 (byte 0xfe at character 0)"),
    (["--stop", "x\udfff"], "--stop string 1 is not valid Unicode"),
])
def test_system_or_stop_that_is_not_utf8_is_one_line(tiny, args, message):
    """A system message the tokenizer cannot encode was a traceback; a stop string that is not text
    could never match, and was accepted silently."""
    assert_one_line_error(generate(tiny, *args, "--prompt", "x"), 2, message)


def test_jsonl_fields_are_written_back_as_valid_json(tiny):
    line = '{"prompt": "The sea", "id": ' + "7" * 4000 + ', "x": [1e308, -0.0, "\\u00e9\\ud83d\\ude00"]}\n'
    result = generate(tiny, "--jsonl", input=line)
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout, parse_constant=lambda name: pytest.fail(name))
    assert record["id"] == int("7" * 4000) and record["x"] == [1e308, -0.0, "é😀"]


def test_format_record_never_writes_nan():
    with pytest.raises(SpecdiffError, match="cannot write a result as JSON"):
        format_record(PromptRecord("a"), "b", {"tau": float("nan")})


# 7. malformed models.yaml and export manifests


def registry_file(tmp_path, text: str | bytes):
    path = tmp_path / "models.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


@pytest.mark.parametrize("text, message", [
    ("1: x\n", "models.yaml:1: key 1 is not text (quote it)"),
    ("models:\n  - name: a\n    kind: target\n    hub: x/a\n    1: b\n", "models.yaml:2: key 1 is not text"),
    ("models:\n  - {name: p, kind: pair, target: a, drafter: a, defaults: {2.5: 1}}\n", "key 2.5 is not text"),
    ("models:\n  - name: a\n    ? [x]\n    : 1\n", "not valid YAML: found unhashable key (line 3)"),
    (b"models:\n  - name: \xe9\n", "models.yaml: not valid UTF-8 (byte 18)"),
    ("models: " + "[" * 100000, "models.yaml: nested too deeply"),
    ("models: " + "{a: " * 100000, "models.yaml: nested too deeply"),
], ids=["top-level int key", "entry int key", "defaults float key", "list key", "not UTF-8", "deep lists",
        "deep mappings"])
def test_malformed_registry_is_one_line(tmp_path, text, message):
    path = registry_file(tmp_path, text)
    with pytest.raises(RegistryError) as info:
        load_registry(path)
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)
    result = CliRunner().invoke(cli, ["models"], env={"SPECDIFF_MODELS": str(path)})
    assert_one_line_error(result, 2, message)


def test_a_registry_or_manifest_that_never_ends_is_one_line(tmp_path, monkeypatch):
    """SPECDIFF_MODELS=/dev/zero was read whole into a MemoryError (issue 25, fault 13); so would
    a manifest.json or config.json that is a huge (here: sparse) file."""
    from specdiff import reading
    from specdiff.artifacts import open_artifacts
    from specdiff.errors import LoadError
    from specdiff.nets.checkpoint import read_json

    result = CliRunner().invoke(cli, ["models"], env={"SPECDIFF_MODELS": "/dev/zero"})
    assert_one_line_error(result, 2, "cannot read model registry /dev/zero: larger than 64 MiB")
    monkeypatch.setattr(reading, "MAX_SMALL_FILE", 2**20)
    monkeypatch.setattr(reading.read_small_text, "__defaults__", (2**20,))
    for name in ("manifest.json", "config.json"):
        with open(tmp_path / name, "wb") as f:
            f.truncate(2**20 + 1)
    with pytest.raises(LoadError, match="manifest.json: cannot read the manifest: larger than 1 MiB"):
        open_artifacts(tmp_path)
    with pytest.raises(LoadError, match="config.json: unreadable config: .*larger than 1 MiB"):
        read_json(tmp_path / "config.json")


def test_registry_path_that_is_missing_says_so(tiny, tmp_path):
    path = registry_file(tmp_path, """
        models:
          - name: gone
            kind: target
            path: no/such/dir
          - name: file
            kind: drafter
            path: models.yaml
    """)
    env = {"SPECDIFF_MODELS": str(path)}
    result = CliRunner().invoke(cli, ["generate", "--target", "gone", "--prompt", "a"], env=env)
    assert_one_line_error(result, 1, f"models.yaml entry 'gone': directory {tmp_path}/no/such/dir does not exist")
    assert "hub" not in result.stderr
    result = CliRunner().invoke(cli, ["generate", "--target", str(tiny.gpt2), "--drafter", "file",
                                                            "--prompt", "a"], env=env)
    assert_one_line_error(result, 1, f"models.yaml entry 'file': directory {path} is not a directory")


GOOD_MANIFEST = {
    "format": "specdiff-export", "format_version": 2, "dtype": "fp32",
    "tokenizer": {"dir": "tokenizer", "vocab_size": 300, "vocab_sha256": "0" * 64},
    "files": {"target.onnx": "0" * 64},
    "components": {"target": {"graph": "target.onnx", "engine": None, "io": {  # the names a 2-layer target's graph has
        "inputs": [{"name": n} for n in ("input_ids", "attention_mask", "position_ids", "past_key_values.0.key",
                                         "past_key_values.0.value", "past_key_values.1.key", "past_key_values.1.value")],
        "outputs": [{"name": n} for n in ("logits", "present.0.key", "present.0.value", "present.1.key",
                                          "present.1.value")]},
                              "model": {"name": "t", "vocab_size": 300, "max_length": 128, "eos_token_id": 299,
                                        "layers": 2, "kv_heads": 2, "head_dim": 16}}},
}


def _with(path: str, value):
    """GOOD_MANIFEST with the field at a dotted path replaced (None: removed)."""
    manifest = json.loads(json.dumps(GOOD_MANIFEST))
    *parents, last = path.split(".")
    record = manifest
    for key in parents:
        record = record[key]
    if value is None:
        del record[last]
    else:
        record[last] = value
    return json.dumps(manifest).encode()


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe{}", "unreadable manifest (not UTF-8: byte 0)"),
    (b'{"format": ' + b"1" * 5000 + b"}", "unreadable manifest (Exceeds the limit"),
    (b"[" * 100000, "unreadable manifest (maximum recursion depth exceeded"),
    (_with("dtype", None), "malformed manifest: dtype is missing"),
    (_with("files", ["target.onnx"]), "malformed manifest: files must be an object, got an array"),
    (_with("files", {"target.onnx": 5}), "the sha256 of 'target.onnx' must be a string"),
    (_with("files", {"../../etc/passwd": "0"}), "'../../etc/passwd' is not a path inside the export directory"),
    (_with("tokenizer", "tokenizer"), "malformed manifest: tokenizer must be an object, got a string"),
    (_with("tokenizer.dir", 5), "malformed manifest: tokenizer.dir must be a string, got an integer"),
    (_with("components", {"teacher": {}}), "unknown component 'teacher'"),
    (_with("components.target.model.vocab_size", True), "components.target.model.vocab_size must be an integer, got a boolean"),
    (_with("components.target.model.layers", None), "components.target.model.layers is missing"),
    (_with("components.target.engine", {"file": 1}), "components.target.engine.file must be a string"),
    (_with("components.target.io.inputs", [{"nom": "x"}]), "components.target.io.inputs[0].name is missing"),
], ids=lambda x: x[:40] if isinstance(x, str) else "")
def test_malformed_manifest_is_one_line(tmp_path, content, message):
    (tmp_path / "manifest.json").write_bytes(content)
    result = invoke(["generate", "--runtime", "onnxruntime", "--artifacts", str(tmp_path), "--prompt", "x"])
    assert_one_line_error(result, 1, str(tmp_path / "manifest.json"), message)


def test_good_manifest_passes_the_schema(tmp_path):
    from specdiff.artifacts import read_manifest

    (tmp_path / "manifest.json").write_bytes(_with("dtype", "fp32"))
    assert read_manifest(tmp_path) == GOOD_MANIFEST


def test_library_errors_name_parameters_not_flags():
    for kwargs in ({"temperature": -1}, {"top_k": -1}, {"top_p": 2}):
        with pytest.raises(UsageError) as info:
            Sampling(**kwargs)
        assert "--" not in str(info.value) and list(kwargs)[0] in str(info.value)


def test_the_cli_shows_parameters_as_the_flags_that_set_them():
    from specdiff_cli.flags import flag_names, to_flags

    flags = flag_names(cli)
    assert to_flags("`max_batch` must be >= 1; export again with `fmt` tensorrt", flags) == \
        "--max-batch must be >= 1; export again with --format tensorrt"
    assert to_flags("`others` '' is empty", flags) == "--also-drafter '' is empty"


def test_the_cli_renames_only_its_own_parameters_not_torchs():
    """torch's weights-only refusal names its own `weights_only` and advises setting it False: shown
    as a --weights-only flag, that was advice to pass a flag that does not exist (and to run code)."""
    from specdiff_cli.flags import flag_names, to_flags

    torchs = "Re-running `torch.load` with `weights_only` set to `False` will likely succeed"
    assert to_flags(torchs, flag_names(cli)) == torchs


# 13. endless or huge prompt input: one line, before the input is read whole or any model loads


@pytest.fixture
def small_input_bound(monkeypatch):
    """MAX_INPUT_BYTES at 1 MiB: the same paths as 256 MiB, without reading 256 MiB in a test."""
    from specdiff_cli import prompts

    monkeypatch.setattr(prompts, "MAX_INPUT_BYTES", 2**20)
    monkeypatch.setattr("specdiff.loading.load_target", lambda *a, **k: pytest.fail("a model was loaded"))


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_an_endless_prompt_file_is_one_line(tiny, small_input_bound, command):
    """/dev/zero as --prompt-file was read whole: a MemoryError traceback (issue 25, fault 13)."""
    result = invoke([command, "--target", str(tiny.gpt2), "--prompt-file", "/dev/zero"])
    assert_one_line_error(result, 2, "/dev/zero holds more than 1 MiB of prompts")


def test_a_huge_prompt_file_is_one_line(tiny, small_input_bound, tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(2**20 + 1)  # sparse: refused by its size
    assert_one_line_error(generate(tiny, "--prompt-file", str(big)), 2, "holds more than 1 MiB of prompts")


def test_an_endless_stdin_is_one_line(tiny, small_input_bound):
    with open("/dev/zero", "rb") as zero:
        assert_one_line_error(generate(tiny, input=zero), 2, "stdin holds more than 1 MiB of prompts")


def test_a_prompt_file_at_the_bound_is_read(small_input_bound, tmp_path):
    from specdiff_cli.prompts import read_prompts

    path = tmp_path / "at-the-bound.txt"
    path.write_bytes(b"a" * (2**20 - 2) + b"\nb")  # exactly MAX_INPUT_BYTES
    assert [r.prompt for r in read_prompts((), str(path), None, "text")] == ["a" * (2**20 - 2), "b"]


@pytest.mark.parametrize("fmt", ["auto", "text"])
def test_an_endless_line_for_output_dir_is_one_line_before_ray(tiny, small_input_bound, tmp_path, monkeypatch,
                                                               fmt):
    """--output-dir reads its file line by line; one line of /dev/zero never ends."""
    import specdiff.ray as sray

    monkeypatch.setattr(sray, "init", lambda *a, **k: pytest.fail("Ray was started"))
    result = invoke(["generate", "--target", str(tiny.gpt2), "--prompt-file", "/dev/zero", "--input-format", fmt,
                     "--ray", "local", "--output-dir", str(tmp_path / "out")])
    assert_one_line_error(result, 2, "/dev/zero", "is longer than 1 MiB (no line end in sight)")
    assert not (tmp_path / "out").exists()  # made only once the file is known good
