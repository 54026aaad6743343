"""Every bad input of `specdiff generate`: one line on stderr starting "specdiff: error:", exit 2 for
a usage error and 1 for a runtime error, no traceback, nothing on stdout and no file from -o."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

import specdiff
from specdiff.errors import ContextWindowWarning
from specdiff.tools.drafter_init import init_drafter
from specdiff_cli.main import cli
from cli_checks import assert_one_line_error, invoke
from tiny import make_dflash, with_defaults


def permuted_copy(src: Path, dst: Path) -> Path:
    """A copy of the model at src whose tokenizer swaps the ids of two ordinary tokens: the same
    size and the same tokens, a different token-to-id map."""
    shutil.copytree(src, dst)
    spec = json.loads((dst / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (dst / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return dst


def bigger_vocab_copy(src: Path, dst: Path) -> Path:
    """A copy of the model at src whose tokenizer has one token more (the padded head still fits)."""
    shutil.copytree(src, dst)
    tokenizer = AutoTokenizer.from_pretrained(str(src))
    tokenizer.add_tokens(["<extra>"])
    tokenizer.save_pretrained(str(dst))
    return dst


def truncated_copy(src: Path, dst: Path) -> Path:
    """A copy of the model at src with only the first half of its weights file."""
    shutil.copytree(src, dst)
    weights = dst / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return dst


@pytest.fixture(scope="module")
def models(tiny, tmp_path_factory) -> dict[str, str]:
    """Placeholders of the cases below -> paths: the tiny models and broken variants of them."""
    root = tmp_path_factory.mktemp("bad")
    permuted = permuted_copy(tiny.gpt2, root / "permuted")
    bigger = bigger_vocab_copy(tiny.gpt2, root / "bigger")
    small = dict(layers=1, dim=32, heads=2, context=16)
    (root / "empty").mkdir()
    broken_config = shutil.copytree(tiny.drafter, root / "broken-config")
    (broken_config / "config.json").write_text("{not json", encoding="utf-8")
    paths = {
        "gpt2": tiny.gpt2, "ar": tiny.ar, "drafter": tiny.drafter, "empty": root / "empty",
        "nothing": root / "nothing", "permuted_ar": permuted,
        "permuted_drafter": init_drafter(str(permuted), root / "permuted-drafter", **small),
        "bigger_drafter": init_drafter(str(bigger), root / "bigger-drafter", **small),
        "truncated_drafter": truncated_copy(tiny.drafter, root / "truncated-drafter"),
        "truncated_target": truncated_copy(tiny.gpt2, root / "truncated-target"),
        "broken_config": broken_config, "dflash": make_dflash(root / "dflash", Path(tiny.gpt2), seed=6),
        "gamma_drafter": with_defaults(Path(tiny.drafter), root / "gamma-drafter", {"gamma": 200}),
    }
    return {k: str(v) for k, v in paths.items()}


def long_prompt(tokenizer, n_tokens: int) -> str:
    text = "The sea was calm and the sky was grey and blue. " * n_tokens
    assert len(tokenizer.encode(text)) > n_tokens
    return text


def fail(tmp_path: Path, args: list[str], code: int, *fragments: str, input=None) -> str:
    """Run `specdiff generate ARGS -o FILE` and check the error; -o must leave nothing behind.
    -> the error line."""
    out = tmp_path / "out"
    out.mkdir()
    result = invoke(["generate", *args, "-o", str(out / "result.txt")], input)
    assert_one_line_error(result, code, *fragments)
    assert list(out.iterdir()) == []
    return result.stderr


def expand(args: str, models: dict[str, str]) -> list[str]:
    return [word.format(**models) for word in args.split()]


USAGE = {  # the request itself is wrong: options, names, combinations
    "gamma < 1": ("--drafter {drafter} --gamma 0", "--gamma must be an integer >= 1 or auto, got 0"),
    "gamma auto for ar": ("--method ar --gamma auto", "method 'ar' does not use --gamma; it reads none of the draft"),
    "steps < 1": ("--drafter {drafter} --steps 0", "--steps must be an integer >= 1, got 0"),
    "max-new-tokens < 1": ("--max-new-tokens 0", "--max-new-tokens must be an integer >= 1, got 0"),
    "temperature < 0": ("--temperature -0.5", "--temperature must be a finite number >= 0 (0 = greedy), got -0.5"),
    "temperature nan": ("--temperature nan", "--temperature must be a finite number >= 0"),
    "top-p 0": ("--top-p 0", "--top-p must be a number in (0, 1], got 0.0"),
    "top-p > 1": ("--top-p 1.5", "--top-p must be a number in (0, 1], got 1.5"),
    "top-k < 0": ("--top-k -1", "--top-k must be an integer >= 0"),
    "gamma not a number": ("--gamma x", "Invalid value for '--gamma'"),
    "unknown option": ("--gama 3", "No such option '--gama'", "Did you mean '--gamma'"),
    "unknown schedule": ("--schedule sideways", "Invalid value for '--schedule'"),
    "unknown model name": ("--target no-such-model", "unknown model 'no-such-model'", "gpt2-xl"),
    "missing path": ("--target {nothing}", "not in models.yaml", "not a directory"),
    "missing drafter path": ("--drafter {nothing}", "unknown model"),
    "unknown pair": ("--pair no-such-pair", "unknown pair 'no-such-pair'"),
    "a target is not a pair": ("--pair gpt2", "'gpt2' is a target in models.yaml, not a pair"),
    "specdiff without a drafter": ("--method specdiff", "method 'specdiff' needs a diffusion drafter"),
    "specdiff with an AR drafter": ("--drafter {ar} --method specdiff", "needs a diffusion drafter; the --drafter "
                                    "given", "is an autoregressive (causal LM) drafter: use --method spec-ar"),
    "spec-ar with a diffusion drafter": ("--drafter {drafter} --method spec-ar", "needs an autoregressive",
                                         "is a diffusion drafter: use --method specdiff, which drafts with it"),
    "specdiff with a DFlash drafter": ("--drafter {dflash} --method specdiff", "method 'specdiff' needs a diffusion "
                                       "drafter; the --drafter given", "is a DFlash drafter: use --method dflash"),
    "schedule on dflash": ("--drafter {dflash} --method dflash --schedule l2r", "method 'dflash' does not use "
                           "--schedule; it reads --gamma (an integer or auto), --drafts, --draft-temperature"),
    "dflash compiled": ("--drafter {dflash} --method dflash --compile", "a compiled target does not keep: drop "
                        "--compile"),
    "recorded gamma past the context window": ("--drafter {gamma_drafter}", "gamma 200 (recorded by the drafter; "
                                               "give --gamma to change it) does not fit the target's context window"),
    "greedy acceptance when sampling": ("--drafter {drafter} --acceptance greedy --temperature 1",
                                        "greedy acceptance needs --temperature 0"),
    "confidence with standard when sampling": (
        "--drafter {drafter} --schedule confidence --acceptance standard --temperature 1",
        "DiffusionProposer(schedule=confidence, steps=4) declares only greedy, match, select exact",
        "would not be exact", "--acceptance match"),
    "drafts < 1": ("--drafter {drafter} --drafts 0", "--drafts must be an integer >= 1, got 0"),
    "multi with confidence when sampling": (
        "--drafter {drafter} --schedule confidence --drafts 4 --acceptance multi --temperature 1",
        "multi acceptance would not be exact", "--acceptance select"),
    "standard over several drafts": ("--drafter {drafter} --drafts 4 --acceptance standard --temperature 1",
                                     "standard acceptance checks a single draft; with --drafts > 1 use greedy, select, multi"),
    "multi over one draft": ("--drafter {drafter} --acceptance multi --temperature 1",
                             "multi acceptance chooses among candidate drafts: it needs --drafts > 1"),
    "draft temperature with one draft": ("--drafter {drafter} --draft-temperature 1.5", "it needs --drafts > 1"),
    "draft temperature 0": ("--drafter {drafter} --drafts 2 --draft-temperature 0",
                            "--draft-temperature must be a finite number > 0, got 0.0"),
    "several drafts with spec-ar": ("--drafter {ar} --method spec-ar --drafts 2",
                                    "method 'spec-ar' drafts one candidate; --drafts > 1 needs specdiff or dflash"),
    "oneshot with several steps": ("--drafter {drafter} --schedule oneshot --steps 3", "exactly 1 step"),
    "unknown device": ("--device nonsense", "unknown device 'nonsense'"),
    "drafts past free memory": ("--drafter {drafter} --drafts 100000000", "--batch-size 8, --drafts 100000000, "
                                "--gamma 8: one decoding step needs about", "GB free on cpu; lower them"),
    "repetition penalty past float32": ("--repetition-penalty 1e-300",  # accepted, then blamed on the weights
                                        "--repetition-penalty must be a finite number from 1e-30 to 1e+30", "1e-300"),
    "threshold on ar": ("--threshold 0.5", "method 'ar' does not use --threshold; it reads none of the draft"),
    "schedule on spec-ar": ("--drafter {ar} --schedule confidence", "method 'spec-ar' does not use --schedule; "
                            "it reads --gamma"),
    "steps on spec-ar": ("--drafter {ar} --steps 2", "method 'spec-ar' does not use --steps"),
    "spec-ar on a graph runtime": ("--drafter {ar} --method spec-ar --runtime onnxruntime",
                                   "method 'spec-ar' drafts with an autoregressive (causal LM) drafter, which runs in torch only "
                                   "(--runtime torch)"),
    "remasking on specdiff": ("--drafter {drafter} --remasking dynamic", "method 'specdiff' does not use --remasking"),
    "gamma on ar": ("--method ar --gamma 4", "method 'ar' does not use --gamma"),
    "gamma past the context window": ("--drafter {drafter} --gamma 100000",
                                      "--gamma 100000 does not fit the target's context window (128 tokens)"),
    "tree past the context window": ("--drafter {drafter} --steps 1 --gamma 4 --tree 1000000000",
                                     "--tree 1000000000 does not fit the target's context window (128 tokens)"),
}


@pytest.mark.parametrize("case", USAGE, ids=list(USAGE))
def test_usage_errors_exit_2(tmp_path, models, case):
    """... and every flag a message names, unquoted (click quotes a flag it does not know), is one
    that generate has: dflash "reads --adaptive" named none."""
    args, *fragments = USAGE[case]
    target = [] if "--target" in args or "--pair" in args else ["--target", models["gpt2"]]
    stderr = fail(tmp_path, [*target, *expand(args, models), "--prompt", "Hello"], 2, *fragments)
    flags = {flag for param in cli.commands["generate"].params for flag in param.opts}
    assert set(re.findall(r"(?<!')--[a-z][a-z-]*", stderr)) <= flags, stderr


def test_the_memory_check_sizes_the_rows_the_prompts_fill_not_the_batch_size(models):
    """5 prompts at --batch-size 100000000000 are 5 rows: they were refused as a step of 1e11 rows."""
    args = ["generate", "--target", models["gpt2"], "--drafter", models["drafter"], "--max-new-tokens", "2"]
    result = invoke([*args, "--batch-size", "100000000000"], input="a\nb\nc\nd\ne\n")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("\n") == 5


@pytest.mark.parametrize("given, flag", [(["--target", ""], "--target"), (["--pair", "demo", "--drafter", ""], "--drafter")])
def test_an_empty_model_name_is_refused_not_read_as_here_or_as_the_pairs(tmp_path, given, flag):
    """--target '' was read as the current directory ("." : no model here); --drafter '' beside a pair
    was taken for the pair's drafter, and ran."""
    fail(tmp_path, [*given, "--prompt", "Hello"], 2, f"{flag} is empty: give a models.yaml name, a directory or a hub id")


