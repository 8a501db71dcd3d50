#!/usr/bin/env bash
# train_vs_pytorch.sh: cnnflow vs Debian's CPU PyTorch, training the same
# "two-layer CNN + FC" on Fashion-MNIST with 2 threads, side by side (issue 2).
#
# Runs, alternating, R times each:
#   cnnflow: build/cnnflow train configs/fashion_mnist.yaml --set train.epochs=1
#            --set train.max_steps=S --set threads=2 --set data.test=null --out TMP
#            -> images_per_s of TMP/metrics.csv
#   pytorch: /usr/bin/python3 bench/pytorch_train.py --threads 2 --steps S
#            --warmup W, in each of PyTorch's best settings (see bench/README.md):
#            the better median counts
# then prints a table: median images/s of each, cnnflow/pytorch, and the
# fraction of the machine's 2-thread FMA peak (fma_peak) each reaches.
#
# usage: bench/train_vs_pytorch.sh [--reps R] [--steps S] [--warmup W]
#          [--threads T] [--out FILE] [--cnnflow BIN] [--config YAML]
#          [--fma-peak BIN] [--pytorch-setting "K=V ...|ARGS" ...]
#          [--keep-openblas-env] [--with-eval]
# One run with the defaults takes ~1.5 minutes on a quiet 2-core machine, up to
# ~5 when the machine is busy.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPS=3
STEPS=500
WARMUP=20
THREADS=2
OUT=""
CNNFLOW="$ROOT/build/cnnflow"
CONFIG="$ROOT/configs/fashion_mnist.yaml"
FMA_PEAK=""
PYTHON=/usr/bin/python3           # Debian's interpreter: the one with torch
# PyTorch's best settings on this machine, "ENVIRONMENT|ARGUMENTS", found with
#   /usr/bin/python3 bench/pytorch_train.py --search --threads 2
# (bench/README.md, Results): OpenBLAS single-threaded, channels_last, and
# glibc malloc kept from mmap-ing (and page-faulting) every step's tensors.
# OpenMP's default (spinning) wait is the fastest on an idle machine;
# OMP_WAIT_POLICY=PASSIVE is, by far, when other processes share the 2 cores.
# Both run every round; the better median counts.
PT_MALLOC="MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456"
PT_SETTINGS=("OPENBLAS_NUM_THREADS=1 $PT_MALLOC|--channels-last"
             "OPENBLAS_NUM_THREADS=1 $PT_MALLOC OMP_WAIT_POLICY=PASSIVE|--channels-last")
PT_GIVEN=0
KEEP_OPENBLAS_ENV=0
WITH_EVAL=0

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --reps) REPS="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --cnnflow) CNNFLOW="$2"; shift 2 ;;
    --config) CONFIG="$2"; shift 2 ;;
    --fma-peak) FMA_PEAK="$2"; shift 2 ;;
    --pytorch-setting)
      [[ $PT_GIVEN -eq 0 ]] && PT_SETTINGS=()
      PT_GIVEN=1; PT_SETTINGS+=("$2"); shift 2 ;;
    --keep-openblas-env) KEEP_OPENBLAS_ENV=1; shift ;;
    --with-eval) WITH_EVAL=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

TMP="$(mktemp -d /tmp/train_vs_pytorch.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
log() { echo "# $*" >&2; }

# OpenBLAS 0.3.21 (Debian 12) does not know this CPU model and, with
# OPENBLAS_CORETYPE unset, runs its Prescott (SSE3) kernels: sgemm ~5x
# slower. Both sides link OpenBLAS, so both get the same core type: an
# existing OPENBLAS_CORETYPE is left as it is; an unset one becomes SkylakeX
# (AVX-512 kernels) unless --keep-openblas-env.
OB_NOTE="OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-unset} (from the environment)"
if [[ -z "${OPENBLAS_CORETYPE+x}" && $KEEP_OPENBLAS_ENV -eq 0 ]]; then
  export OPENBLAS_CORETYPE=SkylakeX
  OB_NOTE="OPENBLAS_CORETYPE=SkylakeX (set by this script for both sides; it was unset)"
fi

