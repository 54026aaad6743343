"""Question / answer pairs for the prefill teacher corpus (`specdiff distill --prefill`), from text
on this machine whose licence is checked here.

    python scripts/smol/corpus.py OUT.jsonl     # {"prompt", "answer", "source"} a line

Sources and their licences:
  - Python's standard library docstrings (every importable module of sys.stdlib_module_names, its
    public functions, classes and methods, as questions.py --large walks them) and the language
    reference's help topics (pydoc_data.topics): the Python Software Foundation License Version 2
    ("Python software and documentation are licensed under the Python Software Foundation License
    Version 2", LICENSE.txt beside the standard library; examples in the documentation are also
    0BSD). The question is one of questions.py's phrasings about the object or topic, the answer its
    own docstring or topic text.
  - The docstrings of installed Python packages with permissive licences (PACKAGES: numpy, pandas,
    networkx, click, werkzeug, flask BSD-3-Clause; scipy, sympy, mpmath, jinja2 BSD; pygments
    BSD-2-Clause; torch (BSD-3-Clause, its own code; only torch.nn, optim, distributions, linalg,
    fft, special, autograd, utils.data walked); matplotlib (its PSF-based licence); requests,
    sortedcontainers Apache-2.0; packaging Apache-2.0 OR BSD-2-Clause; PyYAML, pydantic, rich,
    attrs, jsonschema, pyparsing MIT; transformers Apache-2.0), each used only when its installed metadata
    (License-Expression, License or classifiers) names that licence, otherwise skipped and said so
    (the run prints what each one's metadata says). Their modules are walked recursively, private
    and test modules left out.
  - The AWS API reference that botocore carries (its data/*/service-2.json models, Apache-2.0 as
    botocore's metadata says: checked): each operation's and structure member's documentation,
    HTML stripped, the question naming the service, operation or member.
  Looked at and not used: /usr/share/doc on this machine holds changelogs, copyright files and a
  few API references (libxslt, zlib examples, python-policy), no prose or Q&A worth the checking;
  no Debian documentation package (python3.11-doc, perl-doc, debian-faq) is installed.

Long answers are cut at paragraph or line boundaries into pieces of about CHUNK_CHARS characters
(about 100-130 SmolLM2 tokens: prefill.sh keeps 128), each its own row (later pieces asked
for as "Show part N of the documentation of `NAME`."). Never anything about the held-out
modules or topics (questions.py HELD_OUT_MODULES, HELD_OUT_TOPICS): those modules and topics are
skipped, and so is any row whose question or answer names a held-out module or a held-out keyword
(assert, lambda, yield, the with statement, context managers), the help topic 'context-managers'
included. Rows are deduplicated by answer and written in a stable shuffled order (prefill.sh cuts
the file into parts in order; distill holds out each part's last rows). Prints the row count and
an approximate token count (characters / 4). Deterministic for a given set of installed versions.
"""

from __future__ import annotations

import contextlib
import gzip
import html
import importlib
import importlib.metadata
import io
import inspect
import json
import pkgutil
import re
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from questions import (HELD_OUT_MODULES, HELD_OUT_TOPICS, LARGE_PER_MODULE, LARGE_TEMPLATES,  # noqa: E402
                       LARGE_TOPICS, licence, pick, public_objects)

CHUNK_CHARS = 400
L = 128  # answer tokens a prefill row keeps (prefill.sh)
MIN_CHARS = 150  # shorter answers teach little: a row costs P + L positions however short its answer
PACKAGES = {  # import name -> (what its metadata's licence must name, the modules walked: "" all of them)
    "numpy": ("BSD-3-Clause", ""), "scipy": ("BSD", ""), "sympy": ("BSD", ""), "pandas": ("BSD-3-Clause", ""),
    "networkx": ("BSD-3-Clause", ""), "mpmath": ("BSD", ""), "matplotlib": ("Python Software Foundation", ""),
    "torch": ("BSD-3-Clause", "torch.nn torch.optim torch.distributions torch.linalg torch.fft torch.special "
              "torch.autograd torch.utils.data"),
    "pygments": ("BSD-2-Clause", ""), "click": ("BSD-3-Clause", ""), "jinja2": ("BSD", ""),
    "werkzeug": ("BSD-3-Clause", ""), "flask": ("BSD-3-Clause", ""), "requests": ("Apache", ""),
    "packaging": ("Apache-2.0 OR BSD-2-Clause", ""), "yaml": ("MIT", ""), "pydantic": ("MIT", ""),
    "rich": ("MIT", ""), "attr": ("MIT", ""), "jsonschema": ("MIT", ""), "pyparsing": ("MIT", ""),
    "sortedcontainers": ("Apache", ""), "transformers": ("Apache", ""),
}
DISTRIBUTIONS = {"yaml": "PyYAML", "attr": "attrs", "pygments": "Pygments"}  # import name -> distribution name
HELD = re.compile(r"\b(" + "|".join(HELD_OUT_MODULES) + r"|assert|lambda|yield)\b|\bwith[- ]statement|"
                  r"\bcontext[- ]manager", re.IGNORECASE)
