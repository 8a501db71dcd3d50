#!/usr/bin/env bash
# bench/time_to_accuracy.sh's plumbing, with stand-ins for cnnflow, the
# PyTorch interpreter and nvidia-smi (seconds, no GPU, no torch):
#   1. a results file of the 13 columns before device and timed_s, with
#      old CPU rows of this machine, gets both columns (empty in its old
#      rows) when a CPU session appends to it; the summary over the file
#      pairs the old rows and the new (wall time on a CPU);
#   2. --device cuda passes cnnflow 'graph.devices=[cuda:0]' and (train
#      only) data.device_resident=true (graph.precision only for bf16 and
#      fp16, PyTorch --precision alike), and
#      PyTorch --device cuda, compiled (--compile) then eager, each seed;
#      the rows carry the GPU's name (its comma made ';') and timed_s; the
#      summaries compare the timed spans (ratios checked), and the file's
#      summary takes the GPU rows only;
#   3. --no-compile runs eager PyTorch only; --budget 0 runs one seed;
#      fp16 on the CPU is refused; a failed run makes the exit status 1,
#      the other seeds still run.
#   usage: time_to_accuracy_test.sh
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
script="$root/bench/time_to_accuracy.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
mkdir -p "$tmp/bin" "$tmp/data/cifar10-jpeg/train" "$tmp/data/cifar10-jpeg/test"

# cnnflow: train prints the TTA accuracy and the timed span (2.50 s), eval
# the accuracy without TTA; every command line goes to cnnflow.args.
cat >"$tmp/bin/cnnflow" <<EOF
#!/usr/bin/env bash
echo "\$*" >>"$tmp/cnnflow.args"
case "\$1" in
  --version) echo "cnnflow 0.0-test" ;;
  train) [[ "\$*" == *"seed=13 "* ]] && { echo "error: seed 13 fails"; exit 1; }
         out=""; while [[ \$# -gt 0 ]]; do [[ \$1 == --out ]] && out=\$2; shift; done
         mkdir -p "\$out" && : >"\$out/model.safetensors"; sleep 0.1
         echo "epoch 1/1: train loss 0.5, test loss 0.3, test accuracy 94.1% of 10000 samples, 100 img/s"
         echo "timed span: 2.50 s from the whitening init to the end of the last evaluation (the init 0.30 s)" ;;
  eval) echo "test loss 0.31, test accuracy 93.4% of 10000 samples" ;;
esac
EOF
# python: 'import torch' checks pass; airbench_pytorch.py prints its JSON
# (timed_s 3.00 compiled, 4.00 eager); any other -c runs in python3.
cat >"$tmp/bin/python" <<EOF
#!/usr/bin/env bash
if [[ "\$1" == -c ]]; then
  case "\$2" in *"import torch"*) echo "torch 2.99.0 cuda 12.9"; exit 0 ;; esac
  exec python3 "\$@"
fi
echo "\$*" >>"$tmp/python.args"
seed=0 timed=4.00 compile_s=0
while [[ \$# -gt 0 ]]; do
  case "\$1" in --seed) seed=\$2 ;; --compile) timed=3.00 compile_s=41.5 ;; esac; shift
done
echo "{\"seed\": \$seed, \"accuracy\": 93.5, \"accuracy_tta\": 94.0, \"wall_s\": 60.0, \"timed_s\": \$timed, \"decode_s\": 1.5, \"compile_s\": \$compile_s, \"torch\": \"2.99.0\"}"
EOF
cat >"$tmp/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
case "$*" in *name,driver*) echo "NVIDIA Test, GPU, 999.1, 81559 MiB" ;; *) echo "NVIDIA Test, GPU" ;; esac
EOF
chmod +x "$tmp/bin/"*
export PATH="$tmp/bin:$PATH"
run() {  # args...: the script with the stand-ins, its output in $tmp/out
  bash "$script" --cnnflow "$tmp/bin/cnnflow" --python "$tmp/bin/python" --data "$tmp/data" \
    --torch-malloc glibc --logs "$tmp/logs" --csv "$tmp/tta.csv" --epochs 1 "$@" >"$tmp/out" 2>&1
}

