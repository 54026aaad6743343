"""--threads: `generate` sets torch's thread count for the run; the default (shared with `bench`)
leaves one usable CPU free, since one thread per core ran slower and erratically on a shared
2-vCPU machine."""

from __future__ import annotations

import os

import pytest
import torch
from click.testing import CliRunner

from specdiff_cli import threads
from specdiff_cli.main import cli


@pytest.fixture(autouse=True)
def keep_threads():
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


@pytest.mark.parametrize("cpus, expected", [(1, 1), (2, 1), (16, 15)])
def test_default_leaves_one_cpu_free(monkeypatch, cpus, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    assert threads.default_threads() == expected


@pytest.mark.parametrize("extra, expected", [(("--threads", "3"), 3), ((), None)])
def test_generate_sets_torch_threads(tiny, extra, expected):
    torch.set_num_threads(5)
    result = CliRunner().invoke(cli, ["generate", "--target", str(tiny.gpt2), "--prompt", "x",
                                      "--max-new-tokens", "2", *extra])
    assert result.exit_code == 0, result.output
    assert torch.get_num_threads() == (expected or threads.default_threads())


def test_threads_must_be_positive(tiny):
    result = CliRunner().invoke(cli, ["generate", "--target", str(tiny.gpt2), "--prompt", "x", "--threads", "0"])
    assert result.exit_code == 2 and "--threads" in result.stderr


@pytest.mark.parametrize("command", [["generate", "--prompt", "x"], ["bench"], ["distill", "--prompts", "p", "--out", "o"]])
@pytest.mark.parametrize("count", ["100000", str(10**20)])
def test_threads_are_bounded(tiny, command, count):
    """--threads 10**20 overflowed inside torch.set_num_threads (a traceback); 100000 threads ran
    the machine out of memory, reported as 'cannot load model' (issue 25, fault 13)."""
    result = CliRunner().invoke(cli, [*command, "--target", str(tiny.gpt2), "--threads", count])
    assert result.exit_code == 2 and result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert f"Invalid value for '--threads': {count} is not in the range 1<=x<=1024" in result.stderr


def test_the_api_runs_with_the_threads_it_is_given_and_restores_them(tiny, monkeypatch):
    """specdiff.generate(threads=1): torch runs the call with one thread (the target's forward
    sees it), the process's count comes back after, the output is the same; bad counts are refused."""
    import specdiff
    from specdiff.targets.causal import CausalLMTarget

    seen = []
    run = CausalLMTarget._run
    monkeypatch.setattr(CausalLMTarget, "_run", lambda self, *a, **k: seen.append(torch.get_num_threads())
                        or run(self, *a, **k))
    torch.set_num_threads(2)
    one = specdiff.generate("x", target=str(tiny.gpt2), method="ar", max_new_tokens=3, threads=1)
    assert set(seen) == {1} and torch.get_num_threads() == 2
    assert specdiff.generate("x", target=str(tiny.gpt2), method="ar", max_new_tokens=3).texts == one.texts
    assert seen[-1] == 2
    for bad in (0, 1.5, True):
        with pytest.raises(specdiff.SpecdiffError, match="`threads` must be an integer from 1 to 1024"):
            specdiff.generate("x", target=str(tiny.gpt2), method="ar", max_new_tokens=3, threads=bad)
