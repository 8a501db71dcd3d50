#!/usr/bin/env bash
# An elastic `cnnflow launch` over 4 network-namespace hosts (netns_lib.sh),
# 1 process x 2 replicas each. At step 25 host 3 crashes from inside (its
# rank takes the host's link down and SIGKILLs its orted and itself:
# CNNFLOW_TEST_FAULT mode=run); the launcher probes the hosts through
# netns_agent.sh (which, like ssh, cannot reach a host whose link is down),
# restarts on the 3 that answer from the newest checkpoint; once that runs,
# the test brings host 3's link back, the launcher's probe finds it, stops
# the job after the current step (SIGUSR1, a checkpoint) and restarts on 4.
# The job ends with the uninterrupted 4-host run's model.safetensors, byte
# for byte (with graph.logical_replicas fixing the replicas over any number
# of processes), and nothing of it is left on any host. Prints the time from
# the death to the first step on 3 hosts and from the return to the first
# step on 4.
#   usage: netns_elastic_test.sh MPIEXEC CNNFLOW_BINARY
# Exits 77 (skip) where namespaces cannot be made.
set -u
mpiexec="$1"
cnnflow=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
source "$here/netns_lib.sh"
source "$here/mpi_lib.sh"
netns_require
name=cfel
octet=216
out=$(mktemp -d)
trap 'kill $launcher 2> /dev/null; netns_down $name; rm -rf "$out"' EXIT
launcher=""
netns_up "$name" 4 "$octet"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OMPI_MCA_btl  # netns_mpirun picks the TCP transport
# A far orted whose mpirun is gone ends when its TCP gives up (parallel.md).
for h in 0 1 2 3; do ip netns exec "${name}h$h" sysctl -q -w net.ipv4.tcp_retries2=5; done
export NETNS_TMP="/tmp/${name}-hosts"  # the agent's, for the launcher's probes too
hosts="${name}h0,${name}h1,${name}h2,${name}h3"

# What the launcher runs as mpirun (`--mpirun`): netns_mpirun on host 0 with
# the launcher's --host; it becomes that mpirun (exec).
cat > "$out/mpirun.sh" <<EOF
#!/usr/bin/env bash
source "$here/netns_lib.sh"
mpiexec="$mpiexec"
[[ \$1 == --host ]] || { echo "mpirun.sh: expected --host SPEC first, got \$*" >&2; exit 2; }
spec=\$2
shift 2
NETNS_EXEC=1 netns_mpirun "$name" "\$spec" --map-by node -x CNNFLOW_TEST_SLOW_RANK -x CNNFLOW_TEST_FAULT "\$@"
EOF
chmod +x "$out/mpirun.sh"

# 8 replicas for the run's life, however many processes carry them.
sets=(--set train.epochs=1 --set train.batch=32 --set train.max_steps=150 --set threads=2
  --set 'graph.devices=[cpu:0, cpu:1]' --set graph.logical_replicas=8
  --set train.checkpoint_every=10 --set train.keep_checkpoints=0 --set train.log_every=5
  --set graph.collective_timeout_s=5)
# Each step takes at least 80 ms (replica 0 sleeps in its backward), so that
# the job is still running when host 3 comes back; the bits do not change.
export CNNFLOW_TEST_SLOW_RANK="rank=0,ms=80"

# Lines of $1 with the time each was read prepended.
stamp() { while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done > "$1"; }

start=$EPOCHREALTIME
"$out/mpirun.sh" --host "${name}h0:1,${name}h1:1,${name}h2:1,${name}h3:1" -n 4 \
  "$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" --out "$out/straight" \
  > "$out/straight.log" 2>&1 || { cat "$out/straight.log"; echo "FAIL: the uninterrupted run"; exit 1; }
echo "uninterrupted 4-host run: $(since "$start") s"

# Host 3's rank (MPI rank 3 of 4) at step 25: the host's link down, then its
# orted (the rank's parent) and the rank itself killed; the time of death first.
export CNNFLOW_TEST_FAULT="rank=3,step=25,mode=run,cmd=date +%s.%N > $out/died; ip link set eth0 down; kill -9 \$(ps -o ppid= -p \$PPID) \$PPID"
ip netns exec "${name}h0" timeout -s KILL 150 "$cnnflow" launch --hosts "$hosts" --min-hosts 2 \
  --probe-every 2 --agent "$here/netns_agent.sh" --mpirun "$out/mpirun.sh" --max-restarts 2 -- \
  "$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" --out "$out/elastic" \
  > >(stamp "$out/launch.log") 2>&1 &