# --- the machine's FMA peak --------------------------------------------------
if [[ -z "$FMA_PEAK" ]]; then
  if [[ -x "$ROOT/build/bench/fma_peak" ]]; then
    FMA_PEAK="$ROOT/build/bench/fma_peak"
  else
    log "build/bench/fma_peak not built; compiling bench/fma_peak.cc into $TMP"
    # shellcheck disable=SC2046
    g++ -O3 -march=native -std=c++20 $(pkg-config --cflags openblas) \
      "$ROOT/bench/fma_peak.cc" -o "$TMP/fma_peak" $(pkg-config --libs openblas) -pthread
    FMA_PEAK="$TMP/fma_peak"
  fi
fi
log "fma_peak: $FMA_PEAK --threads $THREADS --reps 5 --no-sgemm"
"$FMA_PEAK" --threads "$THREADS" --reps 5 --no-sgemm > "$TMP/fma.txt"
cat "$TMP/fma.txt" >&2
field() { sed -n "s/.*[ ]$1=\([^ ]*\).*/\1/p"; }   # value of key=value on stdin
# The peak is a hardware ceiling that noise can only lower: take the best rep.
PEAK_ISA=avx512
PEAK=$(grep "isa=avx512 threads=$THREADS " "$TMP/fma.txt" | field gflops_best || true)
if [[ -z "$PEAK" ]]; then
  PEAK_ISA=avx2
  PEAK=$(grep "isa=avx2 threads=$THREADS " "$TMP/fma.txt" | field gflops_best)
fi

# --- FLOPs per training image ------------------------------------------------
# forward MACs: conv1 28*28*32*(1*3*3) + conv2 14*14*64*(32*3*3)
#               + fc1 3136*128 + fc2 128*10
# FLOPs per training image = forward MACs x 2 (mul+add) x 3 (forward, and a
# backward twice the forward: gradients of inputs and of weights). ReLU, pooling,
# loss, biases and the SGD update are left out (well under 1%).
MACS=$(( 28*28*32*1*9 + 14*14*64*32*9 + 3136*128 + 128*10 ))
FLOPS_PER_IMAGE=$(( MACS * 2 * 3 ))

