// Module init of commlayer.facade.calls._fast_paths (see facade_fast_paths.h for what it is).
#include "facade_fast_paths.h"

#include "../common/python_module.h"

PyObject *str_dtype, *str_device, *str_layout, *str_is_contiguous, *zero;
PyObject *send_names[5], *recv_names[5];

// set_tensor_meta(reader): called by commlayer/facade/calls/plans.py (see python_module.h).
COMMLAYER_TENSOR_META_READER

static int intern_names(PyObject **names, const char *const *spelled) {
    for (int index = 0; index < 5; index++) {
        names[index] = PyUnicode_InternFromString(spelled[index]);
        if (names[index] == NULL) return -1;
    }
    return 0;
}

static PyMethodDef module_methods[] = {COMMLAYER_SET_TENSOR_META_METHOD, {NULL}};

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
    static const CommlayerExport exports[] = {
        {"PlannedP2P", &PlannedP2PType},
        {"PlannedCollective", &PlannedCollectiveType},
        {"PlannedPaired", &PlannedPairedType},
        {"P2PEntry", &P2PEntryType},
        {NULL},
    };
    return commlayer_module(&fast_paths_module, exports);
}
