#!/usr/bin/env bash
# cnnflow predict: real PNGs of Fashion-MNIST test images through the
# weights PyTorch trained (tests/data/pytorch_tiny.*, 83.89% on the test
# set): most top-1 classes are the labels, the same with the layers split
# over 2 devices (tensor parallelism), and bad input is a named error.
#   usage: predict_test.sh CNNFLOW_BINARY
set -u
cnnflow="$1"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# The first 50 test images as 8-bit grey PNGs named by their label.
python3 - "$out" <<'PY' || fail "could not write the PNGs"
import gzip, struct, sys, zlib
out = sys.argv[1]
images = gzip.open('/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz').read()[16:]
labels = gzip.open('/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz').read()[8:]
def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
for i in range(50):
    px = images[i * 784:(i + 1) * 784]
    raw = b''.join(b'\0' + px[r * 28:(r + 1) * 28] for r in range(28))
    png = (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 28, 28, 8, 0, 0, 0, 0)) +
           chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))
    open(f'{out}/{i:03d}_label{labels[i]}.png', 'wb').write(png)
PY
weights=(tests/data/pytorch_tiny.yaml --weights tests/data/pytorch_tiny.safetensors --top 3)
"$cnnflow" predict "${weights[@]}" "$out"/*.png > "$out/one.txt" 2> "$out/log" ||
  { rc=$?; cat "$out/log"; fail "predict exited with $rc"; }
right=$(grep -c '_label\([0-9]\)\.png: \1 (' "$out/one.txt")
(( right >= 35 )) || { cat "$out/one.txt"; fail "only $right of 50 top-1 classes are the labels"; }
grep -q "forward latency median" "$out/one.txt" || fail "no latency summary"
# The same predictions with conv1 (column) and fc (row) split over 2 devices.
"$cnnflow" predict "${weights[@]}" --set 'graph.devices=[cpu:0, cpu:1]' \
  --set 'graph.tensor_parallel={size: 2, layers: {conv1: column, fc: row}}' "$out"/*.png \
  > "$out/two.txt" 2> "$out/log" || { rc=$?; cat "$out/log"; fail "predict with TP exited with $rc"; }
grep -q "tensor parallel over 2 device" "$out/two.txt" || fail "TP was not used: $(head -1 "$out/two.txt")"
diff <(grep png: "$out/one.txt" | sed 's/   decode.*//') <(grep png: "$out/two.txt" | sed 's/   decode.*//') ||
  fail "TP predictions differ from 1 device"
# A file that is no image: exit 1, naming it; no weights: usage, exit 2.
echo "not an image" > "$out/notes.png"
"$cnnflow" predict "${weights[@]}" "$out/notes.png" > /dev/null 2> "$out/log"
[[ $? == 1 ]] || fail "a bad file did not exit 1"
grep -q "notes.png" "$out/log" || { cat "$out/log"; fail "the error does not name the file"; }
"$cnnflow" predict tests/data/pytorch_tiny.yaml "$out/000_label9.png" > /dev/null 2> "$out/log"
[[ $? == 2 ]] || fail "no --weights did not exit 2"
grep -q "usage: cnnflow predict" "$out/log" || fail "no usage line"
echo "PASS: predict ($right of 50 right; TP == 1 device)"