# This machine as the script names it (its first line).
bash "$script" --only cnnflow --cnnflow "$tmp/bin/cnnflow" --seeds 0 --logs "$tmp/logs0" \
  --csv "$tmp/probe.csv" --epochs 1 >"$tmp/probe" 2>&1 || { cat "$tmp/probe"; fail "probe run"; }
cpu=$(sed -n '1s/^cpu: \(.*\), [0-9]* cores; isa: .*/\1/p' "$tmp/probe")
isa=$(sed -n '1s/.*; isa: \([^;]*\);.*/\1/p' "$tmp/probe")
[[ -n "$cpu" && -n "$isa" ]] || { cat "$tmp/probe"; fail "no cpu or isa in the first line"; }

# 1. The old format: 13 columns, two seeds of both sides on this CPU.
old_header="date,commit,cpu,isa,side,precision,threads,seed,epochs,accuracy,accuracy_tta,wall_s,malloc"
{
  echo "$old_header"
  echo "2026-12-01T00:00:00Z,abc1234,${cpu//,/;},$isa,cnnflow,fp32,2,7,1,90.00,91.00,100.00,glibc"
  echo "2026-12-01T00:10:00Z,abc1234,${cpu//,/;},$isa,pytorch,fp32,2,7,1,90.50,91.50,150.00,glibc"
  echo "2026-12-01T00:20:00Z,abc1234,Another CPU,avx2,cnnflow,fp32,2,8,1,89.00,90.00,999.00,glibc"
} >"$tmp/tta.csv"
run --seeds "0 1" || { cat "$tmp/out"; fail "cpu session"; }
[[ $(head -1 "$tmp/tta.csv") == "$old_header,device,timed_s" ]] || fail "header not migrated: $(head -1 "$tmp/tta.csv")"
grep -q "^2026-12-01T00:10:00Z,abc1234,.*,pytorch,fp32,2,7,1,90.50,91.50,150.00,glibc,,$" "$tmp/tta.csv" ||
  fail "an old row lost its fields or did not get two empty ones"
awk -F, 'NF != 15 { exit 1 }' "$tmp/tta.csv" || fail "a row without 15 fields"
[[ $(grep -c ",cpu,2.50$" "$tmp/tta.csv") -eq 2 && $(grep -c ",cpu,4.0$" "$tmp/tta.csv") -eq 2 ]] ||
  { cat "$tmp/tta.csv"; fail "new cpu rows without device cpu and timed_s"; }
grep -q "cnnflow and pytorch on cpu" "$tmp/out" || { cat "$tmp/out"; fail "no file summary"; }
file_summary=$(sed -n '/^every seed of/,$p' "$tmp/out")
grep -q "cnnflow *3 runs .* wall mean" <<<"$file_summary" ||
  { cat "$tmp/out"; fail "the file summary does not pair the old row with the new"; }
grep -q "pytorch *3 runs" <<<"$file_summary" || { cat "$tmp/out"; fail "pytorch: not 3 runs"; }
grep -q "compile" "$tmp/python.args" && fail "PyTorch compiled on the CPU without --compile"
echo "ok: old rows migrated and read with the new (cpu: wall time)"

# 2. On a GPU: both PyTorch runs a seed, compiled first; timed spans compared.
: >"$tmp/cnnflow.args"; : >"$tmp/python.args"
# fp32 and 2 threads as the CPU rows: only the device tells them apart.
run --device cuda --threads 2 --seeds "0 1" || { cat "$tmp/out"; fail "cuda session"; }
grep "^train " "$tmp/cnnflow.args" | grep -q -- "--set threads=2 --set graph.devices=\[cuda:0\] --set data.device_resident=true" ||
  { cat "$tmp/cnnflow.args"; fail "cnnflow train without the GPU sets"; }
