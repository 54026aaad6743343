#!/usr/bin/env bash
# The smol pair's prefill teacher corpus: the target reads given answers (one forward pass a batch,
# no decoding loop) for its soft labels and features.
#
#   scripts/smol/prefill.sh [WORK] [PARTS] [FIRST]   # default build/smol 64 0: parts FIRST .. PARTS - 1
#
# WORK/corpus.jsonl: question / answer pairs from the docstrings and help topics of Python and of
# permissively licensed installed packages (scripts/smol/corpus.py: licences checked and printed; no
# held-out module or topic), in a stable shuffled order. WORK/prefill/part-NN.jsonl: its rows
# NN * ROWS + 1 .. (NN + 1) * ROWS (ROWS = 2,112), and WORK/prefill/part-NN the teacher cache made of
# them (`specdiff distill --chat --prefill`): each question through the chat template left-padded to
# 96 tokens, its answer's first 128 tokens (then the end-of-turn token to 128), the target's top-32
# soft labels at every answer position and the outputs of target layers 1, 14 and 27 that
# smol-dflash and smol-eagle3 read (part-NN/features-1-14-27), all from the same pass; a part's
# last 64 usable rows (a tenth of a shorter part) are held out, the rest train. The parts train
# beside the generated answers (answers.sh) as `specdiff distill --more-data DIR,DIR,...` (same
# target, P, L and soft labels). Resumable: a part's chunks are written as they are made and a
# finished part (its val.safetensors, written last) is skipped; the loop stops where the corpus
# ends. Run it with nothing else timing on the machine; a second run with another FIRST makes other
# parts meanwhile.
# PREFILL_TARGET and PREFILL_ROWS override the target and ROWS (the tests run it on a tiny model).
set -euo pipefail
cd "$(dirname "$0")/../.."
work=${1:-build/smol}
parts=${2:-64}
first=${3:-0}
target=${PREFILL_TARGET:-smollm2-135m-instruct}
rows=${PREFILL_ROWS:-2112}
mkdir -p "$work/prefill"
[ -f "$work/corpus.jsonl" ] || python scripts/smol/corpus.py "$work/corpus.jsonl"
for ((i = first; i < parts; i++)); do
  part=$(printf '%s/prefill/part-%02d' "$work" "$i")
  [ -f "$part/val.safetensors" ] && continue
  if [ ! -f "$part.jsonl" ]; then
    sed -n "$((i * rows + 1)),$(((i + 1) * rows))p" "$work/corpus.jsonl" > "$part.jsonl.tmp"
    mv "$part.jsonl.tmp" "$part.jsonl"
  fi
  if [ "$(wc -l < "$part.jsonl")" -lt 2 ]; then
    rm -f "$part.jsonl"
    echo "prefill.sh: the corpus ends before part $i" >&2
    break
  fi
  specdiff distill --target "$target" --chat --prefill --prompts "$part.jsonl" --data "$part" \
    --prompt-tokens 96 --num-prompts "$rows" --continuation-tokens 128 --soft-labels 32 --threads 1 \
    --method dflash --target-layers 1,14,27 --layers 2 --heads 9 --gamma 7 --out "$work/prefill/run" --data-only
done
