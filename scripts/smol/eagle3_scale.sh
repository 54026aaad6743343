#!/usr/bin/env bash
# smol-eagle3: an EAGLE-3 head for SmolLM2-135M-Instruct trained on the smol pair's teacher data at
# scale (answers.sh), beside dflash_scale.sh and on the same caches.
#
#   scripts/smol/eagle3_scale.sh [WORK] [MODELS] [STEPS]   # default build/smol specdiff/data/models/smol 3000
#   scripts/smol/eagle3_scale.sh publish [WORK] [MODELS]    # the newest checkpoint -> MODELS/eagle3-drafter
#
# WORK/eagle3-scale: `specdiff distill --method eagle3` on the lowest-numbered finished part of
# WORK/answers (its held-out answers: the validation set; kept in WORK/eagle3-scale.base) and, with --more-data, every other finished part, reading the target
# layers 1, 14, 27: the features smol-dflash's runs cached there (WORK/answers/part-NN/features-1-14-27),
# so no target pass is repeated. A new head (one Llama layer of 576, the target's embedding, an
# 8,192-row draft vocabulary from the answers' token counts, d2t / t2d), or, once MODELS/eagle3-drafter
# exists, that head continued (its layers and map kept). 16 answers a step, each unrolled 7 steps
# (EAGLE-3's training-time test: steps 2..7 read the head's own output), ce + kl per step weighted
# 0.8^(k-1), lr 5e-4 on a cosine over STEPS; tau / alpha measured with `--method eagle3` at gamma 4.
# Checkpoints every 25 steps and --resume: a rerun continues, with the parts finished since.
# `publish` writes the newest checkpoint (or the finished run, if no checkpoint is newer) to
# MODELS/eagle3-drafter in fp16, in the published EAGLE-3 format: do it, and commit, before work
# stops. Run it with nothing else timing on the machine.
#
# For a check on another target (a tiny one): TARGET, LAYERS and DATA_OPTIONS (the teacher-data
# options, word-split) replace the smol ones; the prompts are WORK/questions-large.txt either way.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/smol/scale_lib.sh
if [ "${1:-}" = publish ]; then
  work=${2:-build/smol}
  models=${3:-specdiff/data/models/smol}
  newest=$(newest_run "$work/eagle3-scale")
  [ -n "$newest" ] || { echo "eagle3_scale.sh: no checkpoint in $work/eagle3-scale" >&2; exit 1; }
  mkdir -p "$models"
  python -c "import shutil, sys, tempfile, torch; from pathlib import Path
from specdiff.nets.eagle3 import load_eagle3, save_eagle3
net = load_eagle3(Path(sys.argv[1])); out = Path(sys.argv[2])
tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix='.eagle3-drafter-'))
save_eagle3(tmp, net, torch.float16)
if (out / 'README.md').is_file(): shutil.copy(out / 'README.md', tmp)
shutil.rmtree(out, ignore_errors=True); tmp.chmod(0o755); tmp.rename(out)" "$newest" "$models/eagle3-drafter"
  echo "$newest -> $models/eagle3-drafter"
  exit 0
fi
work=${1:-build/smol}
models=${2:-specdiff/data/models/smol}
steps=${3:-3000}
out=$work/eagle3-scale
target=${TARGET:-smollm2-135m-instruct}
data_options=${DATA_OPTIONS:---chat --prompt-tokens 96 --num-prompts 2048 --continuation-tokens 128 \
--teacher-temperature 0,0.7,1 --teacher-top-p 1,0.95,0.95 --soft-labels 32}
base=$(base_part "$work" "$out")
[ -n "$base" ] || { echo "eagle3_scale.sh: no finished part in $work/answers (scripts/smol/answers.sh makes them)" >&2; exit 1; }
parts=$(more_parts "$work" "$base")
extra=()
[ -n "$parts" ] && extra=(--more-data "$parts")
if [ -f "$models/eagle3-drafter/config.json" ]; then
  extra+=(--drafter "$models/eagle3-drafter")  # its layers and draft vocabulary
else
  extra+=(--target-layers "${LAYERS:-1,14,27}")
fi
# shellcheck disable=SC2086  # data_options: word-split on purpose
specdiff distill --method eagle3 --target "$target" --prompts "$work/questions-large.txt" \
  --data "$base" "${extra[@]}" $data_options --seed "$(part_seed "$base")" --threads 1 \
  --draft-vocab 8192 --unroll 7 --gamma 4 --batch-size 16 --lr 5e-4 --loss ce+kl --max-steps "$steps" \
  --val-every 100 --checkpoint-every 25 --eval-prompts 8 --eval-temperature 0.7 --out "$out" --resume \
  >>"$work/eagle3-scale.log" 2>&1
