#!/usr/bin/env bash
# The house's rules (CONTRIBUTING.md), checked on the sources so they cannot
# drift:
#  - includes go one way: ops <- loaders <- stages <- pipeline <- onnx <- tools,
#    and only tools/ and tests/ include a tools/ header (the CLI is no library);
#  - inside ops/, each room keeps to itself: the collectives include no CUDA
#    header (the NCCL group is made in ops/cuda/), no kernel and not the
#    device seam include ops/train/ (the loss contract is ops/loss.h), the
#    model includes no ops/parallel/ header (tensor parallelism reaches it
#    as a LayerSplitter), and a header lives in the room that implements it
#    (ops/parallel/ has no header whose only implementation is in ops/cuda/).
#  - one registry: Registry<T> (ops/registry.h) is the only class with a
#    static Get() and a Register();
#  - options are filled by the config's parser, not copied field by field;
#  - source files stay within 800 lines, functions within 100 (universal-
#    ctags' spans, lambdas included) but for at most 3, each named with its
#    reason in CONTRIBUTING.md ("Long functions");
#  - every registered layer type has an ONNX export or a declaration that it
#    has none (read from `cnnflow stages`, when the binary is given).
#   usage: house_test.sh [CNNFLOW_BINARY]   (from the repository root)
set -u
fail=0
# forbid PATHS FOLDERS WHY: no #include of a header under FOLDERS (an ERE
# alternation) in the files under PATHS.
forbid() {
  local paths=$1 folders=$2 why=$3 hits
  hits=$(grep -rnE "^#include \"($folders)/" $paths --include='*.h' --include='*.cc' --include='*.cu')
  if [[ -n "$hits" ]]; then
    echo "$why:"
    echo "$hits" | sed 's/^/  /'
    fail=1
  fi
}
forbid ops "loaders|stages|pipeline|onnx|tools" "ops/ includes a layer above it"
forbid loaders "stages|pipeline|onnx|tools" "loaders/ includes a layer above it"
forbid stages "pipeline|onnx|tools" "stages/ includes a layer above it"
forbid pipeline "onnx|tools" "pipeline/ includes a layer above it"
forbid onnx "tools" "onnx/ includes tools/"
forbid "bench fuzz python" "tools" "a library user includes a tools/ header (the CLI is no library)"
forbid ops/collectives "ops/cuda" "the collectives include a CUDA header (make the GPU group in ops/cuda/)"
forbid "ops/cpu ops/device_ops.h ops/device_ops.cc" "ops/train" "a kernel or the device seam includes ops/train/ (the loss contract is ops/loss.h)"
forbid "ops/model.h ops/model.cc" "ops/parallel" "the model includes ops/parallel/ (tensor parallelism is a LayerSplitter)"
# A header of ops/parallel/ is implemented there.
for h in ops/parallel/*.h; do
  base=$(basename "$h" .h)
  if [[ ! -f "ops/parallel/$base.cc" ]] && grep -rlq "#include \"$h\"" ops/cuda --include='*.cc' --include='*.cu'; then
    echo "$h is implemented only in ops/cuda/: it belongs there"
    fail=1
  fi
done
# One registry template: a class of its own with a static Get() and a
# Register() is a second registry.
hits=$(grep -rlE "void Register\(" ops loaders stages pipeline onnx tools python \
         --include='*.h' --include='*.cc' --include='*.cu' | grep -v '^ops/registry.h$' |
       xargs -r grep -lE "static [A-Za-z_:<>]+ ?& ?Get\(\)")
if [[ -n "$hits" ]]; then
  echo "a registry defined outside ops/registry.h (use Registry<T>):"
  echo "$hits" | sed 's/^/  /'
  fail=1
fi
# Options are filled once, by the config's parser: nobody else copies a
# RunConfig option field by field into an options struct (start from
# config.data_parallel or config.pipeline_options whole, add the layout).
hits=$(grep -rnE "^\s*\w+\.\w+ = (config_|config|rc|c)\.(data_parallel|pipeline_options)\.\w+;" \
         pipeline stages onnx tools python bench --include='*.cc' --include='*.h' |
       grep -v '^pipeline/run_config.cc:' | grep -vE ':\s*run_\.')  # RunContext: not an options struct
if [[ -n "$hits" ]]; then
  echo "a RunConfig option copied field by field outside pipeline/run_config.cc:"
  echo "$hits" | sed 's/^/  /'
  fail=1
fi
# Source files within 800 lines.
big=$(find ops loaders stages pipeline onnx tools python \( -name '*.cc' -o -name '*.h' -o -name '*.cu' \
        -o -name '*.cuh' \) -exec awk 'END {if (NR > 800) print FILENAME ": " NR " lines"}' {} \;)
if [[ -n "$big" ]]; then
  echo "source files over 800 lines (cut them into rooms):"
  echo "$big" | sed 's/^/  /'
  fail=1
fi
# Functions within 100 lines; the few longer ones named in CONTRIBUTING.md.
if ctags --version 2>/dev/null | grep -q "Universal Ctags"; then
  long=$(ctags -R --languages=C++ --kinds-C++=f --fields=+ne -x \
           --_xformat='%{end} %{line} %N %F' ops loaders stages pipeline onnx tools python |
         awk '$1 - $2 + 1 > 100 {print $4, $3, $1 - $2 + 1}')
  allowed=$(sed -n '/^## Long functions/,/^## [^L]/p' CONTRIBUTING.md)
  n=0
  while read -r file name lines; do
    [[ -z "$file" ]] && continue
    n=$((n + 1))
    if ! grep -F "\`$file\`" <<<"$allowed" | grep -qF "$name"; then
      echo "$file: $name is $lines lines (over 100, and not among CONTRIBUTING.md's long functions)"
      fail=1
    fi
  done <<<"$long"
  if ((n > 3)); then
    echo "$n functions are over 100 lines (at most 3 may be):"
    echo "$long" | sed 's/^/  /'
    fail=1
  fi
else
  echo "note: universal-ctags not found; function lengths not checked (scripts/setup.sh installs it)"
fi
# Every layer type has an ONNX export or a declaration that it has none.
if [[ -n "${1:-}" ]]; then
  listing=$("$1" stages) || { echo "$1 stages failed"; exit 1; }
  section() {  # the entry names of the section whose heading starts with $1
    awk -v h="$1" 'index($0, h) == 1 {on = 1; next} /^[^ ]/ {on = 0} on && /^  [^ ]/ {print $1}' <<<"$listing"
  }
  layers=$(section "layer types")
  exports=$(section "ONNX export by layer type")
  [[ -n "$layers" && -n "$exports" ]] || { echo "cannot read the layer types and the ONNX exports from '$1 stages'"; exit 1; }
  missing=$(comm -23 <(sort <<<"$layers") <(sort <<<"$exports"))
  if [[ -n "$missing" ]]; then
    echo "layer types with neither an ONNX export nor CNNFLOW_ONNX_NOT_EXPORTABLE (onnx/converters/):"
    echo "$missing" | sed 's/^/  /'
    fail=1
  fi
fi
((fail == 0)) || { echo "FAIL: the house rules above are broken"; exit 1; }
echo "PASS: includes keep to the house's rules"
