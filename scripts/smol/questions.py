"""Instruction prompts for the smol pair, written from text that Python itself carries.

    python scripts/smol/questions.py

Questions about the standard library (each public function's or class's docstring: what it does,
how to use it, its summary explained), about its modules, about the language reference's help
topics (pydoc_data.topics) and the Python FAQ questions (prompts/python-faq.txt). Modules in
HELD_OUT_MODULES and topics in HELD_OUT_TOPICS never appear in the training file: the held-out
questions (package data, `specdiff bench --pair smol` reads them) are drawn from them only.

Writes prompts/smol-train.txt (one question a line) and specdiff/data/prompts/smol-heldout.jsonl
({"prompt", "source"} a line). Deterministic on a given Python version: the same interpreter gives
byte-identical files. Standard library only.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "prompts" / "smol-train.txt"
HELDOUT = ROOT / "specdiff" / "data" / "prompts" / "smol-heldout.jsonl"
FAQ = ROOT / "prompts" / "python-faq.txt"
MODULES = """abc argparse array asyncio base64 bisect bz2 cmath codecs collections colorsys configparser
contextlib copy csv dataclasses datetime decimal dis email enum filecmp fnmatch functools getpass
gettext glob graphlib gzip hashlib heapq hmac html http.client imaplib inspect io ipaddress itertools
json keyword linecache locale logging lzma math mimetypes numbers operator os os.path pathlib pickle
pkgutil platform plistlib pprint queue quopri random re reprlib sched secrets select selectors shelve
shlex shutil signal smtplib socket sqlite3 ssl stat statistics string struct subprocess sys tarfile
tempfile threading time timeit tokenize trace traceback types typing unicodedata unittest urllib.parse
urllib.request uuid warnings weakref xml.etree.ElementTree zipfile zlib calendar difflib fractions
textwrap""".split()
HELD_OUT_MODULES = ("calendar", "difflib", "fractions", "textwrap")
HELD_OUT_TOPICS = ("assert", "with", "lambda", "yield")
MAX_PER_MODULE = 40
HELDOUT_COUNT = 32


def pick(key: str, n: int) -> int:
    """A stable choice in range(n) from a key (not Python's salted hash)."""
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % n


def summary(obj) -> str | None:
    """The first sentence of an object's own docstring, if it reads as one."""
    doc = inspect.getdoc(obj) or ""
    first = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
    if not 20 <= len(first) <= 200 or first.startswith("Deprecated") or "(" in first[:12]:
        return None
    return first


def object_questions(name: str, text: str) -> list[str]:
    templates = (f"What does `{name}` do in Python?",
                 f"How do I use `{name}` in Python? Show a short example.",
                 f"Explain this line of the Python documentation for `{name}` in simple words: {text}",
                 f"Write a small Python program that uses `{name}` and explain it.")
    first = pick(name, len(templates))
    return [templates[first], templates[(first + 1) % len(templates)]]


def module_questions(module: str) -> list[str]:
    mod = importlib.import_module(module)
    out = [f"What is the Python `{module}` module used for?",
           f"Give me a beginner-friendly example of the `{module}` module in Python."]
    names = sorted(n for n in getattr(mod, "__all__", dir(mod)) if not n.startswith("_"))
    for n in names:
        obj = getattr(mod, n, None)
        if obj is None or not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
            continue
        if (getattr(obj, "__module__", None) or module).split(".")[0].lstrip("_") != module.split(".")[0]:
            continue  # re-exported from elsewhere
        text = summary(obj)
        if text:
            out += object_questions(f"{module}.{n}", text)
        if len(out) >= MAX_PER_MODULE:
            break
    return out


def topic_questions(topic: str) -> list[str]:
    word = topic.replace("-", " ")
    return [f"Explain {word} in Python, with an example.", f"What should a beginner know about {word} in Python?"]


def main() -> None:
    import pydoc_data.topics

    warnings.simplefilter("ignore")
    train: list[str] = []
    held: list[dict] = []
    for module in MODULES:
        questions = module_questions(module)
        if module in HELD_OUT_MODULES:
            held += [{"prompt": q, "source": f"stdlib:{module}"} for q in questions]
        else:
            train += questions
    for topic in sorted(pydoc_data.topics.topics):
        if topic in HELD_OUT_TOPICS:
            held += [{"prompt": q, "source": f"pydoc-topic:{topic}"} for q in topic_questions(topic)]
        else:
            train += topic_questions(topic)
    train += [line for line in FAQ.read_text(encoding="utf-8").splitlines() if line.strip()]
    chosen = sorted(held, key=lambda h: pick(h["prompt"], 1 << 30))[:HELDOUT_COUNT]
    TRAIN.write_text("".join(q + "\n" for q in dict.fromkeys(train)), encoding="utf-8")
    HELDOUT.write_text("".join(json.dumps(h) + "\n" for h in chosen), encoding="utf-8")
    print(f"{len(dict.fromkeys(train))} training questions -> {TRAIN}; {len(chosen)} held out -> {HELDOUT}")


if __name__ == "__main__":
    main()