RUNTIME = {  # the request is fine, the files it names are not
    "directory without a model": ("--target {empty}", "no model here (config.json not found)"),
    "drafter directory without a model": ("--drafter {empty}", "no model here"),
    "tokenizers disagree (diffusion drafter)": (
        "--drafter {permuted_drafter}",
        "drafter and target tokenizers disagree on 2 token(s) (id in target/drafter: '§' 100/101, '¨' 101/100)"),
    "tokenizers disagree (AR drafter)": ("--drafter {permuted_ar}", "tokenizers disagree"),
    "vocabulary sizes differ": ("--drafter {bigger_drafter}",
                                "drafter vocabulary has 301 tokens, target's tokenizer 300"),
    "truncated drafter weights": ("--drafter {truncated_drafter}", "model.safetensors"),
    "truncated target weights": ("--target {truncated_target}", "cannot load model from"),
    "drafter config not JSON": ("--drafter {broken_config}", "config.json"),
}


@pytest.mark.parametrize("case", RUNTIME, ids=list(RUNTIME))
def test_runtime_errors_exit_1(tmp_path, models, case):
    args, *fragments = RUNTIME[case]
    target = [] if "--target" in args else ["--target", models["gpt2"]]
    fail(tmp_path, [*target, *expand(args, models), "--prompt", "Hello"], 1, *fragments)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_missing_cuda_exit_1(tmp_path, models):
    fail(tmp_path, ["--target", models["gpt2"], "--device", "cuda", "--prompt", "Hello"], 1,
         "device 'cuda' is not usable")


