"""Instruction prompts for the smol pair, written from text that Python itself carries.

    python scripts/smol/questions.py            # the shipped training and held-out files
    python scripts/smol/questions.py --large OUT  # a broad training set for the teacher data at scale
    python scripts/smol/questions.py --breadth OUT  # questions about installed third-party packages

Questions about the standard library (each public function's or class's docstring: what it does,
how to use it, its summary explained), about its modules, about the language reference's help
topics (pydoc_data.topics) and the Python FAQ questions (prompts/python-faq.txt). Modules in
HELD_OUT_MODULES and topics in HELD_OUT_TOPICS never appear in the training file: the held-out
questions (package data, `specdiff bench --pair smol` reads them) are drawn from them only.

Writes prompts/smol-train.txt (one question a line) and specdiff/data/prompts/smol-heldout.jsonl
({"prompt", "source"} a line). Deterministic on a given Python version: the same interpreter gives
byte-identical files. Standard library only.

`--large` writes about 34k training questions to OUT (answers.sh keeps it in its work folder), in
a stable shuffled order (distill holds out the file's last tenth): every importable standard-library
module outside HELD_OUT_MODULES (sys.stdlib_module_names), every public function, class and method
with a one-sentence docstring, each in all LARGE_TEMPLATES, every help topic outside HELD_OUT_TOPICS
in four phrasings, the FAQ; no question names a held-out module.

`--breadth` writes the same templates over the public objects of widely used third-party packages
(BREADTH_MODULES: numpy, pandas, scipy, torch, requests, ...) that are installed, for answers about
code no standard-library question names (the drafter accepts its first slot far more often on modules
its training saw than on the held-out ones), and OUT.sources.json: each package's version and licence.
Deterministic for given installed versions; no question names a held-out module.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import re
import sys
import warnings
from importlib import metadata
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
LARGE_PER_MODULE = 400
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


LARGE_TEMPLATES = (
    "What does `{name}` do in Python?",
    "How do I use `{name}` in Python? Show a short example.",
    "Explain this line of the Python documentation for `{name}` in simple words: {text}",
    "Write a small Python program that uses `{name}` and explain it.",
    "What are the arguments of `{name}` and what does it return?",
    "When should I use `{name}` in Python, and when not?",
    "What is a common mistake when using `{name}`?",
    "Summarise in one paragraph: {text}",
)
BREADTH_MODULES = {  # module: the distribution it comes from (its licence goes in the sources file)
    "numpy": "numpy", "numpy.linalg": "numpy", "numpy.random": "numpy", "numpy.fft": "numpy",
    "pandas": "pandas", "scipy.stats": "scipy", "scipy.optimize": "scipy", "scipy.linalg": "scipy",
    "scipy.signal": "scipy", "scipy.integrate": "scipy", "scipy.interpolate": "scipy", "sympy": "sympy",
    "networkx": "networkx", "requests": "requests", "click": "click", "jinja2": "Jinja2", "yaml": "PyYAML",
    "attr": "attrs", "rich.console": "rich", "rich.table": "rich", "pydantic": "pydantic",
    "pygments": "pygments", "packaging.version": "packaging", "tqdm": "tqdm", "matplotlib.pyplot": "matplotlib",
    "PIL.Image": "pillow", "torch": "torch", "torch.nn": "torch", "torch.nn.functional": "torch",
    "torch.optim": "torch", "pytest": "pytest", "urllib3": "urllib3", "jsonschema": "jsonschema",
}
LARGE_TOPICS = ("Explain {word} in Python, with an example.", "What should a beginner know about {word} in Python?",
                "Give me three short examples of {word} in Python.", "What goes wrong most often with {word} in Python?")


def public_objects(module: str, mod: object) -> list[tuple[str, object]]:
    """(dotted name, object) of a module's own public functions and classes, and their methods."""
    out: list[tuple[str, object]] = []
    for n in sorted(n for n in getattr(mod, "__all__", dir(mod)) if not n.startswith("_")):
        obj = getattr(mod, n, None)
        if obj is None or not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
            continue
        if (getattr(obj, "__module__", None) or module).split(".")[0].lstrip("_") != module.split(".")[0]:
            continue  # re-exported from elsewhere
        out.append((f"{module}.{n}", obj))
        if inspect.isclass(obj):
            out += [(f"{module}.{n}.{m}", getattr(obj, m)) for m in sorted(vars(obj))
                    if not m.startswith("_") and callable(getattr(obj, m, None))]
    return out


