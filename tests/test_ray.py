"""specdiff.ray on a real local Ray (2 CPUs, actors reserving half a CPU each so that the driver
is never starved): the same outputs as a local run, in input order, through a worker's death."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import ray
from click.testing import CliRunner

import specdiff
import specdiff.ray as sray
from specdiff.errors import InputError, LoadError, UsageError
from specdiff_cli import ray_run
from specdiff_cli.main import cli

PROMPTS = ["Hello", "The quick brown fox jumps", "a", "Once upon a time there", "xyz xyz", "0 1 2 3 4 5 6"]
POOL = {"workers": 2, "cpus_per_worker": 0.5, "task_size": 2, "threads": 1}


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


@pytest.mark.slow  # a Ray cluster, a subprocess or an export: 12-30 s; .ci/run runs it
def test_sampled_outputs_equal_the_local_run_in_order_though_a_worker_dies(tiny, local_ray, tmp_path,
                                                                            monkeypatch):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    DiesOnce.marker = str(tmp_path / "died")
    monkeypatch.setattr(sray, "Worker", DiesOnce)
    options = _options(tiny, temperature=1.0, top_k=50)
    local = specdiff.generate(PROMPTS, **options, batch_size=1)
    result = sray.generate(PROMPTS, **POOL, **options, batch_size=3)  # 2 rows a task: a ragged batch
    assert os.path.exists(DiesOnce.marker)  # a batch was retried on a restarted worker
    assert [o.prompt for o in result.outputs] == PROMPTS
    assert [o.tokens for o in result.outputs] == [o.tokens for o in local.outputs]
    assert result.metrics.new_tokens == local.metrics.new_tokens
    assert result.ray["batches"] == 3 and result.settings["method"] == "specdiff"


def test_a_worker_error_is_raised_as_itself(tiny, local_ray):
    with pytest.raises(InputError, match="prompt 3 is 802 tokens"):
        sray.generate(["Hello", "Hi", "word " * 400], workers=1, cpus_per_worker=0.5, **_options(tiny))


def _prompt_file(path, n):
    lines = [json.dumps({"id": i, "prompt": PROMPTS[i % len(PROMPTS)]}) for i in range(n)]
    lines.insert(3, "")  # skipped, as by a local run
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow  # a Ray cluster, a subprocess or an export: 12-30 s; .ci/run runs it
def test_output_dir_shards_hold_the_local_records_in_order(tiny, local_ray, tmp_path, monkeypatch):
    monkeypatch.setattr(ray_run, "SHARD", 8)
    prompts = _prompt_file(tmp_path / "in.jsonl", 20)
    model = [f"--{k.replace('_', '-')}={v}" for k, v in _options(tiny, temperature=1.0).items()]
    local = CliRunner().invoke(cli, ["generate", "--prompt-file", str(prompts), "--jsonl", *model])
    args = ["generate", "--prompt-file", str(prompts), "--jsonl", "--output-dir", str(tmp_path / "out"),
            "--ray", "--workers", "2", "--cpus-per-worker", "0.5", "--threads", "1", *model]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    shards = sorted((tmp_path / "out").iterdir())
    assert [p.name for p in shards] == ["part-00000.jsonl", "part-00001.jsonl", "part-00002.jsonl"]
    records = [json.loads(line) for p in shards for line in p.read_text().splitlines()]
    expected = [json.loads(line) for line in local.output.splitlines()]
    assert [(r["id"], r["text"]) for r in records] == [(r["id"], r["text"]) for r in expected]


def test_a_prompt_file_is_indexed_in_chunks_that_read_back_its_prompts(tmp_path, monkeypatch):
    monkeypatch.setattr(ray_run, "MAX_CHUNKS", 4)
    path = _prompt_file(tmp_path / "in.jsonl", 20)
    chunks = ray_run.index_file(str(path), "jsonl", 2)  # chunks of 2, merged whenever more than 4
    assert [c.count for c in chunks] == [8, 6, 4, 2]
    assert [c.first for c in chunks] == [0, 8, 14, 18]
    assert all(a.end == b.start for a, b in zip(chunks, chunks[1:])) and chunks[-1].end == path.stat().st_size
    rows = [r for c in chunks for r in ray_run.read_chunk(dataclasses.asdict(c), str(path), "jsonl")]
    assert [r["index"] for r in rows] == list(range(20))
    assert [r["prompt"] for r in rows] == [PROMPTS[i % len(PROMPTS)] for i in range(20)]


def test_output_dir_refuses_a_malformed_line_before_ray_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(sray, "init", lambda *a, **k: pytest.fail("Ray was started"))
    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": 3}\n')
    result = CliRunner().invoke(cli, ["generate", "--prompt-file", str(path), "--ray", "local",
                                      "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 2 and "line 2" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("pool, message", [
    ({"workers": 0}, "workers"), ({"cpus_per_worker": -1}, "cpus_per_worker"),
    ({"cpus_per_worker": 0}, "resources"), ({"task_size": 0}, "task_size"),
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


def test_unknown_keywords_are_refused_before_ray_starts(tiny, monkeypatch):
    """A misspelt setting used to travel to the workers unread: greedy output where sampling was asked."""
    monkeypatch.setattr(sray, "init", lambda *a, **k: pytest.fail("Ray was started"))
    with pytest.raises(UsageError, match=r"unknown option `temprature` \(did you mean `temperature`\?\)"):
        sray.generate(PROMPTS, **POOL, **_options(tiny), temprature=0.8)
    with pytest.raises(UsageError, match="unknown option `tmperature`"):
        sray.map_prompts(None, **_options(tiny), tmperature=0.8)
    with pytest.raises(UsageError, match="`top_p` must be a number"):
        sray.map_prompts(None, **_options(tiny), top_p=2.0)


ROOT = Path(__file__).resolve().parents[1]


def _run_cli(script: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`script` (which patches the library) then the CLI with `args`, in a fresh interpreter."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **(env or {})}
    code = script + "\nfrom specdiff_cli.main import main\nsys.argv = ['specdiff', *sys.argv[1:]]\nmain()\n"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=ROOT, stdin=subprocess.DEVNULL)


def _model_args(tiny) -> list[str]:
    return ["--target", str(tiny.gpt2), "--drafter", str(tiny.drafter), "--max-new-tokens", "6",
            "--workers", "1", "--cpus-per-worker", "0.5"]


DIES_ONCE = """
import os, sys
import specdiff.ray as sray

