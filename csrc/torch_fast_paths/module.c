// Module init of commlayer.backends._torch_fast_paths (see fast_paths.h for what it is).
#include "fast_paths.h"

#include "../common/python_module.h"

PyObject *str_shape, *str_dim, *str_view, *str_wait, *str_result, *str_torch_work, *str_done, *minus_one, *zero,
    *empty_tuple;
CommlayerTensorMetaReader tensor_meta_reader;

// set_tensor_meta(reader): called by backends/torch_fast_paths.py (see python_module.h).
static PyObject *set_tensor_meta(PyObject *module, PyObject *reader) {
    (void)module;
    return commlayer_set_tensor_meta(reader, &tensor_meta_reader);
}

static PyMethodDef module_methods[] = {
    {"work_support", work_support, METH_VARARGS, "work_support(TorchWork, raise_typed) -> the C Work type"},
    {"set_tensor_meta", set_tensor_meta, METH_O, "set_tensor_meta(reader): _tensor_meta.READER, or None"},
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
    PyObject *module = PyModule_Create(&fast_paths_module);
    if (module == NULL) return NULL;
    // CWorkType is not exported: work_support() hands it to backends/torch_fast_paths.py.
    if (PyType_Ready(&CWorkType) < 0 || commlayer_add_type(module, "FastPath", &FastPathType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