# --- the runs ----------------------------------------------------------------
run_cnnflow() {
  local dir="$TMP/cnnflow.$1" extra=(--set data.test=null)
  [[ $WITH_EVAL -eq 1 ]] && extra=()
  mkdir -p "$dir"
  if ! /usr/bin/time -f "%e %U %S" -o "$dir/time" "$CNNFLOW" train "$CONFIG" \
      --set train.epochs=1 --set "train.max_steps=$STEPS" --set "threads=$THREADS" \
      "${extra[@]}" --out "$dir" > "$dir/log" 2>&1; then
    log "cnnflow failed (rep $1):"; tail -5 "$dir/log" >&2; return 1
  fi
  local col ips
  col=$(head -1 "$dir/metrics.csv" | tr ',' '\n' | grep -n -x images_per_s | cut -d: -f1)
  ips=$(sed -n 2p "$dir/metrics.csv" | cut -d, -f"$col")
  echo "$ips" >> "$TMP/cnnflow.ips"
  log "rep $1 cnnflow: $ips images/s (wall/user/sys s: $(cat "$dir/time"))"
}
run_pytorch() {  # rep setting-index
  local line setting="${PT_SETTINGS[$2]}"
  # shellcheck disable=SC2086
  line=$(env ${setting%%|*} "$PYTHON" "$ROOT/bench/pytorch_train.py" --threads "$THREADS" \
         --steps "$STEPS" --warmup "$WARMUP" ${setting#*|}) \
    || { log "pytorch failed (rep $1, setting $2)"; return 1; }
  echo "$line" | field images_per_s >> "$TMP/pytorch.$2.ips"
  log "rep $1 $line"
}
run_all_pytorch() {  # rep [reverse]
  local i n=${#PT_SETTINGS[@]}
  for ((i = 0; i < n; i++)); do run_pytorch "$1" $(( $2 ? n - 1 - i : i )); done
}

HAVE_CNNFLOW=1
if [[ ! -x "$CNNFLOW" ]]; then
  log "no cnnflow binary at $CNNFLOW: build it (cmake --build build); pytorch side only"
  HAVE_CNNFLOW=0
fi
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
for ((r = 1; r <= REPS; r++)); do
  # Alternate the order, so that no run always follows the same other one.
  if (( r % 2 )); then
    [[ $HAVE_CNNFLOW -eq 1 ]] && { run_cnnflow "$r" || HAVE_CNNFLOW=0; }
    run_all_pytorch "$r" 0
  else
    run_all_pytorch "$r" 1
    [[ $HAVE_CNNFLOW -eq 1 ]] && { run_cnnflow "$r" || HAVE_CNNFLOW=0; }
  fi
done
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print ""; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
runs() { tr '\n' ' ' < "$1" | sed 's/ $//'; }
PT_MED=""; PT_BEST=0
for ((i = 0; i < ${#PT_SETTINGS[@]}; i++)); do
  m=$(median < "$TMP/pytorch.$i.ips")
  if [[ -z "$PT_MED" ]] || awk -v a="$m" -v b="$PT_MED" 'BEGIN { exit !(a > b) }'; then
    PT_MED=$m; PT_BEST=$i
  fi
done
CF_MED=""
[[ -s "$TMP/cnnflow.ips" ]] && CF_MED=$(median < "$TMP/cnnflow.ips")

{
  echo "train_vs_pytorch $(date -u +%Y-%m-%dT%H:%MZ)  $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
  echo "model: two-layer CNN + FC ($(basename "$CONFIG")), batch 64, SGD momentum, threads=$THREADS"
  echo "steps per run: $STEPS (pytorch after $WARMUP warm-up steps; cnnflow's figure includes its start), reps: $REPS, alternating"
  echo "$OB_NOTE"
  echo "load average at start / end: $LOAD_START / $LOAD_END"
  echo "FLOPs per training image = 3 x 2 x forward MACs = 3 x 2 x $MACS = $FLOPS_PER_IMAGE"
  echo "  (forward MACs: conv1 28*28*32*9 + conv2 14*14*64*32*9 + fc1 3136*128 + fc2 128*10)"
  echo "FMA peak, $THREADS threads ($PEAK_ISA, best of 5): $PEAK GFLOP/s"
  echo
  printf "%-10s %14s %10s %13s  %s\n" "" "images/s (med)" "GFLOP/s" "% of FMA peak" "runs"
  row() {  # name median runs
    if [[ -z "$2" ]]; then printf "%-10s %14s %10s %13s  %s\n" "$1" "-" "-" "-" "not run"; return; fi
    awk -v n="$1" -v ips="$2" -v f="$FLOPS_PER_IMAGE" -v p="$PEAK" -v r="$3" 'BEGIN {
      g = ips * f / 1e9; printf "%-10s %14.1f %10.1f %12.1f%%  %s\n", n, ips, g, 100 * g / p, r }'
  }
  row cnnflow "$CF_MED" "$( [[ -s $TMP/cnnflow.ips ]] && runs "$TMP/cnnflow.ips")"
  for ((i = 0; i < ${#PT_SETTINGS[@]}; i++)); do
    row "pytorch[$i]" "$(median < "$TMP/pytorch.$i.ips")" "$(runs "$TMP/pytorch.$i.ips")"
  done
  for ((i = 0; i < ${#PT_SETTINGS[@]}; i++)); do
    s="${PT_SETTINGS[$i]}"
    echo "pytorch[$i]: ${s%%|*} ${s#*|}$( ((i == PT_BEST)) && echo "   <- best")"
  done
  if [[ -n "$CF_MED" ]]; then
    awk -v c="$CF_MED" -v p="$PT_MED" -v b="$PT_BEST" \
      'BEGIN { printf "cnnflow / pytorch (best, [%d]) = %.2f\n", b, c / p }'
  else
    echo "cnnflow / pytorch = - (cnnflow did not run)"
  fi
} > "$TMP/table.txt"
cat "$TMP/table.txt"
[[ -n "$OUT" ]] && cp "$TMP/table.txt" "$OUT" && log "table written to $OUT"
exit 0