class DiesOnce(sray.Worker):
    def __call__(self, batch):
        if not os.path.exists(os.environ["DIED"]):
            open(os.environ["DIED"], "w").close()
            os._exit(1)
        return super().__call__(batch)

sray.Worker = DiesOnce
"""


@pytest.mark.slow  # a Ray cluster, a subprocess or an export: 12-30 s; .ci/run runs it
def test_ray_messages_about_a_dead_worker_stay_off_stdout(tiny, tmp_path):
    """Ray's driver printed "(raylet) A worker died..." in the results on stdout (issue 25, fault 1):
    stdout holds the results of a local run, and Ray's message is on stderr."""
    prompts = ["--prompt", "Hello", "--prompt", "Once upon"]
    local = CliRunner().invoke(cli, ["generate", *prompts, *_model_args(tiny)[:6]])
    run = _run_cli(DIES_ONCE, ["generate", "--ray", "local", *prompts, *_model_args(tiny)],
                   env={"DIED": str(tmp_path / "died")})
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "died").exists()  # a worker did die
    assert run.stdout == local.stdout
    assert "worker died" in run.stderr and "\x1b[" not in run.stderr  # no colour codes in a file


def test_ray_cluster_messages_are_printed_on_stderr(local_ray, capsys):
    """What Ray's driver prints of its cluster (published errors: a dead worker, a failed task)
    goes to stderr once specdiff.ray has connected."""
    from ray._private.utils import publish_error_to_driver
    from ray._private.worker import global_worker

    sray.init()
    publish_error_to_driver("specdiff_test", "a cluster message (test)", global_worker.gcs_client)
    deadline, out, err = time.monotonic() + 20, "", ""
    while "a cluster message (test)" not in err + out and time.monotonic() < deadline:
        time.sleep(0.2)
        captured = capsys.readouterr()
        out, err = out + captured.out, err + captured.err
    assert "a cluster message (test)" in err and "a cluster message" not in out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("how", ["argument", "RAY_ADDRESS"])
