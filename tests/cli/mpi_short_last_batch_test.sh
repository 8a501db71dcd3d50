#!/usr/bin/env bash
# Invariant 5 with a short last batch: training sets that the global batch
# does not divide, every epoch trained to its end (no train.max_steps).
# `mpirun -np 2` with R replicas each ends byte for byte as one process with
# 2 x R replicas: each process takes the rows of the last batch that its
# replicas would take in one process (uneven parts, or none), and the
# gradient is the mean over the global batch's rows.
#   1001 samples, batch 32: the last global batch is 41 rows over 2 x 1
#   replicas (20 + 21), 105 over 2 x 2 (26 + 26 | 26 + 27);
#   385 samples: 1 row, so rank 0 (and 3 of 4 replicas) have none;
#   523 samples over 2 x 4 replicas: 11 rows, 1 1 2 1 | 1 2 1 2 (not rank 0's
#   5 rows cut 1 1 1 2 among its own replicas, another sum tree).
#   usage: mpi_short_last_batch_test.sh MPIEXEC CNNFLOW_BINARY
set -u
mpiexec="$1"
cnnflow="$2"
source "$(dirname "$0")/mpi_lib.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for size_replicas in 1001:1 1001:2 385:1 385:2 523:4; do
  size=${size_replicas%:*} replicas=${size_replicas#*:}
  case=$out/$size-$replicas
  sets=(--set "data.train={source: synthetic, shape: [1, 28, 28], size: $size}"
    --set "data.test={source: synthetic, shape: [1, 28, 28], size: 100}"
    --set train.epochs=2 --set train.batch=32)
  devices=$(seq -s ', ' -f 'cpu:%g' 0 $((replicas - 1)))
  all=$(seq -s ', ' -f 'cpu:%g' 0 $((2 * replicas - 1)))
  "$mpiexec" -n 2 --oversubscribe "$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" \
    --set threads="$replicas" --set "graph.devices=[$devices]" --out "$case/mpi" > "$case.mpi.log" 2>&1 ||
    { cat "$case.mpi.log"; echo "FAIL: mpirun, $size samples, $replicas replicas each"; exit 1; }
  "$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" --set threads=$((2 * replicas)) \
    --set "graph.devices=[$all]" --out "$case/one" > "$case.one.log" 2>&1 ||
    { cat "$case.one.log"; echo "FAIL: one process, $size samples, $((2 * replicas)) replicas"; exit 1; }
  [[ $(wc -l < "$case/one/metrics.csv") -eq 3 ]] || { echo "FAIL: expected 2 epochs"; exit 1; }
  expect_same_end_state "$case/one" "$case/mpi" ||
    { echo "FAIL: $size samples: mpirun -np 2 x $replicas != 1 process x $((2 * replicas))"; exit 1; }
  echo "$size samples: mpirun -np 2 x $replicas == 1 process x $((2 * replicas)) replicas"
done
# Each process a 2-stage pipeline, 385 samples: rank 0 has no rows in each
# epoch's last step and still takes part in its gradient sums, stop
# agreement and optimizer step (else rank 1 waits out the timeout); the
# losses agree with the 2 replicas' (385-2) to float noise.
pipe=$out/385-pipeline
"$mpiexec" -n 2 --oversubscribe "$cnnflow" train configs/fashion_mnist_pipeline.yaml \
  --set "data.train={source: synthetic, shape: [1, 28, 28], size: 385}" \
  --set "data.test={source: synthetic, shape: [1, 28, 28], size: 100}" \
  --set train.epochs=2 --set train.batch=32 --set threads=2 --set graph.collective_timeout_s=20 --out "$pipe" > "$pipe.log" 2>&1 ||
  { cat "$pipe.log"; echo "FAIL: mpirun, 2 pipelines, 385 samples"; exit 1; }
paste -d, "$pipe/metrics.csv" "$out/385-1/one/metrics.csv" | tail -n +2 | awk -F, '
  function rel(a, b) { d = a - b; if (d < 0) d = -d; return d / (b < 0 ? -b : b) }
  { n = NF / 2; if (rel($2, $(n + 2)) > 5e-4 || rel($4, $(n + 4)) > 5e-4) { print "FAIL: epoch " $1 " differs"; bad = 1 } }
  END { exit bad }' || { cat "$pipe/metrics.csv" "$out/385-1/one/metrics.csv"; exit 1; }
[[ $(wc -l < "$pipe/metrics.csv") -eq 3 ]] || { echo "FAIL: the pipelines trained no 2 epochs"; exit 1; }
echo "385 samples: mpirun -np 2 x 2-stage pipeline ~ 1 process x 2 replicas"
echo "PASS: a short last batch: mpirun -np 2 x 1, x 2 and x 4 == 1 process x 2, x 4 and x 8 replicas"
