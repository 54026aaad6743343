#!/usr/bin/env bash
# Build the smol pair's drafters (SmolLM2-135M-Instruct target, models.yaml `smol`) with no hub:
#
#   scripts/smol/build.sh [WORK] [MODELS]   # default build/smol specdiff/data/models/smol
#
#   1. questions  prompts/smol-train.txt and the held-out specdiff/data/prompts/smol-heldout.jsonl
#                 (questions.py: written from the standard library's docstrings, pydoc topics, the FAQ)
#   2. teacher    WORK/data: the target's answers to 1,280 training questions through its chat
#                 template, 128 tokens each, chunks alternating greedy / temperature 0.7 / 1.0 (top-p
#                 0.95), with its top-32 soft labels (`specdiff distill --data-only`, 1 thread)
#   3. drafters   three drafters on that data, trained at once (one thread each): the DDiTs for
#                 SMOL_STEPS steps of 32 rows (8 draft slots each, about 6 masked: ~190 scored
#                 tokens a step), the AR drafter for 333 steps of 8 answers (~1,000 scored tokens a
#                 step). The shipped DDiTs: SMOL_STEPS=500, then SMOL_STEPS=1000, which resumes
#                 them (the cosine learning rate then restarts at 0.6 x its peak at step 500); the
#                 AR drafter: 333 steps (an earlier run of this step):
#                 WORK/aligned  DDiT 2 x 576 reading and writing through the target's own token
#                               embedding and output head (frozen; --from-target), N = 48, gamma 8,
#                               T <= 2: soft-label KL + SpecDiff-2's ce-streak at temperature 0.7
#                               (the shipped diffusion drafter)
#                 WORK/ce       the same DDiT trained with plain cross-entropy (the alignment's baseline)
#                 WORK/ar       GPT-2 2 x 256 on the same answers (the spec-ar baseline's drafter)
#   4. fp16       MODELS/drafter (the aligned DDiT) and MODELS/ar-drafter, in fp16
#   5. dflash     WORK/dflash: a DFlash drafter (2 Qwen3 layers of 576, 9.0M parameters, reading the
#                 outputs of target layers 1, 14 and 27; block 8 = gamma 7) on the same teacher data,
#                 `specdiff distill --method dflash`: first the target's features of every sequence
#                 (WORK/data/features-1-14-27, cached a chunk at a time), then DFLASH_STEPS steps of
#                 32 answers x 2 blocks (448 scored slots a step; 550 steps: 246k, the DDiT's 1,000
#                 x 32 x 8 = 256k draft slots), ce + kl per slot weighted exp(-(k - 1) / 3.5);
#                 MODELS/dflash-drafter in fp16 (pair `smol-dflash`). The shipped one:
#                 DFLASH_STEPS=550 (the DDiT's budget), then DFLASH_STEPS=1400, which resumes it (the
#                 cosine learning rate then restarts at 0.78 x its peak at step 550)
#   6. vocab      draft vocabularies (specdiff.vocab) of the three shipped drafters: MODELS/*/
#                 draft_vocab.safetensors, the VOCAB_N (default 8,192) most frequent tokens of the
#                 target's answers in WORK/data with its special tokens (training/vocab.py); the
#                 counts also go to scripts/smol/answer-counts.safetensors, from which the maps are
#                 rebuilt when WORK/data is gone (`specdiff drafter convert --frequencies` reads both)
#   7. data at scale  WORK/answers: the target's answers to ~34k broad questions in SMOL_PARTS (default
#                 16) parts of 2,048, with the features smol-dflash reads (answers.sh; ~1 hour a part on
#                 one core, so run it over days); both cores: a second `answers.sh WORK PARTS FIRST`
#   8. dflash at scale  WORK/dflash-scale: smol-dflash continued on every finished part (dflash_scale.sh,
#                 SMOL_SCALE_STEPS steps, default 3000), then published to MODELS/dflash-drafter in fp16
#                 (`dflash_scale.sh publish`); commit it (and its card) whenever work stops
#   9. on a GPU   scripts/smol/gpu.sh (two device calls: pack here, stash, run, merge here): the
#                 target's answers in bulk and smol-dflash trained on them in one prepared run;
#                 the returned weights merged into WORK/dflash-gpu, adopted only if bench says so
#
# Resumable: every step is skipped when its output exists; the teacher data is written a chunk at
# a time and training checkpoints every 100 steps (every 2 minutes for the AR drafter), so a rerun
# after an interruption continues where it stopped. Run it with nothing else on the machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=${1:-build/smol}
models=${2:-specdiff/data/models/smol}
steps=${SMOL_STEPS:-1000}
dflash_steps=${DFLASH_STEPS:-1400}
vocab_n=${VOCAB_N:-8192}
target=smollm2-135m-instruct
mkdir -p "$work"

[ -f specdiff/data/prompts/smol-heldout.jsonl ] || python scripts/smol/questions.py

teacher=(--target "$target" --chat --prompts prompts/smol-train.txt --data "$work/data" --prompt-tokens 96
         --num-prompts 1280 --continuation-tokens 128 --teacher-temperature 0,0.7,1 --teacher-top-p 1,0.95,0.95
         --soft-labels 32 --threads 1)
