#!/usr/bin/env bash
# The default job, offline: the embedded demo pair (specdiff/data/models/demo, models.yaml `demo`)
# continues three held-out prompts with specdiff, then `specdiff bench` times plain decoding, spec-ar (the demo AR
# drafter) and specdiff side by side on 8 held-out prompts and checks that every greedy output is
# token-identical to plain decoding (exit 1 if not). Figures go to OUT (default: a temporary dir).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d)}
mkdir -p "$out"
prompts=specdiff/data/prompts/heldout.jsonl
cat <<'TEXT'
== 1. specdiff generate: three held-out prompts (text the models never saw), 48 new tokens each
   --- where the prompt comes from     ... its last 120 characters     >>> the continuation
   (the demo target is a 12M-parameter model trained for 40 minutes: it soon repeats itself)

TEXT
head -3 "$prompts" | specdiff generate --max-new-tokens 48 --jsonl |
  python -c 'import json, sys
prompts = [json.loads(line)["prompt"] for line in open(sys.argv[1])]
for prompt, line in zip(prompts, sys.stdin):
    r = json.loads(line)
    print("---", r["source"], "\n..." + prompt[-120:], "\n>>>" + r["text"], "\n")' "$prompts"
cat <<'TEXT'
== 2. specdiff bench --check: the same target decodes 8 held-out prompts (64 tokens, greedy) by
   ar (plain decoding: the reference), spec-ar (a small AR drafter) and specdiff (the diffusion
   drafter); progress lines first, then the table:
     method      g = gamma, draft length; T = denoising steps per draft; l2r = the schedule
     tok/s       new tokens per second, median over rounds; [min, max] over rounds
     speed-up    tok/s over ar's in the same round (median): above 1.00x is faster than plain
     tau         tokens per target call (bonus included; 1 for ar); alpha: drafted tokens accepted
     ideal       speed-up the measured forward-pass costs allow; meas/ideal: the share achieved
     match       yes: token-identical to ar on every prompt; NO: not; ref: ar itself
   On a busy or shared machine speeds vary from run to run; the match column does not.

TEXT
status=0
specdiff bench --ar-drafter demo-ar --methods ar,spec-ar,specdiff --num-prompts 8 --repeats 1 \
  --check --no-plots --out "$out" > "$out/table.txt" || status=$?
head -n -1 "$out/table.txt"  # the last line is the JSON summary, kept in bench.json
tail -n 1 "$out/table.txt" | python -c 'import json, sys
line = sys.stdin.read().strip()
check = json.loads(line)["check"] if line.startswith("{") else None
print({True: "\nAll outputs identical to plain decoding: every method gave ar'"'"'s tokens on every prompt.",
       False: "\nOutputs DIFFER from plain decoding (the MISMATCH lines above say where): a bug; please report it.",
       None: "\nThe benchmark did not finish (see the error above)."}[check])'
echo "bench.json: $out/bench.json" >&2
exit $status
