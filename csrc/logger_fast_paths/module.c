// Module init of commlayer.comms_logger._fast_paths (see logger_fast_paths.h for what it is).
#include "logger_fast_paths.h"

#include "../common/python_module.h"

// set_tensor_meta(reader): called by commlayer/comms_logger/timer.py (see python_module.h).
COMMLAYER_TENSOR_META_READER

static PyMethodDef module_methods[] = {COMMLAYER_SET_TENSOR_META_METHOD, {NULL}};

static struct PyModuleDef fast_paths_module = {
    PyModuleDef_HEAD_INIT, "_fast_paths", "The comms logger's fast path: its timer and the ring it writes.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__fast_paths(void) {
    if (timed_init_names() < 0) return NULL;
    static const CommlayerExport exports[] = {{"Timed", &TimedType}, {"TimedLog", &TimedLogType}, {NULL}};
    return commlayer_module(&fast_paths_module, exports);
}
