#!/usr/bin/env bash
# smol-dflash on the teacher data at scale (answers.sh): continue the shipped drafter on every
# finished part.
#
#   scripts/smol/dflash_scale.sh [WORK] [MODELS] [STEPS]   # default build/smol specdiff/data/models/smol 3000
#   scripts/smol/dflash_scale.sh publish [WORK] [MODELS]    # the newest checkpoint -> MODELS/dflash-drafter
#
# WORK/dflash-scale: `specdiff distill --method dflash` started from MODELS/dflash-drafter (fp16 in
# git: the checkpoint a new machine continues from; its 8,192-row draft vocabulary kept), trained on
# the lowest-numbered finished part of WORK/answers (its held-out answers: the validation set; kept
# for the run in WORK/dflash-scale.base) and, with --more-data, every other finished part; 16
# answers x 8 anchors a step (896 scored slots: more anchors a row cost little, the row's context
# is read once), ce + kl per slot, lr 5e-4 (or $LR) on a cosine over STEPS. FRESH=1: a new drafter
# of the shipped shape (2 layers, the 8,192 most frequent answer tokens as its head) in
# WORK/dflash-fresh instead, the same data and steps as eagle3_scale.sh's new head (issue 33's
# same-budget comparison). PREFILL=1: the finished parts of the prefill corpus (prefill.sh) train
# beside the answers. RUN=NAME: the run in WORK/NAME (an experiment beside the main run); LOSS:
# distill's --loss (default ce+kl).
# Checkpoints every 25 steps (about 3 minutes) and --resume: a rerun continues, with the parts
# finished since (on a new machine, without WORK: from MODELS/dflash-drafter, the schedule anew).
# `publish` writes the newest checkpoint (or the finished run, if no checkpoint is newer) to MODELS/dflash-drafter in fp16 with
# its map: do it, and commit, before work stops. Run it with nothing else timing on the machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/smol/scale_lib.sh
if [ "${1:-}" = publish ]; then
  work=${2:-build/smol}
  models=${3:-specdiff/data/models/smol}
  newest=$(newest_run "$work/${RUN:-dflash-scale}")
  [ -n "$newest" ] || { echo "dflash_scale.sh: no checkpoint in $work/${RUN:-dflash-scale}" >&2; exit 1; }
  python -c "import shutil, sys, tempfile, torch; from pathlib import Path
from specdiff.nets.dflash import load_dflash, save_dflash
net, spec = load_dflash(Path(sys.argv[1])); out = Path(sys.argv[2])
tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix='.dflash-drafter-'))
save_dflash(tmp, net, spec, torch.float16); shutil.copy(Path(sys.argv[1]) / 'draft_vocab.safetensors', tmp)
shutil.copy(out / 'README.md', tmp); shutil.rmtree(out); tmp.chmod(0o755); tmp.rename(out)" "$newest" "$models/dflash-drafter"
  echo "$newest -> $models/dflash-drafter"
  exit 0
fi
work=${1:-build/smol}
models=${2:-specdiff/data/models/smol}
steps=${3:-3000}
out=$work/${RUN:-dflash-scale}
from=(--drafter "$models/dflash-drafter")
if [ -n "${FRESH:-}" ]; then  # a new drafter of the shipped shape, as eagle3_scale.sh's new head
  out=$work/dflash-fresh
  from=(--layers 2 --heads 9 --target-layers 1,14,27 --draft-vocab 8192)
fi
base=$(base_part "$work" "$out")
[ -n "$base" ] || { echo "dflash_scale.sh: no finished part in $work/answers (scripts/smol/answers.sh makes them)" >&2; exit 1; }
parts=$(more_parts "$work" "$base")
extra=()
[ -n "$parts" ] && extra=(--more-data "$parts")
specdiff distill --method dflash --target smollm2-135m-instruct --chat --prompts "$work/questions-large.txt" \
  --data "$base" "${extra[@]}" --prompt-tokens 96 --num-prompts 2048 --continuation-tokens 128 \
  --teacher-temperature 0,0.7,1 --teacher-top-p 1,0.95,0.95 --soft-labels 32 --seed "$(part_seed "$base")" --threads 1 \
  --gamma 7 --anchors 8 --batch-size 16 --lr "${LR:-5e-4}" --loss "${LOSS:-ce+kl}" --max-steps "$steps" --val-every 100 \
  --checkpoint-every 25 --eval-prompts 8 --eval-temperature 0.7 --out "$out" "${from[@]}" --resume >>"$out.log" 2>&1
