# Helpers for the fault tests (sourced): tests/cli/*_test.sh that break a
# run on purpose.

# Sanitized builds run several times slower: ctest sets CNNFLOW_TEST_SLOWDOWN
# there, and the time bounds below stretch by it.
slowdown=${CNNFLOW_TEST_SLOWDOWN:-1}

# train_expect STATUS LOG ARGS...: `$cnnflow train ARGS` (configs/
# fashion_mnist.yaml) under a 100 s alarm, its output in LOG; fails with the
# log unless it exits STATUS.
train_expect() {
  local want="$1" log="$2"
  shift 2
  timeout -k 5 100 "$cnnflow" train configs/fashion_mnist.yaml "$@" > "$log" 2>&1
  local status=$?
  [[ $status -eq $want ]] && return 0
  cat "$log"
  echo "FAIL: cnnflow train $*: exit status $status, expected $want"
  exit 1
}

# Seconds since $1 (an $EPOCHREALTIME), to 0.01 s.
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }

# Checks every file under the checkpoint directory $1 the way a reader would
# take it (pipeline/checkpoint.h): each sidecar step-N.json names a data file
# of its recorded size and CRC-32, and each data file under a final name
# (step-N.safetensors) is a whole safetensors file (its header's last
# offset is where the file ends). Prints one line per checkpoint; fails
# naming the first file that is torn. Temporary files (*.tmp.PID) are not
# checkpoints and are listed as such. Needs python3 (standard library only).
check_checkpoints() {
  python3 - "$1" <<'PY'
import json, os, struct, sys, zlib
d = sys.argv[1]
bad = []
for name in sorted(os.listdir(d)):
    p = os.path.join(d, name)
    if ".tmp." in name:
        print(f"  temporary {name} ({os.path.getsize(p)} bytes): not a checkpoint")
    elif name.endswith(".safetensors"):
        b = open(p, "rb").read()
        n = struct.unpack("<Q", b[:8])[0] if len(b) >= 8 else -1
        try:
            h = json.loads(b[8:8 + n]) if 0 < n <= len(b) - 8 else None
        except ValueError:
            h = None
        end = max([v["data_offsets"][1] for k, v in (h or {}).items() if k != "__metadata__"] + [0])
        if h is None or 8 + n + end != len(b):
            bad.append(f"{name}: torn data file under its final name ({len(b)} bytes)")
    elif name.endswith(".json"):
        s = json.load(open(p))
        data = os.path.join(d, s["data_file"])
        if not os.path.exists(data):
            bad.append(f"{name}: its data file {s['data_file']} is missing")
            continue
        b = open(data, "rb").read()
        crc = "%08x" % (zlib.crc32(b) & 0xffffffff)
        if len(b) != s["data_bytes"] or crc != s["data_crc32"]:
            bad.append(f"{name}: data {len(b)} bytes crc {crc}, sidecar says {s['data_bytes']} {s['data_crc32']}")
        else:
            print(f"  valid {name} (step {s['global_step']}, {len(b)} bytes)")
for line in bad:
    print("  BAD " + line)
sys.exit(1 if bad else 0)
PY
}

# small_disk SIZE: a scratch folder $out with a tmpfs of SIZE (e.g. 5m) at
# $disk, a real file system that fills up; both go at exit. Exits 77 (the
# tests' skip) where mount is not permitted (not root).
small_disk() {
  out=$(mktemp -d)
  disk="$out/disk"
  mkdir -p "$disk"
  trap 'umount "$disk" 2>/dev/null; rm -rf "$out"' EXIT
  if ! mount -t tmpfs -o "size=$1" cnnflow-small-disk "$disk" 2>"$out/mount.err"; then
    echo "SKIP: cannot mount a tmpfs here ($(head -n 1 "$out/mount.err")): run as root for this test"
    exit 77
  fi
}
