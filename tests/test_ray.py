"""specdiff.ray on a real local Ray (2 CPUs, actors reserving half a CPU each so that the driver
is never starved): the same outputs as a local run, in input order, through a worker's death."""

from __future__ import annotations

import logging
import os
import sys

import pytest
import ray
from click.testing import CliRunner

import specdiff
import specdiff.ray as sray
from specdiff.errors import InputError, LoadError, UsageError
from specdiff_cli.main import cli

PROMPTS = ["Hello", "The quick brown fox jumps", "a", "Once upon a time there", "xyz xyz", "0 1 2 3 4 5 6"]
POOL = {"workers": 2, "cpus_per_worker": 0.5, "batch_size": 2, "threads": 1}


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
    yield
    ray.shutdown()


def _options(tiny, **extra):
    return {"target": str(tiny.gpt2), "drafter": str(tiny.drafter), "method": "specdiff", "gamma": 4,
            "max_new_tokens": 12, "seed": 7, **extra}


class DiesOnce(sray.Worker):
    """A worker whose process dies on the first batch it is given, once in the whole run."""

    marker = ""

    def __call__(self, batch):
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(1)
        return super().__call__(batch)


def test_sampled_outputs_equal_the_local_run_in_order_though_a_worker_dies(tiny, local_ray, tmp_path,
                                                                            monkeypatch):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    DiesOnce.marker = str(tmp_path / "died")
    monkeypatch.setattr(sray, "Worker", DiesOnce)
    options = _options(tiny, temperature=1.0, top_k=50)
    local = specdiff.generate(PROMPTS, **options)
    result = sray.generate(PROMPTS, **POOL, **options)
    assert os.path.exists(DiesOnce.marker)  # a batch was retried on a restarted worker
    assert [o.prompt for o in result.outputs] == PROMPTS
    assert [o.tokens for o in result.outputs] == [o.tokens for o in local.outputs]
    assert result.metrics.new_tokens == local.metrics.new_tokens
    assert result.ray["batches"] == 3 and result.settings["method"] == "specdiff"


def test_a_worker_error_is_one_line_and_no_output_file(tiny, local_ray, tmp_path):
    out = tmp_path / "out.jsonl"
    args = ["generate", "--prompt", "Hello", "--prompt", "Hi", "--prompt", "word " * 400, "--jsonl", "-o", str(out),
            "--ray", "--workers", "1", "--cpus-per-worker", "0.5", "--threads", "1",
            *(f"--{k.replace('_', '-')}={v}" for k, v in _options(tiny).items())]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == InputError.exit_code, result.output
    assert "prompt 3 is 802 tokens" in result.output and "Traceback" not in result.output
    assert not out.exists()


@pytest.mark.parametrize("pool, message", [
    ({"workers": 0}, "workers"), ({"cpus_per_worker": -1}, "cpus_per_worker"),
    ({"cpus_per_worker": 0}, "resources"), ({"batch_size": 0}, "batch_size"),
])
def test_bad_pool_settings_are_refused_before_ray_starts(tiny, pool, message, monkeypatch):
    monkeypatch.setattr(sray, "init", lambda *a, **k: pytest.fail("Ray was started"))
    with pytest.raises(UsageError, match=message):
        sray.generate(PROMPTS, **{**POOL, **pool}, **_options(tiny))


def test_missing_extra_is_one_line_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(LoadError, match=r"ray is not installed: .*ray"):
        sray.init("local")
    result = CliRunner().invoke(cli, ["generate", "--prompt", "hi", "--ray", "local"])
    assert result.exit_code == 1 and "[ray]" in result.output and "Traceback" not in result.output


def test_worker_flags_need_ray():
    result = CliRunner().invoke(cli, ["generate", "--prompt", "hi", "--workers", "4"])
    assert result.exit_code == 2 and "--ray" in result.output


def test_a_shard_numbers_prompts_and_seeds_generators_by_their_place_in_the_input(tiny):
    """What makes sharding invisible: prompts 3..5 decoded alone, told their indices, give the
    outputs and the error numbers of the whole input."""
    options = _options(tiny, temperature=1.0)
    p = specdiff.generation.plan(**options)
    whole = specdiff.generate(PROMPTS, **options)
    shard = list(specdiff.generation.iter_generate(PROMPTS[3:], p, indices=[3, 4, 5]))
    assert [o.tokens for o in shard] == [o.tokens for o in whole.outputs[3:]]
    with pytest.raises(InputError, match="prompt 5 is"):
        list(specdiff.generation.iter_generate(["Hi", "word " * 400], p, indices=[3, 4]))
