#!/usr/bin/env bash
# Exact distributed evaluation (issue 34): `mpirun -np 3 cnnflow eval` on a
# test set that 3 does not divide (Fashion-MNIST's 10,000: shards of 3,334,
# 3,333 and 3,333) at a batch that gives the shards different numbers of
# batches (2, 1, 1) counts every sample exactly once, does not hang, and
# gives the single process's correct and sample counts exactly and its loss
# to 1e-9 relative (the ranks' f64 sums are added in rank order).
#   usage: mpi_eval_test.sh MPIEXEC CNNFLOW_BINARY
set -u
mpiexec="$1"
cnnflow="$2"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
config=configs/fashion_mnist.yaml
# Weights to evaluate: a few steps of training.
"$cnnflow" train "$config" --set train.epochs=1 --set train.max_steps=20 --set threads=2 \
  --set data.test=null --out "$out/run" > "$out/train.log" 2>&1 ||
  { cat "$out/train.log"; echo "FAIL: training the weights"; exit 1; }
sets=(--weights "$out/run/model.safetensors" --set train.eval_batch=3000 --set threads=1)
"$cnnflow" eval "$config" "${sets[@]}" > "$out/one.log" 2>&1 ||
  { cat "$out/one.log"; echo "FAIL: eval in one process"; exit 1; }
timeout -k 5 120 "$mpiexec" -n 3 --oversubscribe "$cnnflow" eval "$config" "${sets[@]}" \
  > "$out/mpi.log" 2>&1 || { cat "$out/mpi.log"; echo "FAIL: mpirun -np 3 eval (exit $?)"; exit 1; }
cat "$out/one.log" "$out/mpi.log"
# The report line: "test accuracy A% (C of N samples), test loss L (...)".
for f in one mpi; do
  read -r correct samples loss < <(grep -m1 '^test accuracy' "$out/$f.log" |
    sed -E 's/.*\(([0-9]+) of ([0-9]+) samples\), test loss ([0-9.e+-]+).*/\1 \2 \3/')
  eval "${f}_loss=$loss ${f}_correct=$correct ${f}_samples=$samples"
done
[[ -n "${one_samples:-}" && -n "${mpi_samples:-}" ]] || { echo "FAIL: no report line to compare"; exit 1; }
[[ "$mpi_samples" == 10000 && "$one_samples" == 10000 ]] ||
  { echo "FAIL: samples counted: one process $one_samples, 3 ranks $mpi_samples (want 10000)"; exit 1; }
[[ "$mpi_correct" == "$one_correct" ]] ||
  { echo "FAIL: correct: one process $one_correct, 3 ranks $mpi_correct"; exit 1; }
awk -v a="$mpi_loss" -v b="$one_loss" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(d <= 1e-9) }' ||
  { echo "FAIL: loss: one process $one_loss, 3 ranks $mpi_loss"; exit 1; }
[[ $(grep -c "^test accuracy" "$out/mpi.log") -eq 1 ]] || { echo "FAIL: expected one report (rank 0's)"; exit 1; }
echo "PASS: mpirun -np 3 eval == one process ($mpi_correct of $mpi_samples, loss $mpi_loss)"
