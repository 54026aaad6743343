"""The CLI invoked in-process, and the check of its one-line errors (exit code, nothing on stdout,
one `specdiff: error: ` line on stderr, no traceback), shared by the bad-input tests
(tests/test_bad_input.py, tests/test_hardened_input.py) and the others that run the CLI."""

from __future__ import annotations

from click.testing import CliRunner

from specdiff_cli.main import cli


def invoke(args: list[str], input=None):
    return CliRunner().invoke(cli, args, input=input)


def assert_one_line_error(result, code: int, *fragments: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.stderr, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception  # not an uncaught error
    assert result.stdout == ""
    assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("specdiff: error: ") and "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
