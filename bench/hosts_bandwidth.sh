#!/usr/bin/env bash
# Across "hosts" on a shaped link: network namespaces on a bridge
# (tests/cli/netns_lib.sh), each host's cable limited to RATE by a tbf qdisc
# in both directions, mpirun over TCP only. Prints, per link rate:
#   1. the all-reduce's bus bandwidth against the link rate, 1-64 MB buckets,
#      cnnflow's tree all-reduce and MPI_Allreduce side by side
#      (build/bench/mpi_allreduce_bench), for 2 and 4 hosts;
#   2. the data-parallel scaling of model A (configs/fashion_mnist.yaml) and
#      ResNet-18 (bench/configs/resnet18_synthetic.yaml, CIFAR-shaped): one
#      rank alone against 2 hosts x 1 rank, same per-rank batch, 1 thread each.
# Needs root (namespaces, tc). Run from the repository root after
# scripts/build.sh -DCNNFLOW_BUILD_BENCH=ON:
#   bench/hosts_bandwidth.sh [BUILD_DIR] [RATES...]     (default: build 1gbit 100mbit)
set -euo pipefail
build=$(realpath "${1:-build}")
shift || true
rates=("$@")
((${#rates[@]})) || rates=(1gbit 100mbit)
mpiexec=mpirun
source tests/cli/netns_lib.sh
netns_require
name=cfbw
trap 'netns_down $name' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OMPI_MCA_btl

echo "# cnnflow across shaped links, $(date -u +%Y-%m-%d), $(git rev-parse --short HEAD)"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; isa: $(grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | paste -sd+)"
echo "Open MPI $(ompi_info --version 2> /dev/null | sed -n 's/^Open MPI v//p' | head -1), TCP between network namespaces, tbf on each host's egress"

# shape RATE HOSTS: every host's cable limited to RATE each way.
shape() {
  local h
  for ((h = 0; h < $2; ++h)); do
    ip netns exec "${name}h$h" tc qdisc replace dev eth0 root tbf rate "$1" burst 1mb latency 50ms
  done
}
gbps() { case $1 in *gbit) echo "${1%gbit}" ;; *mbit) awk -v m="${1%mbit}" 'BEGIN { print m / 1000 }' ;; esac; }

# img/s of a training run: the epoch line's rate.
img_per_s() { sed -n 's/^epoch 1\/1: .* \([0-9]*\) img\/s$/\1/p' "$1"; }

for rate in "${rates[@]}"; do
  for hosts in 2 4; do
    netns_up "$name" "$hosts" 222
    shape "$rate" "$hosts"
    spec=$(for ((h = 0; h < hosts; ++h)); do echo -n "${name}h$h:1,"; done)
    echo
    echo "## all-reduce, $hosts hosts x 1 rank, link $rate"
    echo '```'
    netns_mpirun "$name" "${spec%,}" -n "$hosts" --map-by node "$build/bench/mpi_allreduce_bench" \
      --sizes-mb 1,4,16,64 --rounds 3 --link-gbps "$(gbps "$rate")"
    echo '```'
    netns_down "$name"
  done
  netns_up "$name" 2 222
  shape "$rate" 2
  echo
  echo "## data-parallel scaling, link $rate (img/s; 1 thread a rank; per-rank batch as given)"
  echo
  echo "| model | batch/rank | 1 rank | 2 hosts x 1 rank | speedup |"
  echo "|---|---:|---:|---:|---:|"
  for model in "configs/fashion_mnist.yaml 64 200" "bench/configs/resnet18_synthetic.yaml 64 12"; do
    read -r config batch steps <<< "$model"
    sets=(--set train.epochs=1 --set train.batch="$batch" --set train.max_steps="$steps" --set threads=1
      --set train.eval_every=1000 --set 'graph.devices=[cpu:0]')
    out=$(mktemp -d)
    netns_mpirun "$name" "${name}h0:1" -n 1 "$build/cnnflow" train "$config" "${sets[@]}" --out "$out/one" > "$out/one.log" 2>&1
    netns_mpirun "$name" "${name}h0:1,${name}h1:1" -n 2 --map-by node "$build/cnnflow" train "$config" \
      "${sets[@]}" --out "$out/two" > "$out/two.log" 2>&1
    one=$(img_per_s "$out/one.log") two=$(img_per_s "$out/two.log")
    echo "| $(basename "$config" .yaml) | $batch | $one | $two | $(awk -v a="$one" -v b="$two" 'BEGIN { printf "%.2fx", b / a }') |"
    rm -rf "$out"
  done
  netns_down "$name"
done
