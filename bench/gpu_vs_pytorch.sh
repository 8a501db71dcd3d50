#!/usr/bin/env bash
# gpu_vs_pytorch.sh: cnnflow vs PyTorch eager on one GPU, the same model,
# batch, optimizer and synthetic data, side by side (issue 6).
#
# For each model (mlp2: the two-layer CNN of configs/fashion_mnist.yaml at
# batch 64; resnet18: configs/resnet18_cifar.yaml's ResNet-18 at batch 256)
# and precision (fp32, bf16) it runs
#   cnnflow: CNNFLOW bench bench/configs/<model>_synthetic.yaml --devices 1
#            --max-steps S --warmup W [--set graph.precision=bf16]
#   pytorch: PYTHON bench/pytorch_train.py --model <model> --precision <p>
#            --device cuda --source synthetic --feed host --steps S --warmup W
# and prints a table (model, precision, batch, images/s of each, the ratio
# cnnflow / pytorch), also written as CSV, with every run's log, to --out.
# A run that fails is a row that says so ("not supported" when cnnflow does
# not know the precision yet, "failed", "timeout") and the script goes on.
# Rows are appended to the CSV as they finish: a run cut short keeps them.
#
# usage: bench/gpu_vs_pytorch.sh [--out DIR] [--cnnflow BIN] [--python PY]
#          [--cpu] [--models "mlp2 resnet18"] [--precisions "fp32 bf16"]
#          [--steps-mlp2 S] [--steps-resnet18 S] [--warmup W] [--batch B]
#          [--run-timeout SEC] [--budget SEC]
# --cpu (or GPU_VS_PYTORCH_DEVICE=cpu): a smoke test on a machine without a
#   GPU: graph.devices=[cpu:0] and --device cpu, Debian's /usr/bin/python3,
#   2 timed steps after 1 warm-up at batch 8 (unless given).
# On the H200 with the defaults (500 / 200 timed steps) the whole table takes
# about 2-3 minutes; --budget (default 240 s) caps it: each run's timeout is
# min(--run-timeout, what is left), and runs that no longer fit are skipped.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT=""
CNNFLOW="$ROOT/build/cnnflow"
PYTHON=""
DEVICE="${GPU_VS_PYTORCH_DEVICE:-cuda}"
MODELS="mlp2 resnet18"
PRECISIONS="fp32 bf16"
STEPS_MLP2=""
STEPS_RESNET18=""
WARMUP=""
BATCH=""
RUN_TIMEOUT=45
BUDGET=240

usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --cnnflow) CNNFLOW="$2"; shift 2 ;;
    --python) PYTHON="$2"; shift 2 ;;
    --cpu) DEVICE=cpu; shift ;;
    --models) MODELS="$2"; shift 2 ;;
    --precisions) PRECISIONS="$2"; shift 2 ;;
    --steps-mlp2) STEPS_MLP2="$2"; shift 2 ;;
    --steps-resnet18) STEPS_RESNET18="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --batch) BATCH="$2"; shift 2 ;;
    --run-timeout) RUN_TIMEOUT="$2"; shift 2 ;;
    --budget) BUDGET="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
case "$DEVICE" in
  cuda)
    : "${PYTHON:=python3}"          # the GPU machine's python3 has torch with CUDA
    : "${STEPS_MLP2:=500}" "${STEPS_RESNET18:=200}" "${WARMUP:=30}" ;;
  cpu)
    : "${PYTHON:=/usr/bin/python3}"   # Debian's: the one with torch here
    : "${STEPS_MLP2:=2}" "${STEPS_RESNET18:=2}" "${WARMUP:=1}" "${BATCH:=8}" ;;
  *) echo "GPU_VS_PYTORCH_DEVICE must be cuda or cpu, got '$DEVICE'" >&2; exit 2 ;;
esac
[[ -z "$OUT" ]] && OUT="$(mktemp -d /tmp/gpu_vs_pytorch.XXXXXX)"
mkdir -p "$OUT"
CSV="$OUT/gpu_vs_pytorch.csv"
TABLE="$OUT/gpu_vs_pytorch.txt"
START=$SECONDS
log() { echo "# $*" >&2; }

echo "model,precision,batch,steps,warmup,device,cnnflow_images_per_s,pytorch_images_per_s,ratio,cnnflow_status,pytorch_status" > "$CSV"

# Seconds a run may take: min(--run-timeout, what is left of --budget).
time_left() {
  local left=$(( BUDGET - (SECONDS - START) ))
  (( left > RUN_TIMEOUT )) && left=$RUN_TIMEOUT
  echo "$left"
}
# Why a run failed, from its exit status and log: timeout / not supported / failed.
failure() {  # rc log
  if [[ $1 -eq 124 || $1 -eq 137 ]]; then echo "timeout"
  elif grep -Eqi "unknown key 'precision'|precision.*not (yet )?(supported|implemented)|(bf16|fp16|f16|half).*not (yet )?(supported|implemented)" "$2"; then
    echo "not supported"
  else echo "failed"; fi
}

