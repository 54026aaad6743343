"""The import direction of the design: specdiff_cli -> {exporters, runtimes, specdiff};
exporters, runtimes -> specdiff; inside specdiff the tools (bench, distillation, conversion) import
the algorithm and never the reverse. The one crossing between exporters and runtimes: export
validation runs the graphs it wrote on ONNX Runtime."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = "specdiff (algorithm)"
FORBIDDEN = {CORE: {"specdiff_cli", "exporters", "runtimes", "specdiff.tools"},
             "specdiff/tools": {"specdiff_cli", "exporters", "runtimes"},
             "runtimes": {"specdiff_cli", "exporters"},
             "exporters": {"specdiff_cli", "runtimes"}}
ALLOWED = {("exporters/validate.py", "runtimes.onnxruntime")}


def _module(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_modules(path: Path) -> set[str]:
    """Absolute dotted names of everything a file imports (relative imports resolved)."""
    package = _module(path) if path.name == "__init__.py" else _module(path)[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names |= {module} | {f"{module}.{a.name}" for a in node.names}
    return names


def _files(group: str) -> list[Path]:
    if group == CORE:
        return [p for p in (ROOT / "specdiff").rglob("*.py") if "tools" not in p.relative_to(ROOT).parts]
    return list((ROOT / group).rglob("*.py"))


def _violates(name: str, banned: set[str]) -> bool:
    return any(name == b or name.startswith(b + ".") for b in banned)


@pytest.mark.parametrize("group", sorted(FORBIDDEN))
def test_import_direction(group):
    bad = {}
    for path in _files(group):
        rel = str(path.relative_to(ROOT))
        allowed = {m for f, m in ALLOWED if f == rel}
        hits = sorted(n for n in imported_modules(path)
                      if _violates(n, FORBIDDEN[group]) and not _violates(n, allowed))
        if hits:
            bad[rel] = hits
    assert not bad


def test_the_checker_resolves_relative_imports():
    """Relative imports must resolve to the modules they name, else the test above is blind."""
    bench = imported_modules(ROOT / "specdiff" / "tools" / "bench.py")
    assert {"specdiff.tools.callstats", "specdiff.errors", "specdiff.generation"} <= bench
    assert "specdiff.contracts" in imported_modules(ROOT / "specdiff" / "decoding.py")
    assert _violates("specdiff.tools.bench", FORBIDDEN[CORE])


FLAG = re.compile(r"(?<![\w-])--[a-z]")


def _raises(path: Path):
    return [n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.Raise)]


def test_library_errors_name_parameters_and_keep_their_cause():
    """The library speaks in parameters (`truncate_prompt`), which the CLI shows as flags, and a
    library error raised while handling another keeps it as its cause (no `from None`)."""
    flags, dropped = [], []
    for path in (ROOT / "specdiff").rglob("*.py"):
        for node in _raises(path):
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            texts = [c.value for c in ast.walk(node.exc) if isinstance(c, ast.Constant)
                     and isinstance(c.value, str)] if node.exc else []
            flags += [where for t in texts if FLAG.search(t)]
            if isinstance(node.cause, ast.Constant) and node.cause.value is None:
                dropped.append(where)
    assert not flags and not dropped
