#!/usr/bin/env bash
# Training across "hosts": network namespaces on a bridge (netns_lib.sh),
# ranks started by mpirun over TCP only, as on separate machines.
#   usage: netns_train_test.sh MPIEXEC CNNFLOW_BINARY MODE
#   equal      2 hosts x 1 rank and 2 hosts x 2 ranks end with model.safetensors
#              byte for byte that of one process with the same replicas
#   flap       host 1's cable out for 6 s mid-run: the run goes on, warns of
#              the stall (graph.stall_warn_s 2) and ends bitwise as the
#              unflapped run
#   loss       1% of the packets each host sends dropped at random
#              (nftables): the run completes with the lossless run's weights
#              bit for bit; the log shows any stall warnings
#   restart    `cnnflow launch --max-restarts 2` around the 2-host job; host
#              1's cable out for 12 s after the step-20 checkpoint (the ranks
#              fail at graph.collective_timeout_s 5), then back: the launcher
#              restarts every rank from the checkpoint and the job ends
#              bitwise as the uninterrupted one
#   link_down  host 1's cable out for good (graph.collective_timeout_s 10):
#              every cnnflow rank on both hosts exits within 10 + 10 s,
#              naming the collective and the rank it waits on; the
#              `cnnflow launch` around them, told by its host's rank, ends
#              its mpirun and exits 1 within 10 + 10 s too, nothing left on
#              host 0; with the hosts' TCP retries cut
#              (net.ipv4.tcp_retries2=5, see docs/parallel.md) host 1's
#              orted (Open MPI's) ends on its own: no process is left on
#              either host
# Exits 77 (skip) where namespaces cannot be made.
set -u
mpiexec="$1"
cnnflow=$(realpath "$2")
mode="$3"
here=$(cd "$(dirname "$0")" && pwd)
source "$here/netns_lib.sh"
source "$here/mpi_lib.sh"
netns_require
case "$mode" in
  equal) name=cfeq octet=211 ;;
  flap) name=cffl octet=212 ;;
  loss) name=cfls octet=214 ;;
  restart) name=cfrs octet=215 ;;
  link_down) name=cfld octet=213 ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
out=$(mktemp -d)
trap 'netns_down $name; rm -rf "$out"' EXIT
netns_up "$name" 2 "$octet"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OMPI_MCA_btl  # netns_mpirun picks the TCP transport
hosts="${name}h0:2,${name}h1:2"
sets=(--set train.epochs=1 --set train.batch=32)

# rank and process counts on host $1 (ps comm names, space separated)
procs_on() { netns_pids "${name}h$1" | xargs -r ps -o comm= -p | tr '\n' ' '; }

if [[ $mode == equal ]]; then
  for layout in 1 2; do
    n=$((2 * layout))
    devices="[cpu:0$( ((layout == 2)) && echo ", cpu:1")]"
    netns_mpirun "$name" "$hosts" -n 2 --map-by node "$cnnflow" train configs/fashion_mnist.yaml \
      "${sets[@]}" --set train.max_steps=40 --set threads="$layout" \
      --set "graph.devices=$devices" --out "$out/hosts$n" > "$out/hosts$n.log" 2>&1 ||
      { cat "$out/hosts$n.log"; echo "FAIL: 2 hosts x $layout"; exit 1; }
    one="[cpu:0$(for ((i = 1; i < n; ++i)); do echo -n ", cpu:$i"; done)]"
    "$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" --set train.max_steps=40 \
      --set threads="$n" --set "graph.devices=$one" --out "$out/one$n" > "$out/one$n.log" 2>&1 ||
      { cat "$out/one$n.log"; echo "FAIL: one process"; exit 1; }
    cmp "$out/hosts$n/model.safetensors" "$out/one$n/model.safetensors" ||
      { echo "FAIL: 2 hosts x $layout replicas differ from 1 process x $n"; exit 1; }
    echo "2 hosts x $layout == 1 process x $n replicas, byte for byte"
  done
  echo "PASS: training across 2 hosts over TCP equals one process"
  exit 0
fi

