// Module init of commlayer.backends._torch_launcher (see launcher.c for what it is).
#include "launcher.h"

PyObject *str_shape, *str_dim, *str_view, *str_wait, *str_result, *str_torch_work, *str_done, *str_dtype,
    *str_device, *str_layout, *str_is_contiguous, *minus_one, *zero, *empty_tuple;

static PyMethodDef module_methods[] = {
    {"work_support", work_support, METH_VARARGS, "work_support(TorchWork, raise_typed) -> the C Work type"},
    {NULL},
};

static struct PyModuleDef launcher_module = {
    PyModuleDef_HEAD_INIT, "_torch_launcher", "Fused C launchers for the torch backends' hot ops.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__torch_launcher(void) {
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
    str_dtype = PyUnicode_InternFromString("dtype");
    str_device = PyUnicode_InternFromString("device");
    str_layout = PyUnicode_InternFromString("layout");
    str_is_contiguous = PyUnicode_InternFromString("is_contiguous");
    if (PyType_Ready(&LauncherType) < 0 || PyType_Ready(&PlannedP2PType) < 0 ||
        PyType_Ready(&PlannedCollectiveType) < 0 || PyType_Ready(&CWorkType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&launcher_module);
    if (module == NULL) return NULL;
    Py_INCREF(&LauncherType);
    if (PyModule_AddObject(module, "Launcher", (PyObject *)&LauncherType) < 0) {
        Py_DECREF(&LauncherType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&PlannedP2PType);
    if (PyModule_AddObject(module, "PlannedP2P", (PyObject *)&PlannedP2PType) < 0) {
        Py_DECREF(&PlannedP2PType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&PlannedCollectiveType);
    if (PyModule_AddObject(module, "PlannedCollective", (PyObject *)&PlannedCollectiveType) < 0) {
        Py_DECREF(&PlannedCollectiveType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
