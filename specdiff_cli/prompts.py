"""Prompt input and result formatting for `specdiff generate` (output.py writes the results).

Input: plain text, one prompt per line (blank lines skipped); the whole text as one prompt
(`whole`: one final line end dropped); or JSONL, one {"prompt": ..., other fields} object per
line, all its fields passed through to the output. `auto` picks JSONL when the first non-blank
line starts with "{". Everything is read and checked before any generation starts.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from typing import IO, Any, NoReturn

from specdiff.errors import InputError, SpecdiffError, UsageError
from specdiff.requests import check_text


@dataclass
class PromptRecord:
    prompt: str
    fields: dict[str, Any] = field(default_factory=dict)  # a JSONL line's fields, "prompt" among them


def decode_utf8(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{where} is not valid UTF-8 (byte {e.start})") from None


def parse_prompts(text: str, fmt: str, where: str) -> list[PromptRecord]:
    if fmt == "whole":
        return _parse_whole(text, where)
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()  # the final newline, and blank lines after the last prompt, start no prompt
    if fmt == "auto":
        first = next((line for line in lines if line.strip()), "")
        fmt = "jsonl" if first.lstrip().startswith("{") else "text"
    records = _parse_jsonl(lines, where) if fmt == "jsonl" else _parse_text(lines)
    if not records:
        raise InputError(f"{where} holds no prompts")
    return records


def _parse_whole(text: str, where: str) -> list[PromptRecord]:
    """The text is one prompt, less one final line end (which an editor or `echo` adds)."""
    prompt = text.removesuffix("\r\n") if text.endswith("\r\n") else text.removesuffix("\n")
    if not prompt.strip():
        raise InputError(f"{where} holds no prompts")
    return [PromptRecord(prompt)]


def _parse_text(lines: list[str]) -> list[PromptRecord]:
    return [PromptRecord(line) for line in lines if line.strip()]


def _parse_jsonl(lines: list[str], where: str) -> list[PromptRecord]:
    return [parse_jsonl_line(line, f"{where} line {n}") for n, line in enumerate(lines, 1) if line.strip()]


def parse_jsonl_line(line: str, where: str) -> PromptRecord:
    """One non-blank JSONL line -> its record (InputError naming `where`)."""
    obj = _json_line(line, where)
    if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
        raise InputError(f"{where}: expected an object with a string \"prompt\"")
    if not obj["prompt"].strip():
        raise InputError(f"{where}: empty prompt")
    return PromptRecord(obj["prompt"], obj)


def parse_line(line: str, fmt: str, where: str) -> PromptRecord | None:
    """One line of a prompt file (text or jsonl; its line end removed) -> its record, None if blank."""
    line = line.removesuffix("\r")
    if not line.strip():
        return None
    return parse_jsonl_line(line, where) if fmt == "jsonl" else PromptRecord(line)


def _json_line(line: str, where: str) -> Any:
    """One JSONL line -> its value, which can be written back as JSON: no NaN or Infinity (not
    JSON), no number that overflows to inf or exceeds int()'s digit limit, no lone surrogate
    ("\\ud800"), no nesting deeper than the parser's recursion limit."""
    try:
        obj = json.loads(line, parse_constant=_refuse_constant, parse_float=_finite_float,
                         parse_int=_bounded_int)
        json.dumps(obj, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: malformed JSON ({e.msg})") from e
    except UnicodeEncodeError as e:
        raise InputError(f"{where}: not valid Unicode (lone surrogate {e.object[e.start]!r})") from e
    except ValueError as e:  # from the hooks below
        raise InputError(f"{where}: {e}") from e
    except RecursionError as e:
        raise InputError(f"{where}: nested too deeply") from e
    return obj


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]}{'...' if len(text) > 20 else ''} is out of range")
    return value


def _bounded_int(text: str) -> int:
    digits, limit = len(text.lstrip("-")), sys.get_int_max_str_digits()
    if limit and digits > limit:  # int() would raise a ValueError that names a sys function
        raise ValueError(f"integer of {digits} digits is too long (at most {limit})")
    return int(text)


