"""`specdiff` as a real process in a shell pipeline: a reader that stops early, bytes that are not
UTF-8, a terminal on stderr (a progress bar, no library chatter)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import shlex
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from click.testing import CliRunner

from specdiff_cli.main import cli

TIMEOUT = 180
pytestmark = pytest.mark.slow  # a real process each (7-10 s: python, torch, the CLI): CI's slow step


def specdiff_executable() -> str:
    """The installed console script, beside this interpreter (a venv) or on PATH."""
    beside = Path(sys.executable).with_name("specdiff")
    found = str(beside) if beside.is_file() else shutil.which("specdiff")
    if found is None:
        pytest.fail("the `specdiff` console script is not installed (pip install -e .)")
    return found


def test_pipeline_into_head_exits_quietly(tiny):
    """`head -1` closes the pipe after one line; specdiff must still exit 0 and print nothing more.
    pipefail is off, as in a default shell, so PIPESTATUS reports each command's own status."""
    command = (f"set +o pipefail; printf 'a\\nb\\nc\\n' | {shlex.quote(specdiff_executable())} generate "
               f"--target {shlex.quote(str(tiny.gpt2))} --max-new-tokens 5 | head -1; "
               'echo "status ${PIPESTATUS[*]}"')
    run = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=TIMEOUT,
                         stdin=subprocess.DEVNULL)
    assert run.returncode == 0
    assert run.stderr == ""  # no traceback, no "Loading weights" bar, no warning
    first = CliRunner().invoke(cli, ["generate", "--target", str(tiny.gpt2), "--max-new-tokens", "5", "--prompt", "a"])
    assert run.stdout.splitlines() == [first.stdout.rstrip("\n"), "status 0 0 0"]


def test_closed_stdout_exits_0(tiny):
    """The same without timing luck: stdout is a pipe whose reader is already gone."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        run = subprocess.run([specdiff_executable(), "generate", "--target", str(tiny.gpt2), "--max-new-tokens", "3"],
                             input=b"a\nb\n", stdout=write_end, stderr=subprocess.PIPE, timeout=TIMEOUT)
    finally:
        os.close(write_end)
    assert (run.returncode, run.stderr) == (0, b"")


def test_invalid_utf8_on_stdin_exits_2(tiny):
    run = subprocess.run([specdiff_executable(), "generate", "--target", str(tiny.gpt2)],
                         input=b"good\n\xc3\x28bad\n", capture_output=True, timeout=TIMEOUT)
    assert run.returncode == 2 and run.stdout == b""
    assert run.stderr == b"specdiff: error: stdin is not valid UTF-8 (byte 5)\n"


def terminal() -> tuple[int, int]:
    """A pseudo-terminal (main, secondary) 100 columns wide (tqdm draws nothing 0 columns wide)."""
    main, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    return main, secondary


def drain(fd: int) -> bytes:
    """What is waiting on fd (the secondary end stays open, so nothing written is lost)."""
    chunks = []
    while select.select([fd], [], [], 0)[0]:
        chunks.append(os.read(fd, 65536))
    return b"".join(chunks)


def test_progress_bar_only_on_a_terminal(tiny):
    """With stderr on a terminal and several prompts, a tqdm bar over the prompts appears there,
    and nothing else does: no "Loading weights" bar, no warnings. (CliRunner tests check that a
    stderr that is not a terminal stays empty.)"""
    main, secondary = terminal()
    try:
        command = [specdiff_executable(), "generate", "--target", str(tiny.gpt2), "--max-new-tokens", "3"]
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=secondary)
        stdout, _ = proc.communicate(b"a\nb\nc\n", timeout=TIMEOUT)
        shown = drain(main).decode("utf-8", "replace")
    finally:
        os.close(main)
        os.close(secondary)
    assert proc.returncode == 0 and stdout.count(b"\n") == 3
    assert "0/3" in shown and "prompt/s" in shown, shown
    assert "Loading" not in shown and "warn" not in shown.lower(), shown