def test_an_address_where_nothing_listens_is_refused_in_seconds(tiny, monkeypatch, how):
    """--ray ADDRESS with nothing listening waited without limit (Ray retries for minutes;
    issue 25, fault 7): one line, exit 2, before ray.init."""
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init was called"))
    address = f"127.0.0.1:{_free_port()}"
    if how == "RAY_ADDRESS":
        monkeypatch.setenv("RAY_ADDRESS", address)
    start = time.monotonic()
    with pytest.raises(UsageError, match=f"cannot reach the Ray cluster at {address}: Connection refused"):
        sray.init(address if how == "argument" else None)
    ray_option = ["--ray", address] if how == "argument" else ["--ray"]  # no value: $RAY_ADDRESS
    result = CliRunner().invoke(cli, ["generate", "--prompt", "hi", *ray_option, *_model_args(tiny)])
    assert time.monotonic() - start < 30
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr == f"specdiff: error: cannot reach the Ray cluster at {address}: Connection refused\n"
    assert result.stdout == ""


TERMINATED_WHILE_DECODING = """
import os, signal, sys, time
import specdiff.ray as sray

original = sray.map_prompts

def map_then_terminate(*args, **kwargs):  # on the driver, Ray running: where a user's kill lands
    done = original(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
    return done

sray.map_prompts = map_then_terminate
"""


def _ray_processes(marker: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if marker in line]


@pytest.mark.slow  # a Ray cluster, a subprocess or an export: 12-30 s; .ci/run runs it
def test_sigterm_ends_a_ray_driver_with_one_line_and_exit_143(tiny, tmp_path):
    """SIGTERM to a --ray driver aborted with exit 134 and a C++ stack dump (Ray's core worker
    installs its own SIGTERM handler; issue 25, fault 7): exit 143, one line, no file, no Ray
    process left."""
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay short
    try:
        out = tmp_path / "out.txt"
        run = _run_cli(TERMINATED_WHILE_DECODING, ["generate", "--ray", "local", "--prompt", "Hello", "-o", str(out),
                                                   *_model_args(tiny)], env={"RAY_TMPDIR": ray_tmp})
        assert run.returncode == 128 + signal.SIGTERM, run.stderr
        assert run.stderr.splitlines()[-1] == "specdiff: error: terminated by SIGTERM"
        assert "SIGTERM received" not in run.stderr and run.stdout == ""
        assert list(tmp_path.iterdir()) == []
        deadline = time.monotonic() + 20
        while _ray_processes(ray_tmp) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _ray_processes(ray_tmp) == []
    finally:
        subprocess.run(["rm", "-rf", ray_tmp])


def test_ray_arguments_of_the_wrong_kind_are_refused_before_ray_starts(tiny, monkeypatch):
    """Each was an AttributeError or TypeError (an int address, a list ray_init), or travelled to
    the workers (threads 10**20, truncate_prompt 'yes') (issue 25, fault 14)."""
    monkeypatch.setattr(sray, "init", lambda *a, **k: pytest.fail("Ray was started"))
    cases = {"`ray_init` must be a dict of ray.init's keyword arguments, got list": {"ray_init": ["x"]},
             "`threads` must be an integer from 1 to 1024, got 100000000000000000000": {"threads": 10**20},
             "`truncate_prompt` must be True or False, got 'yes'": {"truncate_prompt": "yes"}}
    for message, kwargs in cases.items():
        with pytest.raises(UsageError) as info:
            sray.generate(PROMPTS, **{**POOL, **kwargs}, **_options(tiny))
        assert message in str(info.value)
    monkeypatch.undo()
    with pytest.raises(UsageError, match="`address` must be 'local', a Ray address .* or None, got int"):
        sray.init(6379)


def test_a_worker_a_local_ray_cannot_hold_is_refused(tiny, local_ray, monkeypatch):
    """--ray local --cpus-per-worker 4 on a 2-CPU machine waited forever, Ray's autoscaler saying
    every 35 s that no node type fits: a local Ray gets no more nodes."""
    monkeypatch.setitem(sray.STARTED, "local", True)  # as if init had started this one
    with pytest.raises(UsageError, match=r"a worker reserves 4 CPU\(s\) and 0 GPU\(s\) .*the local Ray has 2 and 0"):
        sray.generate(PROMPTS, **{**POOL, "cpus_per_worker": 4}, **_options(tiny))
    with pytest.raises(UsageError, match=r"reserves 0.5 CPU\(s\) and 1 GPU\(s\)"):
        sray.generate(PROMPTS, **{**POOL, "gpus_per_worker": 1}, **_options(tiny))
