#!/usr/bin/env bash
# gpu_resnet_best.sh: one ResNet in one precision on one GPU, cnnflow against
# PyTorch at its best (issue 54). One table per run:
#   cnnflow nchw           CNNFLOW bench CONFIG --devices 1 [--set graph.precision=bf16]
#   cnnflow channels_last  the same with --set graph.channels_last=true
#   cnnflow cuda_graph     channels_last with graph.cuda_graph=true (each
#                          step's forward and backward replayed as CUDA graphs)
#   cnnflow unfused        channels_last with graph.fuse_activations=false,
#                          once (the fusion's share; not a candidate
#                          for cnnflow's best)
#   pytorch eager          bench/pytorch_train.py --channels-last --tf32
#                          (cudnn.benchmark; bf16: torch.autocast) --feed host
#   pytorch compiled       the same with --compile max-autotune, tried in a
#                          phase of its own within --compile-timeout; where it
#                          does not finish, --compile default (the table says
#                          which); compiled once, its --rounds rounds in one
#                          process, the compile time reported apart
# Models (library models, synthetic data, host batches through pinned memory
# on both sides): resnet18 (the CIFAR ResNet-18 of
# bench/configs/resnet18_synthetic.yaml, batch 256) and resnet50 (224 x 224,
# bench/configs/resnet50_synthetic.yaml, batch 128). The four eager sides
# run --rounds times, alternating; each figure is the median, and the ratios
# are cnnflow's best side over each PyTorch side (> 1: cnnflow faster).
# Writes the table, a CSV and every log to --out.
#
# usage: bench/gpu_resnet_best.sh --model resnet18|resnet50 --precision fp32|bf16
#          [--out DIR] [--cnnflow BIN] [--python PY] [--rounds 3] [--steps S]
#          [--warmup W] [--run-timeout SEC] [--compile-timeout SEC] [--no-compile]
#          [--budget SEC] [--cpu]
# --budget (default 400 s): the compiled side gets what the eager rounds left
#   of it (a compile that does not fit says so in the table).
# --cpu: a smoke test without a GPU (cpu:0 and --device cpu, batch 8, 2
#   steps, no compile). On a GPU the defaults (steps 100 for resnet18, 50 for
#   resnet50) keep a run within about 8 minutes.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL=""
PRECISION=""
OUT=""
CNNFLOW="$ROOT/build/cnnflow"
PYTHON=python3
ROUNDS=3
STEPS=""
WARMUP=""
RUN_TIMEOUT=60
COMPILE_TIMEOUT=180
COMPILE=1
BUDGET=400
DEVICE=cuda
BATCH=""

usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --precision) PRECISION="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --cnnflow) CNNFLOW="$2"; shift 2 ;;
    --python) PYTHON="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --run-timeout) RUN_TIMEOUT="$2"; shift 2 ;;
    --compile-timeout) COMPILE_TIMEOUT="$2"; shift 2 ;;
    --no-compile) COMPILE=0; shift ;;
    --budget) BUDGET="$2"; shift 2 ;;
    --cpu) DEVICE=cpu; COMPILE=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
case "$MODEL" in
  resnet18) config=bench/configs/resnet18_synthetic.yaml; batch=256; : "${STEPS:=100}" ;;
  resnet50) config=bench/configs/resnet50_synthetic.yaml; batch=128; : "${STEPS:=50}" ;;
  *) echo "--model must be resnet18 or resnet50" >&2; exit 2 ;;
esac
case "$PRECISION" in
  fp32|bf16) ;;
  *) echo "--precision must be fp32 or bf16" >&2; exit 2 ;;
esac
: "${WARMUP:=15}"
if [[ "$DEVICE" == cpu ]]; then
  batch=8 STEPS=2 WARMUP=1
fi
[[ -z "$OUT" ]] && OUT="$(mktemp -d /tmp/gpu_resnet_best.XXXXXX)"
mkdir -p "$OUT"
log() { echo "# $*" >&2; }

# cnnflow: images/s of one run (its bench table's 5th column), or "" on failure.
cnnflow_run() {  # layout round
  local layout=$1 logf="$OUT/cnnflow-$1-$2.log"
  local args=(bench "$ROOT/$config" --devices 1 --max-steps "$STEPS" --warmup "$WARMUP"
              --set "train.batch=$batch" --set "graph.devices=[$DEVICE:0]")
  [[ "$PRECISION" != fp32 ]] && args+=(--set "graph.precision=$PRECISION")
  [[ "$layout" == nchw ]] && args+=(--set graph.channels_last=false)
  [[ "$layout" != nchw ]] && args+=(--set graph.channels_last=true)
  [[ "$layout" == unfused ]] && args+=(--set graph.fuse_activations=false)
  [[ "$layout" == cuda_graph ]] && args+=(--set graph.cuda_graph=true)
  echo "\$ $CNNFLOW ${args[*]}" > "$logf"
  (cd "$ROOT" && timeout -k 5 "$RUN_TIMEOUT" "$CNNFLOW" "${args[@]}") >> "$logf" 2>&1 || return 0
  awk 'NF >= 9 && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ { v = $5 } END { print v }' "$logf"
}

# PyTorch: images/s (the median of its rounds), or "" on failure.
pytorch_run() {  # name timeout extra-args...
  local name=$1 t=$2 logf="$OUT/pytorch-$1.log"
  shift 2
  local args=("$ROOT/bench/pytorch_train.py" --model "$MODEL" --precision "$PRECISION"
              --device "$DEVICE" --source synthetic --feed host --batch "$batch"
              --steps "$STEPS" --warmup "$WARMUP" --threads "$(nproc)" --channels-last "$@")
  [[ "$DEVICE" == cuda ]] && args+=(--tf32)
  echo "\$ $PYTHON ${args[*]}" > "$logf"
  timeout -k 5 "$t" "$PYTHON" "${args[@]}" >> "$logf" 2>&1 || return 0
  sed -n 's/^pytorch model=.* images_per_s=\([0-9.]*\).*/\1/p' "$logf" | tail -1
}

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }

