// Module init of commlayer.backends.peermem._fast_paths (see kernel_path.c for what it is).
#include "peermem_fast_paths.h"

#include "../common/python_module.h"

PyObject *str_last, *str_handle, *str_stream;

// set_tensor_meta(reader): called by backends/peermem/fast_path.py (see python_module.h).
COMMLAYER_TENSOR_META_READER

static PyMethodDef module_methods[] = {
    COMMLAYER_SET_TENSOR_META_METHOD,
    {NULL},
};

static struct PyModuleDef fast_paths_module = {
    PyModuleDef_HEAD_INIT, "_fast_paths", "The fast path of the ops peermem's kernels serve.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__fast_paths(void) {
    str_last = PyUnicode_InternFromString("last");
    str_handle = PyUnicode_InternFromString("handle");
    str_stream = PyUnicode_InternFromString("stream");
    if (str_last == NULL || str_handle == NULL || str_stream == NULL) return NULL;
    static const CommlayerExport exports[] = {{"KernelPath", &KernelPathType}, {NULL}};
    return commlayer_module(&fast_paths_module, exports);
}
