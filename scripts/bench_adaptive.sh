#!/usr/bin/env bash
# gamma auto beside fixed gammas and plain decoding, by batch size and temperature (issue 24's
# figures in docs/cli.md): `specdiff bench` runs, one thread, run with nothing else on the machine.
#
#   scripts/bench_adaptive.sh [OUT]     # default build/bench-adaptive
#
#   demo        ar and specdiff (gamma auto, 4, 8) at batch 1, 4, 8, 16 and temperature 0, 0.7, 1:
#               16 held-out prompts, 64 new tokens, a warm-up pass (auto times its costs there)
#               and 2 interleaved rounds; greedy rows checked token-identical (--check)
#   smol        ar and specdiff (gamma auto, 2, 4) at batch 1 and 8, temperature 0 and 0.7: 8
#               held-out questions, 64 new tokens, one round
#   smol-dflash ar and dflash (gamma auto, 4), the same grid
# Each writes OUT/NAME/bench.json, the plot tokens/s by batch size, and OUT/NAME.txt (the table).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/bench-adaptive}
mkdir -p "$out"
specdiff bench --pair demo --methods ar,specdiff --gamma auto,4,8 --batch-size 1,4,8,16 --temperature 0,0.7,1 \
  --num-prompts 16 --max-new-tokens 64 --repeats 2 --warmup 1 --threads 1 --check --out "$out/demo" > "$out/demo.txt"
specdiff bench --pair smol --methods ar,specdiff --gamma auto,2,4 --batch-size 1,8 --temperature 0,0.7 --top-p 0.95 \
  --num-prompts 8 --max-new-tokens 64 --repeats 1 --warmup 1 --threads 1 --check --out "$out/smol" > "$out/smol.txt"
specdiff bench --pair smol-dflash --methods ar,dflash --gamma auto,4 --batch-size 1,8 --temperature 0,0.7 --top-p 0.95 \
  --num-prompts 8 --max-new-tokens 64 --repeats 1 --warmup 1 --threads 1 --check --out "$out/smol-dflash" \
  > "$out/smol-dflash.txt"
