#!/usr/bin/env bash
# configs/cifar10_speedrun.yaml end to end on a subset: 2,000 training and
# 1,000 test images of the CIFAR-10 JPEG set (DATA.md), one epoch at batch
# 256 (7 full steps), every recipe piece on (whitening init, frozen tensors,
# parameter groups, lookahead, reflect translation, alternating flip, TTA).
# Checks the run ends with finite figures, the whitening conv is not the
# default init (filters k and k + 12 opposite), the run prints its timed
# span (whitening init to the last evaluation) with a positive figure, and
# evaluation with and without TTA differ. Without the tarball it runs on the 20 committed
# sample images and says so.
#   usage: speedrun_smoke_test.sh CNNFLOW_BINARY
#   CNNFLOW_CIFAR10_JPEG: the tarball (default ../shared/data/cifar10-jpeg.tar.gz
#   beside the repository, then /work/shared/data/cifar10-jpeg.tar.gz)
set -u
cnnflow="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

tarball=${CNNFLOW_CIFAR10_JPEG:-}
for t in ../shared/data/cifar10-jpeg.tar.gz /work/shared/data/cifar10-jpeg.tar.gz; do
  [[ -z "$tarball" && -f "$t" ]] && tarball=$t
done
if [[ -n "$tarball" ]]; then
  # 200 training and 100 test images a class.
  tar xzf "$tarball" -C "$tmp" --wildcards 'cifar10-jpeg/train/*/0[01]??.jpg' \
    'cifar10-jpeg/test/*/00??.jpg' || fail "cannot extract from $tarball"
  train="$tmp/cifar10-jpeg/train" test="$tmp/cifar10-jpeg/test" batch=256
else
  echo "speedrun smoke: no CIFAR-10 JPEG tarball; on the 20 sample images of tests/data"
  # batch 8: the config drops each epoch's short last batch (train.drop_last).
  train=tests/data/cifar10-jpeg-sample test=tests/data/cifar10-jpeg-sample batch=8
fi
"$cnnflow" convert --from folder "$train" --to "$tmp/train.lmdb" --shuffle > /dev/null 2>&1 ||
  fail "convert train"
"$cnnflow" convert --from folder "$test" --to "$tmp/test.lmdb" > /dev/null 2>&1 || fail "convert test"

sets=(--set threads=2 --set train.epochs=1 --set "train.batch=$batch" --set train.eval_batch=500
      --set data.train.path="$tmp/train.lmdb" --set data.test.path="$tmp/test.lmdb")
"$cnnflow" train configs/cifar10_speedrun.yaml "${sets[@]}" --out "$tmp/run" > "$tmp/train.log" 2>&1 ||
  { cat "$tmp/train.log"; fail "train"; }
grep -q "layer .whiten.: whitening init from" "$tmp/train.log" || { cat "$tmp/train.log"; fail "no whitening init line"; }
line=$(grep "^epoch 1/1:" "$tmp/train.log") || { cat "$tmp/train.log"; fail "no epoch line"; }
echo "$line"
[[ "$line" =~ "test accuracy "([0-9.]+)"%" ]] || fail "no test accuracy in: $line"
[[ "$line" == *nan* ]] && fail "a NaN in: $line"
# airbench's timed span (docs/outputs.md#what-a-run-prints): one line,
# parsed as bench/time_to_accuracy.sh parses it.
span=$(grep "^timed span: " "$tmp/train.log") || { cat "$tmp/train.log"; fail "no timed span line"; }
echo "$span"
[[ $(grep -c "^timed span: " "$tmp/train.log") -eq 1 ]] || fail "more than one timed span line"
[[ "$span" =~ ^"timed span: "([0-9]+\.[0-9]+)" s from the whitening init to the end of the last evaluation (the init "([0-9]+\.[0-9]+)" s)"$ ]] ||
  fail "timed span line not as documented: $span"
awk -v s="${BASH_REMATCH[1]}" -v i="${BASH_REMATCH[2]}" 'BEGIN { exit !(s > 0 && i >= 0 && i <= s) }' ||
  fail "timed span not positive, or shorter than its init: $span"

python3 - "$tmp/run/model.safetensors" <<'PY' || fail "whitening weights"
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    base = 8 + n
    meta = header["whiten.weight"]
    assert meta["shape"] == [24, 3, 2, 2], meta["shape"]
    f.seek(base + meta["data_offsets"][0])
    w = struct.unpack("<288f", f.read(288 * 4))
for k in range(12):
    for j in range(12):
        assert w[k * 12 + j] == -w[(k + 12) * 12 + j], (k, j)
print("whiten.weight: filters k and k + 12 opposite")
PY

eval_acc() {
  "$cnnflow" eval configs/cifar10_speedrun.yaml --weights "$tmp/run/model.safetensors" \
    "${sets[@]}" --set train.tta="$1" 2>&1 | grep -o "test loss [0-9.]*"
}
plain=$(eval_acc none) && tta=$(eval_acc flip_translate) || fail "eval"
echo "without TTA: $plain; with TTA: $tta"
[[ "$plain" != "$tta" ]] || fail "TTA changed nothing"

# Without a whitening init the span starts at the first training pass;
# without a test set it ends with training (configs/cifar10.yaml on the
# 20 sample images, a few seconds).
"$cnnflow" convert --from folder tests/data/cifar10-jpeg-sample --to "$tmp/sample.lmdb" > /dev/null 2>&1 ||
  fail "convert sample"
for test_set in "$tmp/sample.lmdb" null; do
  if [[ $test_set == null ]]; then set_test=(--set data.test=null) end="training"
  else set_test=(--set "data.test.path=$test_set") end="the last evaluation"; fi
  "$cnnflow" train configs/cifar10.yaml --set threads=2 --set train.epochs=1 --set train.batch=8 \
    --set data.train.path="$tmp/sample.lmdb" "${set_test[@]}" --out "$tmp/plain-$RANDOM" > "$tmp/plain.log" 2>&1 ||
    { cat "$tmp/plain.log"; fail "train configs/cifar10.yaml"; }
  span=$(grep "^timed span: " "$tmp/plain.log") || { cat "$tmp/plain.log"; fail "no timed span line"; }
  echo "$span"
  [[ "$span" =~ ^"timed span: "([0-9]+\.[0-9]+)" s from the first training pass to the end of $end"$ ]] ||
    fail "timed span line not as documented: $span"
  awk -v s="${BASH_REMATCH[1]}" 'BEGIN { exit !(s > 0) }' || fail "timed span not positive: $span"
done
echo "PASS: the speed-run recipe trains and evaluates end to end"
