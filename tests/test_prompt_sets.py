"""The held-out prompt sets and the broad training prompts kept apart from them (issue 49): the
general set asks what people ask a chat model, no training prompt is near any held-out question,
the near-duplicate filter finds what it claims to, and bench reads a set by name."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from cli_checks import assert_one_line_error, invoke
from specdiff.registry import load_registry
from specdiff.resources import data_path
from specdiff.tools.bench.config import default_prompts, prompt_sets
from specdiff.training.prompts import NearDuplicates, category, diversity, usable

ROOT = Path(__file__).resolve().parents[1]


def _set(name: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in data_path("prompts", f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]


def _training_prompts() -> list[str]:
    """Every committed training prompt: the stdlib questions and the broad set when it is built."""
    out = [q for q in (ROOT / "prompts" / "smol-train.txt").read_text(encoding="utf-8").splitlines() if q.strip()]
    broad = ROOT / "prompts" / "broad" / "prompts.jsonl.gz"
    if broad.exists():
        with gzip.open(broad, "rt", encoding="utf-8") as f:
            out += [json.loads(line)["prompt"] for line in f]
    return out


def test_the_general_set_spans_what_people_ask():
    rows = _set("smol-general")
    counts = Counter(r["category"] for r in rows)
    assert len(rows) >= 100 and len(counts) >= 8 and min(counts.values()) >= 10, counts
    first = [r["category"] for r in rows[:len(counts)]]
    assert len(set(first)) == len(counts)  # --num-prompts N takes every category before repeating one
    index = NearDuplicates()
    assert all(index.add(r["prompt"]) for r in rows)  # no question twice, nor nearly


@pytest.mark.parametrize("name", ["smol-general", "smol-heldout"])
def test_no_training_prompt_is_near_a_held_out_question(name):
    index = NearDuplicates()
    for r in _set(name):
        index.add(r["prompt"])
    near = [q for q in _training_prompts() if index.seen(q)]
    assert near == []


def test_near_duplicates_are_found_and_distinct_questions_kept():
    index = NearDuplicates()
    text = ("Write a short story about a lighthouse keeper who finds a message in a bottle on a stormy "
            "night and decides to follow the map it holds")
    assert index.add(text)
    assert not index.add(text.upper() + "!")  # exact, case and punctuation aside
    assert not index.add(text.replace("stormy", "windy"))  # one word of 25: near
    assert index.add("What is the difference between a lake and a pond?")
    assert index.add("Explain how a bicycle stays upright when it moves.")


@pytest.mark.parametrize("text, why", [
    ("Hi", "length"),
    ("How do I <|im_start|> reset my router at home?", "markup"),
    ("Как приготовить борщ дома быстро и вкусно?", "language"),
    ("I'm sorry, but I cannot help with that request.", "refusal"),
    ("How can I make bread rise better at home?", None),
])
def test_usable_says_why_a_turn_is_dropped(text, why):
    assert usable(text) == why


def test_diversity_counts_categories_and_distinct_ngrams():
    texts = ["Write a poem about rain.", "Write a poem about rain.", "Solve 3x + 2 = 11."]
    d = diversity(texts)
    assert d["prompts"] == 3 and d["categories"] == {"creative": 2, "reasoning": 1}
    assert d["distinct_1"] == pytest.approx(9 / 14, abs=1e-4)  # 9 distinct words of 14
    assert category("What is the difference between a cat and a dog?") == "compare"


def test_smol_pairs_default_to_the_general_set_and_name_the_stdlib_one():
    registry = load_registry()
    for pair in ("smol", "smol-dflash", "smol-eagle3"):
        assert registry.pair(pair).prompts == data_path("prompts", "smol-general.jsonl")
    assert set(prompt_sets()) >= {"smol-general", "smol-heldout", "heldout"}
    assert default_prompts("smol", None, prompt_set="smol-heldout") == data_path("prompts", "smol-heldout.jsonl")


@pytest.mark.parametrize("args, fragment", [
    (["--prompt-set", "nope"], "--prompt-set 'nope': no such shipped set (one of "),
    (["--prompt-set", ""], "--prompt-set '': no such shipped set (one of "),
    (["--prompt-set", "smol-general", "--prompt-file", "x.txt"], "give --prompt-file or --prompt-set, not both"),
])
def test_bench_refuses_a_bad_prompt_set_in_one_line(args, fragment):
    assert_one_line_error(invoke(["bench", "--target", "no-such-model", *args]), 2, fragment)
