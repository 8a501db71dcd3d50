#!/usr/bin/env bash
# `cnnflow launch` ends a job whose rank failed on its host when mpirun does
# not end it (as when another host is unreachable: mpirun then waits on its
# daemon there until TCP gives up). The stand-in mpirun below runs the rank
# for real, `cnnflow train` failing at once (a config that does not exist),
# and then hangs as that mpirun does. The rank tells the launcher
# ($CNNFLOW_LAUNCH_NOTIFY); the launcher gives the job 3 s, ends its child
# (SIGTERM), exits 1 saying why, and leaves nothing of it running. The same
# across network-namespace hosts with a cut link: mpi.hosts.link_down.
#   usage: launch_hung_job_test.sh CNNFLOW_BINARY
set -u
source "$(dirname "$0")/mpi_lib.sh"
cnnflow="$1"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cat > "$out/mpirun.sh" <<'EOF2'
#!/bin/sh
# mpirun -n N COMMAND...: the rank here, then a hang.
shift 2
"$@"
exec sleep 60
EOF2
chmod +x "$out/mpirun.sh"
start=$EPOCHREALTIME
"$cnnflow" launch --max-restarts 0 --mpirun "$out/mpirun.sh" -n 2 -- \
  "$cnnflow" train "$out/missing.yaml" --out "$out/run" > "$out/launch.log" 2>&1 &
launcher=$!
for _ in $(seq 1 100); do hung=$(pgrep -P "$launcher" -x sleep) && break; sleep 0.1; done
[[ -n ${hung:-} ]] || { cat "$out/launch.log"; echo "FAIL: the stand-in mpirun never hung"; exit 1; }
for _ in $(seq 1 200); do kill -0 "$launcher" 2> /dev/null || break; sleep 0.1; done
took=$(since "$start")
if kill -0 "$launcher" 2> /dev/null; then
  kill "$hung" "$launcher"
  cat "$out/launch.log"
  echo "FAIL: the launcher still waits on the hung job ${took} s after its rank failed"
  exit 1
fi
wait "$launcher"
status=$?
cat "$out/launch.log"
((status == 1)) || { echo "FAIL: launcher exit status $status, expected 1"; exit 1; }
grep -q "^cnnflow launch: a rank on this host failed (.*missing.yaml" "$out/launch.log" ||
  { echo "FAIL: the launcher did not name the failed rank's error"; exit 1; }
grep -q "^cnnflow launch: giving up: attempt 1/1 failed (ended by the launcher" "$out/launch.log" ||
  { echo "FAIL: the launcher did not say that it ended the job"; exit 1; }
! kill -0 "$hung" 2> /dev/null || { kill "$hung"; echo "FAIL: the hung mpirun is left running"; exit 1; }
le "$took" 10 || { echo "FAIL: the launcher took ${took} s (3 s of grace expected)"; exit 1; }
echo "PASS: cnnflow launch ended the hung job ${took} s after its rank failed, exit 1"