SKIPPED_TOPICS = {*HELD_OUT_TOPICS, "context-managers"}
QUESTIONS = [t for t in LARGE_TEMPLATES if "{text}" not in t]  # the answer is the text itself


def chunks(text: str) -> list[str]:
    """Text -> pieces of about CHUNK_CHARS, cut between paragraphs, else between lines, a line longer
    than that between its sentences."""
    lines = [piece for line in text.strip().splitlines() for piece in _sentences(line.rstrip())]
    out, piece = [], ""
    for line in lines:
        if piece and len(piece) + len(line) > CHUNK_CHARS and (not line or len(piece) > CHUNK_CHARS // 2):
            out.append(piece.strip())
            piece = ""
        piece += line + "\n"
    if piece.strip():
        out.append(piece.strip())
    return [c for c in out if len(c) >= MIN_CHARS]


def _sentences(line: str) -> list[str]:
    """A line, or a long one's sentences (each a line of its own piece: joined back by newlines)."""
    return [line] if len(line) <= CHUNK_CHARS else re.split(r"(?<=[.!?])\s+", line)


def rows_of(question: str, text: str, source: str) -> list[dict[str, str]]:
    """One row per piece of the answer text: the first answers `question`, the later ones a request
    for that part of the documentation of what `source` names."""
    subject = source.split(":", 1)[1]
    return [{"prompt": question if i == 0 else f"Show part {i + 1} of the documentation of `{subject}`.",
             "answer": piece, "source": source} for i, piece in enumerate(chunks(text))]


def object_rows(package: str, module: str, mod: object) -> list[dict[str, str]]:
    """The module's own docstring and each public object's, one question each."""
    out = rows_of(f"What is the Python `{module}` module used for?", inspect.getdoc(mod) or "", f"{package}:{module}")
    for name, obj in public_objects(module, mod)[:LARGE_PER_MODULE]:
        doc = inspect.getdoc(obj) or ""
        question = QUESTIONS[pick(name, len(QUESTIONS))].format(name=name)
        out += rows_of(question, doc, f"{package}:{name}")
    return out


def stdlib_rows() -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    skip = {*HELD_OUT_MODULES, "this", "antigravity", "idlelib", "turtledemo"}
    for module in sorted(m for m in sys.stdlib_module_names if not m.startswith("_") and m not in skip):
        try:
            mod = importlib.import_module(module)
        except Exception:  # modules of other platforms, or with side effects on import
            continue
        out += object_rows("stdlib", module, mod)
    return out


def topic_rows() -> list[dict[str, str]]:
    import pydoc_data.topics

    out: list[dict[str, str]] = []
    for topic in sorted(set(pydoc_data.topics.topics) - SKIPPED_TOPICS):
        question = LARGE_TOPICS[pick(topic, len(LARGE_TOPICS))].format(word=topic.replace("-", " "))
        out += rows_of(question, pydoc_data.topics.topics[topic], f"pydoc-topic:{topic}")
    return out


def submodules(name: str) -> list[str]:
    """A package and its modules, recursively, leaving out private and test ones (nothing imported
    but the packages walked)."""
    try:
        mod = importlib.import_module(name)
    except Exception:  # an optional dependency missing, another platform's module
        return []
    out = [name]
    for info in pkgutil.iter_modules(getattr(mod, "__path__", None) or []):
        if info.name.startswith("_") or "test" in info.name:
            continue
        full = f"{name}.{info.name}"
        out += submodules(full) if info.ispkg else [full]
    return out


def package_rows() -> tuple[list[dict[str, str]], list[str]]:
    """Rows of PACKAGES whose metadata names the expected licence, and a note for each package."""
    out: list[dict[str, str]] = []
    notes = []
    for package, (expected, roots) in PACKAGES.items():
        try:
            found = licence(DISTRIBUTIONS.get(package, package))
        except importlib.metadata.PackageNotFoundError:
            notes.append(f"{package}: not installed")
            continue
        if expected.lower() not in found.lower():
            notes.append(f"{package}: skipped, its metadata says {found!r}, not {expected}")
            continue
        names = [package, *(m for root in roots.split() for m in submodules(root))] if roots else submodules(package)
        for module in dict.fromkeys(names):
            try:
                with contextlib.redirect_stdout(io.StringIO()):  # some modules print on import
                    out += object_rows(package, module, importlib.import_module(module))
            except Exception:
                continue
        notes.append(f"{package}: {found}")
    return out, notes


def _plain(doc: str) -> str:
    """An AWS model's HTML documentation -> plain text, paragraphs kept."""
    text = re.sub(r"</p>|<br\s*/?>|</li>", "\n\n", doc)
    text = html.unescape(re.sub(r"<[^>]+>", " ", text))
    return "\n\n".join(re.sub(r"\s+", " ", p).strip() for p in text.split("\n\n") if p.strip())


def botocore_rows() -> tuple[list[dict[str, str]], str]:
    """The AWS API reference that botocore carries (data/SERVICE/VERSION/service-2.json, the newest
    version of each service): each operation's and each structure member's documentation, asked about
    by name; botocore's metadata must name Apache-2.0."""
    try:
        found = licence("botocore")
        import botocore
    except (importlib.metadata.PackageNotFoundError, ImportError):
        return [], "botocore: not installed"
    if "apache-2.0" not in found.lower():
        return [], f"botocore: skipped, its metadata says {found!r}, not Apache-2.0"
    models = sorted((Path(botocore.__file__).parent / "data").glob("*/*/service-2.json*"))
    newest = {path.parts[-3]: path for path in models}  # sorted by version: the newest last
    out: list[dict[str, str]] = []
    for service, path in sorted(newest.items()):
        model = json.loads((gzip.open(path) if path.suffix == ".gz" else path.open("rb")).read())
        name = model.get("metadata", {}).get("serviceFullName", service)
        for op, spec in sorted(model.get("operations", {}).items()):
            out += rows_of(f"What does the {name} `{op}` operation do?", _plain(spec.get("documentation", "")),
                           f"botocore:{service}.{op}")
        for shape, spec in sorted(model.get("shapes", {}).items()):
            for member, m in sorted(spec.get("members", {}).items()):
                out += rows_of(f"In the {name} API, what is `{member}` of `{shape}`?",
                               _plain(m.get("documentation", "")), f"botocore:{service}.{shape}.{member}")
    return out, f"botocore: {found}"


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/smol/corpus.py OUT.jsonl")
    warnings.simplefilter("ignore")
    packages, notes = package_rows()
    aws, note = botocore_rows()
    rows = stdlib_rows() + topic_rows() + packages + aws
    notes.append(note)
    kept = {r["answer"]: r for r in rows if not HELD.search(r["prompt"] + "\n" + r["answer"])}
    ordered = sorted(kept.values(), key=lambda r: pick(r["prompt"] + r["answer"], 1 << 30))
    Path(sys.argv[1]).write_text("".join(json.dumps(r) + "\n" for r in ordered), encoding="utf-8")
    chars = sum(min(len(r["answer"]), 4 * L) for r in ordered)
    by_source: dict[str, int] = {}
    for r in ordered:
        key = r["source"].split(":")[0]
        by_source[key] = by_source.get(key, 0) + min(len(r["answer"]), 4 * L)
    print(f"{len(ordered)} pairs ({len(rows) - len(ordered)} held-out or duplicate left out), about "
          f"{chars // 4:,} answer tokens (characters / 4, at most {L} a row) -> {sys.argv[1]}")
    print("answer tokens by source: " + ", ".join(f"{k} {v // 4:,}" for k, v in sorted(by_source.items())))
    print("packages: " + "; ".join(notes))


if __name__ == "__main__":
    main()