launcher=$!

# Waits (up to $2 s) for a line of the launcher's log matching $1; prints its time.
wait_line() {
  local t
  for _ in $(seq 1 $(($2 * 10))); do
    t=$(grep -m1 -- "$1" "$out/launch.log" 2> /dev/null | cut -d' ' -f1)
    [[ -n $t ]] && { echo "$t"; return 0; }
    kill -0 "$launcher" 2> /dev/null || break
    sleep 0.1
  done
  cat "$out/launch.log" >&2
  echo "FAIL: no line '$1' in the launcher's log" >&2
  return 1
}
# The time of the first progress line (a run prints its first step) after time $1.
first_step_after() {
  awk -v t="$1" '$1 > t && $2 == "train" && $3 == "epoch" { print $1; exit }' "$out/launch.log"
}

shrunk=$(wait_line "cnnflow launch: host ${name}h3 lost .*restarting on 3 hosts" 90) || exit 1
for _ in $(seq 1 200); do [[ -n $(first_step_after "$shrunk") ]] && break; sleep 0.1; done
[[ -n $(first_step_after "$shrunk") ]] || { cat "$out/launch.log"; echo "FAIL: no step on 3 hosts"; exit 1; }
sleep 1
ip -n "${name}h3" link set eth0 up
back=$EPOCHREALTIME
wait_line "cnnflow launch: host ${name}h3 answers again; stopping after the current step to grow to 4 hosts" 30 > /dev/null || exit 1
grown=$(wait_line "cnnflow launch: host ${name}h3 joins; restarting on 4 hosts" 60) || exit 1
wait "$launcher"
status=$?
launcher=""
grep -o "cnnflow launch: .*" "$out/launch.log"
((status == 0)) || { echo "FAIL: the launcher exited $status"; exit 1; }
died=$(cat "$out/died" 2> /dev/null) || { echo "FAIL: host 3's rank never ran the fault"; exit 1; }
on3=$(first_step_after "$shrunk") on4=$(first_step_after "$grown")
[[ -n $on4 ]] || { echo "FAIL: no step on 4 hosts after the grow"; exit 1; }
to3=$(awk -v a="$died" -v b="$on3" 'BEGIN { printf "%.1f", b - a }')
to4=$(awk -v a="$back" -v b="$on4" 'BEGIN { printf "%.1f", b - a }')
grep -q "restarting on 3 hosts (${name}h0,${name}h1,${name}h2; 3 processes) from checkpoint step 20 (epoch 1, batch 20): restart 1/2" "$out/launch.log" ||
  { echo "FAIL: the shrink did not resume from step 20 as restart 1/2"; exit 1; }
grep -q "a grow, not counted against --max-restarts" "$out/launch.log" || { echo "FAIL: the grow was counted"; exit 1; }
grep -q "attempt 3 finished on 4 hosts .*; 1 restart(s) of --max-restarts 2 used" "$out/launch.log" ||
  { echo "FAIL: the job did not finish on 4 hosts after 1 restart"; exit 1; }

# Nothing of the job left on any host (a far orted may take its TCP's 13 s).
left=""
for _ in $(seq 1 200); do
  left=""
  for h in 0 1 2 3; do
    procs=$(netns_pids "${name}h$h" | xargs -r ps -o comm= -p | tr '\n' ' ')
    [[ -n ${procs// /} ]] && left+="host $h: $procs; "
  done
  [[ -z $left ]] && break
  sleep 0.1
done
[[ -z $left ]] || { echo "FAIL: left running 20 s after the launcher ended: $left"; exit 1; }

echo "host 3 crashed at step 25: first step on 3 hosts ${to3} s later; back: first step on 4 hosts ${to4} s later"
cmp "$out/straight/model.safetensors" "$out/elastic/model.safetensors" ||
  { echo "FAIL: 4 -> 3 -> 4 hosts ended with other weights than 4 hosts throughout"; exit 1; }
echo "PASS: 4 -> 3 -> 4 hosts: host 3 crashed at step 25, first step on 3 hosts ${to3} s later;" \
  "back, first step on 4 hosts ${to4} s later; bitwise the 4-host run's weights, nothing left running"
