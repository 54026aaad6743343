"""Every write path of the CLI: -o on what is not a regular file (devices, stdout, symlinks,
read-only files), -o checked before models load, failed writes (disk full, file too large, a closed
stdout) as one line and exit 1, and SIGTERM / SIGHUP leaving no temporary file behind."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from specdiff.errors import WriteError
from specdiff.tools import bench_output
from specdiff_cli.main import cli


def invoke(args: list[str]):
    return CliRunner().invoke(cli, args)


def specdiff(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kwargs}
    return subprocess.run(["specdiff", *args], text=True, timeout=300, **kwargs)


def one_line_error(stderr: str, code: int, returncode: int, fragment: str) -> None:
    assert returncode == code, (returncode, stderr)
    assert stderr.count("\n") == 1 and stderr.startswith("specdiff: error: "), stderr
    assert fragment in stderr, (fragment, stderr)


def generate(tiny, *args: str) -> list[str]:
    return ["generate", "--target", str(tiny.gpt2), "--max-new-tokens", "3", "--prompt", "The sea", *args]


def test_dev_null_stays_a_device(tiny):
    before = os.stat("/dev/null")
    result = invoke(generate(tiny, "-o", "/dev/null"))
    assert result.exit_code == 0 and result.stdout == "" and result.stderr == "", result.stderr
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino
    assert not [n for n in os.listdir("/dev") if n.startswith(".null")]


def test_dev_stdout_writes_to_stdout(tiny):
    to_stdout = invoke(generate(tiny))
    result = invoke(generate(tiny, "-o", "/dev/stdout"))
    assert result.exit_code == 0 and result.stdout == to_stdout.stdout != ""


def test_a_symlink_is_written_through(tiny, tmp_path):
    target, link = tmp_path / "results.txt", tmp_path / "link.txt"
    target.write_text("old\n", encoding="utf-8")
    target.chmod(0o600)
    link.symlink_to(target.name)
    result = invoke(generate(tiny, "-o", str(link)))
    assert result.exit_code == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == target.name
    assert target.read_text(encoding="utf-8") == invoke(generate(tiny)).stdout
    assert stat.S_IMODE(target.stat().st_mode) == 0o600  # the file keeps its permissions
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.txt", "results.txt"]


@pytest.mark.parametrize("name, path, fragment", [
    ("empty", "", "the path is empty"),
    ("missing parent", "{tmp}/no/such.txt", "No such file or directory"),
    ("directory", "{tmp}", "it is a directory"),
    ("read-only", "{tmp}/read-only.txt", "it is read-only"),
])
def test_bad_output_fails_before_models_load(tmp_path, name, path, fragment):
    """--target names no model: the -o error comes first, so it came before any loading."""
    read_only = tmp_path / "read-only.txt"
    read_only.write_text("keep\n", encoding="utf-8")
    read_only.chmod(0o444)
    result = invoke(["generate", "--target", str(tmp_path / "no-model"), "--prompt", "hi",
                     "-o", path.format(tmp=tmp_path)])
    one_line_error(result.stderr, 2, result.exit_code, f"Invalid value for '-o' / '--output': ")
    assert fragment in result.stderr and result.stdout == ""
    assert read_only.read_text(encoding="utf-8") == "keep\n"
    assert [p.name for p in tmp_path.iterdir()] == ["read-only.txt"]


def test_full_device_as_output_is_one_line(tiny):
    result = invoke(generate(tiny, "-o", "/dev/full"))
    one_line_error(result.stderr, 1, result.exit_code, "cannot write /dev/full: No space left on device")


@pytest.mark.parametrize("command", ["models", pytest.param("generate", marks=pytest.mark.slow)])  # 9 s: a real process
def test_full_stdout_is_one_line(tiny, command):
    args = ["models"] if command == "models" else generate(tiny)
    with open("/dev/full", "w") as full:
        run = specdiff(args, stdout=full)
    one_line_error(run.stderr, 1, run.returncode, "cannot write stdout: No space left on device")


def test_closed_stdout_is_one_line():
    run = subprocess.run("specdiff models >&-", shell=True, capture_output=True,
                         text=True, timeout=300)
    one_line_error(run.stderr, 1, run.returncode, "cannot write stdout: it is closed")


@pytest.mark.slow  # a Ray cluster, a subprocess or an export: 12-30 s; .ci/run runs it
def test_closed_stdout_with_output_file_runs(tiny, tmp_path):
    """-o needs no stdout: a closed one crashed generate before it started (AttributeError on isatty);
    without -o it is refused before any model loads."""
    out, command = tmp_path / "out.txt", " ".join(shlex.quote(a) for a in ["specdiff", *generate(tiny)])
    run = subprocess.run(f"{command} -o {shlex.quote(str(out))} >&-", shell=True, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert out.read_text(encoding="utf-8").count("\n") == 1
    run = subprocess.run(f"{command} --stats -o {shlex.quote(str(out))} >&-", shell=True, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and json.loads(run.stderr)["new_tokens"] == 3
    run = subprocess.run(f"{command} >&-", shell=True, capture_output=True, text=True, timeout=300)
    one_line_error(run.stderr, 1, run.returncode, "cannot write stdout: it is closed (write the results with -o PATH)")


def small_files() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # writes past 4 KiB fail: EFBIG


@pytest.mark.slow  # 9.5 s: a real process under a file-size limit
def test_file_too_large_in_drafter_init_is_one_line(tiny, tmp_path):
    out = tmp_path / "drafter"
    run = specdiff(["drafter", "init", "--target", str(tiny.gpt2), "--out", str(out)], preexec_fn=small_files)
    one_line_error(run.stderr, 1, run.returncode, f"cannot write {out}")
    assert run.stdout == "" and list(tmp_path.iterdir()) == []


def test_bench_report_is_written_whole(tmp_path, monkeypatch):
    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(WriteError, match="cannot write .*bench.json: No space left on device"):
        bench_output.write_report({"rows": []}, tmp_path, plots=False)
    assert list(tmp_path.iterdir()) == []


def test_bench_out_on_a_file_is_refused_before_models_load(tmp_path):
    out = tmp_path / "results"
    out.write_text("keep\n", encoding="utf-8")
    result = invoke(["bench", "--target", str(tmp_path / "no-model"), "--out", str(out), "--no-plots"])
    one_line_error(result.stderr, 2, result.exit_code, f"Invalid value for '--out': cannot write the report to {out}")
    assert out.read_text(encoding="utf-8") == "keep\n"


@pytest.mark.parametrize("out, fragment", [
    ("", "cannot write the report to '': the path is empty"),  # was the current directory
    ("{tmp}/file/sub", "{tmp}/file is not a directory"),
    ("{tmp}/dangling", "{tmp}/dangling is a link to nothing"),
    ("{tmp}/dangling/sub", "{tmp}/dangling is a link to nothing"),
    ("/proc/specdiff-report", "No such file or directory"),  # no directory can be made there, even by root
    ("/sys/specdiff-report", "Operation not permitted"),
    ("{tmp}/new/" + "x" * 300, "File name too long"),
    ("{tmp}/taken", "{tmp}/taken/bench.json is a directory"),
    ("{tmp}/plot-taken", "{tmp}/plot-taken/speedup.png is a directory"),
])
def test_bench_out_that_cannot_be_written_is_refused_before_models_load(tmp_path, out, fragment):
    """bench --out on /proc/x, /sys/x, a link to nothing, a name too long or a directory whose
    bench.json is a directory passed the check and failed after the whole run; '' wrote the report
    into the current directory (issue 25, fault 14). Refused first, and nothing is left made."""
    (tmp_path / "file").write_text("keep\n", encoding="utf-8")
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing")
    (tmp_path / "taken" / "bench.json").mkdir(parents=True)
    (tmp_path / "plot-taken" / "speedup.png").mkdir(parents=True)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = invoke(["bench", "--target", str(tmp_path / "no-model"), "--out", out.format(tmp=tmp_path)])
    one_line_error(result.stderr, 2, result.exit_code, fragment.format(tmp=tmp_path))
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # no directory made


def test_bench_out_check_makes_and_removes_what_it_tries(tmp_path):
    bench_output.check_report_dir(tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []
    assert bench_output.write_report({"rows": []}, tmp_path / "a" / "b", plots=False) == [tmp_path / "a/b/bench.json"]
    assert [p.name for p in (tmp_path / "a" / "b").iterdir()] == ["bench.json"]  # the probe file is gone


@pytest.mark.parametrize("signum", [signal.SIGTERM, pytest.param(signal.SIGHUP, marks=pytest.mark.slow)])  # 10 s each
def test_stop_signal_during_generate_leaves_no_temporary_file(tiny, tmp_path, signum):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The sea was calm\n" * 5000, encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen(["specdiff", "generate", "--target", str(tiny.gpt2),
                             "--prompt-file", str(prompts), "--max-new-tokens", "32", "-o", str(out / "r.txt")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(out.iterdir()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p.suffix for p in out.iterdir()] == [".tmp"], "generation ended before the signal"
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=60)
    one_line_error(stderr, 128 + signum, proc.returncode, f"terminated by {signal.Signals(signum).name}")
    assert list(out.iterdir()) == [] and stdout == ""


def kill_after(monkeypatch, module, name: str) -> None:
    """module.name does its work, then the process gets SIGTERM (the handler raises right after)."""
    real = getattr(module, name)

    def then_terminate(*args, **kwargs):
        result = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return result

    monkeypatch.setattr(module, name, then_terminate)


def assert_terminated(result, root: Path) -> None:
    one_line_error(result.stderr, 128 + signal.SIGTERM, result.exit_code, "terminated by SIGTERM")
    leftovers = [p for p in root.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"]
    assert leftovers == []


def test_sigterm_during_drafter_convert_leaves_nothing(tiny, tmp_path, monkeypatch):
    from specdiff.kinds import diffusion  # the diffusion kind's converting.save writes the files

    kill_after(monkeypatch, diffusion, "save_own")
    assert_terminated(invoke(["drafter", "convert", str(tiny.drafter), "--out", str(tmp_path / "d")]), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_sigterm_during_export_leaves_nothing(tiny, tmp_path, monkeypatch):
    from specdiff.exporters import export

    def part_of_an_export(tmp, *args):
        (tmp / "target.onnx").write_bytes(b"half")
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(export, "_export_onnx", part_of_an_export)
    assert_terminated(invoke(["export", "--target", str(tiny.gpt2), "--out", str(tmp_path / "e")]), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_sigterm_during_distill_leaves_no_temporary_file(tiny, tmp_path, monkeypatch):
    from specdiff.training import teacher

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The sea was calm and the sky was grey. " * 200, encoding="utf-8")
    kill_after(monkeypatch, teacher, "save_tensors")
    result = invoke(["distill", "--target", str(tiny.gpt2), "--prompts", str(prompts), "--out",
                     str(tmp_path / "d"), "--layers", "1", "--dim", "32", "--heads", "2", "--context", "16",
                     "--gamma", "4", "--num-prompts", "16", "--continuation-tokens", "8", "--threads", "1"])
    assert_terminated(result, tmp_path)
    assert json.loads((tmp_path / "d" / "data" / "meta.json").read_text(encoding="utf-8"))  # the resumable cache


@pytest.mark.slow  # 10-15 s: a real process under a file-size limit
def test_a_full_disk_while_distill_writes_a_checkpoint_is_one_line(tiny, tmp_path):
    """torch.save raised RuntimeError, not OSError, on a failed write: a traceback. The limit lets
    the checkpoint's weights through and stops its optimizer state (state.pt, twice their size)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The sea was calm and the sky was grey. " * 200, encoding="utf-8")
    args = ["distill", "--target", str(tiny.gpt2), "--prompts", str(prompts), "--data", str(tmp_path / "data"),
            "--layers", "1", "--dim", "32", "--heads", "2", "--context", "16", "--gamma", "4", "--num-prompts", "16",
            "--continuation-tokens", "8", "--threads", "1", "--max-steps", "1", "--checkpoint-every", "1",
            "--eval-prompts", "1"]
    assert invoke([*args, "--out", str(tmp_path / "whole")]).exit_code == 0
    step = tmp_path / "whole" / "checkpoints" / "step-0000001"
    weights, state = ((step / name).stat().st_size for name in ("model.safetensors", "state.pt"))
    assert weights < state
    out = tmp_path / "full"

    def fills_up() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ((weights + state) // 2, resource.RLIM_INFINITY))

    run = specdiff([*args, "--out", str(out)], preexec_fn=fills_up)
    progress, error = run.stderr.split("\n", 1)  # the step's progress line (stderr is no terminal), the error
    assert progress.startswith("distill: step 1/1, loss")
    one_line_error(error, 1, run.returncode, f"cannot write {out / 'checkpoints' / 'step-0000001'}: File too large")
    assert list((out / "checkpoints").iterdir()) == []  # nothing half-written
