#!/usr/bin/env bash
# The per-rank step table names a slow rank (pipeline/rank_times.h): with
# CNNFLOW_TEST_SLOW_RANK sleeping 120 ms in one rank's backward, rank 0
# prints the min / median / max table and "rank R is the straggler: its
# backward ...", for rank 1 of `mpirun -n 2` (one replica each) and for
# rank 3 of `mpirun -n 2` with two replicas each (global numbering: process
# 1's second replica). The healthy runs are mpi_train_test.sh's.
#   usage: mpi_straggler_test.sh MPIEXEC CNNFLOW_BINARY
set -u
mpiexec="$1"
cnnflow="$2"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run=(train configs/fashion_mnist.yaml --set train.epochs=1 --set train.max_steps=30)
# slowed RANK LOG [--set ...]: trains with rank RANK's backward 120 ms slower.
slowed() {
  local rank=$1 log=$2
  shift 2
  CNNFLOW_TEST_SLOW_RANK="rank=$rank,ms=120" "$mpiexec" -n 2 --oversubscribe -x CNNFLOW_TEST_SLOW_RANK \
    "$cnnflow" "${run[@]}" "$@" --out "$out/run" > "$log" 2>&1 || { cat "$log"; fail "mpirun exited with $?"; }
  grep -A4 "^step time per rank" "$log"
}
slowed 1 "$out/two.log" --set threads=1
grep -q "^step time per rank (ms/step, 2 ranks) .*data .*forward .*backward .*all-reduce .*optimizer" "$out/two.log" ||
  fail "no per-rank table with 2 ranks"
grep -q "^  median  " "$out/two.log" || fail "no median row"
grep -q "^rank 1 is the straggler: its backward takes [0-9.]*x the other rank's" "$out/two.log" ||
  fail "rank 1, slowed in backward, was not named"
slowed 3 "$out/four.log" --set threads=2 --set 'graph.devices=[cpu:0, cpu:1]'
grep -q "^step time per rank (ms/step, 4 ranks)" "$out/four.log" || fail "no per-rank table with 4 ranks"
grep -q "^rank 3 is the straggler: its backward takes [0-9.]*x the median of the other 3 ranks" "$out/four.log" ||
  fail "rank 3 (process 1's second replica), slowed in backward, was not named"
[[ $(grep -c "is the straggler" "$out/two.log" "$out/four.log" | awk -F: '{ s += $2 } END { print s }') -eq 2 ]] ||
  fail "expected one straggler line per run"
echo "PASS: the slowed rank was named the straggler"