[ -f "$work/data/val.safetensors" ] && [ -f "$work/data/train-00019.safetensors" ] ||
  specdiff distill "${teacher[@]}" --out "$work/data-run" --data-only --from-target --dim 576 --heads 9

train=(--from-target --layers 2 --dim 576 --heads 9 --context 48
       --gamma 8 --steps-per-draft 2 --batch-size 32 --lr 1e-3 --max-steps "$steps"
       --val-every 100 --checkpoint-every 100 --eval-prompts 8 --eval-temperature 0.7 --draft-temperature 0.7)
trained() {  # trained DIR: the steps DIR's finished run took (0: none yet)
  python -c "import json, sys; print(json.load(open(sys.argv[1]))['compute']['steps'])" "$1/report.json" 2>/dev/null ||
    echo 0
}
diffusion() {  # diffusion NAME LOSS: one DDiT drafter, resuming from its checkpoints; log in WORK/NAME.log
  local resume=()
  [ -d "$work/$1/checkpoints" ] && resume=(--resume)
  [ "$(trained "$work/$1")" -ge "$steps" ] ||
    specdiff distill "${teacher[@]}" "${train[@]}" --out "$work/$1" --loss "$2" "${resume[@]}" >>"$work/$1.log" 2>&1
}
ar() {  # the AR drafter: 8 answers (224 tokens with the prompt) a step
  local tokenizer
  tokenizer=$(python -c "from specdiff.registry import load_registry; print(load_registry().entries['$target'].source)")
  [ -f "$work/ar/model/config.json" ] ||
    python scripts/demo/train_lm.py --sequences "$work/data" --tokenizer "$tokenizer" --work "$work/ar" \
      --out "$work/ar/model" --layers 2 --dim 256 --heads 4 --batch-size 8 --lr 1e-3 \
      --steps 333 --eval-s 120 --threads 1 --save-dtype fp32 >>"$work/ar.log" 2>&1
}
diffusion aligned kl+ce-streak &
pids=($!)
diffusion ce ce &
pids+=($!)
ar &
pids+=($!)
for pid in "${pids[@]}"; do wait "$pid"; done

if [ ! "$models/drafter/config.json" -nt "$work/aligned/config.json" ]; then  # none, or an older run's
  rm -rf "$models/drafter"
  specdiff drafter convert "$work/aligned" --out "$models/drafter" --dtype fp16
fi
if [ ! -f "$models/ar-drafter/config.json" ]; then
  mkdir -p "$models/ar-drafter"
  python -c "import sys, torch; from transformers import AutoModelForCausalLM, AutoTokenizer
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float16); m.save_pretrained(sys.argv[2])
AutoTokenizer.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2])" "$work/ar/model" "$models/ar-drafter"
fi

dflash() {  # the DFlash drafter, resuming from its checkpoints; log in WORK/dflash.log
  local resume=()
  [ -d "$work/dflash/checkpoints" ] && resume=(--resume)
  [ "$(trained "$work/dflash")" -ge "$dflash_steps" ] ||
    specdiff distill "${teacher[@]}" --method dflash --layers 2 --heads 9 --gamma 7 --target-layers 1,14,27 \
      --anchors 2 --batch-size 32 --lr 1e-3 --loss ce+kl --max-steps "$dflash_steps" --val-every 50 \
      --checkpoint-every 25 --eval-prompts 8 --eval-temperature 0.7 --out "$work/dflash" "${resume[@]}" \
      >>"$work/dflash.log" 2>&1
}
dflash
if [ ! "$models/dflash-drafter/config.json" -nt "$work/dflash/config.json" ]; then
  rm -rf "$models/dflash-drafter"
  mkdir -p "$models/dflash-drafter"
  python -c "import sys, torch; from pathlib import Path; from specdiff.nets.dflash import load_dflash, save_dflash
net, spec = load_dflash(Path(sys.argv[1])); save_dflash(Path(sys.argv[2]), net, spec, torch.float16)" \
    "$work/dflash" "$models/dflash-drafter"
fi

counts=scripts/smol/answer-counts.safetensors
[ -f "$counts" ] || python -c "import sys; from pathlib import Path; from specdiff import load_target
from specdiff.training.vocab import answer_counts, save_counts
t = load_target(sys.argv[1]); counts, n = answer_counts(Path(sys.argv[2]), t.vocab_size, t.eos_token_id)
save_counts(Path(sys.argv[3]), counts, t.tokenizer, f'the {n:,} answer tokens of the smol pair\'s teacher data')" \
  "$target" "$work/data" "$counts"
for drafter in drafter ar-drafter dflash-drafter; do
  [ -f "$models/$drafter/draft_vocab.safetensors" ] ||
    python -c "import sys; from pathlib import Path; from specdiff import load_target
from specdiff.training.vocab import build_vocab
t = load_target(sys.argv[1]); build_vocab(Path(sys.argv[2]), int(sys.argv[3]), t.tokenizer, t.eos_token_id).save(Path(sys.argv[4]))" \
      "$target" "$counts" "$vocab_n" "$models/$drafter"
done

bash scripts/smol/answers.sh "$work" "${SMOL_PARTS:-16}"
bash scripts/smol/dflash_scale.sh "$work" "$models" "${SMOL_SCALE_STEPS:-3000}"
bash scripts/smol/dflash_scale.sh publish "$work" "$models"
