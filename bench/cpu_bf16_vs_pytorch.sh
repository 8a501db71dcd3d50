#!/usr/bin/env bash
# cpu_bf16_vs_pytorch.sh: bf16 on the CPU (graph.precision: bf16) against
# PyTorch's bf16 autocast, each beside its fp32, side by side (issue 32).
#
# ResNet-18 CIFAR at batch 64 on synthetic 3x32x32 data
# (bench/configs/resnet18_synthetic.yaml; bench/pytorch_train.py --model
# resnet18 --channels-last on tcmalloc where the system has it: PyTorch's best
# CPU setting, bench/torch_malloc.sh), T threads pinned to
# cores 0..T-1 (taskset), R rounds, the four runs in each round in an order
# reversed every other round. Prints the CPU, its bf16 features, a table of
# median images/s with the ratios cnnflow / PyTorch at the same precision
# and bf16 / fp32 of each, and writes every log and a CSV to --out.
# Where the CPU has no native bf16 cnnflow refuses bf16 (the row says so)
# and PyTorch's autocast is emulated: the bf16 targets are measured where
# the CPU has avx512_bf16 or AMX.
#
# usage: bench/cpu_bf16_vs_pytorch.sh [--cnnflow BIN] [--python PY] [--threads T]
#          [--reps R] [--steps S] [--warmup W] [--batch B] [--out DIR] [--run-timeout SEC]
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CNNFLOW="$ROOT/build/cnnflow"
PYTHON="$ROOT/.venv-torch/bin/python"
THREADS=2
REPS=3
STEPS=20
WARMUP=3
BATCH=64
OUT=""
RUN_TIMEOUT=120
usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cnnflow) CNNFLOW="$2"; shift 2 ;;
    --python) PYTHON="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --reps) REPS="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --batch) BATCH="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --run-timeout) RUN_TIMEOUT="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ -z "$OUT" ]] && OUT="$(mktemp -d /tmp/cpu_bf16_vs_pytorch.XXXXXX)"
mkdir -p "$OUT"
CSV="$OUT/cpu_bf16_vs_pytorch.csv"
cores="0-$((THREADS - 1))"
log() { echo "# $*" >&2; }

echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; threads $THREADS pinned to cores $cores"
echo "bf16 features: $(grep -o -w -E 'avx512_bf16|amx_bf16|amx_tile|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
read -r MALLOC PRELOAD < <("$ROOT/bench/torch_malloc.sh")
echo "pytorch: $PYTHON on $MALLOC${PRELOAD:+ ($PRELOAD)}"
echo "resnet18 (CIFAR) batch $BATCH, $STEPS steps timed after $WARMUP, $REPS rounds"
echo "runner,precision,rep,images_per_s,status" > "$CSV"

run_cnnflow() {  # precision rep
  local p=$1 log="$OUT/cnnflow.$1.$2.log" sets=()
  sets=(--set "threads=$THREADS" --set "train.batch=$BATCH" --set "graph.devices=[cpu:0]"
        --set "graph.precision=$p")
  if ! timeout -k 5 "$RUN_TIMEOUT" taskset -c "$cores" "$CNNFLOW" bench \
      "$ROOT/bench/configs/resnet18_synthetic.yaml" --devices 1 --warmup "$WARMUP" \
      --max-steps "$STEPS" --csv "$OUT/cnnflow.$p.$2.csv" "${sets[@]}" > "$log" 2>&1; then
    local why=failed
    grep -q "no native bf16\|neither avx512_bf16" "$log" && why="refused: no native bf16"
    echo "cnnflow,$p,$2,,$why" >> "$CSV"
    log "cnnflow $p rep $2: $why ($(tail -1 "$log"))"
    return
  fi
  local col ips
  col=$(head -1 "$OUT/cnnflow.$p.$2.csv" | tr ',' '\n' | grep -n -x images_per_s | cut -d: -f1)
  ips=$(sed -n 2p "$OUT/cnnflow.$p.$2.csv" | cut -d, -f"$col")
  echo "cnnflow,$p,$2,$ips,ok" >> "$CSV"
  log "cnnflow $p rep $2: $ips images/s"
}
run_pytorch() {  # precision rep
  local p=$1 log="$OUT/pytorch.$1.$2.log" ips
  if ! env ${PRELOAD:+"LD_PRELOAD=$PRELOAD"} timeout -k 5 "$RUN_TIMEOUT" taskset -c "$cores" \
      "$PYTHON" "$ROOT/bench/pytorch_train.py" \
      --model resnet18 --device cpu --precision "$p" --source synthetic --channels-last \
      --threads "$THREADS" --batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP" > "$log" 2>&1; then
    echo "pytorch,$p,$2,,failed" >> "$CSV"
    log "pytorch $p rep $2: failed ($(tail -1 "$log"))"
    return
  fi
  ips=$(grep -o 'images_per_s=[0-9.]*' "$log" | tail -1 | cut -d= -f2)
  echo "pytorch,$p,$2,$ips,ok" >> "$CSV"
  log "pytorch $p rep $2: $ips images/s"
}

runs=("cnnflow fp32" "pytorch fp32" "cnnflow bf16" "pytorch bf16")
for ((r = 1; r <= REPS; r++)); do
  order=("${runs[@]}")
  if ((r % 2 == 0)); then order=("${runs[3]}" "${runs[2]}" "${runs[1]}" "${runs[0]}"); fi
  for run in "${order[@]}"; do
    set -- $run
    "run_$1" "$2" "$r"
  done
done

median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print ""; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
med() { awk -F, -v r="$1" -v p="$2" '$1 == r && $2 == p && $5 == "ok" {print $4}' "$CSV" | median; }
ratio() { [[ -n "$1" && -n "$2" ]] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }' || echo "-"; }
cf=$(med cnnflow fp32); cb=$(med cnnflow bf16); pf=$(med pytorch fp32); pb=$(med pytorch bf16)
refused=$(awk -F, '$1 == "cnnflow" && $2 == "bf16" && $5 ~ /refused/' "$CSV" | head -1)
printf '%-10s %14s %14s %16s\n' precision "cnnflow img/s" "pytorch img/s" "cnnflow/pytorch"
printf '%-10s %14s %14s %16s\n' fp32 "${cf:--}" "${pf:--}" "$(ratio "$cf" "$pf")"
printf '%-10s %14s %14s %16s\n' bf16 "${cb:-${refused:+refused}}" "${pb:--}" "$(ratio "$cb" "$pb")"
printf 'bf16/fp32: cnnflow %s, pytorch %s\n' "$(ratio "$cb" "$cf")" "$(ratio "$pb" "$pf")"
echo "logs and CSV: $OUT"