run_cnnflow() {  # model precision steps log -> images/s on stdout, status in CF_STATUS
  local model=$1 precision=$2 steps=$3 logf=$4 t
  local args=(bench "$ROOT/bench/configs/${model}_synthetic.yaml" --devices 1 --max-steps "$steps"
              --warmup "$WARMUP")
  [[ "$DEVICE" == cpu ]] && args+=(--set "graph.devices=[cpu:0]")
  [[ "$precision" != fp32 ]] && args+=(--set "graph.precision=$precision")
  [[ -n "$BATCH" ]] && args+=(--set "train.batch=$BATCH")
  t=$(time_left)
  if (( t < 5 )); then CF_STATUS="skipped (budget)"; return; fi
  echo "\$ $CNNFLOW ${args[*]}   (timeout ${t}s)" > "$logf"
  ( cd "$ROOT" && timeout -k 5 "$t" "$CNNFLOW" "${args[@]}" ) >> "$logf" 2>&1
  local rc=$?
  if [[ $rc -ne 0 ]]; then CF_STATUS=$(failure "$rc" "$logf"); return; fi
  # The row of the bench table: processes replicas steps batch images/s ...
  CF_IPS=$(awk 'NF >= 9 && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ { v = $5 } END { print v }' "$logf")
  if [[ -z "$CF_IPS" ]]; then CF_STATUS="failed (no images/s in the output)"; else CF_STATUS=ok; fi
}

run_pytorch() {  # model precision steps log
  local model=$1 precision=$2 steps=$3 logf=$4 t
  local args=("$ROOT/bench/pytorch_train.py" --model "$model" --precision "$precision"
              --device "$DEVICE" --source synthetic --feed host --steps "$steps"
              --warmup "$WARMUP" --threads "$(nproc)")
  [[ -n "$BATCH" ]] && args+=(--batch "$BATCH")
  t=$(time_left)
  if (( t < 5 )); then PT_STATUS="skipped (budget)"; return; fi
  echo "\$ $PYTHON ${args[*]}   (timeout ${t}s)" > "$logf"
  timeout -k 5 "$t" "$PYTHON" "${args[@]}" >> "$logf" 2>&1
  local rc=$?
  if [[ $rc -ne 0 ]]; then PT_STATUS=$(failure "$rc" "$logf"); return; fi
  PT_IPS=$(sed -n 's/^pytorch .* images_per_s=\([0-9.]*\).*/\1/p' "$logf" | tail -1)
  if [[ -z "$PT_IPS" ]]; then PT_STATUS="failed (no images_per_s line)"; else PT_STATUS=ok; fi
}

log "device $DEVICE, cnnflow $CNNFLOW, python $PYTHON, logs and CSV in $OUT, budget ${BUDGET}s"
[[ -x "$CNNFLOW" ]] || log "no cnnflow binary at $CNNFLOW: its rows will say failed"
ROWS=()
# Every model in fp32 first, then the half precisions: the figures that
# matter most come first if the budget runs out.
for precision in $PRECISIONS; do
  for model in $MODELS; do
    case "$model" in
      mlp2) steps=$STEPS_MLP2; batch=${BATCH:-64} ;;
      resnet18) steps=$STEPS_RESNET18; batch=${BATCH:-256} ;;
      *) log "unknown model $model (mlp2, resnet18)"; continue ;;
    esac
    CF_IPS=""; PT_IPS=""; CF_STATUS=""; PT_STATUS=""
    run_cnnflow "$model" "$precision" "$steps" "$OUT/$model-$precision-cnnflow.log"
    log "$model $precision cnnflow: ${CF_IPS:-$CF_STATUS}"
    [[ "$CF_STATUS" != ok ]] && tail -3 "$OUT/$model-$precision-cnnflow.log" 2>/dev/null | sed 's/^/#   /' >&2
    run_pytorch "$model" "$precision" "$steps" "$OUT/$model-$precision-pytorch.log"
    log "$model $precision pytorch: ${PT_IPS:-$PT_STATUS}"
    [[ "$PT_STATUS" != ok ]] && tail -3 "$OUT/$model-$precision-pytorch.log" 2>/dev/null | sed 's/^/#   /' >&2
    ratio=""
    [[ -n "$CF_IPS" && -n "$PT_IPS" ]] && ratio=$(awk -v c="$CF_IPS" -v p="$PT_IPS" 'BEGIN { printf "%.2f", c / p }')
    echo "$model,$precision,$batch,$steps,$WARMUP,$DEVICE,$CF_IPS,$PT_IPS,$ratio,$CF_STATUS,$PT_STATUS" >> "$CSV"
    ROWS+=("$model|$precision|$batch|${CF_IPS:-$CF_STATUS}|${PT_IPS:-$PT_STATUS}|${ratio:--}")
  done
done

{
  echo "gpu_vs_pytorch $(date -u +%Y-%m-%dT%H:%MZ) device=$DEVICE"
  if [[ "$DEVICE" == cuda ]]; then
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
  else
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores (smoke test)"
  fi
  "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>/dev/null || echo "torch: not importable by $PYTHON"
  echo "steps: mlp2 $STEPS_MLP2, resnet18 $STEPS_RESNET18 timed after $WARMUP warm-up; synthetic data, host batches copied each step"
  echo
  printf "%-9s %-9s %5s %16s %16s %16s\n" model precision batch "cnnflow img/s" "pytorch img/s" "cnnflow/pytorch"
  for r in "${ROWS[@]}"; do
    IFS='|' read -r m p b c t q <<< "$r"
    printf "%-9s %-9s %5s %16s %16s %16s\n" "$m" "$p" "$b" "$c" "$t" "$q"
  done
  echo "total time: $(( SECONDS - START )) s"
} > "$TABLE"
cat "$TABLE"
log "table: $TABLE, CSV: $CSV"
exit 0
