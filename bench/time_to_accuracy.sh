#!/usr/bin/env bash
# time_to_accuracy.sh: time to accuracy on CIFAR-10 (issues 32 and 59),
# cnnflow's speed run against the same airbench94 recipe in PyTorch 2.x, on
# this machine's CPU or its first GPU, alternating seed by seed (cnnflow,
# then PyTorch, same seed, same precision):
#   cnnflow: CNNFLOW train CONFIG --set seed=S --set threads=T --out DIR
#            (on cuda also --set 'graph.devices=[cuda:0]' --set
#            data.device_resident=true, and graph.precision=bf16|fp16); its
#            wall: this process; its timed span: the "timed span:" line it
#            prints (whitening init to the end of the last evaluation, which
#            is the TTA one: the config evaluates once, at its end). Then
#            CNNFLOW eval CONFIG --weights DIR/model.safetensors --set
#            train.tta=none (untimed: the accuracy without TTA)
#   pytorch: LD_PRELOAD=tcmalloc PY bench/airbench_pytorch.py --seed S
#            --precision P --threads T --device D --json (wall: from its
#            start, reading the JPEGs, to the end of its TTA evaluation;
#            timed_s: airbench's span, whitening init to the TTA accuracy,
#            the data on the device; on tcmalloc, its best allocator, where
#            the system has it: bench/torch_malloc.sh). On cuda it runs
#            twice a seed, eager (side "pytorch") and --compile (side
#            "pytorch-compiled"; the compile and warm-up outside the span)
# Prints the machine first, each seed's runs as they go, and at the end, per
# side: mean and min test accuracy with and without TTA, the mean time and
# the ratio PyTorch / cnnflow (> 1: cnnflow faster), where the time is the
# timed span on a GPU and the wall time on a CPU (where cnnflow's span
# holds its JPEG decode and PyTorch's does not); then the same over every
# seed of the results file that both sides ran on this device, CPU and ISA,
# precision, threads and epochs (seeds accumulate over sessions).
# Appends one row per side and seed to bench/results/time-to-accuracy.csv
# (date,commit,cpu,isa,side,precision,threads,seed,epochs,accuracy,
# accuracy_tta,wall_s,malloc,device,timed_s; accuracies in %; malloc: the
# side's allocator, glibc or tcmalloc; device: cpu or the GPU's name; rows
# before 2026-12-07 have device and timed_s empty: cpu, not measured). A
# file with the old 13-column header gets the two columns (empty in its old
# rows) before the first row is appended. The summary over the file takes
# the seeds both sides ran, PyTorch on this run's allocator (the last row of
# each side). Runs with --subset are smoke tests: not appended unless --csv
# is given. Exit status 1 when a run failed (after the summaries).
#
# usage: bench/time_to_accuracy.sh [--device cpu|cuda] [--seeds "0 1 2"]
#          [--precision fp32|bf16|fp16] [--threads T] [--only torch|cnnflow]
#          [--no-compile] [--no-eager] [--compile] [--epochs E] [--subset N]
#          [--csv FILE] [--cnnflow BIN] [--config YAML] [--data DIR]
#          [--venv DIR | --python PY] [--no-install] [--logs DIR]
#          [--torch-malloc auto|tcmalloc|glibc] [--budget SECONDS]
#   --device D    cpu (default) or cuda (cuda:0 for both sides)
#   --precision   fp32 (default), bf16 (CPUs with avx512_bf16 or amx_bf16,
#                 and GPUs), fp16 (GPUs only: airbench94's own)
#   --threads T   cnnflow's threads and PyTorch's (default 2 on the CPU,
#                 every core, $(nproc), on cuda: host work and JPEG decode)
#   --no-compile  PyTorch eager only (default on cuda: eager and compiled,
#                 alternating; --no-eager: compiled only)
#   --compile     on the CPU, PyTorch compiled too (default there: eager)
#   --epochs E    both sides (cnnflow: --set train.epochs=E); default the
#                 config's and the recipe's 9.9
#   --subset N    train on N images only: PyTorch --subset N; cnnflow on an
#                 LMDB of N shuffled images of DATA/train made here with
#                 `cnnflow convert --limit N` (--set data.train.path=...)
#   --data DIR    the data folder (default $CNNFLOW_DATA_DIR, else data/):
#                 PyTorch reads DIR/cifar10-jpeg/{train,test}/<class>/<n>.jpg;
#                 cnnflow reads what CONFIG names (the LMDBs that
#                 scripts/prepare_cifar10.sh makes from the same JPEGs)
#   --python PY   the interpreter with torch 2.x (a GPU machine's own),
#                 instead of the venv of bench/torch_venv.sh
#   --logs DIR    each run's log, JSON and cnnflow output (default: a new
#                 /tmp/time_to_accuracy.XXXXXX, kept)
#   --torch-malloc  PyTorch's allocator (default auto: tcmalloc where the
#                 system has it; glibc reproduces the rows before 2026-12-05)
#   --budget S    start no seed that would end past S seconds from the
#                 start, judged by the last seed's time (the first always
#                 runs): for a GPU check with a time limit
# bf16 on a CPU runs only with avx512_bf16 or amx_bf16: elsewhere PyTorch
# emulates bf16 (slower than fp32), no fair peer, and the script refuses.
# The torch 2.x venv (default .venv-torch) is made by bench/torch_venv.sh
# --install when missing (never when $CI is set; --no-install: fail instead).
# One fp32 pair takes about an hour on 2 idle CPU cores (the load average
# is printed at the start and after each pair: a busy machine skews the
# walls); on a GPU a seed of the three runs takes a minute or two, most of
# it PyTorch's start, decode and compile.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEVICE=cpu
SEEDS="0 1 2"
PRECISION=fp32
THREADS=""
ONLY=""
EAGER=1
COMPILED=""   # default: 1 on cuda, 0 on the CPU
EPOCHS=""
SUBSET=""
CSV=""
CNNFLOW="$ROOT/build/cnnflow"
CONFIG="$ROOT/configs/cifar10_speedrun.yaml"
DATA="${CNNFLOW_DATA_DIR:-$ROOT/data}"
VENV="$ROOT/.venv-torch"
PYTHON=""
INSTALL=1
LOGS=""
TORCH_MALLOC=auto
BUDGET=""

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "time_to_accuracy.sh: $*" >&2; exit 1; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --seeds) SEEDS="$2"; shift 2 ;;
    --precision) PRECISION="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;
    --no-compile) COMPILED=0; shift ;;
    --no-eager) EAGER=0; shift ;;
    --compile) COMPILED=1; shift ;;
    --epochs) EPOCHS="$2"; shift 2 ;;
    --subset) SUBSET="$2"; shift 2 ;;
    --csv) CSV="$2"; shift 2 ;;
    --cnnflow) CNNFLOW="$2"; shift 2 ;;
    --config) CONFIG="$2"; shift 2 ;;
    --data) DATA="$2"; shift 2 ;;
    --venv) VENV="$2"; shift 2 ;;
    --python) PYTHON="$2"; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --logs) LOGS="$2"; shift 2 ;;
    --torch-malloc) TORCH_MALLOC="$2"; shift 2 ;;
    --budget) BUDGET="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
