#!/usr/bin/env bash
# train_vs_pytorch.sh: cnnflow vs PyTorch 2.x (the PyPI wheel, in a venv) and
# Debian's PyTorch 1.13, training the same models on the CPU with the same
# threads, batches and optimizers, side by side (issues 2 and 11).
#
# Models (--model, comma-separated or "all"; default a):
#   a         configs/fashion_mnist.yaml        pytorch_train.py --model mlp2  batch 64, Fashion-MNIST
#   b         configs/fashion_mnist_cnn3.yaml   pytorch_train.py --model cnn3  batch 64, Fashion-MNIST
#   resnet18  bench/configs/resnet18_synthetic.yaml on cpu:0, --model resnet18, batch 64, synthetic 3x32x32
#   m5        configs/spoken_digits.yaml (data.train: synthetic [1, 8000]), --model m5, batch 32
# and the model library's networks at 224x224 (issue 29), 1000 classes,
# synthetic 3x224x224, batch 16, SGD momentum 0.9, fp32; PyTorch's side is
# torchvision.models.<name>(num_classes=1000) (needs torchvision: only a peer
# whose python has it runs them, i.e. torch 2.x of the venv, not Debian's):
#   resnet50         bench/configs/resnet50_synthetic.yaml         (model: {library: resnet50})
#   mobilenet_v2     bench/configs/mobilenet_v2_synthetic.yaml     dropout 0.2 (train mode)
#   efficientnet_b0  bench/configs/efficientnet_b0_synthetic.yaml  dropout 0.2, stochastic depth 0.2
# ("all": a, b, resnet18, m5; "imagenet": resnet50, mobilenet_v2, efficientnet_b0)
# For each model, R rounds, each running every runner once (the order
# reversed every other round):
#   cnnflow: CNNFLOW bench CONFIG --devices 1 --warmup W --max-steps S
#            --set threads=T --set train.batch=B --set graph.devices=[cpu:0] ...
#   pytorch: PY bench/pytorch_train.py --model M --threads T --batch B
#            --warmup W --steps S, in each of its best settings (the better
#            median counts), for both PyTorch versions
# then prints a table: per model and runner the median images/s, GFLOP/s,
# % of the T-thread FMA peak (bench/fma_peak, its ISA), FLOPs per image, the
# median peak RSS (the runner process's max resident set, /usr/bin/time %M),
# and cnnflow / that runner.
#
# usage: bench/train_vs_pytorch.sh [--model a,b,resnet18,m5,resnet50,mobilenet_v2,
#          efficientnet_b0|all|imagenet] [--reps R]
#          [--steps S] [--warmup W] [--threads T] [--out FILE] [--csv FILE]
#          [--cnnflow BIN] [--config YAML] [--fma-peak BIN]
#          [--peers "torch2 debian"] [--venv DIR] [--no-install]
#          [--pytorch-setting "K=V ...|ARGS" ...] [--keep-openblas-env]
# --steps/--warmup apply to every model selected (defaults: a 500/20,
# b 300/20, resnet18 20/3, m5 200/10, resnet50 10/2, mobilenet_v2 and
# efficientnet_b0 20/3); --config replaces the config of the
# one model selected. The torch 2.x venv (default .venv-torch, git-ignored) is
# made by bench/torch_venv.sh --install when missing (never when $CI is set;
# --no-install skips that peer instead). Duration on a quiet 2-core machine,
# 3 reps: a ~4 min, b ~4 min, resnet18 ~15 min, m5 ~4 min; the imagenet
# models (cnnflow + 3 torch 2.x settings, 3 reps: 12 runs each) not timed
# yet: from a 1-step smoke test (resnet50 ~7-11 s per step of 16 images on
# a busy 2-core machine) resnet50 ~20-25 min, the two others less. The full
# issue-29 table:
#   bench/train_vs_pytorch.sh --model imagenet --peers torch2 --out FILE --csv FILE
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODELS_ARG=a
REPS=3
STEPS=""
WARMUP=""
THREADS=2
OUT=""
CSV=""
CNNFLOW="$ROOT/build/cnnflow"
CONFIG=""
FMA_PEAK=""
PEERS="torch2 debian"
VENV="$ROOT/.venv-torch"
INSTALL=1
DEBIAN_PYTHON=/usr/bin/python3   # Debian's interpreter: torch 1.13
# PyTorch's best settings, "ENVIRONMENT|ARGUMENTS", found with
#   PY bench/pytorch_train.py --search --threads 2
# (bench/README.md, Results): OpenBLAS single-threaded, channels_last (4D
# models), and glibc malloc kept from mmap-ing (and page-faulting) every
# step's tensors. OpenMP's default (spinning) wait is the fastest on an idle
# machine; OMP_WAIT_POLICY=PASSIVE is, by far, when other processes share the
# cores. torch 2.x also runs with glibc's default malloc settings, and both
# on tcmalloc where the system has it (bench/torch_malloc.sh: glibc cannot
# keep blocks over 32 MB off mmap). Every setting runs every round; the best
# median counts, per version and model.
PT_MALLOC="MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456"
PT_SETTINGS_DEBIAN=("OPENBLAS_NUM_THREADS=1 $PT_MALLOC|--channels-last"
                    "OPENBLAS_NUM_THREADS=1 $PT_MALLOC OMP_WAIT_POLICY=PASSIVE|--channels-last")
