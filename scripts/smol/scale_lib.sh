# Sourced by dflash_scale.sh and eagle3_scale.sh (after they cd to the repository): what their runs
# on the teacher data at scale share.

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

# more_parts WORK: every finished part of WORK/answers but part-00 (its held-out answers are the
# validation set), comma-separated for --more-data; nothing when there is none.
more_parts() {
  local work=$1 part more=()
  for part in "$work"/answers/part-*; do
    [ "$part" != "$work/answers/part-00" ] && [ -f "$part/val.safetensors" ] &&
      [ -f "$part/train-00031.safetensors" ] && more+=("$part")
  done
  (IFS=,; echo "${more[*]}")
}
