#!/usr/bin/env bash
# Restarts of one process (`cnnflow train --max-restarts N`, issue 16):
#  1. the process SIGKILLed after a checkpoint is started again with
#     --resume and ends bitwise equal to the uninterrupted run;
#  2. a job that keeps failing is run 1 + N times, then the launcher gives
#     up, says so and exits with the last attempt's status;
#  3. Ctrl-C (SIGINT to the launcher) stops the job once, with a
#     checkpoint and exit 130, and is not restarted; resumed (through the
#     launcher, --resume), it ends as an uninterrupted run (weights,
#     metrics.csv, steps.csv): a stop at whatever step the signal came,
#     accumulating 2 batches a step, so the stop waited for a window's end.
#   usage: restart_test.sh CNNFLOW_BINARY
set -u
source "$(dirname "$0")/mpi_lib.sh"
cnnflow="$1"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sets=(--set train.epochs=2 --set train.max_steps=30 --set train.batch=32 --set threads=2
      --set train.checkpoint_every=10 --set train.keep_checkpoints=0 --set train.log_every=5)

# 1. SIGKILL after the step-20 checkpoint.
timeout 120 "$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" --out "$out/straight" \
  > "$out/straight.log" 2>&1 || { cat "$out/straight.log"; echo "FAIL: uninterrupted run"; exit 1; }
# (No `timeout` around a launcher in the background: $! must be the
# launcher, and timeout would pass a signal on twice. ctest's TIMEOUT is the alarm.)
"$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" --out "$out/killed" \
  --max-restarts 1 > "$out/killed.log" 2>&1 &
launcher=$!
wait_for_file "$out/killed/checkpoints/step-000000020.json" "$out/killed.log" || exit 1
kill -KILL "$(pgrep -P "$launcher")"
wait "$launcher"
status=$?
grep "^cnnflow launch" "$out/killed.log"
[[ $status -eq 0 ]] || { cat "$out/killed.log"; echo "FAIL: exit status $status after a restart"; exit 1; }
grep -Eq "restart 1/1: attempt 1 failed \(killed by signal 9 \(SIGKILL\)\); every rank resumes from checkpoint step (20|30|40|50) " "$out/killed.log" ||
  { echo "FAIL: the restart is not logged"; exit 1; }
expect_same_end_state "$out/straight" "$out/killed" || exit 1

# 2. Every attempt fails (the data is not there): 3 attempts, then it gives up.
timeout 60 "$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" --out "$out/broken" \
  --set data.train.images=/nonexistent/images.gz --max-restarts 2 > "$out/broken.log" 2>&1
status=$?
grep "^cnnflow launch" "$out/broken.log"
[[ $status -eq 1 ]] || { cat "$out/broken.log"; echo "FAIL: exit status $status, expected the last attempt's (1)"; exit 1; }
[[ $(grep -c "^cnnflow launch: attempt [1-3]/3: " "$out/broken.log") -eq 3 ]] || { echo "FAIL: expected 3 attempts"; exit 1; }
grep -q "no valid checkpoint in $out/broken yet: starting over" "$out/broken.log" || { echo "FAIL: no 'starting over'"; exit 1; }
grep -q "giving up: attempt 3/3 failed (exit status 1) and all 2 restart(s) of --max-restarts 2 are used" "$out/broken.log" ||
  { echo "FAIL: no clear give-up message"; exit 1; }

# 3. Ctrl-C: one stop, a checkpoint, exit 130, no restart.
stop_sets=(--set train.epochs=1 --set train.max_steps=400 --set train.accumulate=2 --set train.batch=32
           --set threads=2 --set train.log_every=10)
"$cnnflow" train configs/fashion_mnist.yaml "${stop_sets[@]}" \
  --out "$out/stopped" --max-restarts 3 > "$out/stopped.log" 2>&1 &
launcher=$!
for _ in $(seq 1 600); do grep -q "train epoch 1/1" "$out/stopped.log" && break; sleep 0.1; done
kill -INT "$launcher"
wait "$launcher"
status=$?
grep "^cnnflow launch" "$out/stopped.log"
[[ $status -eq 130 ]] || { cat "$out/stopped.log"; echo "FAIL: exit status $status after Ctrl-C, expected 130"; exit 1; }
grep -q "attempt 1 was stopped (exit status 130, the launcher got signal 2): not restarting" "$out/stopped.log" ||
  { echo "FAIL: the stop is not reported"; exit 1; }
[[ $(grep -c "^cnnflow launch: attempt [0-9]/4: " "$out/stopped.log") -eq 1 ]] || { echo "FAIL: a stopped job was restarted"; exit 1; }
grep -q "stopped by a signal" "$out/stopped.log" || { echo "FAIL: the job did not stop cleanly (once)"; exit 1; }
ls "$out/stopped/checkpoints/"step-*.json > /dev/null 2>&1 || { echo "FAIL: no checkpoint after Ctrl-C"; exit 1; }
timeout 120 "$cnnflow" train configs/fashion_mnist.yaml "${stop_sets[@]}" --resume "$out/stopped" \
  --max-restarts 3 > "$out/resumed.log" 2>&1 || { cat "$out/resumed.log"; echo "FAIL: resume after Ctrl-C"; exit 1; }
grep -o "resuming .*" "$out/resumed.log"
timeout 120 "$cnnflow" train configs/fashion_mnist.yaml "${stop_sets[@]}" --out "$out/whole" \
  > "$out/whole.log" 2>&1 || { cat "$out/whole.log"; echo "FAIL: uninterrupted run"; exit 1; }
expect_same_end_state "$out/whole" "$out/stopped" || { echo "(stopped by Ctrl-C, resumed)"; exit 1; }
echo "PASS: restarted after SIGKILL bitwise equal; gave up after 2 restarts; Ctrl-C not restarted, resumed bitwise equal"
