#!/usr/bin/env bash
# The Python packages some tests read cnnflow's files back with, from PyPI,
# into the git-ignored venv .venv-tools: tensorboard (its event reader, for
# the event files), onnxruntime and onnx (the exported model), numpy and
# safetensors. Safe to run twice; tests that need a package skip with a
# message when it is missing (no network, no pip).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-tools
packages=(tensorboard onnxruntime onnx numpy safetensors)
if [[ -x $venv/bin/python ]] &&
   $venv/bin/python -c 'import tensorboard, onnxruntime, onnx, numpy, safetensors' 2> /dev/null; then
  echo "setup_python: $venv has ${packages[*]}"
  exit 0
fi
if ! python3 -c 'import venv, ensurepip' 2> /dev/null; then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-venv
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "${packages[@]}"
echo "setup_python: installed ${packages[*]} into $venv"
