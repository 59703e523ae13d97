# Sourced by the GPU benchmark scripts, which lay commlayer out without pip (gpu_site.sh):
# build_c_fast_paths TREE SITE compiles TREE's C fast paths built on the Python C API alone and,
# where TREE has one, its C tensor reader (against this machine's torch headers, which setup.py
# would use) into SITE/commlayer. Fails when the fast paths do not build; a reader that does not
# build is reported and left out (the fast paths then ask tensors' Python attributes). TREE may be
# an older commit (torch_vs_commlayer.py --standin --before REF): each layout's extensions are
# built where that commit's setup.py put them.
build_c_fast_paths() {
  local tree=$1 site=$2 python=${PYTHON:-python3}
  local suffix include reader extensions
  suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  if [ -d "$tree/csrc/facade_fast_paths" ]; then  # one extension per layer
    extensions="facade_fast_paths:facade/calls/_fast_paths torch_fast_paths:backends/_torch_fast_paths logger_fast_paths:comms_logger/_fast_paths"
    [ -d "$tree/csrc/peermem_fast_paths" ] && extensions+=" peermem_fast_paths:backends/peermem/_fast_paths"
    reader=core/_tensor_meta
  elif [ -d "$tree/csrc/torch_fast_paths" ]; then  # one extension for every layer's fast paths
    extensions="torch_fast_paths:backends/_torch_fast_paths" reader=core/_tensor_meta
  else  # the layout before the layers were folders
    extensions="torch_launcher:backends/_torch_launcher" reader=backends/_tensor_meta
  fi
  local pair
  for pair in $extensions; do
    gcc -O2 -fPIC -shared -fvisibility=hidden -I"$include" -I"$tree/csrc" "$tree/csrc/${pair%%:*}"/*.c \
      -o "$site/commlayer/${pair#*:}$suffix" || return 1
  done
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
      -o "$site/commlayer/$reader$suffix" 2>/dev/null && return 0
  done
  echo "=== the C tensor reader did not build: the fast paths ask tensors' Python attributes"
}
