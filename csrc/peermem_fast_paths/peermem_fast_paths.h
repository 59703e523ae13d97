// Shared by the files of commlayer.backends.peermem._fast_paths: the fast path of the ops
// peermem's kernels serve (kernel_path.c); module.c makes the module.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#include "../common/tensor_meta.h"

extern PyTypeObject KernelPathType;
// Interned attribute names, made once by the module's init (module.c).
extern PyObject *str_last, *str_handle, *str_stream;
// commlayer.core._tensor_meta's reader, once set_tensor_meta() handed it over (module.c); NULL:
// every call goes to the Python twin.
extern CommlayerTensorMetaReader tensor_meta_reader;
