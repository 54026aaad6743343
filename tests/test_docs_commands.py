"""Every `specdiff ...` command line in the README's and docs/*.md's ```bash blocks parses with the
real CLI (unknown options, bad choices and bad values fail), without running it; a command that
names a hub model (it needs the network) says so with a `# hub` comment, and no command line hides
outside a ```bash block, where this test would not see it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from specdiff.registry import ModelEntry, PairEntry, load_registry
from specdiff_cli.main import cli

ROOT = Path(__file__).parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SEPARATORS = {"|", "||", "&&", ";", "&", "(", ")"}


def _split_comment(line: str) -> tuple[str, str]:
    """(the code, the comment): the first # outside quotes that starts a word."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i:]
    return line, ""


def bash_lines(path: Path) -> list[tuple[int, str, str]]:
    """(line number, code, comment) of each logical line of the file's ```bash blocks: lines ending
    in a backslash joined with the next, the comment of every physical line kept."""
    out: list[tuple[int, str, str]] = []
    fence: str | None = None  # the opening line of the block we are in
    pending: tuple[int, str, str] | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip().startswith("```"):
            fence = line.strip() if fence is None else None
            continue
        if fence != "```bash":
            continue
        code, comment = _split_comment(line)
        start, before, said = pending or (number, "", "")
        joined = code.rstrip().endswith("\\")
        code = before + (code.rstrip()[:-1] + " " if joined else code)
        pending = (start, code, said + comment)
        if not joined:
            out.append(pending)
            pending = None
    return out


