#!/usr/bin/env bash
# torch_venv.sh: the PyTorch 2.x peer of the CPU benchmarks (issue 11), the
# PyPI wheel in a git-ignored virtual environment. Prints the venv's python
# on stdout when it has torch >= 2 (installing it first with --install).
#
# usage: bench/torch_venv.sh [--install] [--venv DIR]
#   --venv DIR   default: .venv-torch in the repository root (git-ignored)
#   --install    if DIR lacks torch 2.x: python3 -m venv DIR &&
#                DIR/bin/pip install torch numpy and what the comparisons
#                with PyTorch read and write (torchvision safetensors onnx
#                onnxruntime onnxscript), from PyPI. Refused when $CI is set:
#                CI never downloads the wheel.
# Environment: TORCH_VENV_PYTHON (the interpreter that makes the venv;
# default python3 on PATH, not Debian's /usr/bin/python3, which lacks
# ensurepip), TORCH_PIP_ARGS (extra pip arguments; the PyPI wheel pulls
# the CUDA libraries, ~5 GB, and runs the same CPU kernels without them).
# Exit status: 0 and the python path on stdout; 1 (a reason on stderr) when
# there is no usable torch 2.x.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-torch"
INSTALL=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --install) INSTALL=1; shift ;;
    --venv) VENV="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "torch_venv.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
PY="$VENV/bin/python"

# torch's major version in the venv, or nothing.
torch_major() {
  [[ -x "$PY" ]] || return 0
  "$PY" -c 'import torch; print(torch.__version__.split(".")[0])' 2>/dev/null || true
}

major=$(torch_major)
if [[ -z "$major" && $INSTALL -eq 1 ]]; then
  if [[ -n "${CI:-}" ]]; then
    echo "torch_venv.sh: CI is set: not installing torch into $VENV" >&2
    exit 1
  fi
  maker="${TORCH_VENV_PYTHON:-python3}"
  echo "torch_venv.sh: installing torch, numpy and the comparisons' packages from PyPI into $VENV (${TORCH_PIP_ARGS:-default index; ~5 GB with the CUDA libraries})" >&2
  [[ -x "$PY" ]] || "$maker" -m venv "$VENV" >&2
  # shellcheck disable=SC2086
  "$VENV/bin/pip" install --disable-pip-version-check ${TORCH_PIP_ARGS:-} torch numpy torchvision \
    safetensors onnx onnxruntime onnxscript >&2
  major=$(torch_major)
fi
if [[ -z "$major" ]]; then
  echo "torch_venv.sh: no torch in $VENV (bench/torch_venv.sh --install makes it)" >&2
  exit 1
fi
if (( major < 2 )); then
  echo "torch_venv.sh: $VENV has torch $major.x, not 2.x" >&2
  exit 1
fi
echo "$PY"