# flap and link_down: 2 hosts x 1 rank, long enough to cut mid-run.
run_sets=("${sets[@]}" --set threads=1 --set graph.collective_timeout_s=10 --set graph.stall_warn_s=2)
if [[ $mode == flap ]]; then
  netns_mpirun "$name" "$hosts" -n 2 --map-by node "$cnnflow" train configs/fashion_mnist.yaml \
    "${run_sets[@]}" --set train.max_steps=300 --out "$out/plain" > "$out/plain.log" 2>&1 ||
    { cat "$out/plain.log"; echo "FAIL: unflapped run"; exit 1; }
  netns_mpirun "$name" "$hosts" -n 2 --map-by node "$cnnflow" train configs/fashion_mnist.yaml \
    "${run_sets[@]}" --set train.max_steps=300 --out "$out/flap" > "$out/flap.log" 2>&1 &
  job=$!
  for _ in $(seq 1 300); do grep -q "train epoch 1/1" "$out/flap.log" 2> /dev/null && break; sleep 0.1; done
  netns_cable "$name" 1 down
  sleep 6
  netns_cable "$name" 1 up
  # A hard alarm; its sleep must not hold the test's output open.
  (sleep 120 && kill -9 "$job") > /dev/null 2>&1 &
  alarm=$!
  wait "$job" || { cat "$out/flap.log"; echo "FAIL: the flapped run failed"; exit 1; }
  pkill -P "$alarm" sleep; kill "$alarm" 2> /dev/null
  grep "warning: MPI .* has waited" "$out/flap.log" || { cat "$out/flap.log"; echo "FAIL: no stall warning"; exit 1; }
  cmp "$out/plain/model.safetensors" "$out/flap/model.safetensors" ||
    { echo "FAIL: the flapped run's weights differ"; exit 1; }
  echo "PASS: a 6 s link flap: warned, went on, ended bitwise equal"
  exit 0
fi

if [[ $mode == loss ]]; then
  if ! command -v nft > /dev/null; then
    echo "SKIP: no nft (nftables): scripts/setup.sh installs it"
    exit 77
  fi
  netns_mpirun "$name" "$hosts" -n 2 --map-by node "$cnnflow" train configs/fashion_mnist.yaml \
    "${run_sets[@]}" --set train.max_steps=200 --out "$out/plain" > "$out/plain.log" 2>&1 ||
    { cat "$out/plain.log"; echo "FAIL: lossless run"; exit 1; }
  for h in 0 1; do
    printf 'table inet loss {\n chain out {\n  type filter hook output priority 0;\n  %s\n }\n}\n' \
      'numgen random mod 100 == 0 counter drop' | ip netns exec "${name}h$h" nft -f - ||
      { echo "FAIL: nft could not add the loss rule"; exit 1; }
  done
  netns_mpirun "$name" "$hosts" -n 2 --map-by node "$cnnflow" train configs/fashion_mnist.yaml \
    "${run_sets[@]}" --set train.max_steps=200 --out "$out/lossy" > "$out/lossy.log" 2>&1 ||
    { cat "$out/lossy.log"; echo "FAIL: the run with 1% loss failed"; exit 1; }
  dropped=0
  for h in 0 1; do
    n=$(ip netns exec "${name}h$h" nft list chain inet loss out | sed -n 's/.*counter packets \([0-9]*\).*/\1/p')
    dropped=$((dropped + n))
  done
  echo "packets dropped: $dropped"
  ((dropped > 0)) || { echo "FAIL: no packet was dropped"; exit 1; }
  cmp "$out/plain/model.safetensors" "$out/lossy/model.safetensors" ||
    { echo "FAIL: the weights differ with 1% loss"; exit 1; }
  echo "stall warnings with 1% loss: $(grep -c 'warning: MPI' "$out/lossy.log")"
  echo "PASS: 1% packet loss: completed, bitwise equal"
  exit 0
fi

# What `cnnflow launch --mpirun` runs: mpirun on host 0 (this script becomes
# it), one rank on each host.
cat > "$out/mpirun.sh" <<EOF
#!/usr/bin/env bash
source "$here/netns_lib.sh"
mpiexec="$mpiexec"
NETNS_EXEC=1 netns_mpirun "$name" "$hosts" --map-by node "\$@"
EOF
chmod +x "$out/mpirun.sh"

if [[ $mode == restart ]]; then
  rs=(--set train.epochs=2 --set train.max_steps=30 --set train.batch=32 --set threads=1
    --set train.checkpoint_every=10 --set train.keep_checkpoints=0 --set train.log_every=5
    --set graph.collective_timeout_s=5)
  "$out/mpirun.sh" -n 2 "$cnnflow" train configs/fashion_mnist.yaml "${rs[@]}" --out "$out/straight" \
    > "$out/straight.log" 2>&1 || { cat "$out/straight.log"; echo "FAIL: uninterrupted run"; exit 1; }
  timeout 240 "$cnnflow" launch --max-restarts 2 --mpirun "$out/mpirun.sh" -n 2 -- \
    "$cnnflow" train configs/fashion_mnist.yaml "${rs[@]}" --out "$out/cut" > "$out/launch.log" 2>&1 &
  launcher=$!
  wait_for_file "$out/cut/checkpoints/step-000000020.json" "$out/launch.log" || exit 1
  netns_cable "$name" 1 down
  sleep 12
  netns_cable "$name" 1 up
  wait "$launcher"
  status=$?
  grep "^cnnflow launch" "$out/launch.log"
  [[ $status -eq 0 ]] || { cat "$out/launch.log"; echo "FAIL: launcher exit status $status"; exit 1; }
  grep -q "restart 1/2: attempt 1 failed" "$out/launch.log" || { echo "FAIL: no restart"; exit 1; }
  expect_same_end_state "$out/straight" "$out/cut" || exit 1
  echo "PASS: a 12 s cut failed the job, cnnflow launch restarted it across the hosts, bitwise equal"
  exit 0
