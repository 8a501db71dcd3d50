#!/usr/bin/env bash
# Kernel picks agree across hosts: each rank of `mpirun -n 2` gets a pick
# cache of its own (CNNFLOW_CACHE_DIR), rank 1's seeded with the contrary
# of rank 0's picks (gemm where rank 0 runs oneDNN and the other way), as
# two hosts with different histories would have. Rank 0's picks are
# broadcast at start-up, so the job still ends byte for byte as one process
# with 2 replicas; and the contrary picks do change the bits (one process
# trained with them differs), so the test would see them used.
#   usage: mpi_kernel_picks_test.sh MPIEXEC CNNFLOW_BINARY
set -u
mpiexec="$1"
cnnflow="$2"
source "$(dirname "$0")/mpi_lib.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sets=(--set "data.train={source: synthetic, shape: [1, 28, 28], size: 400}"
  --set "data.test={source: synthetic, shape: [1, 28, 28], size: 64}"
  --set train.epochs=1 --set train.batch=16)

mkdir -p "$out/one" "$out/rank0" "$out/rank1" "$out/contrary"
CNNFLOW_CACHE_DIR=$out/one "$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" --set threads=2 \
  --set 'graph.devices=[cpu:0, cpu:1]' --out "$out/run-one" > "$out/one.log" 2>&1 ||
  { cat "$out/one.log"; echo "FAIL: one process"; exit 1; }
picks=$out/one/kernel-picks.tsv
[[ -s $picks ]] || { echo "FAIL: no picks were recorded in $picks"; exit 1; }
cp "$picks" "$out/rank0/"
# The contrary: every pass's algorithm swapped, gemm <-> onednn (a matmul
# or flipped pick becomes gemm).
awk -F'\t' 'BEGIN { OFS = "\t" } {
  split($3, parts, " "); n = split(parts[1], algos, ","); line = ""
  for (i = 1; i <= n; ++i) {
    a = algos[i]
    if (i <= 3) a = (a == "onednn") ? "gemm" : "onednn"
    line = line (i > 1 ? "," : "") a
  }
  rest = substr($3, length(parts[1]) + 1)
  print $1, $2, line rest }' "$picks" > "$out/rank1/kernel-picks.tsv"
cp "$out/rank1/kernel-picks.tsv" "$out/contrary/"
cmp -s "$picks" "$out/rank1/kernel-picks.tsv" && { echo "FAIL: the contrary picks are the same"; exit 1; }

# The contrary picks change the result of one process.
CNNFLOW_CACHE_DIR=$out/contrary "$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" --set threads=2 \
  --set 'graph.devices=[cpu:0, cpu:1]' --out "$out/run-contrary" > "$out/contrary.log" 2>&1 ||
  { cat "$out/contrary.log"; echo "FAIL: one process, contrary picks"; exit 1; }
cmp -s "$out/run-one/model.safetensors" "$out/run-contrary/model.safetensors" &&
  { echo "FAIL: the contrary picks train the same bytes: the test could not see them"; exit 1; }

"$mpiexec" -n 2 --oversubscribe sh -c \
  "CNNFLOW_CACHE_DIR=$out/rank\$OMPI_COMM_WORLD_RANK exec \"\$0\" \"\$@\"" \
  "$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" --set threads=1 --out "$out/run-mpi" \
  > "$out/mpi.log" 2>&1 || { cat "$out/mpi.log"; echo "FAIL: mpirun -n 2"; exit 1; }
expect_same_end_state "$out/run-one" "$out/run-mpi" ||
  { echo "FAIL: ranks with contrary pick files trained other bytes than one process"; exit 1; }
echo "PASS: rank 1's contrary pick file was overruled by rank 0's picks ($(wc -l < "$picks") shapes): the same bytes as one process"
