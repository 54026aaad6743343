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
    "device list": ({"device": ["cpu"]}, "`device` must be a string such as 'cpu' or 'cuda:1', got list"),
    "target int": ({"target": 5}, "`target` must be a models.yaml name, a directory, a hub id or a loaded target"),
    "drafter list": ({"drafter": ["d"]}, "`drafter` must be a models.yaml name, a directory, a hub id or a loaded"),
    "schedule list": ({"schedule": ["l2r"]}, "`schedule` must be a name (a string), got list"),
    "method list": ({"method": ["ar"]}, "`method` must be a name (a string), got list"),
    "method empty": ({"method": ""}, "`method` must be a name, got ''"),  # was: the default method
    "acceptance empty": ({"acceptance": ""}, "`acceptance` must be a name, got ''"),
    "dtype empty": ({"dtype": ""}, "`dtype` must be a name, got ''"),
    "pair empty": ({"pair": ""}, "`pair` must be a name, got ''"),
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
    """`drafts` 100000 once grew to 23 GB and woke the OOM killer: plan() checks a step of one
    row (the fewest a run has), stream() the rows and cache lengths its prompts need, before the
    first token."""
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
    for bad in (3, [True], "0", [-1], [2**64], [2**63]):  # 2**64 was a ValueError from torch's manual_seed
        with pytest.raises(UsageError, match=r"`indices` must be 1 integers from 0 to 2\*\*63 - 1"):
            list(specdiff.stream(["Hello"], p, indices=bad))
    last = plan(target=p.target, max_new_tokens=2, seed=2**63 - 1)  # seed + index: at most 2**64 - 2
    assert len(list(specdiff.generation.iter_generate(["Hello"], last, indices=[2**63 - 1]))[0].tokens) == 2
    for threads in (10**20, 0, 2.0):
        with pytest.raises(UsageError, match="`threads` must be an integer from 1 to 1024"):
            specdiff.generate("Hello", target=str(tiny.gpt2), threads=threads)


def test_a_loaded_target_decodes_one_stream_at_a_time(tiny):
    """Two streams over one loaded target, advanced in turn, or a stream resumed after generate(),
    shared its KV cache and met a raw torch size error: the second loop is refused while the first
    is suspended, the first then finishes as if alone, and a closed or finished stream frees it."""
    target, drafter = load_target(tiny.gpt2), load_drafter(tiny.drafter)
    prompts, options = ["The sea was", "To be, or"], {"target": target, "drafter": drafter, "max_new_tokens": 6}
    alone = specdiff.generate(prompts, **options).texts
    first = specdiff.stream(prompts, **options)
    next(first)
    for second in (lambda: next(specdiff.stream(["Hello"], **options)), lambda: specdiff.generate("Hello", **options),
                   lambda: specdiff.generate("Hello", target=target, method="ar", max_new_tokens=2)):
        with pytest.raises(UsageError, match=r"^target '.*' is decoding a stream that has not finished: a loaded "
                                             r"target decodes one stream at a time; exhaust or close\(\) that"):
            second()
    assert [o.text for o in specdiff.generation.in_order(first)] == alone  # the refusals left its cache alone
    held = specdiff.stream(prompts, **options)
    next(held)
    held.close()
    assert specdiff.generate(prompts, **options).texts == alone
    twin = specdiff.stream(prompts, **{**options, "target": load_target(tiny.gpt2)})  # a target per stream
    texts: tuple[dict, dict] = ({}, {})
    for pair in zip(specdiff.stream(prompts, **options), twin):  # advanced in turn
        for got, event in zip(texts, pair):
            got.update({event.index: event.output.text} if event.output else {})
    assert [[got[i] for i in range(2)] for got in texts] == [alone, alone]


