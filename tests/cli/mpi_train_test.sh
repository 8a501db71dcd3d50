#!/usr/bin/env bash
# Invariant 5: `mpirun -np 2` with one replica each trains like one process
# with two replicas: same per-epoch losses (to float noise) and the same test
# accuracy, and only rank 0 writes the run folder.
#   usage: mpi_train_test.sh MPIEXEC CNNFLOW_BINARY
set -u
mpiexec="$1"
cnnflow="$2"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sets=(--set train.epochs=2 --set train.max_steps=25 --set train.batch=32)
"$mpiexec" -n 2 --oversubscribe "$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" \
  --set threads=1 --out "$out/mpi" > "$out/mpi.log" 2>&1 || { cat "$out/mpi.log"; echo "FAIL: mpirun"; exit 1; }
"$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" --set threads=2 \
  --set 'graph.devices=[cpu:0, cpu:1]' --out "$out/one" > "$out/one.log" 2>&1 || { cat "$out/one.log"; echo "FAIL: one process"; exit 1; }
[[ $(grep -c "^done after" "$out/mpi.log") -eq 1 ]] || { echo "FAIL: expected one report (rank 0's)"; exit 1; }
cat "$out/mpi/metrics.csv" "$out/one/metrics.csv"
# Columns: 2 train_loss, 4 test_loss (relative 1e-4), 5 test_accuracy (equal).
paste -d, "$out/mpi/metrics.csv" "$out/one/metrics.csv" | tail -n +2 | awk -F, '
  function rel(a, b) { d = a - b; if (d < 0) d = -d; return d / (b < 0 ? -b : b) }
  { n = NF / 2
    if (rel($2, $(n + 2)) > 1e-4 || rel($4, $(n + 4)) > 1e-4 || $5 != $(n + 5)) {
      print "FAIL: epoch " $1 " differs"; bad = 1 } }
  END { exit bad }' || exit 1
[[ $(wc -l < "$out/mpi/metrics.csv") -eq 3 ]] || { echo "FAIL: expected 2 epochs"; exit 1; }
echo "PASS: mpirun -np 2 == 1 process x 2 replicas"
