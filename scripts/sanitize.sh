#!/usr/bin/env bash
# The test suite under the sanitizers, each in a build folder of its own
# (CUDA off, -O1 -g -fno-omit-frame-pointer), then ctest:
#
#   scripts/sanitize.sh address [CTEST_ARGS...]  # build-asan/: every non-GPU test,
#                                                # ASan + UBSan (UB fatal) + LSan
#   scripts/sanitize.sh thread  [CTEST_ARGS...]  # build-tsan/: the threaded suites, TSan
#
# CTEST_ARGS go to ctest as they are (e.g. -R Collective to run fewer).
# Suppressions, all for third-party code, each with its reason, are in
# scripts/sanitize/{lsan,ubsan,tsan}.supp; docs/testing.md "Sanitizers" says what
# runs where and how long it takes.
#
# address: with clang-14 the build is the fuzz configuration
# (-DCNNFLOW_FUZZ=ON: ASan + UBSan plus libFuzzer's coverage counters) with
# the tests on, so build-asan/ also holds the fuzz binaries:
# FUZZ_BUILD=build-asan scripts/fuzz.sh 600 run_config fuzzes the two config
# targets without a second sanitized build of the whole project. Without
# clang-14 it builds with g++ (-DCNNFLOW_SANITIZE=address).
#
# thread: TSan sees an order between two threads only through code it
# instrumented. Debian's libtbb is not, so every message a flow-graph node
# hands to another would look like a race. The script therefore builds
# oneTBB 2021.8 (the version of Debian's headers) with -fsanitize=thread
# into build-tsan/tbb/ and links the tests against it. It takes the source
# from $CNNFLOW_TBB_SRC, else clones the v2021.8.0 tag from GitHub. libgomp
# (oneDNN's OpenMP) and OpenBLAS are not instrumented either: the run sets
# OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 (what cnnflow's own workers
# use, TOOLCHAIN.md), so their kernels run on the calling thread and every
# thread TSan watches is one of ours or TBB's.
#
# Env: SANITIZE_JOBS (ninja and ctest -j, default 2), SANITIZE_NICE (default
# 10), CXX_SANITIZE (default clang++-14, else g++).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mode=${1:-}
shift || true
case $mode in
  address) build=build-asan ;;
  thread) build=build-tsan ;;
  *)
    echo "usage: scripts/sanitize.sh address|thread [CTEST_ARGS...]" >&2
    exit 2
    ;;
esac
jobs=${SANITIZE_JOBS:-2}
nice=${SANITIZE_NICE:-10}
cxx=${CXX_SANITIZE:-clang++-14}
command -v "$cxx" >/dev/null || cxx=g++
cc=${cxx/clang++/clang}
cc=${cc/g++/gcc}
supp=$root/scripts/sanitize

# The threaded suites (docs/testing.md, "Sanitizers"): in-process collectives, data,
# tensor and pipeline parallel replicas with SyncBN and the tensor-parallel
# member threads, the flow-graph executor and the loader stages
# (ordered/unordered load, prefetch limiter, live knobs, mixup), the autotuner and
# tuner, the profiler's per-thread spans, training through the graph and
# its resume sweep, and the MPI collectives across two processes.
thread_suites='^(Collective|DataParallel|TensorParallel|PipelineModel|ExecutorTest|LoadBatchTest'
thread_suites+='|PrefetchTest|MixupTest|Autotuner|Tuner'
thread_suites+='|BatchNormSync|MemberThreads|Trace|Training|DataParallelTraining|PipelineTraining'
thread_suites+='|TensorParallelTraining|Modes/ResumeSweep)\.|^mpi\.collectives$'

cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCNNFLOW_WITH_CUDA=OFF -DCNNFLOW_BUILD_BENCH=OFF
            -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx"
            "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -fno-omit-frame-pointer"
            "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g -fno-omit-frame-pointer")
targets=()
ctest_filter=()
if [[ $mode == address ]]; then
  if [[ $cxx == clang* ]]; then
    cmake_args+=(-DCNNFLOW_FUZZ=ON)
  else
    cmake_args+=(-DCNNFLOW_SANITIZE=address)
  fi
  # detect_leaks: LSan at exit; Open MPI's allocations are suppressed by library.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:check_initialization_order=1}
  export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$supp/lsan.supp:print_suppressions=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp}
  ctest_filter=(-E GPU)
else
  cmake_args+=(-DCNNFLOW_SANITIZE=thread)
  tbb_src=${CNNFLOW_TBB_SRC:-$root/$build/onetbb-src}
  if [[ ! -f $build/tbb/lib/cmake/TBB/TBBConfig.cmake ]]; then
    if [[ ! -f $tbb_src/CMakeLists.txt ]]; then
      git clone --depth 1 --branch v2021.8.0 https://github.com/oneapi-src/oneTBB.git "$tbb_src" || {
        echo "sanitize: could not clone oneTBB; offline, point CNNFLOW_TBB_SRC at a v2021.8.0 source" \
             "tree (e.g. git -C ONETBB_CLONE archive v2021.8.0 | tar -x -C DIR)" >&2
        exit 2
      }
    fi
    cmake -S "$tbb_src" -B "$build/tbb-build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DTBB_SANITIZE=thread -DTBB_TEST=OFF \
      -DTBB_EXAMPLES=OFF -DTBB_STRICT=OFF -DTBBMALLOC_BUILD=OFF -DCMAKE_INSTALL_PREFIX="$root/$build/tbb" \
      -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
    nice -n "$nice" ninja -C "$build/tbb-build" -j "$jobs" install | tail -n 1
  fi
  cmake_args+=(-DTBB_DIR="$root/$build/tbb/lib/cmake/TBB")
  targets=(ops_test stages_test pipeline_test collective_mpi_test)
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp}
  export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
  ctest_filter=(-R "$thread_suites" -E GPU)
fi

start=$(date +%s)
cmake -S . -B "$build" "${cmake_args[@]}" >/dev/null
# The test binaries run at build time (gtest_discover_tests), under the
# options exported above.
nice -n "$nice" ninja -C "$build" -j "$jobs" "${targets[@]}" | tail -n 1
built=$(date +%s)
echo "sanitize $mode: built in $((built - start)) s"
status=0
(cd "$build" && nice -n "$nice" ctest --output-on-failure -j "$jobs" --timeout 1800 "${ctest_filter[@]}" "$@") ||
  status=$?
echo "sanitize $mode: build $((built - start)) s, ctest $(($(date +%s) - built)) s, exit $status"
exit $status