case "$DEVICE" in
  cpu) case "$PRECISION" in fp32|bf16) ;; *) die "--precision fp32 or bf16 on the CPU, not '$PRECISION' (fp16: --device cuda)" ;; esac ;;
  cuda) case "$PRECISION" in fp32|bf16|fp16) ;; *) die "--precision fp32, bf16 or fp16, not '$PRECISION'" ;; esac ;;
  *) die "--device cpu or cuda, not '$DEVICE'" ;;
esac
case "$ONLY" in ""|torch|cnnflow) ;; *) die "--only torch or cnnflow, not '$ONLY'" ;; esac
[[ -n "$SEEDS" ]] || die "--seeds is empty"
[[ -z "$BUDGET" || "$BUDGET" =~ ^[0-9]+$ ]] || die "--budget takes whole seconds, not '$BUDGET'"
if [[ -z "$THREADS" ]]; then if [[ "$DEVICE" == cuda ]]; then THREADS=$(nproc); else THREADS=2; fi; fi
if [[ -z "$COMPILED" ]]; then if [[ "$DEVICE" == cuda ]]; then COMPILED=1; else COMPILED=0; fi; fi
TORCH_MODES=()   # each seed's PyTorch runs, in this order
if [[ $COMPILED -eq 1 ]]; then TORCH_MODES+=(compiled); fi
if [[ $EAGER -eq 1 ]]; then TORCH_MODES+=(eager); fi
RUN_CNNFLOW=1; RUN_TORCH=1
if [[ "$ONLY" == torch ]]; then RUN_CNNFLOW=0; fi
if [[ "$ONLY" == cnnflow ]]; then RUN_TORCH=0; fi
if [[ ${#TORCH_MODES[@]} -eq 0 ]]; then RUN_TORCH=0; fi
if [[ -z "$CSV" && -z "$SUBSET" ]]; then CSV="$ROOT/bench/results/time-to-accuracy.csv"; fi

# --- the machine ---------------------------------------------------------------
CPU="$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
[[ -n "$CPU" ]] || CPU="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
FLAGS=" $(lscpu 2>/dev/null | sed -n 's/^Flags: *//p') "
[[ "$FLAGS" != "  " ]] || FLAGS=" $(sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo | head -1) "
ISA=""
for f in avx2 avx512f avx512_bf16 amx_bf16; do
  if [[ "$FLAGS" == *" $f "* ]]; then ISA="${ISA:+$ISA+}$f"; fi
done
ISA="${ISA:-none}"
load() { cut -d" " -f1 /proc/loadavg; }  # other processes on the cores skew every wall time
DEVICE_NAME=cpu   # the CSV's device column: cpu, or the GPU's name
if [[ "$DEVICE" == cuda ]]; then
  DEVICE_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null | head -1 || true)"
  DEVICE_NAME="${DEVICE_NAME:-cuda}"
  DEVICE_NAME="${DEVICE_NAME//,/;}"
fi
echo "cpu: $CPU, $(nproc) cores; isa: $ISA; device: $DEVICE_NAME; threads $THREADS, $PRECISION, seeds $SEEDS; load average $(load)"
if [[ "$DEVICE" == cuda ]]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0 2>/dev/null \
    | sed 's/^/gpu: /' || echo "gpu: nvidia-smi failed"
fi
if [[ "$DEVICE" == cpu && "$PRECISION" == bf16 && "$FLAGS" != *" avx512_bf16 "* && "$FLAGS" != *" amx_bf16 "* ]]; then
  die "bf16 needs avx512_bf16 or amx_bf16, which this CPU ($ISA) lacks: PyTorch would emulate bf16 (slower than fp32), no fair peer. Run fp32 here, bf16 where the CPU has it."
fi
# The time the summaries compare: the timed span on a GPU, the wall on a CPU.
if [[ "$DEVICE" == cuda ]]; then METRIC=timed; else METRIC=wall; fi

# --- the two sides -------------------------------------------------------------
PY="" MALLOC=glibc PRELOAD=""
if [[ $RUN_TORCH -eq 1 ]]; then
  if [[ -n "$PYTHON" ]]; then
    PY="$PYTHON"
    "$PY" -c 'import torch' 2>/dev/null || die "no torch in --python $PY"
  else
    args=(--venv "$VENV"); if [[ $INSTALL -eq 1 ]]; then args+=(--install); fi
    PY=$("$ROOT/bench/torch_venv.sh" "${args[@]}") \
      || die "no PyTorch 2.x (bench/torch_venv.sh ${args[*]} failed; see above); --only cnnflow runs without it"
  fi
  [[ -d "$DATA/cifar10-jpeg/train" && -d "$DATA/cifar10-jpeg/test" ]] \
    || die "no $DATA/cifar10-jpeg/{train,test} (--data DIR or CNNFLOW_DATA_DIR: the folder holding cifar10-jpeg/)"
  read -r MALLOC PRELOAD < <("$ROOT/bench/torch_malloc.sh" "$TORCH_MALLOC") \
    || die "bench/torch_malloc.sh $TORCH_MALLOC failed (see above)"
  echo "pytorch: $("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)') on $MALLOC${PRELOAD:+ ($PRELOAD)}; runs: ${TORCH_MODES[*]}"
fi
if [[ $RUN_CNNFLOW -eq 1 ]]; then
  [[ -x "$CNNFLOW" ]] || die "no cnnflow binary $CNNFLOW (cmake --build build, or --cnnflow BIN; --only torch runs without it)"
  [[ -f "$CONFIG" ]] || die "no config $CONFIG (--config YAML)"
  echo "cnnflow: $("$CNNFLOW" --version 2>/dev/null | head -1 || echo "$CNNFLOW")"
fi
if [[ -z "$LOGS" ]]; then LOGS="$(mktemp -d /tmp/time_to_accuracy.XXXXXX)"; else mkdir -p "$LOGS"; fi
echo "logs: $LOGS"
COMMIT="$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)"
RESULTS="$LOGS/results.tsv"   # side seed accuracy accuracy_tta wall_s timed_s, this session's runs
: >"$RESULTS"

now() { date +%s.%N; }
accuracy_of() { sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' "$1" | tail -1; }
CNNFLOW_SETS=(--set "threads=$THREADS")
if [[ "$DEVICE" == cuda ]]; then CNNFLOW_SETS+=(--set 'graph.devices=[cuda:0]'); fi
if [[ "$PRECISION" != fp32 ]]; then CNNFLOW_SETS+=(--set "graph.precision=$PRECISION"); fi
TRAIN_SETS=()
# The training set decoded once and held on the GPU (train only: the
# untimed eval has no use for it).
if [[ "$DEVICE" == cuda ]]; then TRAIN_SETS+=(--set data.device_resident=true); fi
if [[ -n "$EPOCHS" ]]; then TRAIN_SETS+=(--set "train.epochs=$EPOCHS"); fi
if [[ $RUN_CNNFLOW -eq 1 && -n "$SUBSET" ]]; then
  "$CNNFLOW" convert --from folder "$DATA/cifar10-jpeg/train" --to "$LOGS/train-subset.lmdb" \
    --shuffle --limit "$SUBSET" --overwrite >"$LOGS/convert.log" 2>&1 \
    || die "cnnflow convert of a $SUBSET-image subset failed: $LOGS/convert.log"
  # train and the untimed eval (which opens data.train too)
  CNNFLOW_SETS+=(--set "data.train.path=$LOGS/train-subset.lmdb")
fi

# One run each; print "accuracy accuracy_tta wall_s timed_s" on stdout, or fail.
run_cnnflow() {  # seed
  local out="$LOGS/cnnflow-seed$1" t0 t1 acc tta timed
  t0=$(now)
  "$CNNFLOW" train "$CONFIG" --set "seed=$1" "${CNNFLOW_SETS[@]}" "${TRAIN_SETS[@]}" --out "$out" \
    >"$out.train.log" 2>&1 || { echo "cnnflow train failed: $out.train.log" >&2; tail -5 "$out.train.log" >&2; return 1; }
  t1=$(now)
  # The config evaluates once, at its end, with TTA (train.eval_every,
  # train.tta): the run's last epoch line is the TTA accuracy, its wall time
  # the end-to-end time, its "timed span:" line airbench's span. The
  # accuracy without TTA: an untimed eval.
  tta=$(grep -E 'epoch [0-9]+/[0-9]+:.*test accuracy' "$out.train.log" | tail -1 \
        | sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p')
  timed=$(timed_span_of "$out.train.log")
  [[ -n "$timed" ]] || echo "cnnflow: no 'timed span:' line in $out.train.log (a binary before it?): timed_s left empty" >&2
  "$CNNFLOW" eval "$CONFIG" --weights "$out/model.safetensors" "${CNNFLOW_SETS[@]}" \
    --set train.tta=none >"$out.none.log" 2>&1 \
    || { echo "cnnflow eval (no TTA) failed: $out.none.log" >&2; tail -5 "$out.none.log" >&2; return 1; }
  acc=$(accuracy_of "$out.none.log")
  [[ -n "$acc" && -n "$tta" ]] || { echo "cnnflow: no test accuracy in $out.*.log" >&2; return 1; }
  echo "$acc $tta $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') ${timed:--}"
  echo "# cnnflow seed $1: $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')s to the final (TTA) evaluation, timed span ${timed:-?} s" >&2
}
timed_span_of() { sed -n 's/^timed span: \([0-9.]*\) s.*/\1/p' "$1" | tail -1; }
run_torch() {  # seed mode
  local log="$LOGS/pytorch-$2-seed$1" args=(--seed "$1" --precision "$PRECISION" --threads "$THREADS"
                                            --device "$DEVICE" --data "$DATA/cifar10-jpeg" --json)
  if [[ "$2" == compiled ]]; then args+=(--compile); fi
  if [[ -n "$EPOCHS" ]]; then args+=(--epochs "$EPOCHS"); fi
  if [[ -n "$SUBSET" ]]; then args+=(--subset "$SUBSET"); fi
  env ${PRELOAD:+"LD_PRELOAD=$PRELOAD"} "$PY" "$ROOT/bench/airbench_pytorch.py" "${args[@]}" >"$log.json" 2>"$log.log" \
    || { echo "pytorch ($2) failed: $log.log" >&2; tail -5 "$log.log" >&2; return 1; }
  "$PY" -c 'import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(d["accuracy"], d["accuracy_tta"], d["wall_s"], d["timed_s"])
print("# pytorch (%s) seed %s: timed span %ss; before it: decode %ss, compile and warm-up %ss; torch %s" % (
    sys.argv[2], d["seed"], d["timed_s"], d["decode_s"], d["compile_s"], d["torch"]), file=sys.stderr)' "$log.json" "$2"
}
side_of() { if [[ "$1" == compiled ]]; then echo pytorch-compiled; else echo pytorch; fi; }

HEADER="date,commit,cpu,isa,side,precision,threads,seed,epochs,accuracy,accuracy_tta,wall_s,malloc,device,timed_s"
OLD_HEADER="date,commit,cpu,isa,side,precision,threads,seed,epochs,accuracy,accuracy_tta,wall_s,malloc"
# A results file of the 13 columns before device and timed_s: both added,
# empty in its rows (cpu, not measured). Rewritten whole, then renamed.
migrate_csv() {  # file
  [[ -s "$1" && "$(head -1 "$1")" == "$OLD_HEADER" ]] || return 0
  awk -v h="$HEADER" 'NR == 1 { print h; next } NF { print $0 ",," }' "$1" >"$1.tmp" && mv "$1.tmp" "$1"
  echo "$1: the columns device and timed_s added (empty in its old rows)"
}
record() {  # side seed "accuracy accuracy_tta wall_s timed_s"
  local acc tta wall timed malloc=glibc
  if [[ "$1" == pytorch* ]]; then malloc=$MALLOC; fi
  read -r acc tta wall timed <<<"$3"
  [[ "$timed" != - ]] || timed=""
  echo "$1 $2 $acc $tta $wall ${timed:--}" >>"$RESULTS"
  [[ -n "$CSV" ]] || return 0
  mkdir -p "$(dirname "$CSV")"
  migrate_csv "$CSV"
  [[ -s "$CSV" ]] || echo "$HEADER" >"$CSV"
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ),$COMMIT,${CPU//,/;},$ISA,$1,$PRECISION,$THREADS,$2,${EPOCHS:-9.9},$acc,$tta,$wall,$malloc,$DEVICE_NAME,$timed" >>"$CSV"
}
# "93.50% (TTA 94.01%) in 12 s" (+ ", span 3.41 s" where measured).
describe() { awk '{ printf "%.2f%% (TTA %.2f%%) in %.0f s", $1, $2, $3; if ($4 != "-") printf ", span %.2f s", $4 }' <<<"$1"; }
# The compared time of a result line: its timed span on a GPU, its wall on a CPU.
metric_of() { if [[ $METRIC == timed ]]; then awk '{ print $4 }' <<<"$1"; else awk '{ print $3 }' <<<"$1"; fi; }

START=$(now)
FAILED=0         # a run failed: the exit status is 1, after the summaries
last_seed_s=""   # the last seed's seconds, once one ran
for seed in $SEEDS; do
  if [[ -n "$BUDGET" && -n "$last_seed_s" ]] && awk -v s="$START" -v n="$(now)" -v l="$last_seed_s" -v b="$BUDGET" \
       'BEGIN { exit !(n - s + l > b) }'; then
    echo "budget: another seed would end past ${BUDGET}s (the last took ${last_seed_s}s); stopping before seed $seed"
    break
  fi
  seed0=$(now)
  line="seed $seed:"
  c=""
  if [[ $RUN_CNNFLOW -eq 1 ]]; then
    if c=$(run_cnnflow "$seed"); then record cnnflow "$seed" "$c"; line+=" cnnflow $(describe "$c")"
    else c=""; FAILED=1; line+=" cnnflow failed"; fi
  fi
  if [[ $RUN_TORCH -eq 1 ]]; then
    for mode in "${TORCH_MODES[@]}"; do
      side=$(side_of "$mode")
      if t=$(run_torch "$seed" "$mode"); then
        record "$side" "$seed" "$t"; line+="  $side $(describe "$t")"
        a=$(metric_of "$c"); b=$(metric_of "$t")
        if [[ -n "$c" && "$a" != - && "$b" != - ]]; then
          line+=" ($side/cnnflow $METRIC $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", b / a }'))"
        fi
      else FAILED=1; line+="  $side failed"; fi
    done
  fi
  echo "$line  (load average $(load))"
  last_seed_s=$(awk -v a="$seed0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
done

# Per side: runs, mean and min accuracy (without, with TTA), mean time (the
# column `col`: 5 the wall, 6 the timed span); each PyTorch side's ratio to
# cnnflow's mean time. Input lines: side seed accuracy accuracy_tta wall_s
# timed_s ("-" where not measured: such lines count for the accuracies, not
# the time).
summary() {
  awk -v col="$([[ $METRIC == timed ]] && echo 6 || echo 5)" -v what="$([[ $METRIC == timed ]] && echo "timed span" || echo wall)" '
    { if (!($1 in n)) order[++sides] = $1
      n[$1]++; a[$1] += $3; t[$1] += $4
      if ($col != "-") { w[$1] += $col; nw[$1]++ }
      if (!($1 in amin) || $3 < amin[$1]) amin[$1] = $3
      if (!($1 in tmin) || $4 < tmin[$1]) tmin[$1] = $4 }
    END { for (i = 1; i <= sides; i++) { s = order[i]
            printf "  %-16s %2d runs  accuracy mean %.2f%% min %.2f%%  TTA mean %.2f%% min %.2f%%", s, n[s], a[s] / n[s], amin[s], t[s] / n[s], tmin[s]
            if (nw[s]) printf "  %s mean %.2f s (%.1f min)", what, w[s] / nw[s], w[s] / nw[s] / 60
            printf "\n" }
          for (i = 1; i <= sides; i++) { s = order[i]
            if (s == "cnnflow" || !nw[s] || !nw["cnnflow"]) continue
            printf "  ratio %s / cnnflow, mean %s: %.2f (> 1: cnnflow faster)\n", s, what,
                   (w[s] / nw[s]) / (w["cnnflow"] / nw["cnnflow"]) } }'
}
echo "this session ($LOGS):"
if [[ -s "$RESULTS" ]]; then summary <"$RESULTS"; else echo "  no run finished"; fi
# The CSV's rows of this device, CPU and ISA, precision, threads and epochs
# (PyTorch's on this run's allocator) as "side seed accuracy accuracy_tta
# wall_s timed_s", the last row of each side and seed; a seed counts where
# cnnflow and the PyTorch side both have one. Old rows (13 columns, or
# device and timed_s empty) are CPU rows without a span.
file_rows() {  # csv pytorch-side
  awk -F, -v cpu="${CPU//,/;}" -v isa="$ISA" -v p="$PRECISION" -v th="$THREADS" -v e="${EPOCHS:-9.9}" \
      -v m="$MALLOC" -v dev="$DEVICE_NAME" -v other="$2" '
    NR > 1 && $3 == cpu && $4 == isa && $6 == p && $7 == th && $9 == e && ($5 == "cnnflow" || ($5 == other && $13 == m)) &&
    ($14 == "" ? "cpu" : $14) == dev {
      row[$5, $8] = $5 " " $8 " " $10 " " $11 " " $12 " " ($15 == "" ? "-" : $15); seen[$8] = 1 }
    END { for (s in seen) if ((("cnnflow", s) in row) && ((other, s) in row)) {
            print row["cnnflow", s]; print row[other, s] } }' "$1"
}
if [[ -n "$CSV" && -s "$CSV" ]]; then
  paired=0
  for side in pytorch pytorch-compiled; do
    rows=$(file_rows "$CSV" "$side")
    [[ -n "$rows" ]] || continue
    paired=1
    echo "every seed of $CSV run by cnnflow and $side on $DEVICE_NAME, this cpu and isa ($ISA), precision $PRECISION, $THREADS threads, ${EPOCHS:-9.9} epochs (pytorch on $MALLOC):"
    summary <<<"$rows"
  done
  [[ $paired -eq 1 ]] || echo "no seed of $CSV was run by both sides on $DEVICE_NAME, this cpu and isa ($ISA), precision $PRECISION, $THREADS threads, ${EPOCHS:-9.9} epochs"
fi
exit $FAILED
