// Module init of commlayer.backends._torch_fast_paths (see fast_paths.h for what it is).
#include "fast_paths.h"

#include "../common/python_module.h"

PyObject *str_shape, *str_dim, *str_view, *str_wait, *str_result, *str_torch_work, *str_done, *minus_one, *zero,
    *empty_tuple;

// set_tensor_meta(reader): called by backends/torch_fast_paths.py (see python_module.h).
COMMLAYER_TENSOR_META_READER

static PyMethodDef module_methods[] = {
    {"work_support", work_support, METH_VARARGS, "work_support(TorchWork, raise_typed) -> the C Work type"},
    COMMLAYER_SET_TENSOR_META_METHOD,
    {NULL},
};

static struct PyModuleDef fast_paths_module = {
    PyModuleDef_HEAD_INIT, "_torch_fast_paths", "The torch backends' fast paths for their hot ops.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__torch_fast_paths(void) {
    str_shape = PyUnicode_InternFromString("shape");
    str_dim = PyUnicode_InternFromString("dim");
    str_view = PyUnicode_InternFromString("view");
    str_wait = PyUnicode_InternFromString("wait");
    str_result = PyUnicode_InternFromString("_result");
    str_torch_work = PyUnicode_InternFromString("torch_work");
    str_done = PyUnicode_InternFromString("_done");
    minus_one = PyLong_FromLong(-1);
    zero = PyLong_FromLong(0);
    empty_tuple = PyTuple_New(0);
    // CWorkType is not exported: work_support() hands it to backends/torch_fast_paths.py.
    if (PyType_Ready(&CWorkType) < 0) return NULL;
    static const CommlayerExport exports[] = {{"FastPath", &FastPathType}, {NULL}};
    return commlayer_module(&fast_paths_module, exports);
}
