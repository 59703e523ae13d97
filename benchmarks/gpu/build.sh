# Sourced by the GPU benchmark scripts, which lay commlayer out without pip (gpu_site.sh):
# build_c_launchers TREE SITE compiles TREE's torch C fast paths (Python C API only) into
# SITE/commlayer/backends and, where TREE has one, its C tensor reader (against this machine's
# torch headers, which setup.py would use) into SITE/commlayer/core, as setup.py names them. Fails
# when the fast paths do not build; a reader that does not build is reported and left out (the
# fast paths then ask tensors' Python attributes).
build_c_launchers() {
  local tree=$1 backends=$2/commlayer/backends core=$2/commlayer/core python=${PYTHON:-python3}
  local suffix include
  suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  gcc -O2 -fPIC -shared -fvisibility=hidden -I"$include" -I"$tree/csrc" "$tree"/csrc/torch_fast_paths/*.c \
    -o "$backends/_torch_fast_paths$suffix" || return 1
  [ -f "$tree/csrc/tensor_meta/reader.cpp" ] || return 0
  local flags
  flags=$("$python" - <<'PY'
import pathlib, torch
from torch.utils.cpp_extension import include_paths
lib = pathlib.Path(torch.__file__).parent / "lib"
print(" ".join([f"-I{path}" for path in include_paths()] + [f"-L{lib}", f'-DCOMMLAYER_TORCH_VERSION="{torch.__version__}"',
      f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]))
PY
  )
  for standard in c++20 c++17; do  # torch 2.13's headers want C++20; older ones build with 17
    # shellcheck disable=SC2086  # flags is a list of words
    g++ -std=$standard -O2 -fPIC -shared -fvisibility=hidden -w -I"$include" -I"$tree/csrc" $flags \
      "$tree/csrc/tensor_meta/reader.cpp" -ltorch_python -ltorch_cpu -lc10 \
      -o "$core/_tensor_meta$suffix" 2>/dev/null && return 0
  done
  echo "=== the C tensor reader did not build: the launchers ask tensors' Python attributes"
}
