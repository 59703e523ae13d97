#!/usr/bin/env bash
# Issue 14's figures on the project VM, each in one run against a reference (each run under 5
# minutes on a quiet 2-core VM): the facade's own cost per op on torch's stand-in ProcessGroup
# before (BEFORE, default main at 2713f64: the Python launchers) and after (the C launchers of
# csrc/torch_launcher, built by pip install -e .), the enabled comms logger included; the same
# with the Python launchers in this tree (COMMLAYER_C_LAUNCHER=0); the mpi and oneCCL paths'
# facade cost before and after (a world of one on the real library); the recorder's own cost on
# the null backend.
#
#   bash benchmarks/hotpath_vm.sh        (from the repository root; writes $OUT, default /tmp/hotpath_vm)
set -uo pipefail
OUT=${OUT:-/tmp/hotpath_vm}
PYTHON=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
uptime | tee "$OUT/machine.txt"
lscpu | grep -E '^Model name|^CPU\(s\)' | tee -a "$OUT/machine.txt"
# "after" needs the built C launchers (pip install -e . builds them); False: rebuild first.
"$PYTHON" -c 'from commlayer.backends import _torch_plans as p; print("C launchers:", p.native_enabled())' \
  | tee -a "$OUT/machine.txt"
run() {  # name, then the benchmark's arguments
  local name=$1
  shift
  timeout -k 5 300 "$PYTHON" "$@" 2>&1 | grep -v CCL_WARN | tee "$OUT/$name.txt" || echo "=== $name FAILED or timed out"
}
BEFORE=${BEFORE:-2713f64}
run "standin_vs_$BEFORE" benchmarks/torch_vs_commlayer.py --standin --rounds 61 --iters 10 --before "$BEFORE" --repeats 3
COMMLAYER_C_LAUNCHER=0 run "standin_python_launchers_vs_$BEFORE" benchmarks/torch_vs_commlayer.py --standin \
  --rounds 31 --iters 10 --before "$BEFORE" --repeats 1
run "mpi_vs_$BEFORE" benchmarks/torch_vs_commlayer.py --standin --backend mpi --iters 4 --rounds 61 --before "$BEFORE" --repeats 3
run "ccl_vs_$BEFORE" benchmarks/torch_vs_commlayer.py --standin --backend ccl --iters 2 --rounds 31 --before "$BEFORE" --repeats 1
run recorder_null benchmarks/reliability_overhead.py --iters 20000 --debug-iters 100