def modules_questions(modules: list[str]) -> list[str]:
    """LARGE_TEMPLATES over each importable module and its public objects with a one-sentence docstring."""
    out: list[str] = []
    for module in modules:
        try:
            mod = importlib.import_module(module)
        except Exception:  # modules of other platforms, or with side effects on import
            continue
        out += [t.format(name=module, text="") for t in LARGE_TEMPLATES[:2] + LARGE_TEMPLATES[5:7]]
        for name, obj in public_objects(module, mod)[:LARGE_PER_MODULE]:
            text = summary(obj)
            if text:
                out += [t.format(name=name, text=text) for t in LARGE_TEMPLATES]
    return out


def shuffled_training(questions: list[str]) -> list[str]:
    """The questions once each, none naming a held-out module, in a stable shuffled order (distill
    holds out the file's last tenth: a random share)."""
    held = re.compile(r"\b(" + "|".join(HELD_OUT_MODULES) + r")\b")
    kept = [q for q in dict.fromkeys(questions) if not held.search(q)]
    return sorted(kept, key=lambda q: pick(q, 1 << 30))


def large_questions() -> list[str]:
    """The broad training set (see the module docstring)."""
    import pydoc_data.topics

    skip = {*HELD_OUT_MODULES, "this", "antigravity"}  # the last two print or open a browser on import
    out = modules_questions(sorted(m for m in sys.stdlib_module_names if not m.startswith("_") and m not in skip))
    for topic in sorted(set(pydoc_data.topics.topics) - set(HELD_OUT_TOPICS)):
        out += [t.format(word=topic.replace("-", " ")) for t in LARGE_TOPICS]
    out += [line for line in FAQ.read_text(encoding="utf-8").splitlines() if line.strip()]
    return shuffled_training(out)


def licence(distribution: str) -> str:
    """The licence an installed distribution's metadata names ('' if none)."""
    meta = metadata.metadata(distribution)
    named = meta.get("License-Expression") or meta.get("License") or ""
    classifiers = [c.split(" :: ")[-1] for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    return " / ".join([named.splitlines()[0] if named else "", *classifiers]).strip(" /")


def breadth_questions() -> tuple[list[str], dict[str, dict[str, str]]]:
    """Questions about BREADTH_MODULES (installed third-party packages), and {distribution: {version,
    licence}} of the packages they came from, for the card."""
    sources: dict[str, dict[str, str]] = {}
    for dist in sorted(set(BREADTH_MODULES.values())):
        try:
            sources[dist] = {"version": metadata.version(dist), "licence": licence(dist)}
        except metadata.PackageNotFoundError:
            continue
    modules = [m for m, dist in BREADTH_MODULES.items() if dist in sources]
    return shuffled_training(modules_questions(modules)), sources


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
    if sys.argv[1:2] == ["--large"]:
        questions = large_questions()
        Path(sys.argv[2]).write_text("".join(q + "\n" for q in questions), encoding="utf-8")
        print(f"{len(questions)} training questions -> {sys.argv[2]}")
        return
    if sys.argv[1:2] == ["--breadth"]:
        questions, sources = breadth_questions()
        out = Path(sys.argv[2])
        out.write_text("".join(q + "\n" for q in questions), encoding="utf-8")
        out.with_suffix(".sources.json").write_text(json.dumps(sources, indent=1) + "\n", encoding="utf-8")
        print(f"{len(questions)} training questions from {len(sources)} packages -> {out}")
        return
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
