#!/usr/bin/env bash
# torch_malloc.sh: the allocator the PyTorch peer of the CPU benchmarks runs
# on. PyTorch's own CPU launcher (torch.backends.xeon.run_cpu) preloads
# tcmalloc where it finds it: glibc's malloc maps every block over 32 MB
# afresh, so each training step faults its activations in again (a third of
# an fp32 airbench step in the kernel; tcmalloc: 1.26x faster in fp32, 1.13x
# in bf16, bench/results/2026-12-05-time-to-accuracy-fp32.md). cnnflow keeps
# its buffers across steps and gains nothing from it.
#
# usage: bench/torch_malloc.sh [auto|tcmalloc|glibc]
#   auto (default)  tcmalloc where the system has it, else glibc (with a
#                   warning on stderr: the peer is then not at its best)
#   tcmalloc        tcmalloc or fail
#   glibc           the system malloc (the rows before 2026-12-05)
# Prints one line "NAME PRELOAD": NAME tcmalloc or glibc, PRELOAD the path to
# put in LD_PRELOAD (empty for glibc). Debian: apt-get install
# libgoogle-perftools4 (CNNFLOW_SETUP_BENCH=1 scripts/setup.sh installs it).
set -euo pipefail

want="${1:-auto}"
case "$want" in auto|tcmalloc|glibc) ;; *) echo "torch_malloc.sh: auto, tcmalloc or glibc, not '$want'" >&2; exit 2 ;; esac
if [[ "$want" == glibc ]]; then echo "glibc "; exit 0; fi
lib=""
for name in libtcmalloc.so.4 libtcmalloc_minimal.so.4; do
  lib=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n && !f { print $NF; f = 1 }')
  [[ -n "$lib" ]] && break
done
if [[ -n "$lib" ]]; then echo "tcmalloc $lib"; exit 0; fi
if [[ "$want" == tcmalloc ]]; then
  echo "torch_malloc.sh: no tcmalloc (libtcmalloc.so.4) on this system: apt-get install libgoogle-perftools4" >&2
  exit 1
fi
echo "torch_malloc.sh: no tcmalloc here: PyTorch runs on glibc's malloc, 1.1-1.3x slower than at its best (apt-get install libgoogle-perftools4)" >&2
echo "glibc "