grep -q "graph.precision" "$tmp/cnnflow.args" && fail "graph.precision set for fp32"
grep "^eval " "$tmp/cnnflow.args" | grep -q "device_resident" && fail "eval got data.device_resident"
grep "^eval " "$tmp/cnnflow.args" | grep -q -- "graph.devices=\[cuda:0\]" || fail "eval not on the GPU"
[[ $(grep -c -- "--device cuda" "$tmp/python.args") -eq 4 && $(grep -c -- "--compile" "$tmp/python.args") -eq 2 ]] ||
  { cat "$tmp/python.args"; fail "PyTorch not run compiled and eager on cuda"; }
head -1 "$tmp/python.args" | grep -q -- "--compile" || fail "the compiled run does not come first"
grep -q "^gpu: NVIDIA Test, GPU, 999.1" "$tmp/out" || { cat "$tmp/out"; fail "no gpu line"; }
[[ $(grep -c ",NVIDIA Test; GPU,[0-9.]*$" "$tmp/tta.csv") -eq 6 ]] || { cat "$tmp/tta.csv"; fail "not 6 GPU rows"; }
grep -q ",pytorch-compiled,fp32,2,1,1,93.5,94.0,60.0,glibc,NVIDIA Test; GPU,3.0$" "$tmp/tta.csv" ||
  { cat "$tmp/tta.csv"; fail "no compiled row as expected"; }
grep -q "seed 0: cnnflow 93.40% (TTA 94.10%) in [0-9]* s, span 2.50 s  pytorch-compiled .*span 3.00 s (pytorch-compiled/cnnflow timed 1.20)  pytorch .*(pytorch/cnnflow timed 1.60)" "$tmp/out" ||
  { cat "$tmp/out"; fail "the seed line"; }
for ratio in "pytorch-compiled / cnnflow, mean timed span: 1.20" "pytorch / cnnflow, mean timed span: 1.60"; do
  [[ $(grep -c "ratio $ratio" "$tmp/out") -eq 2 ]] || { cat "$tmp/out"; fail "not twice (session, file): $ratio"; }
done
eager_summary=$(sed -n '/^every seed of .* run by cnnflow and pytorch on NVIDIA/,/^  ratio/p' "$tmp/out")
grep -q "cnnflow *2 runs .* timed span mean 2.50 s" <<<"$eager_summary" ||
  { cat "$tmp/out"; fail "the file summary mixes cpu rows into the GPU's"; }
echo "ok: cuda runs both sides with their GPU settings; timed spans compared"

# 3. --no-compile, --budget, fp16 on the CPU.
: >"$tmp/python.args"; : >"$tmp/cnnflow.args"
run --device cuda --precision fp16 --no-compile --budget 0 --seeds "0 1 2" || { cat "$tmp/out"; fail "budget session"; }
[[ $(grep -c -- "--set graph.precision=fp16" "$tmp/cnnflow.args") -eq 2 ]] || fail "cnnflow not fp16 (train and eval)"
grep -q -- "--precision fp16" "$tmp/python.args" || fail "PyTorch not fp16"
[[ $(grep -c "" "$tmp/python.args") -eq 1 ]] && ! grep -q -- "--compile" "$tmp/python.args" ||
  { cat "$tmp/python.args"; fail "--no-compile --budget 0: not one eager run"; }
grep -q "stopping before seed 1" "$tmp/out" || { cat "$tmp/out"; fail "no budget stop"; }
run --precision fp16 --seeds 0 && fail "fp16 on the CPU ran"
grep -q "fp16: --device cuda" "$tmp/out" || { cat "$tmp/out"; fail "fp16 refusal not named"; }
run --only cnnflow --seeds "13 0" && fail "a failed run exited 0"
grep -q "seed 13: cnnflow failed" "$tmp/out" && grep -q "seed 0: cnnflow 93.40%" "$tmp/out" ||
  { cat "$tmp/out"; fail "a failed seed stopped the others"; }
echo "ok: --no-compile, --budget, fp16 refused on the CPU, a failed run: exit 1 after the others"
echo "PASS: time_to_accuracy.sh reads old and new rows and runs both sides on cpu and cuda"
