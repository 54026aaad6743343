#!/usr/bin/env bash
# The default job until the embedded demo pair ships: build a tiny random GPT-2 target and a random
# diffusion drafter for it (offline, seconds), then run `specdiff generate` with ar and specdiff and
# show that the outputs are identical. The text is gibberish (random weights); the code path is the
# real one.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-$(mktemp -d)}
python - "$work" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "tests")
from tiny import make_gpt2, make_tokenizer
root = Path(sys.argv[1])
if not (root / "target" / "config.json").exists():
    tok = make_tokenizer(root / "tokenizer", vocab_size=300)
    make_gpt2(root / "target", tok, scale=10, dim=64, layers=2)
PY
[ -d "$work/drafter" ] || specdiff drafter init --target "$work/target" --out "$work/drafter" --layers 1 --dim 32 --heads 2 --context 16 >/dev/null
prompts="$work/prompts.txt"
printf 'The quick brown fox\nTo be, or not to be\nCall me Ishmael.\n' > "$prompts"
specdiff generate --target "$work/target" --method ar --prompt-file "$prompts" --max-new-tokens 32 > "$work/ar.txt"
specdiff generate --target "$work/target" --drafter "$work/drafter" --method specdiff --gamma 4 --steps 2 \
  --prompt-file "$prompts" --max-new-tokens 32 --stats > "$work/specdiff.txt"
cat "$work/specdiff.txt"
cmp -s "$work/ar.txt" "$work/specdiff.txt" && echo "specdiff output identical to plain decoding ($work)" >&2
