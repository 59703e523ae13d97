#!/usr/bin/env bash
# Issue 14's figures on the project VM, each in one run against a reference (about 4 minutes in
# all on a quiet 2-core VM): the facade's own cost per op on torch's stand-in ProcessGroup before
# (main at f329029, the flight recorder's wrapper) and after; the same against c3ce9eb (this
# issue's hot path before the flight recorder existed: recorder off against on); the mpi and
# oneCCL paths' facade cost before and after (a world of one on the real library, the enabled
# comms logger included); the recorder's own cost on the null backend.
#
#   bash benchmarks/hotpath_vm.sh        (from the repository root; writes $OUT, default /tmp/hotpath_vm)
set -uo pipefail
OUT=${OUT:-/tmp/hotpath_vm}
PYTHON=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
uptime | tee "$OUT/machine.txt"
lscpu | grep -E '^Model name|^CPU\(s\)' | tee -a "$OUT/machine.txt"
run() {  # name, then the benchmark's arguments
  local name=$1
  shift
  timeout -k 5 300 "$PYTHON" "$@" 2>&1 | grep -v CCL_WARN | tee "$OUT/$name.txt" || echo "=== $name FAILED or timed out"
}
run standin_vs_f329029 benchmarks/torch_vs_commlayer.py --standin --rounds 61 --iters 10 --before f329029 --repeats 3
run standin_vs_c3ce9eb benchmarks/torch_vs_commlayer.py --standin --rounds 61 --iters 10 --before c3ce9eb --repeats 3
run mpi_vs_f329029 benchmarks/torch_vs_commlayer.py --standin --backend mpi --iters 4 --rounds 61 --before f329029 --repeats 3
run ccl_vs_f329029 benchmarks/torch_vs_commlayer.py --standin --backend ccl --iters 2 --rounds 31 --before f329029 --repeats 1
run recorder_null benchmarks/reliability_overhead.py --iters 20000 --debug-iters 100