@pytest.mark.parametrize("case", [
    "--schedule confidence",
    "--schedule confidence --acceptance greedy",
    "--schedule confidence --acceptance match --temperature 1",
    "--schedule confidence --temperature 1",  # match by default
    "--schedule l2r --acceptance standard --temperature 1",
    "--schedule confidence --drafts 3 --temperature 1",  # select by default
    "--schedule l2r --drafts 2 --acceptance multi --temperature 1 --draft-temperature 1.5",
])
def test_exact_schedule_acceptance_combinations_are_allowed(models, case):
    args = ["generate", "--target", models["gpt2"], "--drafter", models["drafter"], *expand(case, models),
            "--prompt", "Hello", "--max-new-tokens", "4"]
    result = invoke(args)
    assert result.exit_code == 0 and result.stderr == "", result.stderr
    assert result.stdout.count("\n") == 1


PROMPTS = {  # (args, stdin, fragments)
    "empty --prompt": (["--prompt", ""], None, ["--prompt 1 is empty"]),
    "blank second --prompt": (["--prompt", "a", "--prompt", "   "], None, ["--prompt 2 is empty"]),
    "no prompts on stdin": ([], "", ["stdin holds no prompts"]),
    "only blank lines": ([], "\n  \n\r\n", ["stdin holds no prompts"]),
    "--whole, blank": (["--whole"], " \n", ["stdin holds no prompts"]),
    "--whole and --prompt": (["--whole", "--prompt", "a"], None, ["--whole reads", "each --prompt already is one"]),
    "--whole as JSONL": (["--whole", "--input-format", "jsonl"], "a\n", ["not go with --input-format jsonl"]),
    "--raw and --jsonl": (["--raw", "--jsonl"], "a\n", ["--raw and --separator write plain text"]),
    "--separator and --jsonl": (["--separator", "--", "--jsonl"], "a\n", ["not go with --jsonl"]),
    "empty JSONL prompt": ([], '{"prompt": "a"}\n{"prompt": ""}\n', ["stdin line 2: empty prompt"]),
    "malformed JSONL line": ([], '{"id": 1, "prompt": "a"}\n\n{"id": 2, "prompt": "b"\n{"prompt": "c"}\n',
                             ["stdin line 3: malformed JSON"]),
    "JSONL line without prompt": ([], '{"prompt": "a"}\n{"id": 2}\n',
                                  ['stdin line 2: expected an object with a string "prompt"']),
    "JSONL prompt not a string": ([], '{"prompt": 5}\n', ['stdin line 1: expected an object']),
    "text read as JSONL": (["--input-format", "jsonl"], "Hello\n", ["stdin line 1: malformed JSON"]),
    "invalid UTF-8 on stdin": ([], b"fine\n\xff\xfebad\n", ["stdin is not valid UTF-8 (byte 5)"]),
    "--prompt and --prompt-file": (["--prompt", "a", "--prompt-file", "-"], "b\n", ["not both"]),
}


