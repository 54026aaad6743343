"""A run killed outright (kill -9: no handler runs) at any point of `generate -o`, `export`,
`distill` and the caches' writes leaves nothing the next run does not remove: every temporary file
or directory is named for its process (atomic.temp_path), and the next write into the same folder
removes those of processes that are gone (atomic.remove_stale). Real processes, real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from specdiff_cli.main import cli

pytestmark = pytest.mark.slow  # a real process each, 10-30 s; .ci/run runs them


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"]


def killed(args: list[str], ready, hook: str | None = None) -> None:
    """Run `specdiff args` in a new process and kill -9 it once ready() is true; with hook
    ("module:function"), the process stops right after that function returns (its file written,
    the temporary around it not yet renamed) and ready() is that moment."""
    module, _, name = (hook or "").partition(":")
    code = textwrap.dedent(f"""
        import importlib, os, sys, time
        if {module!r}:
            module = importlib.import_module({module!r})
            real = getattr(module, {name!r})

            def stopped(*args, **kwargs):
                result = real(*args, **kwargs)
                os.write(2, b"stopped\\n")
                time.sleep(600)
                return result

            setattr(module, {name!r}, stopped)
        from specdiff_cli.main import cli
        cli.main({args!r}, prog_name="specdiff")
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        if hook:
            assert proc.stderr is not None
            lines = iter(proc.stderr.readline, "")
            assert any(line == "stopped\n" for line in lines), "the process ended before its hook"
        else:
            deadline = time.monotonic() + 240
            while not ready() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert ready(), "the process ended before it wrote anything"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL


def test_a_killed_generate_leaves_nothing_the_next_removes(tiny, tmp_path):
    """`generate -o FILE` killed with SIGKILL left .FILE.<hex>.tmp for good (issue 53, cause 9)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The sea was calm\n" * 5000, encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    args = ["generate", "--target", str(tiny.gpt2), "--max-new-tokens", "32", "-o", str(out / "r.txt")]
    killed([*args, "--prompt-file", str(prompts)], lambda: bool(list(out.iterdir())))
    assert [p.suffix for p in out.iterdir()] == [".tmp"]
    result = CliRunner().invoke(cli, [*args, "--prompt", "The sea"])
    assert result.exit_code == 0, result.stderr
    assert [p.name for p in out.iterdir()] == ["r.txt"]


def test_a_killed_export_leaves_nothing_the_next_removes(tiny, tmp_path):
    out = tmp_path / "e"
    killed(["export", "--target", str(tiny.gpt2), "--out", str(out)], lambda: bool(leftovers(tmp_path)))
    assert leftovers(tmp_path) and not out.exists()
    result = CliRunner().invoke(cli, ["export", "--target", str(tiny.gpt2), "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["e"] and leftovers(tmp_path) == []


DISTILL_POINTS = {"teacher data": ("specdiff.training.teacher:save_tensors", "data"),
                  "a checkpoint": ("specdiff.training.checkpoints:save_state", "checkpoints"),
                  "the drafter": ("specdiff.training.distill:save_drafter", ".")}


@pytest.mark.parametrize("point", sorted(DISTILL_POINTS))
def test_a_killed_distill_leaves_nothing_the_next_removes(tiny, tmp_path, point):
    """Killed while writing the teacher data, a checkpoint or the drafter; `--resume` then finishes."""
    hook, folder = DISTILL_POINTS[point]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The sea was calm and the sky was grey. " * 200, encoding="utf-8")
    out = tmp_path / "d"
    args = ["distill", "--target", str(tiny.gpt2), "--prompts", str(prompts), "--out", str(out), "--layers", "1",
            "--dim", "32", "--heads", "2", "--context", "16", "--gamma", "4", "--num-prompts", "16",
            "--continuation-tokens", "8", "--threads", "1", "--max-steps", "2", "--checkpoint-every", "1",
            "--eval-prompts", "1"]
    killed(args, lambda: True, hook)
    assert [p.parent for p in leftovers(out)] == [out / folder]
    result = CliRunner().invoke(cli, [*args, "--resume"])
    assert result.exit_code == 0, result.stderr
    assert (out / "config.json").is_file() and leftovers(out) == []
