# Sourced by the GPU benchmark scripts: installs the wheels found in .whl/ (DeepSpeed, pydantic, ...)
# into a --target folder and lays commlayer out there by hand (package, backends and entry points),
# compiling only the C fast paths there (the optional oneCCL extension is left out).
# Sets PYTHONPATH and writes the machine's description to "$OUT/machine.txt".
SITE=${SITE:-/tmp/zero_site}
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
# The C fast paths, and the peermem kernels' sources where an installed wheel keeps them.
source benchmarks/gpu/build.sh && build_c_fast_paths . "$SITE" >&2 || echo "=== C fast paths not built" >&2
mkdir -p "$SITE/commlayer/backends/peermem/_csrc" && cp csrc/peermem/* "$SITE/commlayer/backends/peermem/_csrc/"
(cd /tmp && python3 -c 'import commlayer; print(commlayer.__file__, [(b.name, bool(b.availability)) for b in commlayer.list_backends()])') || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/machine.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$OUT/machine.txt"