read -r _ PT_TCMALLOC < <("$ROOT/bench/torch_malloc.sh")
if [[ -n "$PT_TCMALLOC" ]]; then PT_SETTINGS_DEBIAN+=("OPENBLAS_NUM_THREADS=1 LD_PRELOAD=$PT_TCMALLOC|--channels-last"); fi
PT_SETTINGS_TORCH2=("${PT_SETTINGS_DEBIAN[@]}"
                    "OPENBLAS_NUM_THREADS=1|--channels-last")
PT_GIVEN=()
KEEP_OPENBLAS_ENV=0

usage() { sed -n '2,48p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model|--models) MODELS_ARG="$2"; shift 2 ;;
    --reps) REPS="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --csv) CSV="$2"; shift 2 ;;
    --cnnflow) CNNFLOW="$2"; shift 2 ;;
    --config) CONFIG="$2"; shift 2 ;;
    --fma-peak) FMA_PEAK="$2"; shift 2 ;;
    --peers) PEERS="$2"; shift 2 ;;
    --venv) VENV="$2"; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --pytorch-setting) PT_GIVEN+=("$2"); shift 2 ;;
    --keep-openblas-env) KEEP_OPENBLAS_ENV=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
if [[ ${#PT_GIVEN[@]} -gt 0 ]]; then
  PT_SETTINGS_DEBIAN=("${PT_GIVEN[@]}"); PT_SETTINGS_TORCH2=("${PT_GIVEN[@]}")
fi

TMP="$(mktemp -d /tmp/train_vs_pytorch.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
log() { echo "# $*" >&2; }
field() { sed -n "s/.*[ ]$1=\([^ ]*\).*/\1/p"; }   # value of key=value on stdin

# --- the models ----------------------------------------------------------------
# Forward MACs of the conv and linear layers (output positions x output
# channels x input channels x kernel); FIRST: those of the first layer, whose
# input gradient neither side computes.
declare -A CONF PTM BATCH DSTEPS DWARM SETS MACS FIRST MACS_HOW NAME NEEDS_TV
CONF[a]=configs/fashion_mnist.yaml; PTM[a]=mlp2; BATCH[a]=64; DSTEPS[a]=500; DWARM[a]=20
NAME[a]="model A, two-layer CNN + FC, Fashion-MNIST 1x28x28"
MACS[a]=$(( 28*28*32*1*9 + 14*14*64*32*9 + 3136*128 + 128*10 )); FIRST[a]=$(( 28*28*32*9 ))
MACS_HOW[a]="conv1 28*28*32*9 + conv2 14*14*64*32*9 + fc1 3136*128 + fc2 128*10"
CONF[b]=configs/fashion_mnist_cnn3.yaml; PTM[b]=cnn3; BATCH[b]=64; DSTEPS[b]=300; DWARM[b]=20
NAME[b]="model B, three-layer CNN + FC, Fashion-MNIST 1x28x28"
MACS[b]=$(( 28*28*32*9 + 14*14*64*32*9 + 7*7*128*64*9 + 1152*128 + 128*10 )); FIRST[b]=$(( 28*28*32*9 ))
MACS_HOW[b]="conv1 28*28*32*9 + conv2 14*14*64*32*9 + conv3 7*7*128*64*9 + fc1 1152*128 + fc2 128*10"
CONF[resnet18]=bench/configs/resnet18_synthetic.yaml; PTM[resnet18]=resnet18; BATCH[resnet18]=64
DSTEPS[resnet18]=20; DWARM[resnet18]=3
NAME[resnet18]="CIFAR ResNet-18, synthetic 3x32x32"
# stem; stage 1: 4 convs 64->64 at 32x32; stages 2-4 (C = 128, 256, 512 at
# S = 16, 8, 4): a stride-2 conv C/2->C, 3 convs C->C, a 1x1 stride-2
# shortcut C/2->C; fc 512->10.
r18=$(( 32*32*64*3*9 + 4*32*32*64*64*9 ))
for cs in "128 16" "256 8" "512 4"; do
  read -r c s <<<"$cs"
  r18=$(( r18 + s*s*c*(c/2)*9 + 3*s*s*c*c*9 + s*s*c*(c/2) ))
done
MACS[resnet18]=$(( r18 + 512*10 )); FIRST[resnet18]=$(( 32*32*64*3*9 ))
MACS_HOW[resnet18]="stem 32*32*64*3*9 + 4 x 32*32*64*64*9 + per stage (C,S) in (128,16) (256,8) (512,4): S*S*C*(C/2)*9 + 3 x S*S*C*C*9 + 1x1 S*S*C*(C/2); + fc 512*10"
CONF[m5]=configs/spoken_digits.yaml; PTM[m5]=m5; BATCH[m5]=32; DSTEPS[m5]=200; DWARM[m5]=10
NAME[m5]="spoken-digit M5 1D CNN, synthetic [1, 8000] (FSDD's shape)"
SETS[m5]="data.train={source: synthetic, shape: [1, 8000], classes: 10, size: 1048576, seed: 1}"
MACS[m5]=$(( 1981*32*1*80 + 495*32*32*3 + 123*64*32*3 + 30*64*64*3 + 64*10 )); FIRST[m5]=$(( 1981*32*80 ))
MACS_HOW[m5]="conv1 1981*32*80 + conv2 495*32*32*3 + conv3 123*64*32*3 + conv4 30*64*64*3 + fc 64*10"

# The model library's networks at 224x224 (issue 29): torchvision's, 1000
# classes, batch 16. Their MACs come from their block lists below (a
# depthwise conv: output positions x channels x kernel); torchvision's
# modules with forward hooks count the same: 4,089,184,256 / 300,774,272 /
# 385,814,752.
for m in resnet50 mobilenet_v2 efficientnet_b0; do
  CONF[$m]=bench/configs/${m}_synthetic.yaml; PTM[$m]=$m; BATCH[$m]=16; NEEDS_TV[$m]=1
done
DSTEPS[resnet50]=10; DWARM[resnet50]=2
DSTEPS[mobilenet_v2]=20; DWARM[mobilenet_v2]=3
DSTEPS[efficientnet_b0]=20; DWARM[efficientnet_b0]=3
NAME[resnet50]="torchvision ResNet-50 (v1.5), synthetic 3x224x224, 1000 classes"
NAME[mobilenet_v2]="torchvision MobileNetV2, dropout 0.2, synthetic 3x224x224, 1000 classes"
NAME[efficientnet_b0]="torchvision EfficientNet-B0, dropout 0.2, stochastic depth 0.2, synthetic 3x224x224, 1000 classes"
# ResNet-50: per stage (planes P, blocks N, input C at size SI, output size S):
# 1x1 C->P at SI (then 4P->P at S), 3x3 P->P at S (stride on it), 1x1 P->4P,
# and the first block's 1x1 shortcut C->4P at S.
r50=$(( 112*112*64*3*49 ))
for st in "64 3 64 56 56" "128 4 256 56 28" "256 6 512 28 14" "512 3 1024 14 7"; do
  read -r p n c si s <<<"$st"
  r50=$(( r50 + si*si*p*c + (n-1)*s*s*p*4*p + n*(s*s*p*p*9 + s*s*4*p*p) + s*s*4*p*c ))
done
MACS[resnet50]=$(( r50 + 2048*1000 )); FIRST[resnet50]=$(( 112*112*64*3*49 ))
MACS_HOW[resnet50]="stem 112*112*64*3*49 + per stage (P,N,C,SI,S) in (64,3,64,56,56) (128,4,256,56,28) (256,6,512,28,14) (512,3,1024,14,7): SI*SI*P*C + (N-1) x S*S*P*4P + N x (S*S*P*P*9 + S*S*4P*P) + shortcut S*S*4P*C; + fc 2048*1000"
# Inverted residual blocks (MobileNetV2, EfficientNet's MBConv): expand
# E = in x t (1x1 at the input size, left out at t = 1), depthwise k x k at
# stride s, [squeeze-excitation: 2 x E x SQ at 1x1], project E -> out.
# ir_macs SIZE IN "t out n s k sq-div" ... -> MACs of the stages (sq-div 0:
# no squeeze-excitation; else its squeeze width is max(1, in / sq-div)).
ir_macs() {
  local size=$1 in=$2 st t c n s k sq i e so total=0; shift 2
  for st in "$@"; do
    read -r t c n s k sq <<<"$st"
    for ((i = 0; i < n; i++)); do
      e=$(( in * t )); so=$(( i == 0 ? size / s : size ))
      (( t != 1 )) && total=$(( total + size*size*in*e ))
      total=$(( total + so*so*e*k*k + so*so*e*c ))
      (( sq > 0 )) && total=$(( total + 2*e*(in/sq > 1 ? in/sq : 1) ))
      in=$c; size=$so
    done
  done
  echo "$total"
}
# MobileNetV2: stem 3->32 s2; (t, c, n, s) of torchvision, k 3, no SE; 1x1 320->1280; fc 1280->1000.
MACS[mobilenet_v2]=$(( 112*112*32*3*9 + $(ir_macs 112 32 "1 16 1 1 3 0" "6 24 2 2 3 0" "6 32 3 2 3 0"   "6 64 4 2 3 0" "6 96 3 1 3 0" "6 160 3 2 3 0" "6 320 1 1 3 0") + 7*7*320*1280 + 1280*1000 ))
FIRST[mobilenet_v2]=$(( 112*112*32*3*9 ))
MACS_HOW[mobilenet_v2]="stem 112*112*32*3*9 + inverted residuals (t,c,n,s) (1,16,1,1) (6,24,2,2) (6,32,3,2) (6,64,4,2) (6,96,3,1) (6,160,3,2) (6,320,1,1): [1x1 S*S*in*E] + depthwise So*So*E*9 + 1x1 So*So*E*c, E = in*t; + 7*7*320*1280 + fc 1280*1000"
# EfficientNet-B0: stem 3->32 s2; MBConv (t, c, n, s, k), SE squeeze in/4; 1x1 320->1280; fc 1280->1000.
MACS[efficientnet_b0]=$(( 112*112*32*3*9 + $(ir_macs 112 32 "1 16 1 1 3 4" "6 24 2 2 3 4" "6 40 2 2 5 4"   "6 80 3 2 3 4" "6 112 3 1 5 4" "6 192 4 2 5 4" "6 320 1 1 3 4") + 7*7*320*1280 + 1280*1000 ))
FIRST[efficientnet_b0]=$(( 112*112*32*3*9 ))
MACS_HOW[efficientnet_b0]="stem 112*112*32*3*9 + MBConv (t,c,n,s,k) (1,16,1,1,3) (6,24,2,2,3) (6,40,2,2,5) (6,80,3,2,3) (6,112,3,1,5) (6,192,4,2,5) (6,320,1,1,3): [1x1 S*S*in*E] + depthwise So*So*E*k*k + SE 2*E*(in/4) + 1x1 So*So*E*c, E = in*t; + 7*7*320*1280 + fc 1280*1000"

MODELS=()
IFS=', ' read -r -a req <<<"$MODELS_ARG"
for m in "${req[@]}"; do
  case "$m" in
    all) MODELS+=(a b resnet18 m5) ;;
    imagenet|library) MODELS+=(resnet50 mobilenet_v2 efficientnet_b0) ;;
    a|A|mlp2) MODELS+=(a) ;;
    b|B|cnn3) MODELS+=(b) ;;
    resnet18|r18) MODELS+=(resnet18) ;;
    m5|spoken_digits) MODELS+=(m5) ;;
    resnet50|r50) MODELS+=(resnet50) ;;
    mobilenet_v2|mbv2) MODELS+=(mobilenet_v2) ;;
    efficientnet_b0|effb0) MODELS+=(efficientnet_b0) ;;
    "") ;;
    *) echo "unknown model '$m' (a, b, resnet18, m5, resnet50, mobilenet_v2, efficientnet_b0, all, imagenet)" >&2; exit 2 ;;
  esac
