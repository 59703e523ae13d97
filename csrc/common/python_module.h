// What each of commlayer's C extensions built on the Python C API alone (the facade's, the torch
// backends' and the comms logger's fast paths) does when its module is made.
#pragma once

#include <Python.h>

#include "tensor_meta.h"

// Make `type` ready and add it to `module` as `name`; -1 with an exception set.
static inline int commlayer_add_type(PyObject *module, const char *name, PyTypeObject *type) {
    if (PyType_Ready(type) < 0) return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

// set_tensor_meta(reader)'s body: the capsule of commlayer.core._tensor_meta, or None to ask
// tensors' Python attributes again. The Python side hands over only a reader built for the
// running torch version (commlayer/core/tensor_reader.py): another torch's headers would misread
// every tensor.
static inline PyObject *commlayer_set_tensor_meta(PyObject *reader, CommlayerTensorMetaReader *into) {
    if (reader == Py_None) {
        *into = NULL;
        Py_RETURN_NONE;
    }
    void *function = PyCapsule_GetPointer(reader, COMMLAYER_TENSOR_META_CAPSULE);
    if (function == NULL) return NULL;
    *into = (CommlayerTensorMetaReader)function;
    Py_RETURN_NONE;
}
