// Module init of commlayer.backends._torch_fast_paths (see launcher.c for what it is).
#include "fast_paths.h"

PyObject *str_shape, *str_dim, *str_view, *str_wait, *str_result, *str_torch_work, *str_done, *str_dtype,
    *str_device, *str_layout, *str_is_contiguous, *minus_one, *zero, *empty_tuple;
PyObject *send_names[5], *recv_names[5];
CommlayerTensorMetaReader tensor_meta_reader;

// set_tensor_meta(reader): the capsule of commlayer.core._tensor_meta, or None to ask tensors'
// Python attributes again. Called by commlayer.dist with what commlayer/core/tensor_reader.py allows:
// only a reader built for this torch version (another torch's headers would misread every tensor).
static PyObject *set_tensor_meta(PyObject *module, PyObject *reader) {
    (void)module;
    if (reader == Py_None) {
        tensor_meta_reader = NULL;
        Py_RETURN_NONE;
    }
    void *function = PyCapsule_GetPointer(reader, COMMLAYER_TENSOR_META_CAPSULE);
    if (function == NULL) return NULL;
    tensor_meta_reader = (CommlayerTensorMetaReader)function;
    Py_RETURN_NONE;
}

static int intern_names(PyObject **names, const char *const *spelled) {
    for (int index = 0; index < 5; index++) {
        names[index] = PyUnicode_InternFromString(spelled[index]);
        if (names[index] == NULL) return -1;
    }
    return 0;
}

static PyMethodDef module_methods[] = {
    {"work_support", work_support, METH_VARARGS, "work_support(TorchWork, raise_typed) -> the C Work type"},
    {"set_tensor_meta", set_tensor_meta, METH_O, "set_tensor_meta(reader): _tensor_meta.READER, or None"},
    {NULL},
};

static struct PyModuleDef launcher_module = {
    PyModuleDef_HEAD_INIT, "_torch_fast_paths", "Fused C launchers for the torch backends' hot ops.", -1,
    module_methods,
};

static int add_type(PyObject *module, const char *name, PyTypeObject *type) {
    if (PyType_Ready(type) < 0) return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

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
    str_dtype = PyUnicode_InternFromString("dtype");
    str_device = PyUnicode_InternFromString("device");
    str_layout = PyUnicode_InternFromString("layout");
    str_is_contiguous = PyUnicode_InternFromString("is_contiguous");
    static const char *const send_spelled[5] = {"tensor", "dst", "group", "tag", "group_dst"};
    static const char *const recv_spelled[5] = {"tensor", "src", "group", "tag", "group_src"};
    if (timed_init_names() < 0 || check_dict_versions() < 0 || intern_names(send_names, send_spelled) < 0 ||
        intern_names(recv_names, recv_spelled) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&launcher_module);
    if (module == NULL) return NULL;
    // CWorkType is not exported: work_support() hands it to the torch plans.
    if (PyType_Ready(&CWorkType) < 0 || add_type(module, "Launcher", &LauncherType) < 0 ||
        add_type(module, "PlannedP2P", &PlannedP2PType) < 0 ||
        add_type(module, "PlannedCollective", &PlannedCollectiveType) < 0 ||
        add_type(module, "PlannedPaired", &PlannedPairedType) < 0 ||
        add_type(module, "P2PEntry", &P2PEntryType) < 0 || add_type(module, "Timed", &TimedType) < 0 ||
        add_type(module, "TimedLog", &TimedLogType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
