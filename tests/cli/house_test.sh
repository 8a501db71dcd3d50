#!/usr/bin/env bash
# The house's include rules (CONTRIBUTING.md), checked on the sources so they
# cannot drift:
#  - includes go one way: ops <- loaders <- stages <- pipeline <- tools;
#  - inside ops/, each room keeps to itself: the collectives include no CUDA
#    header (the NCCL group is made in ops/cuda/), no kernel and not the
#    device seam include ops/train/ (the loss contract is ops/loss.h), the
#    model includes no ops/parallel/ header (tensor parallelism reaches it
#    as a LayerSplitter), and a header lives in the room that implements it
#    (ops/parallel/ has no header whose only implementation is in ops/cuda/).
#   usage: house_test.sh   (from the repository root)
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
forbid ops "loaders|stages|pipeline|tools" "ops/ includes a layer above it"
forbid loaders "stages|pipeline|tools" "loaders/ includes a layer above it"
forbid stages "pipeline|tools" "stages/ includes a layer above it"
forbid pipeline "tools" "pipeline/ includes tools/"
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
((fail == 0)) || { echo "FAIL: the include rules above are broken"; exit 1; }
echo "PASS: includes keep to the house's rules"
