#!/usr/bin/env bash
# The smol pair's teacher data at scale: the target's own answers to the broad question set.
#
#   scripts/smol/answers.sh [WORK] [PARTS] [FIRST]   # default build/smol 16 0: parts FIRST .. PARTS - 1
#
# WORK/questions-large.txt: about 34k training questions (questions.py --large; no held-out module or
# topic). WORK/answers/part-NN: PARTS parts of 2,048 answers each (128 tokens through the chat
# template, chunks alternating greedy / temperature 0.7 / 1.0 at top-p 0.95, the target's top-32
# soft labels) and the outputs of target layers 1, 14 and 27 that smol-dflash reads (taken from the
# same calls, part-NN/features-1-14-27), part NN drawn with seed NN, so parts are independent samples of the questions and
# any number of them can be trained on (`specdiff distill --more-data DIR,DIR,...`). About 37 minutes a
# part on one core. Resumable: a part's chunks are written as they are made and a finished part is
# skipped; run it with nothing else timing on the machine. Two cores: a second run with another
# FIRST (say PARTS / 2) makes other parts at the same time.
# SET=breadth: the questions about third-party packages instead (questions.py --breadth:
# WORK/questions-breadth.txt, with its packages' licences beside it) into WORK/answers/breadth-NN, the
# same recipe; the scale runs train on them with the other parts.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/smol/scale_lib.sh
work=${1:-build/smol}
parts=${2:-16}
first=${3:-0}
target=smollm2-135m-instruct
set=${SET:-large}
case $set in large) name=part ;; breadth) name=breadth ;; *) echo "answers.sh: SET is large or breadth, not $set" >&2; exit 2 ;; esac
questions=$work/questions-$set.txt
mkdir -p "$work/answers"
[ -f "$questions" ] || python scripts/smol/questions.py "--$set" "$questions"
for ((i = first; i < parts; i++)); do
  part=$(printf '%s/answers/%s-%02d' "$work" "$name" "$i")
  finished "$part" && continue
  specdiff distill --target "$target" --chat --prompts "$questions" --data "$part" \
    --prompt-tokens 96 --num-prompts 2048 --continuation-tokens 128 --teacher-temperature 0,0.7,1 \
    --teacher-top-p 1,0.95,0.95 --soft-labels 32 --seed "$i" --threads 1 \
    --method dflash --target-layers 1,14,27 --layers 2 --heads 9 --gamma 7 --out "$work/answers/run" --data-only
done
