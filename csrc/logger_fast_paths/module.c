// Module init of commlayer.comms_logger._fast_paths (see logger_fast_paths.h for what it is).
#include "logger_fast_paths.h"

#include "../common/python_module.h"

CommlayerTensorMetaReader tensor_meta_reader;

// set_tensor_meta(reader): called by commlayer/comms_logger/timer.py (see python_module.h).
static PyObject *set_tensor_meta(PyObject *module, PyObject *reader) {
    (void)module;
    return commlayer_set_tensor_meta(reader, &tensor_meta_reader);
}

static PyMethodDef module_methods[] = {
    {"set_tensor_meta", set_tensor_meta, METH_O, "set_tensor_meta(reader): _tensor_meta.READER, or None"},
    {NULL},
};

static struct PyModuleDef fast_paths_module = {
    PyModuleDef_HEAD_INIT, "_fast_paths", "The comms logger's fast path: its timer and the ring it writes.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__fast_paths(void) {
    if (timed_init_names() < 0) return NULL;
    PyObject *module = PyModule_Create(&fast_paths_module);
    if (module == NULL) return NULL;
    if (commlayer_add_type(module, "Timed", &TimedType) < 0 ||
        commlayer_add_type(module, "TimedLog", &TimedLogType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
