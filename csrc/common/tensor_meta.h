// What commlayer's C fast paths read of a tensor, and the reader commlayer.core._tensor_meta
// hands them (a C function behind a capsule). Plain C, so the torch fast paths, which include no
// torch header, can call the reader, which is compiled against one torch version's headers.
#pragma once

#include <Python.h>
#include <stdint.h>

#define COMMLAYER_TENSOR_META_CAPSULE "commlayer.core._tensor_meta.reader"
#define COMMLAYER_TENSOR_META_DIMS 8

typedef struct {
    int8_t scalar_type;  // c10::ScalarType
    int8_t device_type;  // c10::DeviceType
    int8_t layout;       // c10::Layout
    int8_t contiguous;   // is_contiguous() in the default memory format
    int8_t itemsize;     // bytes per element
    int16_t device_index;
    int16_t dim;
    int64_t sizes[COMMLAYER_TENSOR_META_DIMS];
    uintptr_t data;  // data_ptr(): 0 where the tensor has no storage to point at
} CommlayerTensorMeta;

// 1 with *meta filled in for a plain tensor: exactly torch.Tensor or torch.nn.Parameter, no
// torch function mode active, concrete sizes, at most COMMLAYER_TENSOR_META_DIMS dimensions.
// 0 for anything else, with no exception set: the caller then asks the tensor's Python
// attributes, which is what a subclass or a mode may answer differently.
typedef int (*CommlayerTensorMetaReader)(PyObject *tensor, CommlayerTensorMeta *meta);

// Whether two reads are of the same kind of tensor: dtype, device and layout (a plan key's part).
static inline int commlayer_tensor_meta_same_kind(const CommlayerTensorMeta *a, const CommlayerTensorMeta *b) {
    return a->scalar_type == b->scalar_type && a->device_type == b->device_type &&
           a->device_index == b->device_index && a->layout == b->layout;
}

static inline long long commlayer_tensor_meta_numel(const CommlayerTensorMeta *meta) {
    long long elements = 1;
    for (int index = 0; index < meta->dim; index++) elements *= meta->sizes[index];
    return elements;
}

// A new reference to the tuple of meta's sizes, as a flight-recorder entry holds it: *last when it
// holds them already (a loop over same-shaped tensors builds no tuple), else a new tuple that
// replaces *last. NULL with an exception set.
static inline PyObject *commlayer_tensor_meta_shape(PyObject **last, const CommlayerTensorMeta *meta) {
    int same = *last != NULL && PyTuple_GET_SIZE(*last) == meta->dim;
    for (Py_ssize_t index = 0; same && index < meta->dim; index++) {
        same = PyLong_AsLongLong(PyTuple_GET_ITEM(*last, index)) == meta->sizes[index];
    }
    if (!same) {
        PyObject *shape = PyTuple_New(meta->dim);
        for (Py_ssize_t index = 0; shape != NULL && index < meta->dim; index++) {
            PyObject *size = PyLong_FromLongLong(meta->sizes[index]);
            if (size == NULL) Py_CLEAR(shape);
            else PyTuple_SET_ITEM(shape, index, size);
        }
        if (shape == NULL) return NULL;
        Py_XSETREF(*last, shape);
    }
    return Py_NewRef(*last);
}
