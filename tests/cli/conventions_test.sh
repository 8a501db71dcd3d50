#!/usr/bin/env bash
# The command line's conventions: --help, help COMMAND, COMMAND --help (every
# command) and --version exit 0 with their text on stdout and nothing on
# stderr; wrong arguments (an unknown command, an unknown flag, a flag
# without its value, a bad value, a missing CONFIG) exit 2 with the error
# and the usage line on stderr and nothing on stdout.
#   usage: conventions_test.sh CNNFLOW_BINARY
set -u
cnnflow="$1"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# ok WANT_PREFIX ARGS...: exit 0, stdout starts with WANT_PREFIX, stderr empty.
ok() {
  local want=$1; shift
  "$cnnflow" "$@" > "$out/stdout" 2> "$out/stderr"
  local rc=$?
  [[ $rc == 0 ]] || fail "cnnflow $* exited $rc"
  [[ $(head -c ${#want} "$out/stdout") == "$want" ]] || fail "cnnflow $*: stdout starts: $(head -2 "$out/stdout")"
  [[ -s "$out/stderr" ]] && fail "cnnflow $*: wrote to stderr: $(cat "$out/stderr")"
  return 0
}
# usage_error WANT_ERROR USAGE_PREFIX ARGS...: exit 2, stderr has WANT_ERROR and a
# line starting USAGE_PREFIX, stdout empty.
usage_error() {
  local want=$1 usage=$2; shift 2
  "$cnnflow" "$@" > "$out/stdout" 2> "$out/stderr"
  local rc=$?
  [[ $rc == 2 ]] || fail "cnnflow $* exited $rc, not 2: $(cat "$out/stderr")"
  grep -qF -- "$want" "$out/stderr" || fail "cnnflow $*: stderr lacks '$want': $(cat "$out/stderr")"
  grep -q "^$usage" "$out/stderr" || fail "cnnflow $*: no usage line '$usage' on stderr"
  [[ -s "$out/stdout" ]] && fail "cnnflow $*: wrote to stdout: $(cat "$out/stdout")"
  return 0
}

ok "usage: cnnflow COMMAND" --help
ok "usage: cnnflow COMMAND" -h
ok "usage: cnnflow COMMAND" help
ok "cnnflow 0." --version
for c in train launch eval tune bench validate graph devices stages; do
  ok "usage: cnnflow $c" "$c" --help
  ok "usage: cnnflow $c" help "$c"
done
ok "usage: cnnflow train CONFIG" train configs/fashion_mnist.yaml --set train.epochs=1 -h
ok "usage: cnnflow convert" convert --help
ok "usage: cnnflow convert" help convert

usage_error "unknown command 'frobnicate'" "usage: cnnflow COMMAND" frobnicate
usage_error "unknown command 'frobnicate'" "usage: cnnflow COMMAND" frobnicate --help
usage_error "unknown command 'frobnicate'" "usage: cnnflow COMMAND" help frobnicate
usage_error "no command given" "usage: cnnflow COMMAND"
usage_error "unknown option '--bogus'" "usage: cnnflow train" train configs/fashion_mnist.yaml --bogus
usage_error "--weights needs a value" "usage: cnnflow eval" eval configs/fashion_mnist.yaml --weights
usage_error "--steps needs a whole number >= 1, got 'x'" "usage: cnnflow tune" tune configs/fashion_mnist.yaml --steps x
usage_error "needs a CONFIG file" "usage: cnnflow validate" validate
usage_error "unknown option '--bogus'" "usage: cnnflow convert" convert --bogus
usage_error "--to needs a value" "usage: cnnflow convert" convert --from folder x --to
usage_error "--on-bad expects fail or skip, got 'maybe'" "usage: cnnflow convert" convert --from folder x --to y --on-bad maybe
usage_error "--max-restarts needs a whole number >= 0, got 'x'" "usage: cnnflow launch" launch --max-restarts x -- "$cnnflow" train c.yaml --out d
usage_error "the train command needs --out RUN_DIR" "usage: cnnflow launch" launch -- "$cnnflow" train configs/fashion_mnist.yaml
usage_error "the command must run \`cnnflow train\`" "usage: cnnflow launch" launch -- sleep 1
# Inside mpirun one rank cannot relaunch the others: --max-restarts is refused there.
OMPI_COMM_WORLD_SIZE=2 "$cnnflow" train configs/fashion_mnist.yaml --out "$out/x" --max-restarts 1 > "$out/stdout" 2> "$out/stderr"
[[ $? == 2 ]] && grep -q "cnnflow launch --max-restarts N -n RANKS -- cnnflow train" "$out/stderr" ||
  fail "train --max-restarts under mpirun: $(cat "$out/stderr")"
echo "PASS: --help, --version and usage errors"
