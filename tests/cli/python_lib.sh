# The Python that has the tools' packages (tensorboard, onnxruntime):
# $CNNFLOW_PYTHON, else the venv scripts/setup_python.sh makes, else python3.
# Sourced by the tests that read cnnflow's files back with them.
tools_python() {
  if [[ -n "${CNNFLOW_PYTHON:-}" ]]; then echo "$CNNFLOW_PYTHON"
  elif [[ -x .venv-tools/bin/python ]]; then echo .venv-tools/bin/python
  else echo python3; fi
}
# Exits 77 (ctest: skipped) with a message when `module` is not importable.
require_module() {
  local py=$1 module=$2
  "$py" -c "import $module" 2> /dev/null && return 0
  echo "SKIP: $module is not importable by $py (scripts/setup_python.sh installs it from PyPI)"
  exit 77
}
