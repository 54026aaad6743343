#!/usr/bin/env bash
# The default job, offline: the embedded demo pair (specdiff/data/models/demo, models.yaml `demo`)
# continues three held-out prompts with specdiff, then `specdiff bench` times plain decoding, spec-ar (the demo AR
# drafter) and specdiff side by side on 8 held-out prompts and checks that every greedy output is
# token-identical to plain decoding (exit 1 if not). Figures go to OUT (default: a temporary dir).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d)}
prompts=specdiff/data/prompts/heldout.jsonl
head -3 "$prompts" | specdiff generate --max-new-tokens 48 --jsonl |
  python -c 'import json, sys
prompts = [json.loads(line)["prompt"] for line in open(sys.argv[1])]
for prompt, line in zip(prompts, sys.stdin):
    r = json.loads(line)
    print("---", r["source"], "\n..." + prompt[-120:], "\n>>>" + r["text"], "\n")' "$prompts"
specdiff bench --ar-drafter demo-ar --methods ar,spec-ar,specdiff --num-prompts 8 --repeats 1 \
  --check --no-plots --out "$out" | head -n -1
echo "bench.json: $out/bench.json" >&2
