"""The Python API checks a request's values before it reads models.yaml or loads any model
(specdiff.requests), and takes pathlib.Path wherever it takes a path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import specdiff
import specdiff.generation.planning as generation
from specdiff.errors import InputError, SpecdiffError, UsageError
from specdiff.generation import plan
from specdiff.loading import load_drafter, load_target
from specdiff.registry import as_registry, load_registry
from specdiff.requests import check_prompts

BAD = {  # generate() keyword arguments -> the start of the error
    "prompts None": ({"prompts": None}, "prompts must be a string or a list of strings, got None"),
    "prompts int": ({"prompts": 5}, "prompts must be a string or a list of strings, got int"),
    "prompts bytes": ({"prompts": b"hi"}, "prompts must be a string or a list of strings, got bytes"),
    "prompt not str": ({"prompts": ["a", 1]}, "prompt 2 must be a string, got int"),
    "prompt surrogate": ({"prompts": ["a\ud800"]}, "prompt 1 is not valid Unicode (lone surrogate '\\ud800' at character 1)"),
    "seed str": ({"seed": "x"}, "seed must be an integer from 0 to 2**63 - 1, got 'x'"),
    "seed float": ({"seed": 1.5}, "seed must be an integer from 0 to 2**63 - 1, got 1.5"),
    "seed bool": ({"seed": True}, "seed must be an integer from 0 to 2**63 - 1, got True"),
    "seed 2**64": ({"seed": 2**64}, f"seed must be an integer from 0 to 2**63 - 1, got {2**64}"),
    "seed negative": ({"seed": -1}, "seed must be an integer from 0 to 2**63 - 1, got -1"),
    "seed 5000 digits": ({"seed": 10**5000}, "got an integer of about 5001 digits"),
    "temperature str": ({"temperature": "hot"}, "`temperature` must be a finite number >= 0 (0 = greedy), got 'hot'"),
    "temperature inf": ({"temperature": float("inf")}, "`temperature` must be a finite number >= 0 (0 = greedy), got inf"),
    "top_k float": ({"top_k": 2.5}, "`top_k` must be an integer >= 0 (0 disables it), got 2.5"),
    "top_p str": ({"top_p": "0.9"}, "`top_p` must be a number in (0, 1], got '0.9'"),
    "max_new_tokens str": ({"max_new_tokens": "8"}, "`max_new_tokens` must be an integer >= 1, got '8'"),
    "max_new_tokens 0": ({"max_new_tokens": 0}, "`max_new_tokens` must be an integer >= 1, got 0"),
    "gamma float": ({"gamma": 2.0}, "`gamma` must be an integer >= 1 or auto, got 2.0"),
    "gamma word": ({"gamma": "banana"}, "`gamma` must be an integer >= 1 or auto, got 'banana'"),
    "adaptive not a flag": ({"adaptive": "yes"}, "`adaptive` must be True or False, got 'yes'"),
    "device int": ({"device": 3}, "`device` must be a string such as 'cpu' or 'cuda:1', got int"),
    "device None": ({"device": None}, "`device` must be a string such as 'cpu' or 'cuda:1', got None"),
    "target int": ({"target": 5}, "`target` must be a models.yaml name, a directory, a hub id or a loaded target"),
    "drafter list": ({"drafter": ["d"]}, "`drafter` must be a models.yaml name, a directory, a hub id or a loaded"),
    "schedule list": ({"schedule": ["l2r"]}, "`schedule` must be a name (a string), got list"),
    "method list": ({"method": ["ar"]}, "`method` must be a name (a string), got list"),
    "chat str": ({"chat": "yes"}, "`chat` must be True or False, got 'yes'"),
    "repetition_penalty 1e-300": ({"repetition_penalty": 1e-300}, "`repetition_penalty` must be a finite number from"),
}


@pytest.fixture
def nothing_loads(monkeypatch):
    """Fail the test if generate() / plan() get as far as models.yaml or a model."""
    def refuse(*args, **kwargs):
        pytest.fail("a bad request reached models.yaml or a model")
    def registry_unread(registry):  # plan's models.yaml: a misused argument is still refused
        if registry is None or isinstance(registry, (str, os.PathLike)):
            refuse()
        return as_registry(registry)
    for name in ("load_target", "load_drafter"):
        monkeypatch.setattr(generation, name, refuse)
    monkeypatch.setattr(generation, "as_registry", registry_unread)


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_values_raise_before_anything_loads(nothing_loads, case):
    kwargs, message = BAD[case]
    calls = [lambda: specdiff.generate(**{"prompts": ["Hello"], "target": "gpt2", **kwargs})]
    if "prompts" not in kwargs:
        calls.append(lambda: plan(**{"target": "gpt2", **kwargs}))
    for call in calls:
        with pytest.raises(UsageError) as info:
            call()
        assert message in str(info.value) and "--" not in str(info.value), str(info.value)


def test_error_types():
    assert issubclass(UsageError, SpecdiffError)
    with pytest.raises(InputError):
        check_prompts(["\udcff"])
    assert check_prompts("one") == ["one"] and check_prompts(p for p in ("a", "b")) == ["a", "b"]


def test_paths_are_accepted_wherever_a_path_is(tiny, tmp_path):
    target, drafter = Path(tiny.gpt2), Path(tiny.drafter)
    expected = specdiff.generate("The sea", target=str(target), drafter=str(drafter), max_new_tokens=4).texts
    assert specdiff.generate("The sea", target=target, drafter=drafter, max_new_tokens=4).texts == expected
    p = plan(target=target, drafter=drafter, device=torch.device("cpu"))
    assert p.method.name == "specdiff" and p.target.name == str(target)
    assert load_target(target).name == str(target) and load_drafter(Path(tiny.ar)).source == str(tiny.ar)
    registry = tmp_path / "models.yaml"
    registry.write_text(f"models:\n  - name: t\n    kind: target\n    path: {tiny.gpt2}\n", encoding="utf-8")
    assert load_target("t", registry=load_registry(registry)).name == "t"


@pytest.mark.parametrize("typo, hint", [("temprature", "did you mean `temperature`?"),
                                         ("max_tokens", "did you mean `max_new_tokens`?"),
                                         ("xyzzy", "known: adaptive, batch_size, draft_temperature")])
def test_unknown_keywords_are_refused_by_plan_and_stream(nothing_loads, typo, hint):
    """plan() and stream() take settings as **options: a misspelt one used to be ignored (greedy
    output where sampling was asked for)."""
    for call in (lambda: plan(target="gpt2", **{typo: 0.8}),
                 lambda: list(specdiff.stream("Hello", target="gpt2", **{typo: 0.8}))):
        with pytest.raises(UsageError, match=f"unknown option `{typo}`") as info:
            call()
        assert hint in str(info.value)


def test_stream_refuses_settings_beside_a_plan(tiny):
    p = plan(target=tiny.gpt2)
    with pytest.raises(UsageError, match="`temperature` is a setting of a plan: pass the settings or the plan"):
        list(specdiff.stream("Hello", p, temperature=0.8))


def test_a_step_larger_than_free_memory_is_refused_before_decoding(tiny, monkeypatch):
    """`drafts` 100000 once grew to 23 GB and woke the OOM killer: plan() checks a step of
    `batch_size` rows, stream() the rows and cache lengths its prompts need, before the first token."""
    from specdiff import budget

    p = plan(target=tiny.gpt2, drafter=tiny.drafter, batch_size=2)
    free = budget.step_bytes(p.target, rows=2, tokens=9, context=0) + 1  # the plan's step, no cache
    monkeypatch.setattr(budget, "free_bytes", lambda device: free)
    p = plan(target=tiny.gpt2, drafter=tiny.drafter, batch_size=2)
    assert specdiff.generate("The sea", target=tiny.gpt2, drafter=tiny.drafter, batch_size=2).texts
    with pytest.raises(UsageError, match="`batch_size` 2, `gamma` 8: one decoding step needs about"):
        next(specdiff.stream(["The sea", "Hello"], p))  # two rows and their caches
    with pytest.raises(UsageError, match="`batch_size` 2, `drafts` 3, `gamma` 8: one decoding step"):
        plan(target=tiny.gpt2, drafter=tiny.drafter, batch_size=2, drafts=3)


@pytest.mark.parametrize("options, message", [
    ({"chat": True, "system": "\udcff"}, "`system` is not valid UTF-8 (byte 0xff at character 0)"),
    ({"chat": True, "system": 5}, "`system` must be a string, got int"),
    ({"stop": ["ok", "\ud800"]}, "`stop` string 2 is not valid Unicode"),
    ({"stop": 5}, "`stop` must be a string or a list of strings, got int"),
])
def test_system_and_stop_are_checked_before_anything_loads(nothing_loads, options, message):
    with pytest.raises(UsageError) as info:
        plan(target="gpt2", **options)
    assert message in str(info.value)


def test_api_misuse_is_a_usage_error_not_a_python_error(tiny, nothing_loads):
    """Each of these was an AttributeError or TypeError from deep inside."""
    from transformers import AutoModelForCausalLM

    from specdiff import loading

    calls = {
        "`registry` must be a path to a models.yaml or a loaded Registry, got int":
            lambda: plan(target="gpt2", registry=5),
        "`p` must be a Plan (specdiff.generation.plan), got str": lambda: list(specdiff.stream("Hello", "plan")),
        "`truncate_prompt` must be True or False, got 'yes'":
            lambda: list(specdiff.stream("Hello", target="gpt2", truncate_prompt="yes")),
        "`target` must be a models.yaml name, a directory or a hub id (a string or a path), got int":
            lambda: loading.load_target(5),
        "`drafter` must be a models.yaml name, a directory or a hub id (a string or a path), got NoneType":
            lambda: loading.load_drafter(None),
    }
    for message, call in calls.items():
        with pytest.raises(UsageError) as info:
            call()
        assert message in str(info.value)
    raw = AutoModelForCausalLM.from_pretrained(str(tiny.gpt2))
    registry = load_registry()
    with pytest.raises(UsageError, match=r"`target` must be .* a loaded target \(specdiff.load_target\), got GPT2LMHead"):
        plan(target=raw, registry=registry)
    with pytest.raises(UsageError, match=r"`drafter` must be .* \(specdiff.load_drafter\), got GPT2LMHeadModel"):
        plan(target=load_target(tiny.gpt2, registry=registry), drafter=raw, registry=registry)


def test_loaders_and_exports_refuse_misused_arguments_with_a_usage_error(tiny, tmp_path):
    """Each of these was a TypeError, AttributeError or ValueError from torch, a dict lookup or
    a missing `.entries` (issue 25, fault 14): the loaders, export and the runtimes' loader are
    called by users as much as generate is."""
    from specdiff.exporters.export import export
    from specdiff.runtimes import load_models
    from specdiff import loading
    from specdiff.artifacts import open_artifacts

    zero_d = torch.tensor(1)  # iterable by its type, not in fact
    calls = {
        "`device` must be a string such as 'cpu' or 'cuda:1', got float": lambda: loading.load_target(tiny.gpt2, device=2.5),
        "`device` must be a string such as 'cpu' or 'cuda:1', got int": lambda: loading.load_drafter(tiny.drafter, device=10**30),
        "`dtype` must be a name (a string), got list": lambda: loading.load_target(tiny.gpt2, dtype=["fp16"]),
        "unknown dtype 'fp8'": lambda: loading.load_drafter(tiny.drafter, dtype="fp8"),
        "`registry` must be a path to a models.yaml or a loaded Registry, got dict":
            lambda: loading.load_target(tiny.gpt2, registry={"models": []}),
        "`registry` must be a path to a models.yaml or a loaded Registry, got int":
            lambda: loading.load_drafter(tiny.drafter, registry=3),
        "prompts must be a string or a list of strings, got Tensor": lambda: specdiff.generate(zero_d, target="gpt2"),
        "`stop` must be a string or a list of strings, got Tensor": lambda: plan(target="gpt2", stop=zero_d),
        "`out` must be the path of a new directory, got 3": lambda: export(3, target=str(tiny.gpt2)),
        "`fmt` must be a name (a string), got list": lambda: export(tmp_path / "x", target=str(tiny.gpt2), fmt=["onnx"]),
        "`dtype` must be a name (a string), got dict": lambda: export(tmp_path / "x", target=str(tiny.gpt2), dtype={}),
        "`opset` must be an integer in 18..23, got '18'": lambda: export(tmp_path / "x", target=str(tiny.gpt2), opset="18"),
        "`max_batch` must be an integer from 1 to 2147483647 (a 32-bit dimension), got None":
            lambda: export(tmp_path / "x", target=str(tiny.gpt2), max_batch=None),
        "`max_batch` must be an integer from 1 to 2147483647 (a 32-bit dimension), got True":
            lambda: export(tmp_path / "x", target=str(tiny.gpt2), max_batch=True),
        "`device` must be a string such as 'cpu' or 'cuda:1', got list":
            lambda: export(tmp_path / "x", target=str(tiny.gpt2), device=["cpu"]),
        "`artifacts` must be the path of a `specdiff export` directory, got None": lambda: open_artifacts(None),
        "`artifacts` must be the path of a `specdiff export` directory, got 3": lambda: load_models("onnxruntime", 3),
        "unknown runtime ['onnxruntime']": lambda: load_models(["onnxruntime"], tmp_path),
        "unknown device '' (e.g. cpu, cuda, cuda:1)": lambda: load_models("onnxruntime", tmp_path, device=""),
    }
    for message, call in calls.items():
        with pytest.raises(UsageError) as info:
            call()
        assert message in str(info.value), (message, str(info.value))
    assert not (tmp_path / "x").exists()


def test_stream_indices_and_api_threads_of_the_wrong_kind_are_usage_errors(tiny):
    """`indices=3` was a TypeError from len(); `threads=10**20` an overflow inside torch."""
    p = plan(target=str(tiny.gpt2), max_new_tokens=2)
    for bad in (3, [True], "0", [-1]):
        with pytest.raises(UsageError, match="`indices` must be 1 integers >= 0"):
            list(specdiff.stream(["Hello"], p, indices=bad))
    for threads in (10**20, 0, 2.0):
        with pytest.raises(UsageError, match="`threads` must be an integer from 1 to 1024"):
            specdiff.generate("Hello", target=str(tiny.gpt2), threads=threads)
