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

// A type a module exports: its name there, and the type.
typedef struct {
    const char *name;
    PyTypeObject *type;
} CommlayerExport;

// The module `def` describes, with each of `exports` (ended by {NULL}) made ready and added to it;
// NULL with an exception set.
static inline PyObject *commlayer_module(PyModuleDef *def, const CommlayerExport *exports) {
    PyObject *module = PyModule_Create(def);
    if (module == NULL) return NULL;
    for (; exports->name != NULL; exports++) {
        if (commlayer_add_type(module, exports->name, exports->type) < 0) {
            Py_DECREF(module);
            return NULL;
        }
    }
    return module;
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

// Each extension reads tensors through its own reader, set from Python by set_tensor_meta(reader):
// COMMLAYER_TENSOR_META_READER defines both, COMMLAYER_SET_TENSOR_META_METHOD is the method's
// entry in the module's method table.
#define COMMLAYER_TENSOR_META_READER                                       \
    CommlayerTensorMetaReader tensor_meta_reader;                          \
    static PyObject *set_tensor_meta(PyObject *module, PyObject *reader) { \
        (void)module;                                                      \
        return commlayer_set_tensor_meta(reader, &tensor_meta_reader);     \
    }
#define COMMLAYER_SET_TENSOR_META_METHOD \
    {"set_tensor_meta", set_tensor_meta, METH_O, "set_tensor_meta(reader): _tensor_meta.READER, or None"}

// A garbage-collected object's dealloc: untracked, its references cleared by PREFIX_clear, freed.
#define COMMLAYER_GC_DEALLOC(PREFIX, STRUCT)          \
    static void PREFIX##_dealloc(STRUCT *self) {      \
        PyObject_GC_UnTrack(self);                    \
        PREFIX##_clear(self);                         \
        Py_TYPE(self)->tp_free((PyObject *)self);     \
    }

// The fields of a type whose instances are called like functions (vectorcall) and hold
// references the collector traverses: made by tp_new, set up by INIT, and dealloc'd, traversed
// and cleared by PREFIX_dealloc, PREFIX_traverse and PREFIX_clear. A type adds its other
// fields after it: {COMMLAYER_VECTORCALL_TYPE(...), .tp_repr = ...}.
#define COMMLAYER_VECTORCALL_TYPE(NAME, STRUCT, INIT, PREFIX, DOC)                                         \
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = NAME, .tp_basicsize = sizeof(STRUCT),                         \
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL, .tp_doc = DOC,        \
    .tp_new = PyType_GenericNew, .tp_init = (initproc)INIT, .tp_dealloc = (destructor)PREFIX##_dealloc,    \
    .tp_traverse = (traverseproc)PREFIX##_traverse, .tp_clear = (inquiry)PREFIX##_clear,                   \
    .tp_call = PyVectorcall_Call, .tp_vectorcall_offset = offsetof(STRUCT, vectorcall)

// A type's object fields listed once, as FIELDS(EACH) calling EACH(name) per field, give its
// traverse and clear: PREFIX_traverse visits them, PREFIX_clear clears them (then returns 0).
#define COMMLAYER_VISIT_FIELD(name) Py_VISIT(self->name);
#define COMMLAYER_CLEAR_FIELD(name) Py_CLEAR(self->name);
#define COMMLAYER_GC_FIELDS(PREFIX, STRUCT, FIELDS)                                 \
    static int PREFIX##_traverse(STRUCT *self, visitproc visit, void *arg) {        \
        FIELDS(COMMLAYER_VISIT_FIELD)                                               \
        return 0;                                                                   \
    }                                                                               \
    static int PREFIX##_clear(STRUCT *self) {                                       \
        FIELDS(COMMLAYER_CLEAR_FIELD)                                               \
        return 0;                                                                   \
    }
