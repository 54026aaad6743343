"""The README's and docs/*.md's links and the repository paths they name stay inside the repository
and exist, so that a reader of a checkout (or of the wheel's metadata) is never sent elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"(?<![\w./-])((?:docs|scripts|prompts|specdiff|tests)/[\w./*-]*\w)")


def test_links_point_into_the_repository():
    for doc in ["README.md", "prompts/README.md", *map(str, (ROOT / "docs").glob("*.md"))]:
        for target in LINK.findall((ROOT / doc).read_text(encoding="utf-8")):
            path = (ROOT / doc).parent / target.split("#")[0]
            assert ROOT.resolve() in path.resolve().parents and path.exists(), (doc, target)


def test_named_repository_paths_exist():
    named = set(REPO_PATH.findall((ROOT / "README.md").read_text(encoding="utf-8")))
    assert "scripts/demo/corpus.sh" in named
    missing = [p for p in sorted(named) if not any(ROOT.glob(p))]
    assert missing == []


def test_docs_name_repository_paths_that_exist():
    missing = [(doc.name, p) for doc in sorted((ROOT / "docs").glob("*.md"))
               for p in sorted(set(REPO_PATH.findall(doc.read_text(encoding="utf-8")))) if not any(ROOT.glob(p))]
    assert missing == []