def read_prompts(prompts: tuple[str, ...], prompt_file: str | None, stdin: IO[bytes] | None,
                 fmt: str) -> list[PromptRecord]:
    """From --prompt (repeatable), --prompt-file PATH, or stdin, a binary stream (also
    --prompt-file -; None when the process has no stdin)."""
    if prompts and prompt_file:
        raise UsageError("give prompts with --prompt or --prompt-file, not both")
    if prompts and fmt == "whole":
        raise UsageError("--whole reads --prompt-file or stdin as one prompt; each --prompt already is one")
    if prompts:
        for i, p in enumerate(prompts, 1):
            check_text(p, f"--prompt {i}")  # argv's undecodable bytes arrive as lone surrogates
            if not p.strip():
                raise InputError(f"--prompt {i} is empty")
        return [PromptRecord(p) for p in prompts]
    if prompt_file and prompt_file != "-":
        try:
            with open(prompt_file, "rb") as f:
                data = read_bounded(f, prompt_file)
        except OSError as e:
            raise InputError(f"cannot read prompt file {prompt_file}: {e.strerror}") from None
        return parse_prompts(decode_utf8(data, prompt_file), fmt, prompt_file)
    if stdin is None or (stdin.isatty() and not prompt_file):
        raise UsageError("no prompts: use --prompt TEXT, --prompt-file PATH, or pipe them on stdin")
    return parse_prompts(decode_utf8(read_bounded(stdin, "stdin"), "stdin"), fmt, "stdin")


MAX_INPUT_BYTES = 256 * 2**20  # prompts read whole (generate, bench), and any one line of a file


def read_bounded(f: IO[bytes], where: str) -> bytes:
    """All of `f`, refused past MAX_INPUT_BYTES: an endless input (/dev/zero, `yes |`) or a huge
    file was read whole and ended in a MemoryError. A regular file is judged by its size first."""
    size = _regular_size(f)
    if size is None or size <= MAX_INPUT_BYTES:
        data = f.read(MAX_INPUT_BYTES + 1)
        if len(data) <= MAX_INPUT_BYTES:
            return data
    raise InputError(f"{where} holds more than {MAX_INPUT_BYTES >> 20} MiB of prompts, which are read whole "
                     "before decoding starts (split it, or decode it with --ray --output-dir, which reads a "
                     "--prompt-file in chunks)")


def read_line_bounded(f: IO[bytes], where: str) -> bytes:
    """The next line of `f` (b"" at its end), refused past MAX_INPUT_BYTES: one line of /dev/zero
    never ends."""
    line = f.readline(MAX_INPUT_BYTES + 1)
    if len(line) > MAX_INPUT_BYTES:
        raise InputError(f"{where} is longer than {MAX_INPUT_BYTES >> 20} MiB (no line end in sight)")
    return line


def _regular_size(f: IO[bytes]) -> int | None:
    try:
        status = os.fstat(f.fileno())
    except (OSError, ValueError, AttributeError):  # a stream without a file descriptor
        return None
    return status.st_size if stat.S_ISREG(status.st_mode) else None


def escape_line(text: str) -> str:
    """One output line per prompt: backslash, newline and carriage return escaped."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def unescape(text: str) -> str:
    """'\\n', '\\t', '\\r' and '\\\\' as the characters they name; any other backslash stays."""
    return re.sub(r"\\([ntr\\])", lambda m: ESCAPES[m.group(1)], text)


@dataclass(frozen=True)
class Layout:
    """How results are written. `escaped`: one line per prompt (escape_line); `raw`: the text as
    it is, `separator` between results and a newline after the last; `jsonl`: one record per
    prompt (format_record). `echo`: each prompt written before its continuation (escaped, raw).
    A result is head + text pieces + tail, so that streamed output equals the whole result."""

    mode: str = "escaped"
    separator: str = "\n\n"
    echo: bool = False

    def head(self, index: int, record: PromptRecord) -> str:
        between = self.separator if self.mode == "raw" and index else ""
        return between + (self.text(record.prompt) if self.echo else "")

    def text(self, piece: str) -> str:
        return piece if self.mode == "raw" else escape_line(piece)

    def tail(self) -> str:
        return "\n" if self.mode == "escaped" else ""

    def end(self) -> str:
        """After the last result."""
        return "\n" if self.mode == "raw" else ""

    def result(self, index: int, record: PromptRecord, text: str, metrics: dict[str, Any]) -> str:
        if self.mode == "jsonl":
            return format_record(record, text, metrics) + "\n"
        return self.head(index, record) + self.text(text) + self.tail()


def format_record(record: PromptRecord, text: str, metrics: dict[str, Any]) -> str:
    """The input's fields (a plain-text prompt: just "prompt"), `text` and `metrics` as JSON."""
    fields = record.fields or {"prompt": record.prompt}
    try:
        return json.dumps({**fields, "text": text, "metrics": metrics}, ensure_ascii=False,
                          allow_nan=False)
    except (ValueError, RecursionError) as e:  # NaN / inf have no JSON spelling
        raise SpecdiffError(f"cannot write a result as JSON: {e}") from e
