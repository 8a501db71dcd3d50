#!/usr/bin/env bash
# A batch too large for memory. Linux overcommits, so a big request often
# "succeeds" and the process is later killed by the OOM killer; to make the
# allocation itself fail, as it does on a machine without overcommit or
# under a batch system's memory limit, the address space is capped
# (prlimit --as, i.e. ulimit -v) at 2 GiB and the batch is 20000 images
# (conv1's output alone is 20000 x 32 x 28 x 28 floats, 2 GB). The run must
# exit 1 (an error, not a crash) with a message naming the layer, the bytes
# asked and the bytes available, and saying to use a smaller batch.
# Under ASan (CNNFLOW_SANITIZE=address, set by ctest) an address-space cap
# leaves no room for ASan's shadow memory, so the cap is ASan's own instead:
# an allocation over 1 GiB fails (max_allocation_size_mb) as a cap would
# fail it (allocator_may_return_null: bad_alloc, not an ASan abort).
#   usage: oom_test.sh CNNFLOW_BINARY
set -u
cnnflow="$1"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cap=(prlimit --as=$((2 << 30)) --)
limit=", address space limited to $((2 << 30)) bytes \(ulimit -v\)"
if [[ ${CNNFLOW_SANITIZE:-} == address ]]; then
  cap=(env "ASAN_OPTIONS=${ASAN_OPTIONS:-}:max_allocation_size_mb=1024:allocator_may_return_null=1")
  limit=""  # no ulimit to report
fi
"${cap[@]}" timeout -k 5 60 "$cnnflow" train configs/fashion_mnist.yaml \
  --set train.batch=20000 --set train.epochs=1 --set train.max_steps=2 --set threads=1 \
  --out "$out/run" > "$out/log" 2>&1
status=$?
grep "error" "$out/log" | sed 's/^/  | /'
[[ $status -eq 1 ]] || { cat "$out/log"; echo "FAIL: exit status $status, expected 1 (an error, no crash)"; exit 1; }
grep -qE "error: .*out of memory: asked [0-9]+ bytes .*for layer '[a-z0-9_]+' \([a-z0-9_]+\) (forward|backward)" "$out/log" ||
  { echo "FAIL: the error does not name the layer and the bytes asked"; exit 1; }
grep -qE "[0-9]+ bytes available \(MemAvailable\)$limit" "$out/log" ||
  { echo "FAIL: the error does not say the bytes available"; exit 1; }
grep -q "use a smaller batch (train.batch)" "$out/log" || { echo "FAIL: the error does not say what to do"; exit 1; }
echo "PASS: a batch too large for memory: a named error, exit 1"