def specdiff_commands(code: str) -> list[list[str]]:
    """The argument lists of the `specdiff` commands on one shell line (after pipes, &&, env
    assignments; redirections dropped)."""
    code = re.sub(r"(?<=\s)\d+(?=>)", "", code)  # 2>/dev/null: the descriptor
    lex = shlex.shlex(code, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = ""
    segments: list[list[str]] = [[]]
    tokens = list(lex)
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t in SEPARATORS:
            segments.append([])
        elif set(t) <= set("<>&|") and ("<" in t or ">" in t):
            i += 1  # a redirection and its target
        else:
            segments[-1].append(t)
        i += 1
    commands = []
    for words in segments:
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            words = words[1:]
        if words and words[0] == "specdiff":
            commands.append(words[1:])
    return commands


def parse(args: list[str]) -> click.Context | None:
    """The innermost click context of `specdiff ARGS`, made as the CLI makes it (callbacks and
    types run: bad values raise), nothing invoked; None for an eager option that exits 0
    (--version, --help)."""
    try:
        ctx = cli.make_context("specdiff", list(args), resilient_parsing=False)
        command: click.Command = cli
        while isinstance(command, click.Group):
            rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
            name, sub, rest = command.resolve_command(ctx, rest)
            assert name is not None and sub is not None
            ctx = sub.make_context(name, rest, parent=ctx, resilient_parsing=False)
            command = sub
    except click.exceptions.Exit as e:
        if e.exit_code == 0:
            return None
        raise
    return ctx


def hub_models() -> set[str]:
    """models.yaml names that load from the hub: hub entries, and pairs naming one."""
    registry = load_registry()
    hub = {name for name, e in registry.entries.items() if isinstance(e, ModelEntry) and e.hub}
    pairs = {name for name, e in registry.entries.items() if isinstance(e, PairEntry)
             and {e.target, e.drafter, e.ar_drafter} & hub}
    return hub | pairs


def all_commands() -> list[tuple[str, list[str], str]]:
    return [(f"{doc.relative_to(ROOT)}:{number}", args, comment)
            for doc in DOCS for number, code, comment in bash_lines(doc) for args in specdiff_commands(code)]


def test_the_docs_show_commands():
    found = all_commands()
    assert len(found) > 50
    assert any(where.startswith("README.md") for where, _, _ in found)


def test_every_command_parses(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # --out / -o checks try their paths here, not in the checkout
    failures = []
    for where, args, _ in all_commands():
        try:
            parse(args)
        except (click.ClickException, click.exceptions.Exit) as e:
            message = e.format_message() if isinstance(e, click.ClickException) else f"exit {e.exit_code}"
            failures.append(f"{where}: specdiff {shlex.join(args)}: {message}")
    capsys.readouterr()
    assert failures == [], "\n".join(failures)


def test_commands_that_need_the_network_say_hub(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    hub = hub_models()
    unmarked = []
    for where, args, comment in all_commands():
        ctx = parse(args)
        named = {v for v in (ctx.params.values() if ctx else ()) if isinstance(v, str)} & hub
        if named and "# hub" not in comment:
            unmarked.append(f"{where}: specdiff {shlex.join(args)} names {sorted(named)}: add '# hub: network'")
    capsys.readouterr()
    assert unmarked == [], "\n".join(unmarked)


def test_network_comments_are_uniform():
    """'network' in a command's comment comes with the `# hub` marker the other check looks for."""
    odd = [f"{doc.relative_to(ROOT)}:{number}: {comment}" for doc in DOCS for number, _, comment in bash_lines(doc)
           if "network" in comment and "# hub" not in comment]
    assert odd == [], "\n".join(odd)


def test_no_command_outside_bash_blocks():
    """A specdiff command in an indented block or another fence would escape the parse check."""
    stray = []
    for doc in DOCS:
        fence: str | None = None
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip().startswith("```"):
                fence = line.strip() if fence is None else None
                continue
            if fence not in (None, "```bash") and re.match(r"\s*(\$ )?specdiff\s", line):
                stray.append(f"{doc.relative_to(ROOT)}:{number}: {line.strip()}")
            if fence is None and re.match(r"( {4,}|\t)(\S+ \| )?(echo .* \| )?specdiff\s", line):
                stray.append(f"{doc.relative_to(ROOT)}:{number}: {line.strip()}")
    assert stray == [], "\n".join(stray)


@pytest.mark.parametrize("line, expected", [
    ("echo hi | specdiff generate --stats  # a comment", [["generate", "--stats"]]),
    ("RAY_ADDRESS=x specdiff generate -o out.txt 2>/dev/null", [["generate", "-o", "out.txt"]]),
    ("cd /tmp && specdiff models > list.txt", [["models"]]),
    ("specdiff distill --mask-token '<|mask|>' --out d", [["distill", "--mask-token", "<|mask|>", "--out", "d"]]),
])
def test_commands_are_found(line, expected):
    assert specdiff_commands(_split_comment(line)[0]) == expected


def test_a_bad_command_fails(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for args in (["generate", "--no-such-option"], ["generate", "--runtime", "nope"], ["bench", "--gamma", "x"],
                 ["drafter", "convert"], ["generate", "extra"]):
        with pytest.raises(click.ClickException):
            parse(args)
    assert parse(["drafter", "convert", "mdlm-owt", "--out", "d"]).params["src"] == "mdlm-owt"


def _entry(text: str, method: str) -> str:
    """The parenthesis after `method` in docs/cli.md's list of methods, nested ones included."""
    start = text.index(f"`{method}` (") + len(method) + 4
    depth, end = 1, start
    while depth:
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        end += 1
    return text[start:end - 1]


def test_the_cli_doc_says_where_each_exported_drafter_runs():
    """docs/cli.md said EAGLE-3 ran on "the eager torch target only"; a method whose drafter kind
    declares a graph runs exported on ONNX Runtime too, and where its entry names the torch
    target it names that runtime beside it."""
    from specdiff.kinds import get_kind
    from specdiff.methods import METHODS

    text = " ".join((ROOT / "docs" / "cli.md").read_text(encoding="utf-8").split())
    exported = [m.name for m in METHODS.values() if m.needs is not None and get_kind(m.needs).graph is not None]
    assert {"dflash", "eagle3"} <= set(exported)
    for method in exported:
        entry = _entry(text, method)
        assert "torch target only" not in entry and ("torch target" not in entry or "--runtime onnxruntime" in entry), \
            (method, entry)
