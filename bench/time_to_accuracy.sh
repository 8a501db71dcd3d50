#!/usr/bin/env bash
# time_to_accuracy.sh: minutes to accuracy on CIFAR-10 (issue 32), cnnflow's
# speed run against the same airbench94 recipe in PyTorch 2.x, on this
# machine, alternating seed by seed (cnnflow, then PyTorch, same seed, same
# precision, same threads):
#   cnnflow: CNNFLOW train CONFIG --set seed=S --set threads=T --out DIR
#            (wall: this process; the config evaluates once, at its end, with
#            TTA: its last epoch line), then CNNFLOW eval CONFIG --weights
#            DIR/model.safetensors --set train.tta=none (untimed: the
#            accuracy without TTA)
#   pytorch: LD_PRELOAD=tcmalloc PY bench/airbench_pytorch.py --seed S
#            --precision P --threads T --json (wall: from its start, reading
#            the JPEGs, to the end of its TTA evaluation; on tcmalloc, its
#            best allocator, where the system has it: bench/torch_malloc.sh)
# Prints the CPU and its ISA first, each seed's pair as it goes, and at the
# end, per side: mean and min test accuracy with and without TTA, mean wall
# time, and the ratio PyTorch wall / cnnflow wall (> 1: cnnflow faster); then
# the same over every seed of the results file that both sides ran on this
# CPU and ISA, precision, threads and epochs (seeds accumulate over sessions).
# Appends one row per side and seed to bench/results/time-to-accuracy.csv
# (date,commit,cpu,isa,side,precision,threads,seed,epochs,accuracy,
# accuracy_tta,wall_s,malloc; accuracies in %; malloc: the side's allocator,
# glibc or tcmalloc). The summary over the file takes the seeds both sides
# ran, PyTorch on this run's allocator (the last row of each side). Runs
# with --subset are smoke tests: not appended unless --csv is given.
#
# usage: bench/time_to_accuracy.sh [--seeds "0 1 2"] [--precision fp32|bf16]
#          [--threads 2] [--only torch|cnnflow] [--epochs E] [--subset N]
#          [--csv FILE] [--cnnflow BIN] [--config YAML] [--data DIR]
#          [--venv DIR] [--no-install] [--logs DIR]
#          [--torch-malloc auto|tcmalloc|glibc]
#   --epochs E    both sides (cnnflow: --set train.epochs=E); default the
#                 config's and the recipe's 9.9
#   --subset N    train on N images only: PyTorch --subset N; cnnflow on an
#                 LMDB of N shuffled images of DATA/train made here with
#                 `cnnflow convert --limit N` (--set data.train.path=...)
#   --data DIR    the data folder (default $CNNFLOW_DATA_DIR, else data/):
#                 PyTorch reads DIR/cifar10-jpeg/{train,test}/<class>/<n>.jpg;
#                 cnnflow reads what CONFIG names (the LMDBs that
#                 scripts/prepare_cifar10.sh makes from the same JPEGs)
#   --logs DIR    each run's log, JSON and cnnflow output (default: a new
#                 /tmp/time_to_accuracy.XXXXXX, kept)
#   --torch-malloc  PyTorch's allocator (default auto: tcmalloc where the
#                 system has it; glibc reproduces the rows before 2026-12-05)
# bf16 runs only on a CPU with avx512_bf16 or amx_bf16: elsewhere PyTorch
# emulates bf16 (slower than fp32), no fair peer, and the script refuses.
# The torch 2.x venv (default .venv-torch) is made by bench/torch_venv.sh
# --install when missing (never when $CI is set; --no-install: fail instead).
# One fp32 pair takes about an hour on 2 idle cores (the load average is
# printed at the start and after each pair: a busy machine skews the walls).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SEEDS="0 1 2"
PRECISION=fp32
THREADS=2
ONLY=""
EPOCHS=""
SUBSET=""
CSV=""
CNNFLOW="$ROOT/build/cnnflow"
CONFIG="$ROOT/configs/cifar10_speedrun.yaml"
DATA="${CNNFLOW_DATA_DIR:-$ROOT/data}"
VENV="$ROOT/.venv-torch"
INSTALL=1
LOGS=""
TORCH_MALLOC=auto