fi

# link_down, under `cnnflow launch` (no restart), which runs on host 0 (its
# mpirun does). Each rank writes its own output on its own host
# (--output-filename).
for h in 0 1; do ip netns exec "${name}h$h" sysctl -q -w net.ipv4.tcp_retries2=5; done
"$cnnflow" launch --max-restarts 0 --mpirun "$out/mpirun.sh" -n 2 -- --output-filename "$out/ranks" \
  "$cnnflow" train configs/fashion_mnist.yaml "${run_sets[@]}" --set train.epochs=100 --out "$out/down" \
  > "$out/down.log" 2>&1 &
job=$!
for _ in $(seq 1 300); do cat "$out"/ranks/1/rank.0/std* 2> /dev/null | grep -q "train epoch 1/" && break; sleep 0.1; done
sleep 1
netns_cable "$name" 1 down
cut=$EPOCHREALTIME
ranks_gone="" launch_gone="" host0_gone="" host1_gone=""
while le "$(since "$cut")" 90; do
  p0=$(procs_on 0) p1=$(procs_on 1)
  if [[ -z $ranks_gone && $p0$p1 != *cnnflow* ]]; then ranks_gone=$(since "$cut"); fi
  if [[ -z $launch_gone ]] && ! kill -0 "$job" 2> /dev/null; then launch_gone=$(since "$cut"); fi
  if [[ -z $host0_gone && -z ${p0// /} ]]; then host0_gone=$(since "$cut"); fi
  if [[ -z $host1_gone && -z ${p1// /} ]]; then host1_gone=$(since "$cut"); fi
  [[ -n $launch_gone && -n $host0_gone && -n $host1_gone ]] && break
  # Host 1's last processes (Open MPI's orted) as they were when the launcher ended.
  [[ -n $launch_gone && -z ${left1+x} ]] && left1="host 0: $p0; host 1: $p1"
  sleep 0.2
done
echo "after the cut: cnnflow ranks gone after ${ranks_gone:-?} s, cnnflow launch after ${launch_gone:-?} s," \
  "every process of host 0 after ${host0_gone:-?} s, of host 1 after ${host1_gone:-?} s"
echo "left when the launcher ended: ${left1:-}"
echo "left now on host 0: $(procs_on 0); on host 1: $(procs_on 1)"
wait "$job"
status=$?
echo "cnnflow launch exit code $status"
grep "^cnnflow launch" "$out/down.log"
((status != 0)) || { echo "FAIL: cnnflow launch exited 0"; exit 1; }
for r in 0 1; do
  echo "rank $r:"
  grep -h "did not complete" "$out"/ranks/1/rank.$r/std* | head -2
done
[[ -n $ranks_gone ]] && le "$ranks_gone" 20 || { echo "FAIL: cnnflow ranks left 20 s after the cut"; exit 1; }
for r in 0 1; do
  grep -qh "MPI AllReduceSum .*, waiting on rank $((1 - r))) did not complete within 10 s" \
    "$out"/ranks/1/rank.$r/std* || { echo "FAIL: rank $r did not name the collective and its peer"; exit 1; }
done
# The launcher: within collective_timeout_s + 10 s, having ended its mpirun
# itself (a rank on its host told it of the failure), with nothing of its
# own left on its host.
[[ -n $launch_gone ]] && le "$launch_gone" 20 || { echo "FAIL: cnnflow launch still running 20 s after the cut"; exit 1; }
grep -q "^cnnflow launch: a rank on this host failed" "$out/down.log" ||
  { echo "FAIL: the launcher did not hear of the failed rank"; exit 1; }
[[ -n $host0_gone ]] && le "$host0_gone" 20 || { echo "FAIL: processes left on host 0 20 s after the cut"; exit 1; }
# Host 1's orted is Open MPI's and ends on its own, when its TCP gives up
# on the unreachable mpirun (net.ipv4.tcp_retries2=5 above).
[[ -n $host1_gone ]] || { echo "FAIL: processes left on host 1 90 s after the cut"; exit 1; }
echo "PASS: a link down for good: ranks gone in ${ranks_gone} s, cnnflow launch in ${launch_gone} s," \
  "host 0 empty in ${host0_gone} s, host 1 (its orted) in ${host1_gone} s"
