#!/usr/bin/env bash
# The start-up deadline (graph.startup_timeout_s) apart from the collective
# one (graph.collective_timeout_s 3 s): rank 1 is made slow by
# CNNFLOW_TEST_SLOW_START (ops/test_fault.h), 2 ranks, 20 steps.
#   slow_start       rank 1 sleeps 6 s before its first collective (the
#                    config check), startup_timeout_s 30: the run succeeds.
#   slow_first_step  rank 1 sleeps 6 s in step 0, before its gradient
#                    all-reduce, startup_timeout_s 30: the run succeeds
#                    (the first step is start-up).
#   start_too_slow   rank 1 sleeps 12 s at start, startup_timeout_s 4: the
#                    job fails within 4 + 5 s of the sleep, naming the
#                    collective and the start-up deadline.
#   stall_after      rank 1 sleeps 6 s in step 2, startup_timeout_s 30: the
#                    job fails at collective_timeout_s, as before.
# A hard alarm (timeout) bounds every job, so a hang fails the test.
#   usage: mpi_startup_test.sh MPIEXEC CNNFLOW_BINARY MODE   (KEEP=1 keeps the logs)
set -u
source "$(dirname "$0")/mpi_lib.sh"
mpiexec="$1"
cnnflow="$2"
mode="$3"
# Under the sanitizers (slowdown 5) every time stretches.
timeout_s=$((3 * slowdown))
out=$(mktemp -d)
trap '[[ -n "${KEEP:-}" ]] || rm -rf "$out"' EXIT
log="$out/log"

case "$mode" in
  slow_start) sleep_s=$((6 * slowdown)) step=start startup_s=$((30 * slowdown)) ;;
  slow_first_step) sleep_s=$((6 * slowdown)) step=0 startup_s=$((30 * slowdown)) ;;
  start_too_slow) sleep_s=$((12 * slowdown)) step=start startup_s=$((4 * slowdown)) ;;
  stall_after) sleep_s=$((6 * slowdown)) step=2 startup_s=$((30 * slowdown)) ;;
  *)
    echo "FAIL: unknown mode '$mode'"
    exit 1
    ;;
esac
where="step $step"
[[ $step != start ]] || where=start-up
hook_line="CNNFLOW_TEST_SLOW_START: rank 1 sleeps $sleep_s s at $where"

timeout -k 5 $((60 * slowdown)) "$mpiexec" -n 2 --oversubscribe \
  -x "CNNFLOW_TEST_SLOW_START=rank=1,s=$sleep_s,step=$step" "$cnnflow" train \
  configs/fashion_mnist.yaml --set train.epochs=1 --set train.max_steps=20 --set threads=1 \
  --set graph.collective_timeout_s=$timeout_s --set graph.startup_timeout_s=$startup_s \
  --out "$out/run" > "$log" 2>&1 &
launcher=$!
t0=""
for _ in $(seq 1 $((600 * slowdown))); do
  grep -q "$hook_line" "$log" 2>/dev/null && t0=$EPOCHREALTIME && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.05
done
wait "$launcher"
status=$?
[[ -n "$t0" ]] || { cat "$log"; echo "FAIL: rank 1 never slept"; exit 1; }
elapsed=$(since "$t0")
echo "$mode: mpirun exit status $status, ${elapsed} s after rank 1 began its ${sleep_s} s sleep"
grep -E "error|warning" "$log" | head -n 3 | cut -c1-400 | sed 's/^/  | /'
[[ $status -ne 124 && $status -ne 137 ]] || { cat "$log"; echo "FAIL: hung, ended by the alarm"; exit 1; }

# The job failed within $1 s of the sleep, rank 0's error matching $2 ($3 says what).
expect_failure() {
  [[ $status -ne 0 ]] || { cat "$log"; echo "FAIL: exit status 0, expected a failure"; exit 1; }
  grep -qE "rank 0 of 2: error: .*$2" "$log" || { cat "$log"; echo "FAIL: rank 0 did not name $3"; exit 1; }
  le "$elapsed" "$1" || { echo "FAIL: took ${elapsed} s, more than $1 s"; exit 1; }
}

case "$mode" in
  slow_start | slow_first_step)
    [[ $status -eq 0 ]] || { cat "$log"; echo "FAIL: exit status $status: the slow start was not let through"; exit 1; }
    grep -q "^done after epoch 1" "$log" || { cat "$log"; echo "FAIL: no final report"; exit 1; }
    echo "PASS: $mode: rank 1 ${sleep_s} s late at $where, collective_timeout_s $timeout_s, startup_timeout_s $startup_s: the run completed"
    ;;
  start_too_slow)
    # Within the bound: failed by the deadline, not ended by rank 1 waking up.
    expect_failure $((startup_s + 5)) "MPI AllGather 'hash of the resolved config' \(.*\) did not complete within $startup_s s \(the start-up deadline, graph\.startup_timeout_s\)" \
      "the collective and the start-up deadline"
    echo "PASS: $mode: rank 1 ${sleep_s} s late, startup_timeout_s $startup_s: the job failed in ${elapsed} s, naming the start-up deadline"
    ;;
  stall_after)
    expect_failure $((timeout_s + 5)) "MPI AllReduceSum '(bucket [0-9]+ \(.*\)|stop request)' \(.*\) did not complete within $timeout_s s: " \
      "the collective and collective_timeout_s"
    echo "PASS: $mode: rank 1 stalled ${sleep_s} s at $where: the job failed in ${elapsed} s at collective_timeout_s $timeout_s"
    ;;
esac