log "model $MODEL, $PRECISION, batch $batch, $STEPS steps x $ROUNDS rounds, device $DEVICE, logs in $OUT"
nchw=() cl=() graphs=() eager=()
for r in $(seq 1 "$ROUNDS"); do
  nchw+=("$(cnnflow_run nchw "$r")")
  cl+=("$(cnnflow_run channels_last "$r")")
  graphs+=("$(cnnflow_run cuda_graph "$r")")
  eager+=("$(pytorch_run "eager-$r" "$RUN_TIMEOUT")")
  log "round $r: cnnflow nchw ${nchw[-1]:-failed}, channels_last ${cl[-1]:-failed}, cuda_graph ${graphs[-1]:-failed}, pytorch eager ${eager[-1]:-failed}"
done
unfused=$(cnnflow_run unfused 1)
log "cnnflow channels_last unfused: ${unfused:-failed}"
m_nchw=$(echo "${nchw[*]}" | median)
m_cl=$(echo "${cl[*]}" | median)
m_graphs=$(echo "${graphs[*]}" | median)
m_eager=$(echo "${eager[*]}" | median)

compiled="" compile_mode="" compile_s=""
if [[ "$COMPILE" == 1 ]]; then
  for mode in max-autotune default; do
    t=$(( COMPILE_TIMEOUT + RUN_TIMEOUT * ROUNDS ))
    left=$(( BUDGET - SECONDS ))
    (( left < t )) && t=$left
    if (( t < 30 )); then log "no time left for torch.compile mode=$mode"; break; fi
    compiled=$(pytorch_run "compiled-$mode" "$t" --compile "$mode" --rounds "$ROUNDS")
    if [[ -n "$compiled" ]]; then
      compile_mode=$mode
      compile_s=$(sed -n 's/^pytorch model=.* compile_s=\([0-9.]*\).*/\1/p' "$OUT/pytorch-compiled-$mode.log" | tail -1)
      break
    fi
    log "torch.compile mode=$mode did not finish: $(tail -1 "$OUT/pytorch-compiled-$mode.log")"
  done
fi

best=$(printf '%s\n' "${m_nchw:-0}" "${m_cl:-0}" "${m_graphs:-0}" | sort -g | tail -1)
ratio() { [[ -n "$1" && "$best" != 0 ]] && awk -v c="$best" -v p="$1" 'BEGIN { printf "%.2f", c / p }' || echo "-"; }
{
  echo "gpu_resnet_best $(date -u +%Y-%m-%dT%H:%MZ) model=$MODEL precision=$PRECISION batch=$batch steps=$STEPS rounds=$ROUNDS"
  if [[ "$DEVICE" == cuda ]]; then
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
  else
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') (smoke test)"
  fi
  printf "%-34s %12s %10s  %s\n" side "images/s" "cnnflow/x" "rounds"
  printf "%-34s %12s %10s  %s\n" "cnnflow nchw" "${m_nchw:-failed}" "$(ratio "$m_nchw")" "${nchw[*]}"
  printf "%-34s %12s %10s  %s\n" "cnnflow channels_last" "${m_cl:-failed}" "$(ratio "$m_cl")" "${cl[*]}"
  printf "%-34s %12s %10s  %s\n" "cnnflow channels_last cuda_graph" "${m_graphs:-failed}" "$(ratio "$m_graphs")" "${graphs[*]}"
  printf "%-34s %12s %10s  %s\n" "cnnflow channels_last unfused" "${unfused:-failed}" "$(ratio "$unfused")" "once"
  printf "%-34s %12s %10s  %s\n" "pytorch eager (cl, best)" "${m_eager:-failed}" "$(ratio "$m_eager")" "${eager[*]}"
  if [[ "$COMPILE" == 1 ]]; then
    printf "%-34s %12s %10s  %s\n" "pytorch compiled (${compile_mode:-failed})" "${compiled:-failed}" \
      "$(ratio "$compiled")" "compile ${compile_s:--} s, once"
  fi
} | tee "$OUT/table.txt"
{
  echo "model,precision,batch,steps,rounds,side,images_per_s,ratio_cnnflow_best"
  echo "$MODEL,$PRECISION,$batch,$STEPS,$ROUNDS,cnnflow_nchw,$m_nchw,$(ratio "$m_nchw")"
  echo "$MODEL,$PRECISION,$batch,$STEPS,$ROUNDS,cnnflow_channels_last,$m_cl,$(ratio "$m_cl")"
  echo "$MODEL,$PRECISION,$batch,$STEPS,$ROUNDS,cnnflow_channels_last_cuda_graph,$m_graphs,$(ratio "$m_graphs")"
  echo "$MODEL,$PRECISION,$batch,$STEPS,1,cnnflow_channels_last_unfused,$unfused,$(ratio "$unfused")"
  echo "$MODEL,$PRECISION,$batch,$STEPS,$ROUNDS,pytorch_eager_cl,$m_eager,$(ratio "$m_eager")"
  [[ "$COMPILE" == 1 ]] && echo "$MODEL,$PRECISION,$batch,$STEPS,$ROUNDS,pytorch_compiled_${compile_mode:-failed},$compiled,$(ratio "$compiled")"
} > "$OUT/table.csv"
[[ -n "$m_nchw$m_cl$m_graphs" ]]
