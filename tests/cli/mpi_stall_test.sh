#!/usr/bin/env bash
# A rank that stalls mid-training (SIGSTOP): the other warns after
# graph.stall_warn_s that the collective it waits in (a gradient bucket, or
# the per-step stop agreement) has stalled, then fails within
# graph.collective_timeout_s with a message naming it, and the job ends
# instead of hanging.
#   usage: mpi_stall_test.sh MPIEXEC CNNFLOW_BINARY
set -u
source "$(dirname "$0")/mpi_lib.sh"
mpiexec="$1"
cnnflow="$2"
out=$(mktemp -d)
rank1=""
trap '[[ -n "$rank1" ]] && kill -CONT "$rank1" 2>/dev/null; rm -rf "$out"' EXIT
timeout 120 "$mpiexec" -n 2 --oversubscribe "$cnnflow" train configs/fashion_mnist.yaml \
  --set train.epochs=1 --set threads=1 --set graph.collective_timeout_s=3 --set graph.stall_warn_s=1 --out "$out/run" \
  > "$out/log" 2>&1 &
launcher=$!
rank1=$(wait_for_rank1 "$launcher" "$out/log") || exit 1
start=$(date +%s)
kill -STOP "$rank1"
wait "$launcher"
status=$?
elapsed=$(( $(date +%s) - start ))
grep "error" "$out/log" | head -n 2
[[ $status -ne 0 && $status -ne 124 ]] || { echo "FAIL: exit status $status (124: hung)"; exit 1; }
grep -qE "rank 0 of 2: error: .*MPI AllReduceSum '(bucket [0-9]+ \(.*\)|stop request)' .*did not complete within 3 s" "$out/log" ||
  { echo "FAIL: rank 0 did not report the stalled collective"; exit 1; }
grep -qE "rank 0 of 2: warning: MPI AllReduceSum '(bucket [0-9]+ \(.*\)|stop request)' \([0-9]+ floats, waiting on rank 1\) has waited 1\.[0-9] s" "$out/log" ||
  { echo "FAIL: rank 0 did not warn of the stalled collective before its deadline"; exit 1; }
(( elapsed < 60 )) || { echo "FAIL: took ${elapsed} s"; exit 1; }
echo "PASS: a stalled rank failed the job in ${elapsed} s, naming the collective"
