#!/usr/bin/env bash
# The smol pair's figures in the README, docs/pairs.md and the drafter's card: two `specdiff bench` runs on the
# held-out questions, 128 new tokens, batch 1, fp32, 1 thread (run it with nothing else on the machine):
#
#   scripts/smol/bench.sh [OUT] [N]     # default build/smol/bench, N = 6 questions
#
#   greedy   every method of the field beside specdiff (gamma 4 and 8, T = 1 and 2), --check
#   sampled  ar and specdiff at temperature 0.7 and 1.0 (top-p 0.95): K = 1 and 4 candidate
#            drafts, acceptance standard / select / multi (the combinations that exist), T = 1, 2
#   dflash   the smol-dflash pair: ar and dflash at gamma 2, 3, 4, 7, greedy (--check) and at
#            temperature 0.7 (top-p 0.95)
# Each run times every row once (--repeats 1) after no warm-up pass: a pass is 6 x 128 tokens
# at 5-20 tokens/s here, and a run with the rows interleaved over 3 rounds would take hours.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build/smol/bench}
n=${2:-6}
mkdir -p "$out"
specdiff bench --pair smol --methods ar,spec-ar,hf-assisted,hf-prompt-lookup,specdiff --gamma 4,8 --steps 1,2 \
  --num-prompts "$n" --max-new-tokens 128 --repeats 1 --warmup 0 --threads 1 --check --no-plots \
  --out "$out/greedy" > "$out/greedy.txt"
specdiff bench --pair smol --methods ar,specdiff --gamma 8 --steps 1,2 --drafts 1,4 \
  --acceptance standard,select,multi --temperature 0.7,1 --top-p 0.95 \
  --num-prompts "$n" --max-new-tokens 128 --repeats 1 --warmup 0 --threads 1 --no-plots \
  --out "$out/sampled" > "$out/sampled.txt"
specdiff bench --pair smol-dflash --methods ar,dflash --gamma 2,3,4,7 --temperature 0,0.7 --top-p 0.95 \
  --num-prompts "$n" --max-new-tokens 128 --repeats 1 --warmup 0 --threads 1 --check --no-plots \
  --out "$out/dflash" > "$out/dflash.txt"
