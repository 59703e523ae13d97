// Shared by the files of commlayer.backends._torch_fast_paths: the torch backends' fast paths in
// C (fast_paths.c) and the Work of their async ops (work.c). module.c makes the module.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "../common/tensor_meta.h"

// Interned names and constants, made once by the module's init (module.c).
extern PyObject *str_shape, *str_dim, *str_view, *str_wait, *str_result, *str_torch_work, *str_done, *minus_one,
    *zero, *empty_tuple;

extern PyTypeObject FastPathType, CWorkType;

// A new C Work (work.c) around torch's Work, its result the one tensor given.
PyObject *cwork_new(PyObject *torch_work, PyObject *result_tensor);
// work_support(TorchWork, raise_typed) -> the C Work type (work.c).
PyObject *work_support(PyObject *module, PyObject *args);
// commlayer.core._tensor_meta's reader, once set_tensor_meta() handed it over (module.c); NULL:
// the tensor's Python attributes are asked.
extern CommlayerTensorMetaReader tensor_meta_reader;