usage() { sed -n '2,50p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "time_to_accuracy.sh: $*" >&2; exit 1; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seeds) SEEDS="$2"; shift 2 ;;
    --precision) PRECISION="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;
    --epochs) EPOCHS="$2"; shift 2 ;;
    --subset) SUBSET="$2"; shift 2 ;;
    --csv) CSV="$2"; shift 2 ;;
    --cnnflow) CNNFLOW="$2"; shift 2 ;;
    --config) CONFIG="$2"; shift 2 ;;
    --data) DATA="$2"; shift 2 ;;
    --venv) VENV="$2"; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --logs) LOGS="$2"; shift 2 ;;
    --torch-malloc) TORCH_MALLOC="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
case "$PRECISION" in fp32|bf16) ;; *) die "--precision fp32 or bf16, not '$PRECISION'" ;; esac
case "$ONLY" in ""|torch|cnnflow) ;; *) die "--only torch or cnnflow, not '$ONLY'" ;; esac
[[ -n "$SEEDS" ]] || die "--seeds is empty"
RUN_CNNFLOW=1; RUN_TORCH=1
if [[ "$ONLY" == torch ]]; then RUN_CNNFLOW=0; fi
if [[ "$ONLY" == cnnflow ]]; then RUN_TORCH=0; fi
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
echo "cpu: $CPU, $(nproc) cores; isa: $ISA; threads $THREADS, $PRECISION, seeds $SEEDS; load average $(load)"
if [[ "$PRECISION" == bf16 && "$FLAGS" != *" avx512_bf16 "* && "$FLAGS" != *" amx_bf16 "* ]]; then
  die "bf16 needs avx512_bf16 or amx_bf16, which this CPU ($ISA) lacks: PyTorch would emulate bf16 (slower than fp32), no fair peer. Run fp32 here, bf16 where the CPU has it."
fi

# --- the two sides -------------------------------------------------------------
PY="" MALLOC=glibc PRELOAD=""
if [[ $RUN_TORCH -eq 1 ]]; then
  args=(--venv "$VENV"); if [[ $INSTALL -eq 1 ]]; then args+=(--install); fi
  PY=$("$ROOT/bench/torch_venv.sh" "${args[@]}") \
    || die "no PyTorch 2.x (bench/torch_venv.sh ${args[*]} failed; see above); --only cnnflow runs without it"
  [[ -d "$DATA/cifar10-jpeg/train" && -d "$DATA/cifar10-jpeg/test" ]] \
    || die "no $DATA/cifar10-jpeg/{train,test} (--data DIR or CNNFLOW_DATA_DIR: the folder holding cifar10-jpeg/)"
  read -r MALLOC PRELOAD < <("$ROOT/bench/torch_malloc.sh" "$TORCH_MALLOC") \
    || die "bench/torch_malloc.sh $TORCH_MALLOC failed (see above)"
  echo "pytorch: $("$PY" -c 'import torch; print("torch", torch.__version__)') on $MALLOC${PRELOAD:+ ($PRELOAD)}"
fi
if [[ $RUN_CNNFLOW -eq 1 ]]; then
  [[ -x "$CNNFLOW" ]] || die "no cnnflow binary $CNNFLOW (cmake --build build, or --cnnflow BIN; --only torch runs without it)"
  [[ -f "$CONFIG" ]] || die "no config $CONFIG (--config YAML)"
  echo "cnnflow: $("$CNNFLOW" --version 2>/dev/null | head -1 || echo "$CNNFLOW")"
fi
if [[ -z "$LOGS" ]]; then LOGS="$(mktemp -d /tmp/time_to_accuracy.XXXXXX)"; else mkdir -p "$LOGS"; fi
echo "logs: $LOGS"
COMMIT="$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)"
RESULTS="$LOGS/results.tsv"   # side seed accuracy accuracy_tta wall_s, this session's runs
: >"$RESULTS"

