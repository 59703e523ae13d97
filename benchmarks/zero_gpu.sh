#!/usr/bin/env bash
# commlayer ZeRO-0/1/2/3 against the anchor's DDP, FSDP2 and DeepSpeed ZeRO-1/2/3, one machine, one go.
#
#   bash benchmarks/zero_gpu.sh [MODE ...]        (from the repository root, on a 2-GPU machine)
#
# MODE is any of ddp fsdp2 ds1 ds2 ds3 (the anchor) and cl0 cl1 cl2 cl3 cl1_fused ... (zero_gpu.py);
# default: all but the fused ones. Environment: ANCHOR (zero_anchor.py; default
# shared/anchors/zero_anchor.py), OUT (results folder; default $OUT or /tmp/zero_gpu), NPROC (2),
# STEPS (20), WARMUP (5). Wheels found in .whl/ (DeepSpeed, pydantic, ...) are installed into a
# --target folder, and commlayer itself is laid out there by hand (package, backends and entry
# points), which needs no build tools on the GPU machine (the optional oneCCL extension is left out).
set -uo pipefail
ANCHOR=${ANCHOR:-shared/anchors/zero_anchor.py}
OUT=${OUT:-/tmp/zero_gpu}
NPROC=${NPROC:-2}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-5}
MODES=("$@")
[ ${#MODES[@]} -eq 0 ] && MODES=(ddp fsdp2 ds1 ds2 ds3 cl0 cl1 cl2 cl3)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

SITE=/tmp/zero_site
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 1
fi
rm -rf "$SITE/commlayer" "$SITE"/commlayer-*.dist-info && mkdir -p "$SITE/commlayer-0.1.0.dist-info" || exit 1
cp -r commlayer "$SITE/commlayer" && cp -r backends "$SITE/commlayer/backends" || exit 1
python3 - "$SITE/commlayer-0.1.0.dist-info" <<'PY' || exit 1
import sys, tomllib
from pathlib import Path
info, project = Path(sys.argv[1]), tomllib.loads(Path("pyproject.toml").read_text())["project"]
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: commlayer\nVersion: {project['version']}\n")
lines = []
for group, points in project["entry-points"].items():
    lines += [f"[{group}]", *(f"{name} = {target}" for name, target in points.items()), ""]
(info / "entry_points.txt").write_text("\n".join(lines))
PY
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
(cd /tmp && python3 -c 'import commlayer; print(commlayer.__file__, [(b.name, bool(b.availability)) for b in commlayer.list_backends()])') || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/machine.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$OUT/machine.txt"

for mode in "${MODES[@]}"; do
  case "$mode" in
    cl*) stage=${mode:2:1}; extra=(); [[ "$mode" == *_fused ]] && extra=(--fused)
         command=(benchmarks/zero_gpu.py --stage "$stage" --anchor "$ANCHOR" "${extra[@]}") ;;
    *)   command=("$ANCHOR" --mode "$mode") ;;
  esac
  echo "=== $mode" | tee -a "$OUT/log.txt"
  python3 -m torch.distributed.run --standalone --nproc-per-node "$NPROC" "${command[@]}" --steps "$STEPS" --warmup "$WARMUP" \
    2>&1 | tee -a "$OUT/log.txt" | grep '^{' >> "$OUT/results.jsonl" || echo "=== $mode FAILED (see log.txt)" | tee -a "$OUT/log.txt"
done
python3 benchmarks/zero_report.py "$OUT/results.jsonl" | tee "$OUT/table.md"
