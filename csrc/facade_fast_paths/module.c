// Module init of commlayer.facade.calls._fast_paths (see facade_fast_paths.h for what it is).
#include "facade_fast_paths.h"

#include "../common/python_module.h"

PyObject *str_dtype, *str_device, *str_layout, *str_is_contiguous, *zero;
PyObject *send_names[5], *recv_names[5];
CommlayerTensorMetaReader tensor_meta_reader;

// set_tensor_meta(reader): called by commlayer/facade/calls/plans.py (see python_module.h).
static PyObject *set_tensor_meta(PyObject *module, PyObject *reader) {
    (void)module;
    return commlayer_set_tensor_meta(reader, &tensor_meta_reader);
}

static int intern_names(PyObject **names, const char *const *spelled) {
    for (int index = 0; index < 5; index++) {
        names[index] = PyUnicode_InternFromString(spelled[index]);
        if (names[index] == NULL) return -1;
    }
    return 0;
}

static PyMethodDef module_methods[] = {
    {"set_tensor_meta", set_tensor_meta, METH_O, "set_tensor_meta(reader): _tensor_meta.READER, or None"},
    {NULL},
};

static struct PyModuleDef fast_paths_module = {
    PyModuleDef_HEAD_INIT, "_fast_paths", "The facade's fast paths: planned ops' lookups, dist's p2p entries.",
    -1, module_methods,
};

PyMODINIT_FUNC PyInit__fast_paths(void) {
    str_dtype = PyUnicode_InternFromString("dtype");
    str_device = PyUnicode_InternFromString("device");
    str_layout = PyUnicode_InternFromString("layout");
    str_is_contiguous = PyUnicode_InternFromString("is_contiguous");
    zero = PyLong_FromLong(0);
    static const char *const send_spelled[5] = {"tensor", "dst", "group", "tag", "group_dst"};
    static const char *const recv_spelled[5] = {"tensor", "src", "group", "tag", "group_src"};
    if (str_dtype == NULL || str_device == NULL || str_layout == NULL || str_is_contiguous == NULL ||
        zero == NULL || check_dict_versions() < 0 || intern_names(send_names, send_spelled) < 0 ||
        intern_names(recv_names, recv_spelled) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&fast_paths_module);
    if (module == NULL) return NULL;
    if (commlayer_add_type(module, "PlannedP2P", &PlannedP2PType) < 0 ||
        commlayer_add_type(module, "PlannedCollective", &PlannedCollectiveType) < 0 ||
        commlayer_add_type(module, "PlannedPaired", &PlannedPairedType) < 0 ||
        commlayer_add_type(module, "P2PEntry", &P2PEntryType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
