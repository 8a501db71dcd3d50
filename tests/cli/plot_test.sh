#!/usr/bin/env bash
# cnnflow plot and bench --plot: two short runs (one with a test set over 2
# epochs, one without) overlaid as PNG and as SVG; the files are valid
# images of the expected size, and what was plotted from each run is what
# its CSVs hold (no test curve without a test set). A missing RUN_DIR is an
# error (exit 1) naming it; no -o exits 2. bench --plot writes its figure.
#   usage: plot_test.sh CNNFLOW_BINARY
set -u
cnnflow="$1"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
common=(--set train.max_steps=30 --set train.log_every=10 --set threads=2)
"$cnnflow" train configs/fashion_mnist.yaml --set train.epochs=2 "${common[@]}" --out "$out/with-test" \
  > "$out/log" 2>&1 || { cat "$out/log"; fail "train exited with $?"; }
"$cnnflow" train configs/fashion_mnist.yaml --set train.epochs=1 "${common[@]}" --set data.test=null \
  --out "$out/no-test" > "$out/log" 2>&1 || { cat "$out/log"; fail "train (no test set) exited with $?"; }
for ext in png svg; do
  "$cnnflow" plot "$out/with-test" "$out/no-test" -o "$out/curves.$ext" > "$out/plot.log" 2>&1 ||
    { cat "$out/plot.log"; fail "plot -o curves.$ext exited with $?"; }
  cat "$out/plot.log"
  grep -qx "with-test: 2 epoch(s), train and test, 6 logged step(s)" "$out/plot.log" || fail "with-test summary"
  grep -qx "no-test: 1 epoch(s), train only (no test set), 3 logged step(s)" "$out/plot.log" || fail "no-test summary"
  grep -q "wrote $out/curves.$ext: 2 run(s), 4 panels" "$out/plot.log" || fail "no 'wrote' line"
done
# PNG: the signature, then IHDR's width and height (2 panels of 620 wide).
[[ $(head -c 8 "$out/curves.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || fail "not a PNG"
size=$(od -An -tu1 -j16 -N8 "$out/curves.png" | awk '{print $3*256+$4, $7*256+$8}')
read -r w h <<< "$size"
[[ $w -eq 1240 && $h -gt 800 ]] || fail "PNG is ${w}x${h}, expected 1240 wide and over 800 high"
# SVG: well-formed XML whose root is <svg> of that size.
python3 - "$out/curves.svg" << 'PY' || fail "not a valid SVG"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == "{http://www.w3.org/2000/svg}svg", root.tag
assert root.get("width").startswith("1240"), root.attrib
PY
# A run from before steps.csv: the epoch panels only.
cp -r "$out/with-test" "$out/old" && rm "$out/old/steps.csv"
"$cnnflow" plot "$out/old" -o "$out/old.png" > "$out/log" 2>&1 || { cat "$out/log"; fail "plot of an old run"; }
grep -qx "old: 2 epoch(s), train and test, no steps.csv" "$out/log" &&
  grep -q "wrote $out/old.png: 1 run(s), 2 panels" "$out/log" || { cat "$out/log"; fail "old run summary"; }
"$cnnflow" plot "$out/missing" -o "$out/x.png" > "$out/log" 2>&1
rc=$?
[[ $rc -eq 1 ]] && grep -q "$out/missing: no such run folder" "$out/log" || { cat "$out/log"; fail "missing run: exit $rc"; }
[[ ! -e "$out/x.png" ]] || fail "a failed plot left a file"
"$cnnflow" plot "$out/with-test" > "$out/log" 2>&1
rc=$?
[[ $rc -eq 2 ]] || fail "no -o: exit $rc, expected 2"
"$cnnflow" bench configs/fashion_mnist.yaml --max-steps 5 --warmup 2 --devices 1,2 --set threads=2 \
  --plot "$out/scaling.png" > "$out/log" 2>&1 || { cat "$out/log"; fail "bench --plot exited with $?"; }
grep -q "wrote $out/scaling.png" "$out/log" || fail "bench wrote no plot"
[[ $(head -c 8 "$out/scaling.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || fail "scaling: not a PNG"
[[ -n "${CNNFLOW_KEEP_PLOTS:-}" ]] && cp "$out"/*.png "$out"/*.svg "$CNNFLOW_KEEP_PLOTS"/  # to look at them
echo "PASS: plots drawn"
