# Helpers for the mpirun tests (sourced).

# Prints the pid of MPI rank $2 among the descendants of process $1 (the
# launcher), so that jobs running side by side are never confused.
mpi_rank_pid() {
  local pids=("$1") p child
  while ((${#pids[@]})); do
    p=${pids[0]}
    pids=("${pids[@]:1}")
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$p"
      return 0
    fi
    for child in $(pgrep -P "$p"); do pids+=("$child"); done
  done
  return 1
}

# Seconds since $1 (an $EPOCHREALTIME), to 0.1 s.
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
# Whether $1 <= $2 (decimals).
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }

# CNNFLOW_TEST_SLOWDOWN (set by ctest in sanitized builds) stretches the
# start-up waits below as ctest stretches the TIMEOUTs.
slowdown=${CNNFLOW_TEST_SLOWDOWN:-1}

# Waits (up to 30 s x slowdown) until training has started (log line $2) and
# rank 1 of launcher $1 exists; prints its pid, or fails with the log.
wait_for_rank1() {
  local pid=""
  for _ in $(seq 1 $((300 * slowdown))); do
    if grep -q "train epoch 1/1" "$2" 2>/dev/null && pid=$(mpi_rank_pid "$1" 1); then
      echo "$pid"
      return 0
    fi
    sleep 0.1
  done
  cat "$2" >&2
  echo "FAIL: rank 1 not found" >&2
  return 1
}

# Waits (up to 120 s x slowdown) until file $1 exists, or fails with log $2.
wait_for_file() {
  for _ in $(seq 1 $((6000 * slowdown))); do
    [[ -e "$1" ]] && return 0
    sleep 0.02
  done
  cat "$2" >&2
  echo "FAIL: $1 never appeared" >&2
  return 1
}

# Copies run folder $1 to $2 as a run that died after step $3: the
# checkpoints of later steps and the final weights are gone.
cut_run_at() {
  cp -r "$1" "$2"
  rm -f "$2/model.safetensors"
  local f s
  for f in "$2"/checkpoints/step-*; do
    s=${f##*/step-}
    s=$((10#${s%%.*}))
    if ((s > $3)); then rm -f "$f"; fi
  done
  ls "$2/checkpoints/step-$(printf %09d "$3").json" > /dev/null || { echo "FAIL: no checkpoint at step $3"; return 1; }
}

# Fails unless run folders $1 and $2 end in the same state: model.safetensors
# byte for byte, metrics.csv but for its timing columns (images_per_s,
# seconds), and (unless $3 is "no-steps") steps.csv, one row a step, but for
# its timing columns (images_per_s, data_wait_share, allreduce_share).
expect_same_end_state() {
  cmp "$1/model.safetensors" "$2/model.safetensors" || { echo "FAIL: $2/model.safetensors differs from $1's"; return 1; }
  diff <(cut -d, -f1-5,8,9 "$1/metrics.csv") <(cut -d, -f1-5,8,9 "$2/metrics.csv") ||
    { echo "FAIL: $2/metrics.csv differs from $1's"; return 1; }
  [[ ${3:-} == no-steps ]] || diff <(cut -d, -f1-7 "$1/steps.csv") <(cut -d, -f1-7 "$2/steps.csv") ||
    { echo "FAIL: $2/steps.csv differs from $1's"; return 1; }
  [[ $(wc -l < "$1/metrics.csv") -ge 2 ]] || { echo "FAIL: $1/metrics.csv has no epoch"; return 1; }
}
