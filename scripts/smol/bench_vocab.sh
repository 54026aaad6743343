#!/usr/bin/env bash
# Issue 34's figures: the smol drafters with and without a draft vocabulary (specdiff.vocab), each
# `specdiff bench` run timing `ar` beside the drafted method on the held-out questions (6, 128 new
# tokens, batch 1, 1 thread). Run it with nothing else on the machine.
#
#   scripts/smol/bench_vocab.sh sweep [OUT]   # dflash g=4, greedy, torch: the full head, then maps of
#                                             # 4,096 / 8,192 / 16,384 rows (OUT/dflash-N, cut from the
#                                             # shipped drafter by `drafter convert --draft-vocab`)
#   scripts/smol/bench_vocab.sh table [OUT]   # dflash and specdiff (g=4), greedy and t=0.7 / top-p 0.95,
#                                             # torch and ONNX Runtime, full head (DRAFTER_full) vs the
#                                             # shipped map: four exports (OUT/onnx-*), 2 rounds each
# OUT defaults to build/smol/vocab. The maps come from scripts/smol/answer-counts.safetensors.
set -euo pipefail
cd "$(dirname "$0")/../.."
part=${1:-sweep}
out=${2:-build/smol/vocab}
counts=scripts/smol/answer-counts.safetensors
target=smollm2-135m-instruct
mkdir -p "$out"
common=(--num-prompts 6 --max-new-tokens 128 --threads 1 --no-plots)

full() {  # full NAME SHIPPED: a copy of a shipped drafter without its map (what was shipped before)
  [ -d "$out/$1" ] || { cp -r "specdiff/data/models/smol/$2" "$out/$1"; rm -f "$out/$1/draft_vocab.safetensors"; }
}
cut() {  # cut N: the shipped DFlash drafter with a map of N rows
  [ -d "$out/dflash-$1" ] || specdiff drafter convert "$out/dflash-full" --target "$target" --dtype fp16 \
    --draft-vocab "$1" --frequencies "$counts" --out "$out/dflash-$1" >/dev/null
}
full dflash-full dflash-drafter
full drafter-full drafter
if [ "$part" = sweep ]; then
  for n in full 4096 8192 16384; do
    [ "$n" = full ] || cut "$n"
    specdiff bench --pair smol-dflash --drafter "$out/dflash-$n" --methods ar,dflash --gamma 4 --repeats 1 \
      --warmup 0 --check "${common[@]}" --out "$out/sweep-$n" > "$out/sweep-$n.txt"
  done
  exit 0
fi
for d in full shipped; do
  dflash=$out/dflash-full drafter=$out/drafter-full
  [ "$d" = shipped ] && dflash=smol-dflash-drafter drafter=smol-drafter
  [ -f "$out/onnx-dflash-$d/manifest.json" ] ||
    specdiff export --target "$target" --drafter "$dflash" --out "$out/onnx-dflash-$d" >/dev/null
  [ -f "$out/onnx-drafter-$d/manifest.json" ] ||
    specdiff export --target "$target" --drafter "$drafter" --out "$out/onnx-drafter-$d" >/dev/null
  specdiff bench --pair smol-dflash --drafter "$dflash" --methods ar,dflash --gamma 4 --temperature 0,0.7 \
    --top-p 0.95 --repeats 2 --warmup 0 --check --artifacts "$out/onnx-dflash-$d" "${common[@]}" \
    --out "$out/table-dflash-$d" > "$out/table-dflash-$d.txt"
  specdiff bench --pair smol --drafter "$drafter" --methods ar,specdiff --gamma 4 --steps 1 --temperature 0,0.7 \
    --top-p 0.95 --repeats 2 --warmup 0 --check --artifacts "$out/onnx-drafter-$d" "${common[@]}" \
    --out "$out/table-drafter-$d" > "$out/table-drafter-$d.txt"
done
