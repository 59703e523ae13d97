#!/usr/bin/env bash
# Issue 14's async send/recv, this tree against an earlier one on the same GPU machine: send/recv
# alone (sync and async, 8 B-4 MiB, 61 rounds, pinned, with the raw/raw control), the two trees in
# alternating runs (REPEATS each), each laid out by gpu_site.sh with its C launchers compiled.
#
#   BEFORE_TREE=../before bash benchmarks/p2p_before_after_gpu.sh   (from the repository root;
#   BEFORE_TREE: a checkout of the earlier commit, e.g. `git archive REF | tar -x -C ../before`)
set -uo pipefail
OUT=${OUT:-/tmp/p2p_before_after}
BEFORE_TREE=$(cd "${BEFORE_TREE:?a checkout of the earlier commit}" && pwd)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source benchmarks/gpu_build.sh
lay_out() {  # tree, site: commlayer laid out in site, its C launchers (and tensor reader) compiled
  (cd "$1" && SITE=$2 && source benchmarks/gpu_site.sh >/dev/null && build_c_launchers . "$2")
}
lay_out . /tmp/site_after && lay_out "$BEFORE_TREE" /tmp/site_before || exit 1
for run in $(seq "${REPEATS:-2}"); do
  for side in after before; do
    PYTHONPATH=/tmp/site_$side timeout -k 5 120 python3 benchmarks/torch_vs_commlayer.py --nproc 2 \
      --backend nccl --ops send_recv --min-bytes 8 --max-bytes 4M --factor 4 --rounds 61 --control --pin \
      2>&1 | grep -v Warning | tee "$OUT/${side}_$run.txt" | tail -n 2
  done
done