done
[[ ${#MODELS[@]} -gt 0 ]] || { echo "no model selected" >&2; exit 2; }
if [[ -n "$CONFIG" ]]; then
  [[ ${#MODELS[@]} -eq 1 ]] || { echo "--config needs exactly one --model" >&2; exit 2; }
  CONF[${MODELS[0]}]="$CONFIG"
fi

# --- OpenBLAS core type ----------------------------------------------------------
# OpenBLAS 0.3.21 (Debian 12) does not know some CPU models (the Xeon of
# issue 2) and, with OPENBLAS_CORETYPE unset, runs its Prescott (SSE3)
# kernels there: sgemm ~5x slower. cnnflow and torch 1.13 link it (the PyPI
# torch uses MKL), so both get the same core type, chosen from the CPU's
# features: avx512f -> SkylakeX, avx2 -> Haswell, else left unset (never
# AVX-512 kernels on an AVX2-only CPU). An existing OPENBLAS_CORETYPE, or
# --keep-openblas-env, is left as it is.
CPU_FLAGS=" $(sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo | head -1) "
has_flag() { [[ "$CPU_FLAGS" == *" $1 "* ]]; }
SIMD=""
for f in avx2 fma avx512f avx512_bf16 amx_tile amx_bf16; do has_flag "$f" && SIMD+="${SIMD:+,}$f"; done
OB_NOTE="OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-unset} (from the environment)"
if [[ -z "${OPENBLAS_CORETYPE+x}" && $KEEP_OPENBLAS_ENV -eq 0 ]]; then
  core=""
  if has_flag avx512f; then core=SkylakeX; elif has_flag avx2; then core=Haswell; fi
  if [[ -n "$core" ]]; then
    export OPENBLAS_CORETYPE=$core
    OB_NOTE="OPENBLAS_CORETYPE=$core (set by this script for both sides from the CPU flags ${SIMD:-none}; it was unset)"
  else
    OB_NOTE="OPENBLAS_CORETYPE unset (no avx2/avx512f: OpenBLAS detects the core itself)"
  fi
fi
log "$OB_NOTE"

# --- the peers -----------------------------------------------------------------
declare -A PY PYVER HAS_TV
RUNNERS_PT=()
for peer in $PEERS; do
  case "$peer" in
    torch2)
      args=(--venv "$VENV"); [[ $INSTALL -eq 1 ]] && args+=(--install)
      if py=$("$ROOT/bench/torch_venv.sh" "${args[@]}"); then PY[torch2]=$py
      else log "no PyTorch 2.x (bench/torch_venv.sh): that peer is skipped"; continue; fi ;;
    debian) PY[debian]=$DEBIAN_PYTHON ;;
    *) echo "unknown peer '$peer' (torch2, debian)" >&2; exit 2 ;;
  esac
  if ! PYVER[$peer]=$("${PY[$peer]}" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
    log "${PY[$peer]} has no torch: peer $peer skipped"; unset "PY[$peer]"; continue
  fi
  RUNNERS_PT+=("$peer")
  HAS_TV[$peer]=0
  tv=$("${PY[$peer]}" -c 'import torchvision; print(torchvision.__version__)' 2>/dev/null) && HAS_TV[$peer]=1
  log "peer $peer: torch ${PYVER[$peer]} (${PY[$peer]}), torchvision ${tv:-none}"
done
peer_runs() {  # model peer -> true when that peer can run that model
  [[ -z "${NEEDS_TV[$1]:-}" || ${HAS_TV[$2]} -eq 1 ]]
}
nsettings() {  # peer -> how many settings it runs
  if [[ $1 == torch2 ]]; then echo "${#PT_SETTINGS_TORCH2[@]}"; else echo "${#PT_SETTINGS_DEBIAN[@]}"; fi
}
setting_at() {  # peer index -> "ENV|ARGS"
  if [[ $1 == torch2 ]]; then echo "${PT_SETTINGS_TORCH2[$2]}"; else echo "${PT_SETTINGS_DEBIAN[$2]}"; fi
}

# --- the machine's FMA peak ------------------------------------------------------
# A build/bench/fma_peak older than its source, or from before it printed its
# ISA (the version whose AVX2 chains spilled), is not used: the script
# compiles the source with the flags CMake gives it (Release, CNNFLOW_NATIVE).
if [[ -z "$FMA_PEAK" ]]; then
  b="$ROOT/build/bench/fma_peak"
  if [[ -x "$b" && "$b" -nt "$ROOT/bench/fma_peak.cc" ]] && "$b" --reps 1 --seconds 0.01 --threads 1 --no-sgemm 2>/dev/null | grep -q '^cpu '; then
    FMA_PEAK="$b"
  else
    log "build/bench/fma_peak missing or older than bench/fma_peak.cc: compiling it into $TMP"
    # shellcheck disable=SC2046
    g++ -O3 -DNDEBUG -march=native -std=c++20 -fno-math-errno $(pkg-config --cflags openblas) \
      "$ROOT/bench/fma_peak.cc" -o "$TMP/fma_peak" $(pkg-config --libs openblas) -pthread
    FMA_PEAK="$TMP/fma_peak"
  fi
fi
log "fma_peak: $FMA_PEAK --threads $THREADS --reps 5 --no-sgemm"
"$FMA_PEAK" --threads "$THREADS" --reps 5 --no-sgemm > "$TMP/fma.txt"
cat "$TMP/fma.txt" >&2
# The peak is a hardware ceiling that noise can only lower: take the best rep,
# of the widest ISA the CPU has (fma_peak's peak_isa).
PEAK_ISA=$(grep '^cpu ' "$TMP/fma.txt" | field peak_isa)
PEAK_LINE=$(grep "^fma_peak isa=$PEAK_ISA threads=$THREADS " "$TMP/fma.txt" || true)
PEAK=$(field gflops_best <<<"$PEAK_LINE")
PEAK_CHAINS=$(field chains <<<"$PEAK_LINE")
[[ -n "$PEAK" ]] || { echo "fma_peak gave no $THREADS-thread figure:" >&2; cat "$TMP/fma.txt" >&2; exit 1; }

# --- the runs --------------------------------------------------------------------
HAVE_CNNFLOW=1
if [[ ! -x "$CNNFLOW" ]]; then
  log "no cnnflow binary at $CNNFLOW: build it (cmake --build build); pytorch side only"
  HAVE_CNNFLOW=0
fi
run_cnnflow() {  # model rep
  local m=$1 dir="$TMP/$1.cnnflow.$2" sets=()
  mkdir -p "$dir"
  sets=(--set "threads=$THREADS" --set "train.batch=${BATCH[$m]}" --set "graph.devices=[cpu:0]"
        --set data.test=null)
  [[ -n "${SETS[$m]:-}" ]] && sets+=(--set "${SETS[$m]}")
  if ! /usr/bin/time -f "%e %U %S %M" -o "$dir/time" "$CNNFLOW" bench "$(cfg "$m")" --devices 1 \
      --warmup "$(warm_of "$m")" --max-steps "$(steps_of "$m")" --csv "$dir/bench.csv" \
      "${sets[@]}" > "$dir/log" 2>&1; then
    log "$m rep $2 cnnflow failed:"; tail -5 "$dir/log" >&2; return 1
  fi
  local col ips
  col=$(head -1 "$dir/bench.csv" | tr ',' '\n' | grep -n -x images_per_s | cut -d: -f1)
  ips=$(sed -n 2p "$dir/bench.csv" | cut -d, -f"$col")
  echo "$ips" >> "$TMP/$m.cnnflow.ips"
  rss_mb < "$dir/time" >> "$TMP/$m.cnnflow.rss"
  log "$m rep $2 cnnflow: $ips images/s, peak RSS $(tail -1 "$TMP/$m.cnnflow.rss") MB (wall/user/sys s, max RSS KB: $(cat "$dir/time"))"
}
# The last field of /usr/bin/time's last line (%M, KB) in MB. (time writes a
# "Command exited with non-zero status" line first when the command fails.)
rss_mb() { tail -1 | awk '{ printf "%.1f\n", $NF / 1024 }'; }
run_pytorch() {  # model rep peer setting-index
  local m=$1 peer=$3 line setting
  setting=$(setting_at "$peer" "$4")
  # shellcheck disable=SC2086
  line=$(cd "$ROOT" && env ${setting%%|*} /usr/bin/time -f %M -o "$TMP/pt.time" \
         "${PY[$peer]}" "$ROOT/bench/pytorch_train.py" \
         --model "${PTM[$m]}" --threads "$THREADS" --batch "${BATCH[$m]}" \
         --steps "$(steps_of "$m")" --warmup "$(warm_of "$m")" ${setting#*|} 2>"$TMP/pt.err" | tail -1) \
    || { log "$m rep $2 pytorch ${peer}[$4] failed:"; tail -3 "$TMP/pt.err" >&2; return 1; }
  echo "$line" | field images_per_s >> "$TMP/$m.$peer.$4.ips"
  rss_mb < "$TMP/pt.time" >> "$TMP/$m.$peer.$4.rss"
  log "$m rep $2 ${peer}[$4] $line peak_rss_mb(time %M)=$(tail -1 "$TMP/$m.$peer.$4.rss")"
}
cfg() { local c="${CONF[$1]}"; [[ "$c" == /* ]] && echo "$c" || echo "$ROOT/$c"; }
steps_of() { echo "${STEPS:-${DSTEPS[$1]}}"; }
warm_of() { echo "${WARMUP:-${DWARM[$1]}}"; }

median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print ""; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
med_of() { [[ -s "$1" ]] && median < "$1"; return 0; }           # median of a file's figures, or ""
runs() { [[ -s "$1" ]] && tr '\n' ' ' < "$1" | sed 's/ $//'; return 0; }
best_setting() {  # model peer -> "index median" of its best setting, or nothing
  local i med best="" bi=-1
  for ((i = 0; i < $(nsettings "$2"); i++)); do
    med=$(med_of "$TMP/$1.$2.$i.ips")
    [[ -z "$med" ]] && continue
    if [[ -z "$best" ]] || awk -v a="$med" -v b="$best" 'BEGIN { exit !(a > b) }'; then best=$med; bi=$i; fi
  done
  [[ -n "$best" ]] && echo "$bi $best"
  return 0
}

# The FLOPs of a model as `cnnflow validate` counts them (its conv and
# linear rows, 2 x MACs): a check of the MACs above, logged when off by > 1%.
check_macs() {
  local m=$1 v
  [[ $HAVE_CNNFLOW -eq 1 ]] || return 0
  local sets=(--set "train.batch=${BATCH[$m]}" --set "graph.devices=[cpu:0]" --set data.test=null)
  [[ -n "${SETS[$m]:-}" ]] && sets+=(--set "${SETS[$m]}")
  v=$("$CNNFLOW" validate "$(cfg "$m")" "${sets[@]}" 2>/dev/null |
      awk '$2 ~ /^(conv1d|conv2d|linear)$/ {s += $NF} END {if (s > 0) printf "%.0f", s * 1e6 / 2}') || true
  [[ -n "$v" ]] || return 0
  awk -v a="$v" -v b="${MACS[$m]}" 'BEGIN { d = a / b - 1; exit !(d > 0.01 || d < -0.01) }' &&
    log "WARNING: $m: cnnflow validate counts $v forward MACs in conv/linear layers, this script ${MACS[$m]}"
  return 0
}

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
for m in "${MODELS[@]}"; do
  check_macs "$m"
  CF_OK=$HAVE_CNNFLOW
  # The runners of one round: cnnflow, then every setting of every peer.
  order=()
  [[ $CF_OK -eq 1 ]] && order+=(cnnflow)
  for peer in "${RUNNERS_PT[@]}"; do
    if ! peer_runs "$m" "$peer"; then log "model $m: peer $peer has no torchvision: skipped"; continue; fi
    for ((i = 0; i < $(nsettings "$peer"); i++)); do order+=("$peer:$i"); done
  done
  log "model $m (${NAME[$m]}): $(cfg "$m"), batch ${BATCH[$m]}, $(steps_of "$m") steps after $(warm_of "$m"), $REPS reps of: ${order[*]}"
  for ((r = 1; r <= REPS; r++)); do
    # Alternate the order, so that no run always follows the same other one.
    seq=("${order[@]}")
    if (( r % 2 == 0 )); then
      seq=(); for ((k = ${#order[@]} - 1; k >= 0; k--)); do seq+=("${order[$k]}"); done
    fi
    for x in "${seq[@]}"; do
      if [[ $x == cnnflow ]]; then
        [[ $CF_OK -eq 1 ]] && { run_cnnflow "$m" "$r" || CF_OK=0; }
      else
        run_pytorch "$m" "$r" "${x%%:*}" "${x#*:}" || true
      fi
    done
  done
done
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

# --- the table -------------------------------------------------------------------
CSV_TMP="$TMP/table.csv"
echo "model,runner,torch,setting_index,setting,batch,steps,warmup,threads,flops_per_image,images_per_s_median,runs,gflops,pct_fma_peak,cnnflow_over_this,isa,fma_peak_gflops,peak_rss_mb_median" > "$CSV_TMP"
# Model names up to 15 characters (efficientnet_b0).
row() {  # model runner median runs torch setting cnnflow-median setting-index peak-RSS-median
  local m=$1 F=$(( MACS[$1] * 6 )) ratio="-"
  [[ -n "$7" && -n "$3" ]] && ratio=$(awk -v c="$7" -v p="$3" 'BEGIN { printf "%.2f", c / p }')
  awk -v m="$m" -v n="$2" -v b="${BATCH[$m]}" -v s="$(steps_of "$m")" -v ips="$3" -v f="$F" \
      -v p="$PEAK" -v ratio="$ratio" -v r="${4:-not run}${8:+ [$8]}" -v rss="${9:--}" 'BEGIN {
    if (ips == "") { printf "%-15s %-18s %5d %6d %10.1f %14s %9s %10s %12s %13s  %s\n", m, n, b, s, f / 1e6, "-", "-", "-", "-", "-", r; exit }
    g = ips * f / 1e9
    printf "%-15s %-18s %5d %6d %10.1f %14.1f %9.1f %9.1f%% %12s %13s  %s\n", m, n, b, s, f / 1e6, ips, g, 100 * g / p, rss, ratio, r }'
  awk -v ips="$3" -v f="$F" -v p="$PEAK" -v ratio="$ratio" -v r="$4" \
      -v pre="$m,$2,$5,${8:-},\"$6\",${BATCH[$m]},$(steps_of "$m"),$(warm_of "$m"),$THREADS,$F" \
      -v post="$PEAK_ISA,$PEAK,${9:-}" 'BEGIN {
    if (ips == "") { printf "%s,,,,,,%s\n", pre, post; exit }
    g = ips * f / 1e9; printf "%s,%s,%s,%.2f,%.2f,%s,%s\n", pre, ips, r, g, 100 * g / p, ratio, post }' >> "$CSV_TMP"
}
{
  echo "train_vs_pytorch $(date -u +%Y-%m-%dT%H:%MZ)  $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, threads=$THREADS"
  echo "ISA: $PEAK_ISA (CPU flags: ${SIMD:-none}); FMA peak, $THREADS threads ($PEAK_ISA, $PEAK_CHAINS chains per thread, best of 5): $PEAK GFLOP/s"
  echo "$OB_NOTE"
  for peer in "${RUNNERS_PT[@]}"; do echo "pytorch ${PYVER[$peer]}: ${PY[$peer]}"; done
  echo "load average at start / end: $LOAD_START / $LOAD_END"
  echo "each run: W untimed warm-up steps, then S timed steps (cnnflow: \`cnnflow bench --devices 1\`, its timed pass;"
  echo "pytorch: pytorch_train.py); $REPS reps, every runner once per rep, the order reversed every other rep"
  echo "FLOPs per training image = 3 x 2 x forward MACs of the conv and linear layers (mul + add; forward, and a"
  echo "backward twice the forward: input and weight gradients; a depthwise conv counts kernel x channels per"
  echo "output position); BN, activations, pooling, SE gates, dropout, loss and optimizer left out"
  echo "peak RSS MB: the runner process's maximum resident set (/usr/bin/time %M), median over the reps; it"
  echo "includes cnnflow's warm-up pass and loader, and PyTorch's interpreter, libraries and --pool-batches batches"
  echo
  printf "%-15s %-18s %5s %6s %10s %14s %9s %10s %12s %13s  %s\n" model runner batch steps MFLOP/img \
    "images/s (med)" GFLOP/s "% of peak" "peak RSS MB" "cnnflow/this" runs
  for m in "${MODELS[@]}"; do
    CF=$(med_of "$TMP/$m.cnnflow.ips")
    row "$m" cnnflow "$CF" "$(runs "$TMP/$m.cnnflow.ips")" "" "cnnflow bench" "$CF" "" \
      "$(med_of "$TMP/$m.cnnflow.rss")"
    for peer in "${RUNNERS_PT[@]}"; do
      peer_runs "$m" "$peer" || continue
      read -r bi best <<<"$(best_setting "$m" "$peer")" || true
      if [[ -n "${best:-}" ]]; then
        s=$(setting_at "$peer" "$bi")
        row "$m" "pytorch ${PYVER[$peer]%%+*}" "$best" "$(runs "$TMP/$m.$peer.$bi.ips")" \
          "${PYVER[$peer]}" "${s%%|*} ${s#*|}" "$CF" "$bi" "$(med_of "$TMP/$m.$peer.$bi.rss")"
      else
        row "$m" "pytorch ${PYVER[$peer]%%+*}" "" "" "${PYVER[$peer]}" "" "$CF"
      fi
      bi=""; best=""
    done
  done
  echo
  echo "pytorch settings (median images/s / peak RSS MB of each per model; [i] after a row's runs: the best, which counts):"
  for peer in "${RUNNERS_PT[@]}"; do
    for ((i = 0; i < $(nsettings "$peer"); i++)); do
      s=$(setting_at "$peer" "$i"); meds=""
      for m in "${MODELS[@]}"; do
        peer_runs "$m" "$peer" || continue
        meds+=" $m=$(med_of "$TMP/$m.$peer.$i.ips")/$(med_of "$TMP/$m.$peer.$i.rss")"
      done
      echo "  torch ${PYVER[$peer]%%+*} [$i] ${s%%|*} ${s#*|}:$meds"
    done
  done
  echo
  echo "FLOPs per image (forward MACs of the conv and linear layers; 'no-x1-grad' = 2 x (3 MACs - the first"
  echo "layer's MACs), without the first layer's input gradient, which neither side computes):"
  for m in "${MODELS[@]}"; do
    F=$(( MACS[$m] * 6 )); F2=$(( 2 * (3 * MACS[$m] - FIRST[$m]) ))
    echo "  $m: ${NAME[$m]}; $(basename "$(cfg "$m")"), batch ${BATCH[$m]}"
    echo "     MACs = ${MACS_HOW[$m]} = ${MACS[$m]}"
    awk -v f="$F" -v f2="$F2" 'BEGIN { printf "     FLOPs/image = 6 x MACs = %.0f (%.1f MFLOP); no-x1-grad %.0f (%.1f%% less)\n", f, f / 1e6, f2, 100 * (1 - f2 / f) }'
  done
  echo
  for m in "${MODELS[@]}"; do
    CF=$(med_of "$TMP/$m.cnnflow.ips"); line="$m:"
    for peer in "${RUNNERS_PT[@]}"; do
      peer_runs "$m" "$peer" || continue
      read -r bi best <<<"$(best_setting "$m" "$peer")" || true
      if [[ -n "$CF" && -n "${best:-}" ]]; then
        line+=$(awk -v c="$CF" -v p="$best" -v v="${PYVER[$peer]%%+*}" 'BEGIN { printf "  cnnflow / pytorch %s = %.2f", v, c / p }')
      else
        line+="  cnnflow / pytorch ${PYVER[$peer]%%+*} = -"
      fi
      bi=""; best=""
    done
    echo "$line"
  done
} > "$TMP/table.txt"
cat "$TMP/table.txt"
[[ -n "$OUT" ]] && cp "$TMP/table.txt" "$OUT" && log "table written to $OUT"
[[ -n "$CSV" ]] && cp "$CSV_TMP" "$CSV" && log "CSV written to $CSV"
exit 0
