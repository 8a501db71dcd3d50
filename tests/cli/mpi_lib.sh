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

# Waits until training has started (log line $2) and rank 1 of launcher $1
# exists; prints its pid, or fails with the log.
wait_for_rank1() {
  local pid=""
  for _ in $(seq 1 300); do
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