@pytest.mark.parametrize("case", PROMPTS, ids=list(PROMPTS))
def test_bad_prompts_exit_2(tmp_path, models, case):
    args, stdin, fragments = PROMPTS[case]
    fail(tmp_path, ["--target", models["gpt2"], *args], 2, *fragments, input=stdin)


@pytest.mark.parametrize("content, message", [
    (b"\x80abc\n", "{file} is not valid UTF-8 (byte 0)"),
    (b'{"prompt": "a"}\n{"prompt": "b",}\n', "{file} line 2: malformed JSON"),
    (None, "cannot read prompt file {file}: No such file or directory"),
])
def test_bad_prompt_files_exit_2(tmp_path, models, content, message):
    file = tmp_path / "prompts.txt"
    if content is not None:
        file.write_bytes(content)
    fail(tmp_path, ["--target", models["gpt2"], "--prompt-file", str(file)], 2, message.format(file=file))


def test_prompt_over_the_context_window(tmp_path, tiny, models):
    prompt = long_prompt(tiny.tokenizer, 128)  # the tiny targets see 128 positions
    fail(tmp_path, ["--target", models["gpt2"], "--prompt", "Hello", "--prompt", prompt], 2,
         "prompt 2 is", "the target's context window is 128", "--truncate-prompt")
    result = invoke(["generate", "--target", models["gpt2"], "--prompt", prompt, "--truncate-prompt",
                     "--max-new-tokens", "5", "--jsonl"])
    assert result.exit_code == 0 and result.stderr == ""
    assert json.loads(result.stdout)["metrics"]["new_tokens"] == 5