def test_device_and_dtype_apply_to_what_plan_loads_and_are_refused_where_they_cannot(tiny):
    """With a loaded target, `device` and `dtype` were dropped: fp16 ran fp32, and 'gpu' or 'fp8',
    refused by load_target, ran too. Values no loading takes are refused as load_target refuses
    them; a loaded model's own device and dtype are accepted; others are refused by name."""
    from specdiff import loading

    target = load_target(tiny.gpt2)
    for kwargs in ({"device": "gpu"}, {"device": "meta"}, {"dtype": "fp8"}, {"dtype": "float16"}):
        with pytest.raises(UsageError) as by_name:
            loading.load_target(tiny.gpt2, **kwargs)
        with pytest.raises(UsageError) as loaded:
            specdiff.generate("Hello", target=target, **kwargs)
        assert str(loaded.value) == str(by_name.value), kwargs
    with pytest.raises(UsageError, match=r"^`dtype` fp16 does not apply to target '.*', loaded already as fp32: "
                                         r"drop `dtype`, or load the target with `dtype` fp16$"):
        specdiff.generate("Hello", target=target, dtype="fp16")
    with pytest.raises(UsageError, match=r"^`dtype` bf16 does not apply to drafter '.*', loaded already as fp32"):
        plan(target=str(tiny.gpt2), drafter=load_drafter(tiny.drafter), dtype="bf16")
    p = plan(target=target, device="cpu", dtype="fp32", max_new_tokens=2)
    assert p.target is target and plan(target=target, device=torch.device("cpu"), dtype="auto").target is target
    assert plan(target=target, drafter=str(tiny.drafter)).drafter.backbone.parameters().__next__().device.type == "cpu"


def test_stream_takes_threads_as_generate_does(tiny):
    """stream(threads=1) was "unknown option `threads` (did you mean `threshold`?)": it sets
    torch's threads while each step runs, and the caller keeps its own between events."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []
        for event in specdiff.stream(["Hello", "The sea"], target=str(tiny.gpt2), max_new_tokens=3, threads=1):
            seen.append(torch.get_num_threads())
        assert seen and set(seen) == {2}
        outputs = [e.output.text for e in specdiff.stream("Hello", target=str(tiny.gpt2), max_new_tokens=3,
                                                          threads=1) if e.output]
        assert outputs == specdiff.generate("Hello", target=str(tiny.gpt2), max_new_tokens=3, threads=1).texts
    finally:
        torch.set_num_threads(before)
    with pytest.raises(UsageError, match="`threads` must be an integer from 1 to 1024"):
        specdiff.stream("Hello", target=str(tiny.gpt2), threads=0)
    with pytest.raises(UsageError, match=r"^`threads` is set per call \(generate, stream\), not in a plan$"):
        plan(target=str(tiny.gpt2), threads=1)


def test_a_value_no_option_gave_is_named_by_where_it_came_from(tiny, tmp_path):
    """A drafter's recorded gamma 99 (an export's manifest) was reported as `gamma` 99, which the
    CLI shows as --gamma 99: a flag the user never gave. A pair's or drafter's value says so."""
    from tiny import with_defaults

    registry = tmp_path / "models.yaml"
    registry.write_text(f"models:\n  - name: t\n    kind: target\n    path: {tiny.gpt2}\n  - name: d\n    kind: drafter\n"
                        f"    path: {tiny.drafter}\n  - name: t+d\n    kind: pair\n    target: t\n    drafter: d\n"
                        "    defaults: {gamma: 300}\n", encoding="utf-8")
    with pytest.raises(UsageError, match=r"^gamma 300 \(the pair's default in models.yaml; give `gamma` to change "
                                         r"it\) does not fit the target's context window"):
        plan(pair="t+d", registry=load_registry(registry))
    recorded = with_defaults(Path(tiny.drafter), tmp_path / "d", {"gamma": 300})
    with pytest.raises(UsageError, match=r"^gamma 300 \(recorded by the drafter; give `gamma` to change it\)"):
        plan(target=str(tiny.gpt2), drafter=recorded)
    with pytest.raises(UsageError, match=r"^`gamma` 300 does not fit"):  # given: named as given
        plan(target=str(tiny.gpt2), drafter=recorded, gamma=300)


@pytest.mark.parametrize("dtype, temperature, warned", [("bf16", 0.0, True), ("fp16", 0.0, True),
                                                        ("fp32", 0.0, False), ("bf16", 0.7, False)])
def test_greedy_speculative_decoding_in_half_precision_warns_once(tiny, dtype, temperature, warned):
    """Half-precision logits depend on a call's width (tools/invariance.py), so a greedy verify can
    pick another token than plain decoding: said once per target; fp32 and sampling say nothing."""
    import warnings

    from specdiff.errors import WidthDependenceWarning

    target = load_target(str(tiny.gpt2), dtype=dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            plan(target=target, drafter=str(tiny.drafter), method="specdiff", temperature=temperature)
        plan(target=target, method="ar", temperature=temperature)
    said = [w for w in caught if issubclass(w.category, WidthDependenceWarning)]
    assert len(said) == int(warned) and all(dtype.replace("bf", "bfloat").replace("fp", "float") in str(w.message)
                                            for w in said)
