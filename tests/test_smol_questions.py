"""scripts/smol/questions.py: the training question sets never name a held-out module, and the
breadth set records where its questions came from."""

from __future__ import annotations

import importlib.util
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("smol_questions", ROOT / "scripts" / "smol" / "questions.py")
assert spec is not None and spec.loader is not None
questions = importlib.util.module_from_spec(spec)
spec.loader.exec_module(questions)


def test_training_questions_drop_every_held_out_module_once_each_in_a_stable_order() -> None:
    asked = ["What does `difflib.SequenceMatcher` do?", "What does `zip` do?", "What does `zip` do?",
             "Explain textwrap.dedent", "How do I use `json.dumps`?", "A textwrapper is not textwrap-free"]
    kept = questions.shuffled_training(asked)
    assert sorted(kept) == ["How do I use `json.dumps`?", "What does `zip` do?"]
    assert questions.shuffled_training(list(reversed(asked))) == kept


def test_breadth_questions_come_from_the_installed_package_and_name_its_licence(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(questions, "BREADTH_MODULES", {"click": "click", "no_such_module": "no-such-dist"})
    asked, sources = questions.breadth_questions()
    assert list(sources) == ["click"] and sources["click"]["version"] == metadata.version("click")
    assert "BSD" in sources["click"]["licence"]
    assert "What does `click.echo` do in Python?" in asked
    assert all("click" in q for q in asked if not q.startswith("Summarise"))  # the summary names no object
