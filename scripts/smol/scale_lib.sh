# Sourced by answers.sh, dflash_scale.sh and eagle3_scale.sh (after they cd to the repository): what
# the teacher data at scale and the runs on it share.

# newest_run OUT: the newest checkpoint under OUT/checkpoints, or OUT itself when its finished run
# (report.json) is at least as new; nothing when OUT holds no checkpoint.
newest_run() {
  local out=$1 newest finished
  newest=$(ls -d "$out"/checkpoints/step-* 2>/dev/null | sort | tail -1)
  finished=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['compute']['steps'])" \
    "$out/report.json" 2>/dev/null || echo -1)  # a run that ended, and at which step
  [ -n "$newest" ] && [ "$finished" -ge "$((10#${newest##*step-}))" ] 2>/dev/null && newest=$out
  echo "$newest"
}

# finished PART: the part's every chunk and its held-out answers are written.
finished() {
  [ -f "$1/val.safetensors" ] && [ -f "$1/train-00031.safetensors" ]
}

# base_part WORK OUT: the part a run in OUT reads as `--data` (its held-out answers: the validation
# set), the same for the whole run: the one recorded in OUT.base, else the lowest-numbered finished
# part of WORK/answers, then recorded (a new machine may hold other parts than part-00); nothing
# when no part is finished.
base_part() {
  local work=$1 out=$2 part
  [ -f "$out.base" ] && { cat "$out.base"; return; }
  for part in "$work"/answers/part-*; do
    finished "$part" && { echo "$part" | tee "$out.base"; return; }
  done
}

# part_seed PART: the seed answers.sh drew part-NN with (NN), which its `--data` run must repeat.
part_seed() {
  local n=${1##*part-}
  echo $((10#$n))
}

# more_parts WORK BASE: every finished part of WORK/answers but BASE (the breadth parts too), then
# (PREFILL=1) every finished part of WORK/prefill (prefill.sh), comma-separated for --more-data;
# nothing when there is none.
more_parts() {
  local work=$1 base=$2 part more=()
  for part in "$work"/answers/{part,breadth}-* ${PREFILL:+"$work"/prefill/part-*}; do  # part-NN.jsonl: never finished
    [ "$part" != "$base" ] && finished "$part" && more+=("$part")
  done
  (IFS=,; echo "${more[*]}")
}