def test_max_new_tokens_past_the_context_window_warns_once(tiny, models):
    """Past the window, generation still runs and stops there; the CLI says so in one line, once
    for all prompts; the library warns with its own category."""
    args = ["generate", "--target", models["gpt2"], "--prompt", "Hello", "--prompt", "The sea", "--jsonl"]
    result = invoke([*args, "--max-new-tokens", "200"])
    assert result.exit_code == 0, result.stderr
    assert result.stderr.startswith("specdiff: warning: --max-new-tokens 200 does not fit in the target's "
                                    "context window (128 tokens) after 2 of 2 prompt(s)")
    assert result.stderr.count("\n") == 1
    for line in result.stdout.splitlines():
        metrics, prompt = json.loads(line)["metrics"], json.loads(line)["prompt"]
        assert metrics["stop_reason"] == "context"
        assert metrics["new_tokens"] == 128 - len(tiny.tokenizer.encode(prompt))
    assert invoke([*args, "--max-new-tokens", "100"]).stderr == ""  # "Hello" + 100 fits in 128
    with pytest.warns(ContextWindowWarning, match="after 1 of 1 prompt"):
        specdiff.generate("Hello", target=models["gpt2"], max_new_tokens=200)


def test_error_after_the_output_file_opened_keeps_the_old_file(tmp_path, tiny, models):
    """Prompts are tokenized when generation starts, after -o has its temporary file: an error then
    must leave the existing file as it was and no temporary file beside it."""
    out = tmp_path / "result.txt"
    out.write_text("old results\n", encoding="utf-8")
    result = invoke(["generate", "--target", models["gpt2"], "--prompt", "Hello",
                     "--prompt", long_prompt(tiny.tokenizer, 128), "-o", str(out)])
    assert_one_line_error(result, 2, "context window")
    assert out.read_text(encoding="utf-8") == "old results\n"
    assert list(tmp_path.iterdir()) == [out]


def test_unwritable_output(tmp_path, models):
    args = ["generate", "--target", models["gpt2"], "--prompt", "Hello", "-o"]
    missing = tmp_path / "no" / "such.txt"
    assert_one_line_error(invoke([*args, str(missing)]), 2, f"cannot write {missing}: No such file or directory")
    assert_one_line_error(invoke([*args, str(tmp_path)]), 2, f"cannot write {tmp_path}: it is a directory")
    assert list(tmp_path.iterdir()) == []  # no temporary file left
