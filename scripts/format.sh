#!/usr/bin/env bash
# Formats the C++ and CUDA sources with clang-format-14 and .clang-format
# (Google style, 100 columns).
#   scripts/format.sh           rewrite the files in place
#   scripts/format.sh --check   change nothing; list the files that differ and
#                               exit 1 (ctest cli.format, so CI checks it)
# Exits 77 when clang-format-14 is not installed (scripts/setup.sh adds it).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format-14 >/dev/null || { echo "SKIP: clang-format-14 not found (scripts/setup.sh installs it)"; exit 77; }
# The tracked sources where this is a git checkout, else every source below
# the source folders (an unpacked archive).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
else
  mapfile -t files < <(find bench fuzz loaders ops pipeline python stages tests tools \
                         -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh')
fi
if [[ "${1:-}" != --check ]]; then
  clang-format-14 -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format-14 --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "FAIL: ${#bad[@]} of ${#files[@]} files are not clang-formatted (run scripts/format.sh):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "PASS: ${#files[@]} sources clang-formatted"