now() { date +%s.%N; }
accuracy_of() { sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' "$1" | tail -1; }
CNNFLOW_SETS=(--set "threads=$THREADS")
if [[ "$PRECISION" == bf16 ]]; then CNNFLOW_SETS+=(--set graph.precision=bf16); fi
TRAIN_SETS=()
if [[ -n "$EPOCHS" ]]; then TRAIN_SETS+=(--set "train.epochs=$EPOCHS"); fi
if [[ $RUN_CNNFLOW -eq 1 && -n "$SUBSET" ]]; then
  "$CNNFLOW" convert --from folder "$DATA/cifar10-jpeg/train" --to "$LOGS/train-subset.lmdb" \
    --shuffle --limit "$SUBSET" --overwrite >"$LOGS/convert.log" 2>&1 \
    || die "cnnflow convert of a $SUBSET-image subset failed: $LOGS/convert.log"
  TRAIN_SETS+=(--set "data.train.path=$LOGS/train-subset.lmdb")
fi

# One run each; print "accuracy accuracy_tta wall_s" on stdout, or fail.
run_cnnflow() {  # seed
  local out="$LOGS/cnnflow-seed$1" t0 t1 t2 acc tta none
  t0=$(now)
  "$CNNFLOW" train "$CONFIG" --set "seed=$1" "${CNNFLOW_SETS[@]}" "${TRAIN_SETS[@]}" --out "$out" \
    >"$out.train.log" 2>&1 || { echo "cnnflow train failed: $out.train.log" >&2; tail -5 "$out.train.log" >&2; return 1; }
  t1=$(now)
  # The config evaluates once, at its end, with TTA (train.eval_every,
  # train.tta): the run's last epoch line is the TTA accuracy, and its wall
  # time the end-to-end time. The accuracy without TTA: an untimed eval.
  tta=$(grep -E 'epoch [0-9]+/[0-9]+:.*test accuracy' "$out.train.log" | tail -1 \
        | sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p')
  "$CNNFLOW" eval "$CONFIG" --weights "$out/model.safetensors" "${CNNFLOW_SETS[@]}" \
    --set train.tta=none >"$out.none.log" 2>&1 \
    || { echo "cnnflow eval (no TTA) failed: $out.none.log" >&2; tail -5 "$out.none.log" >&2; return 1; }
  acc=$(accuracy_of "$out.none.log")
  [[ -n "$acc" && -n "$tta" ]] || { echo "cnnflow: no test accuracy in $out.*.log" >&2; return 1; }
  echo "$acc $tta $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')"
  echo "# cnnflow seed $1: $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')s to the final (TTA) evaluation" >&2
}
run_torch() {  # seed
  local log="$LOGS/pytorch-seed$1" args=(--seed "$1" --precision "$PRECISION" --threads "$THREADS"
                                         --data "$DATA/cifar10-jpeg" --json)
  if [[ -n "$EPOCHS" ]]; then args+=(--epochs "$EPOCHS"); fi
  if [[ -n "$SUBSET" ]]; then args+=(--subset "$SUBSET"); fi
  env ${PRELOAD:+"LD_PRELOAD=$PRELOAD"} "$PY" "$ROOT/bench/airbench_pytorch.py" "${args[@]}" >"$log.json" 2>"$log.log" \
    || { echo "pytorch failed: $log.log" >&2; tail -5 "$log.log" >&2; return 1; }
  "$PY" -c 'import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(d["accuracy"], d["accuracy_tta"], d["wall_s"])
print("# pytorch seed %s: data %ss, train %ss, eval %ss, torch %s" % (d["seed"], d["data_s"], d["train_s"], d["eval_s"], d["torch"]), file=sys.stderr)' "$log.json"
}

HEADER="date,commit,cpu,isa,side,precision,threads,seed,epochs,accuracy,accuracy_tta,wall_s,malloc"
record() {  # side seed "accuracy accuracy_tta wall_s"
  local acc tta wall malloc=glibc
  if [[ "$1" == pytorch ]]; then malloc=$MALLOC; fi
  read -r acc tta wall <<<"$3"
  echo "$1 $2 $acc $tta $wall" >>"$RESULTS"
  [[ -n "$CSV" ]] || return 0
  mkdir -p "$(dirname "$CSV")"
  [[ -s "$CSV" ]] || echo "$HEADER" >"$CSV"
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ),$COMMIT,${CPU//,/;},$ISA,$1,$PRECISION,$THREADS,$2,${EPOCHS:-9.9},$acc,$tta,$wall,$malloc" >>"$CSV"
}

for seed in $SEEDS; do
  line="seed $seed:"
  c="" t=""
  if [[ $RUN_CNNFLOW -eq 1 ]]; then
    if c=$(run_cnnflow "$seed"); then record cnnflow "$seed" "$c"; line+=" cnnflow $(awk '{ printf "%.2f%% (TTA %.2f%%) in %.0f s", $1, $2, $3 }' <<<"$c")"
    else c=""; line+=" cnnflow failed"; fi
  fi
  if [[ $RUN_TORCH -eq 1 ]]; then
    if t=$(run_torch "$seed"); then record pytorch "$seed" "$t"; line+="  pytorch $(awk '{ printf "%.2f%% (TTA %.2f%%) in %.0f s", $1, $2, $3 }' <<<"$t")"
    else t=""; line+="  pytorch failed"; fi
  fi
  if [[ -n "$c" && -n "$t" ]]; then
    line+="  pytorch/cnnflow wall $(awk -v a="${c##* }" -v b="${t##* }" 'BEGIN { printf "%.2f", b / a }')"
  fi
  echo "$line  (load average $(load))"
done

# Per side: runs, mean and min accuracy (without, with TTA), mean wall; the
# ratio of the mean walls. Input lines: side seed accuracy accuracy_tta wall_s.
summary() {
  awk '{ n[$1]++; a[$1] += $3; t[$1] += $4; w[$1] += $5
         if (!($1 in amin) || $3 < amin[$1]) amin[$1] = $3
         if (!($1 in tmin) || $4 < tmin[$1]) tmin[$1] = $4 }
       END { split("cnnflow pytorch", sides, " ")
             for (i = 1; i <= 2; i++) { s = sides[i]; if (!(s in n)) continue
               printf "  %-8s %2d runs  accuracy mean %.2f%% min %.2f%%  TTA mean %.2f%% min %.2f%%  wall mean %.0f s (%.1f min)\n",
                      s, n[s], a[s] / n[s], amin[s], t[s] / n[s], tmin[s], w[s] / n[s], w[s] / n[s] / 60 }
             if (n["cnnflow"] && n["pytorch"])
               printf "  ratio pytorch wall / cnnflow wall: %.2f (> 1: cnnflow faster)\n",
                      (w["pytorch"] / n["pytorch"]) / (w["cnnflow"] / n["cnnflow"]) }'
}
echo "this session ($LOGS):"
if [[ -s "$RESULTS" ]]; then summary <"$RESULTS"; else echo "  no run finished"; fi
if [[ -n "$CSV" && -s "$CSV" ]]; then
  # Pairs only: a seed counts where both sides have a row (the last of each),
  # so cnnflow's rows of older commits without a peer of this allocator and
  # PyTorch's without a cnnflow row stay out.
  echo "every seed of $CSV run by both sides on this cpu and isa ($ISA), precision $PRECISION, $THREADS threads, ${EPOCHS:-9.9} epochs (pytorch on $MALLOC):"
  awk -F, -v cpu="${CPU//,/;}" -v isa="$ISA" -v p="$PRECISION" -v th="$THREADS" -v e="${EPOCHS:-9.9}" -v m="$MALLOC" \
    'NR > 1 && $3 == cpu && $4 == isa && $6 == p && $7 == th && $9 == e && ($5 != "pytorch" || $13 == m) {
       row[$5, $8] = $5 " " $8 " " $10 " " $11 " " $12; seen[$8] = 1 }
     END { for (s in seen) if ((("cnnflow", s) in row) && (("pytorch", s) in row)) {
             print row["cnnflow", s]; print row["pytorch", s] } }' "$CSV" | summary
fi
