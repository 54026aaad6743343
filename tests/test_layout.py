"""The import direction of the design: specdiff_cli -> {exporters, runtimes, specdiff};
exporters, runtimes -> specdiff; the core imports none of the others."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"specdiff": {"specdiff_cli", "exporters", "runtimes"},
             "runtimes": {"specdiff_cli", "exporters"}, "exporters": {"specdiff_cli"}}


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_import_direction(package):
    bad = {str(p.relative_to(ROOT)): sorted(_imported_packages(p) & FORBIDDEN[package])
           for p in (ROOT / package).rglob("*.py")}
    assert not {k: v for k, v in bad.items() if v}
