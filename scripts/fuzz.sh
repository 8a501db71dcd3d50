#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang-14, ASan + UBSan) into
# build-fuzz/ and runs each for SECONDS (default 60), one at a time, then
# prints per target the executions, wall and CPU seconds, and the findings.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET ...]   # default: every target
#
# Each target starts from its committed seeds (fuzz/corpus/<target>/) and
# from what earlier runs found (build-fuzz/corpus/<target>/, kept between
# runs). A finding (crash, sanitizer report, uncaught non-cnnflow exception,
# a slow input over 10 s, an allocation over 1 GB or RSS over 2 GB) is saved as
# build-fuzz/findings/<target>/{crash,timeout,oom,leak}-<hash>; replay it
# with build-fuzz/fuzz_<target> FILE, fix the parser, and commit the file to
# fuzz/regressions/<target>/ (the ctest fuzz_regression_test replays those).
# Exit status: 1 when any target had a finding. FUZZ_CPU=1 makes SECONDS
# CPU seconds of the fuzzer (user + sys) instead of wall seconds: it is
# stopped with SIGINT (libFuzzer then prints its final stats) once it has
# had them, however busy the machine is; a slow input is then one over 60 s
# of wall time (a starved fuzzer can wait 10 s for the CPU, which is no
# finding). Env: FUZZ_NICE (default 15),
# FUZZ_BUILD (default build-fuzz), CXX_FUZZ (default clang++-14), FUZZ_FLAGS
# (more libFuzzer flags; "-fork=1 -ignore_crashes=1 -ignore_ooms=1
# -ignore_timeouts=1" goes on past findings, collecting them all).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
build=${FUZZ_BUILD:-build-fuzz}
nice=${FUZZ_NICE:-15}
cxx=${CXX_FUZZ:-clang++-14}
cc=${cxx/clang++/clang}
if ! command -v "$cxx" >/dev/null; then
  echo "fuzz: $cxx not found (Debian 12: apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 2
fi

if [[ ! -f $build/build.ninja ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" \
    -DCNNFLOW_FUZZ=ON -DCNNFLOW_BUILD_TESTS=OFF -DCNNFLOW_BUILD_BENCH=OFF \
    -DCNNFLOW_WITH_CUDA=OFF -DCNNFLOW_NATIVE=OFF >/dev/null
fi
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=($(ls fuzz/corpus))
fi
nice -n "$nice" ninja -C "$build" "${targets[@]/#/fuzz_}" | tail -n 1

# FUZZ_CPU: the wall limit is only a backstop, the CPU watcher stops the run.
max_wall=$seconds unit_timeout=10
[[ -z ${FUZZ_CPU:-} ]] || max_wall=$((seconds * 50)) unit_timeout=60
# stop_after_cpu PID SECONDS: SIGINT to PID once it (with its reaped -fork
# children) has used SECONDS of CPU.
stop_after_cpu() {
  local tck stat f
  tck=$(getconf CLK_TCK)
  while kill -0 "$1" 2>/dev/null; do
    stat=$(<"/proc/$1/stat") || return 0
    read -ra f <<<"${stat##*) }"  # f[11..14]: utime stime cutime cstime
    if (((f[11] + f[12] + f[13] + f[14]) >= $2 * tck)); then
      kill -INT "$1" 2>/dev/null
      return 0
    fi
    sleep 2
  done
}

# The targets that parse a file write each input to a scratch folder under
# $TMPDIR first (fuzz/scratch.h): on a disk idx spent 78% of its CPU time
# in the kernel, and waited on I/O, so it goes to memory when /dev/shm is.
[[ -n ${TMPDIR:-} || ! -w /dev/shm ]] || export TMPDIR=/dev/shm

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
status=0
summary=()
for t in "${targets[@]}"; do
  bin=$build/fuzz_$t
  [[ -x $bin ]] || { echo "fuzz: no target $t ($bin)" >&2; exit 2; }
  mkdir -p "$build/corpus/$t" "$build/findings/$t" "$build/logs"
  log=$build/logs/$t.log
  before=$(ls "$build/findings/$t" | wc -l)
  dict=()  # fuzz/<target>.dict, or fuzz/yaml.dict for the YAML targets
  [[ $t == run_config || $t == graph_template ]] && dict=(-dict=fuzz/yaml.dict)
  [[ -f fuzz/$t.dict ]] && dict=(-dict="fuzz/$t.dict")
  start=$(date +%s.%N)
  TIMEFORMAT='%U %S'
  # libFuzzer writes new inputs to the first folder; the seeds stay as committed.
  cpu=$( { time (
             nice -n "$nice" "$bin" -max_total_time="$max_wall" -timeout="$unit_timeout" \
               -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 \
               -artifact_prefix="$build/findings/$t/" "${dict[@]}" ${FUZZ_FLAGS:-} "$build/corpus/$t" "fuzz/corpus/$t" \
               >"$log" 2>&1 &
             pid=$!
             [[ -z ${FUZZ_CPU:-} ]] || stop_after_cpu "$pid" "$seconds"
             wait "$pid" || true
           ); } 2>&1 )
  wall=$(echo "$(date +%s.%N) - $start" | bc)
  cpu_s=$(echo "$cpu" | awk '{printf "%.0f", $1 + $2}')
  # Plain runs end with stat::number_of_executed_units; -fork runs count in
  # their progress lines ("#EXECS: cov: ...") and end with a stat line of 0.
  execs=$( (grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$';
            grep -o '^#[0-9]*: cov' "$log" | tr -dc '0-9\n') | sort -n | tail -n 1 || true)
  found=$(( $(ls "$build/findings/$t" | wc -l) - before ))
  line=$(printf '%-20s %10s execs %7.0f s wall %6s s CPU  %s' "$t" "${execs:-?}" "$wall" "$cpu_s" \
         "$([[ $found == 0 ]] && echo "no findings" || echo "$found FINDING(S): see $log")")
  echo "$line"
  summary+=("$line")
  ((found == 0)) || status=1
done
echo "fuzz: ${#targets[@]} targets, ${seconds} s$([[ -z ${FUZZ_CPU:-} ]] || echo " of CPU") each:"
printf '  %s\n' "${summary[@]}"
exit $status
