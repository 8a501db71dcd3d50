#!/usr/bin/env bash
# Does graph.autotune make only moves it can prove? Trains with autotune on
#   - the loader-bound photo config from the best static setting (2 threads,
#     prefetch 4; `cnnflow tune` finds it), RUNS times: how many runs keep a
#     change (should be none), and from a bad one (1 thread, prefetch 1):
#     where it ends and after how many batches;
#   - the step-bound main job (configs/fashion_mnist.yaml, 2 threads, from 1
#     load thread): whether it ever adds a decode thread.
#   - reach: autotune from the bad setting against the static settings it
#     could end at ({1, 2} threads x prefetch {2, 4}), alternating, ROUNDS
#     rounds of 20 epochs (500 batches): the median images/s of epochs 13-20
#     (batches 301-500), so what autotune runs at once its 300 batches are
#     spent, against the best static setting.
# Prints one line per run and a summary; the runs' autotune.csv are kept in
# OUT (default /tmp/cnnflow-autotune-check).
#   scripts/prepare_photos.py && bench/autotune_check.sh [RUNS] [OUT] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
out=${2:-/tmp/cnnflow-autotune-check}
rounds=${3:-3}
bin=build/cnnflow
photos=bench/configs/photos_loader_bound.yaml
mkdir -p "$out"
echo "# autotune check, $(date -u +%F), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), ISA flags: $(grep -o -w -E 'avx512f|avx2|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
kept() { grep -c ',keep,' "$1" || true; }
ups() { awk -F, '$2 == "keep" && $5 > $4' "$1" | wc -l; }
settled() { awk -F, '$2 == "settled" {s = $1} END {print s ? s : "(not within the run)"}' "$1"; }

from_best=0
for ((i = 1; i <= runs; ++i)); do
  d="$out/best-$i"
  rm -rf "$d"
  "$bin" train "$photos" --set graph.autotune=true --set graph.load_threads=2 --set graph.prefetch=4 \
    --set train.epochs=12 --set seed=$i --out "$d" >/dev/null 2>&1
  k=$(kept "$d/autotune.csv")
  [[ "$k" -gt 0 ]] && from_best=$((from_best + 1))
  echo "photos from 2 threads, prefetch 4, seed $i: $k kept ($(grep -c ',try,' "$d/autotune.csv" || true) tried), settled at batch $(settled "$d/autotune.csv")$(awk -F, '$2 == "keep" {printf "; kept %s %s->%s", $3, $4, $5}' "$d/autotune.csv")"
done
d="$out/bad"
rm -rf "$d"
"$bin" train "$photos" --set graph.autotune=true --set graph.load_threads=1 --set graph.prefetch=1 \
  --set train.epochs=12 --out "$d" >/dev/null 2>&1
echo "photos from 1 thread, prefetch 1: $(awk -F, '$2 == "keep" {printf "%s %s->%s at batch %s; ", $3, $4, $5, $1}' "$d/autotune.csv")settled at batch $(settled "$d/autotune.csv")"
d="$out/fashion"
rm -rf "$d"
"$bin" train configs/fashion_mnist.yaml --set threads=2 --set graph.autotune=true --set graph.load_threads=1 \
  --set train.epochs=1 --out "$d" >/dev/null 2>&1
thread_ups=$(awk -F, '$2 == "keep" && $3 ~ /threads/ && $5 > $4' "$d/autotune.csv" | wc -l)
echo "fashion_mnist (step-bound) from 1 load thread: $(kept "$d/autotune.csv") kept, $thread_ups of them adding a decode thread"
echo "# summary: from the best setting, $from_best of $runs runs kept a change; step-bound: $thread_ups decode threads added"

# ---- reach ------------------------------------------------------------------------
# One run's median images/s over epochs 13-20 (metrics.csv: epoch, ..., images_per_s).
late_rate() { awk -F, 'NR > 1 && $1 >= 13 {print $6}' "$1/metrics.csv" | sort -g |
              awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
settings=("auto" "1 2" "1 4" "2 2" "2 4")
for ((r = 1; r <= rounds; ++r)); do
  for s in "${settings[@]}"; do
    d="$out/reach-${s// /-}-$r"
    rm -rf "$d"
    if [[ "$s" == auto ]]; then
      sets=(--set graph.autotune=true --set graph.load_threads=1 --set graph.prefetch=1)
    else
      read -r t p <<< "$s"
      sets=(--set graph.load_threads="$t" --set graph.prefetch="$p")
    fi
    "$bin" train "$photos" "${sets[@]}" --set train.epochs=20 --set data.test=null --out "$d" >/dev/null 2>&1
    late_rate "$d" >> "$out/reach-${s// /-}.rates"
  done
done
best="" best_rate=0
for s in "${settings[@]}"; do
  f="$out/reach-${s// /-}.rates"
  m=$(median < "$f")
  echo "reach: ${s/auto/autotune from 1 thread, prefetch 1} -> $m img/s over batches 301-500 (runs: $(tr '\n' ' ' < "$f"| sed 's/ $//'))"
  rm -f "$f"
  if [[ "$s" != auto ]] && awk -v a="$m" -v b="$best_rate" 'BEGIN { exit !(a > b) }'; then best=$s; best_rate=$m; fi
  [[ "$s" == auto ]] && auto_rate=$m
done
echo "# reach: autotune from the bad setting runs at $(awk -v a="$auto_rate" -v b="$best_rate" 'BEGIN { printf "%.2f", a / b }')x the best static setting (threads/prefetch ${best/ //}, $best_rate img/s) after 300 batches; medians of $rounds rounds"
