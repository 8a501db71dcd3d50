#!/usr/bin/env bash
# ctest python.pytest: pip-installs the Python package (pyproject.toml) into
# the git-ignored venv .venv-python, then runs tests/python with pytest.
# The package builds in BUILD_DIR-python (beside BUILD_DIR, at the same depth:
# ccache's base_dir makes paths relative to it) with the tree build's
# compilers and options, so ccache hands it the objects the tree's build
# compiled (scripts/test.sh builds position-independent code for that) and
# CI's build is not doubled.
# Skips (exit 77) only when the venv or PyPI's packages cannot be had.
#   run_pytest.sh SOURCE_DIR BUILD_DIR CNNFLOW_BIN [pytest args...]
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
cli=$(realpath "$3")
shift 3
venv=$src/.venv-python
packages=(scikit-build-core nanobind numpy pytest)
option() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
if [[ -n $(option CNNFLOW_SANITIZE) ]]; then
  echo "SKIP: a sanitized build; the Python package is tested in the plain build"
  exit 77
fi
if ! "$venv/bin/python" -c 'import scikit_build_core, nanobind, numpy, pytest' 2> /dev/null; then
  if ! python3 -m venv "$venv"; then
    echo "SKIP: python3 -m venv failed (python3-venv: scripts/setup_python.sh installs it)"
    exit 77
  fi
  if ! "$venv/bin/pip" install -q --disable-pip-version-check "${packages[@]}"; then
    echo "SKIP: pip could not install ${packages[*]} (no PyPI?)"
    exit 77
  fi
fi
# Built without pip's isolation (the venv's nanobind keeps one path, so the
# build folder stays valid from run to run), 2 jobs as ctest -j2 runs.
CMAKE_BUILD_PARALLEL_LEVEL=2 "$venv/bin/pip" install -q --disable-pip-version-check \
  --no-build-isolation --no-deps --force-reinstall \
  -C build-dir="$build-python" \
  -C cmake.define.CMAKE_C_COMPILER="$(option CMAKE_C_COMPILER)" \
  -C cmake.define.CMAKE_CXX_COMPILER="$(option CMAKE_CXX_COMPILER)" \
  -C cmake.define.CNNFLOW_WITH_CUDA="$(option CNNFLOW_WITH_CUDA)" \
  -C cmake.define.CNNFLOW_NATIVE="$(option CNNFLOW_NATIVE)" \
  "$src"
cd "$src/tests/python"
CNNFLOW_BIN=$cli exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" .
