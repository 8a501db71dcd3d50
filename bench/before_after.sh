#!/usr/bin/env bash
# Throughput of two cnnflow builds side by side: `cnnflow bench` on 1 and 2
# data-parallel replicas (configs/fashion_mnist.yaml) and on the pipeline
# (configs/fashion_mnist_pipeline.yaml), the builds alternating round by
# round, then the median of each and the ratio new/old.
#
#   bench/before_after.sh OLD_BINARY NEW_BINARY [ROUNDS] [--models]
#
# --models: instead, the training step of ResNet-18 (CIFAR shapes, batch 64)
# and of the CIFAR speed run (configs/cifar10_speedrun.yaml, batch 1024), in
# f32 and, where the CPU has avx512_bf16, in bf16, on synthetic data (no
# data set needed, the loader out of the way).
#
# A binary is TREE/BUILD_DIR/cnnflow and runs in TREE, its source checkout
# (cnnflow reads graphs/ and configs/ from there). Make the old one with
#   git worktree add /tmp/before REV && ln -s $PWD/data /tmp/before/data
#   cmake -S /tmp/before -B /tmp/before/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
#     -DCNNFLOW_WITH_CUDA=OFF && ninja -C /tmp/before/build cnnflow
# and compare it with a build of the same options. Prints the ISA: figures
# differ from machine to machine.
set -euo pipefail
old=$(realpath "${1:?usage: $0 OLD_BINARY NEW_BINARY [ROUNDS]}")
new=$(realpath "${2:?usage: $0 OLD_BINARY NEW_BINARY [ROUNDS]}")
rounds=${3:-3}
models=0
[[ "${4:-}" == --models ]] && models=1
isa=$(grep -o -w -E 'avx512f|avx2|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')
echo "# cnnflow bench, old ($old) vs new ($new), alternating, $rounds rounds, $(date -u +%F)"
echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), ISA flags: $isa, $(nproc) cores"

run() {  # binary -> "r1, r2, pipe"
  local bin=$1 tree csv
  tree=$(dirname "$(dirname "$bin")")
  csv=$(mktemp)
  (cd "$tree" && "$bin" bench configs/fashion_mnist.yaml --devices 1,2 --max-steps 300 \
    --warmup 30 --set threads=2 --csv "$csv" >/dev/null)
  local r1 r2 pipe
  r1=$(awk -F, 'NR == 2 {print $5}' "$csv")
  r2=$(awk -F, 'NR == 3 {print $5}' "$csv")
  rm -f "$csv"
  pipe=$(cd "$tree" && "$bin" bench configs/fashion_mnist_pipeline.yaml --max-steps 100 \
    --warmup 10 | awk '/^ *pipeline \(/ {for (i = 1; i <= NF; ++i) if ($(i + 1) == "images/s") print $i}')
  echo "$r1, $r2, $pipe"
}

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

if ((models)); then
  synthetic='data.train={source: synthetic, shape: [3, 32, 32], classes: 10, size: 1048576, seed: 1}'
  # name|config|steps|--set values (one per line after the config)
  cases=("resnet18 f32|bench/configs/resnet18_synthetic.yaml|12|train.batch=64"
         "speedrun f32|configs/cifar10_speedrun.yaml|6|$synthetic;data.test=null")
  if grep -qw avx512_bf16 /proc/cpuinfo; then
    cases+=("resnet18 bf16|bench/configs/resnet18_synthetic.yaml|12|train.batch=64;graph.precision=bf16"
            "speedrun bf16|configs/cifar10_speedrun.yaml|6|$synthetic;data.test=null;graph.precision=bf16")
  fi
  step() {  # binary config steps sets -> images/s
    local tree csv sets=()
    tree=$(dirname "$(dirname "$1")")
    csv=$(mktemp)
    IFS=';' read -ra kv <<<"$4"
    for v in "${kv[@]}" graph.devices=[cpu:0] threads=2; do sets+=(--set "$v"); done
    (cd "$tree" && "$1" bench "$2" --devices 1 --max-steps "$3" --warmup 3 --csv "$csv" \
      "${sets[@]}" >/dev/null)
    awk -F, 'NR == 2 {print $5}' "$csv"
    rm -f "$csv"
  }
  echo "# round, build, $(for c in "${cases[@]}"; do printf '%s images/s, ' "${c%%|*}"; done)"
  declare -A got
  for ((k = 1; k <= rounds; ++k)); do
    for build in old new; do
      bin=$old
      [[ $build == new ]] && bin=$new
      line="$k, $build"
      for c in "${cases[@]}"; do
        IFS='|' read -r name config steps sets <<<"$c"
        v=$(step "$bin" "$config" "$steps" "$sets")
        got[$build,$name]+="$v "
        line+=", $v"
      done
      echo "$line"
    done
  done
  summary=""
  for c in "${cases[@]}"; do
    name=${c%%|*}
    # shellcheck disable=SC2086
    mo=$(median ${got[old,$name]})
    # shellcheck disable=SC2086
    mn=$(median ${got[new,$name]})
    summary+=$(awk -v n="$name" -v o="$mo" -v m="$mn" 'BEGIN {printf "%s %.1f -> %.1f (%.2fx); ", n, o, m, m / o}')
  done
  echo "# medians (images/s): ${summary%; }"
  exit 0
fi

echo "# round, build, images/s 1 replica, images/s 2 replicas, pipeline images/s"
declare -a o1 o2 op n1 n2 np
for ((k = 1; k <= rounds; ++k)); do
  IFS=', ' read -r a b c <<<"$(run "$old")"
  echo "$k, old, $a, $b, $c"
  o1+=("$a") o2+=("$b") op+=("$c")
  IFS=', ' read -r a b c <<<"$(run "$new")"
  echo "$k, new, $a, $b, $c"
  n1+=("$a") n2+=("$b") np+=("$c")
done

report() {  # name old... -- new...
  local name=$1 mo mn
  shift
  mo=$(median "${@:1:$rounds}")
  mn=$(median "${@:$((rounds + 1))}")
  awk -v n="$name" -v o="$mo" -v m="$mn" 'BEGIN {printf "%s %.0f -> %.0f (%.2fx)", n, o, m, m / o}'
}
echo "# medians: $(report "1 replica" "${o1[@]}" "${n1[@]}"), $(report "2 replicas" "${o2[@]}" "${n2[@]}"), $(report pipeline "${op[@]}" "${np[@]}")"
