#!/usr/bin/env bash
# Does graph.autotune make only moves it can prove? Trains with autotune on
#   - the loader-bound photo config from the best static setting (2 threads,
#     prefetch 4; `cnnflow tune` finds it), RUNS times: how many runs keep a
#     change (should be none), and from a bad one (1 thread, prefetch 1):
#     where it ends and after how many batches;
#   - the step-bound main job (configs/fashion_mnist.yaml, 2 threads, from 1
#     load thread): whether it ever adds a decode thread.
# Prints one line per run and a summary; the runs' autotune.csv are kept in
# OUT (default /tmp/cnnflow-autotune-check).
#   scripts/prepare_photos.py && bench/autotune_check.sh [RUNS] [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
out=${2:-/tmp/cnnflow-autotune-check}
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
