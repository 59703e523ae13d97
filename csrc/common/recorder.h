// The flight recorder's steps in C, written once for every C fast path (the torch backends' in C,
// shm's and mpi's in C++ through recording.hpp): read a Recording (the named spec of
// commlayer.core.flight_recorder, whose steps these follow), enter a call in its ring, track an
// async call's Work, mark a blocking one completed, hand a failure to its ``fail``. The entry's
// layout and the Recording's field names come from recorder_spec.h, generated from Python.
//
// Header-only (static inline): each extension compiles its own copy, so a fast path's hot path is
// inlined into one function.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>

#include "recorder_spec.h"

// enter() below fills every slot of an entry: a slot Python adds must be filled here too.
#ifdef __cplusplus
static_assert(RECORDER_ENTRY_SLOTS == 9, "an entry field was added in Python: fill it in commlayer_recorder_enter");
#else
_Static_assert(RECORDER_ENTRY_SLOTS == 9, "an entry field was added in Python: fill it in commlayer_recorder_enter");
#endif

// A Recording as C holds it: strong references, released by commlayer_recording_clear.
typedef struct {
    PyObject *next_seq;  // () -> the call's sequence number
    PyObject *sequence;  // the iterator next_seq is the bound __next__ of, if it is one (advanced directly)
    PyObject *ring;      // list of entries, indexed seq % capacity
    Py_ssize_t capacity;
    PyObject *op;  // the op's name, as entered
    PyObject *dtype;
    PyObject *root;  // int
    PyObject *fail;  // (error) -> raises it, or its typed translation
    PyObject *started, *completed;  // the entry states
} CommlayerRecording;

// The Recording's references: those the collector traverses, and the entry states besides.
#define COMMLAYER_RECORDING_TRAVERSED(EACH) \
    EACH(next_seq) EACH(sequence) EACH(ring) EACH(op) EACH(dtype) EACH(root) EACH(fail)
#define COMMLAYER_RECORDING_CLEAR(name) Py_CLEAR(recording->name);
#define COMMLAYER_RECORDING_VISIT(name) Py_VISIT(recording->name);

static inline void commlayer_recording_clear(CommlayerRecording *recording) {
    COMMLAYER_RECORDING_TRAVERSED(COMMLAYER_RECORDING_CLEAR)
    Py_CLEAR(recording->started);
    Py_CLEAR(recording->completed);
}

static inline int commlayer_recording_traverse(CommlayerRecording *recording, visitproc visit, void *arg) {
    COMMLAYER_RECORDING_TRAVERSED(COMMLAYER_RECORDING_VISIT)
    return 0;
}

// *into read from a flight_recorder.Recording, field by field by name; 0, or -1 with an exception
// set (and *into cleared). The ring must be a list and the capacity positive.
static inline int commlayer_recording_read(PyObject *recording, CommlayerRecording *into) {
    commlayer_recording_clear(into);
    PyObject *capacity = PyObject_GetAttrString(recording, RECORDER_FIELD_CAPACITY);
    into->capacity = capacity == NULL ? -1 : PyLong_AsSsize_t(capacity);
    Py_XDECREF(capacity);
    into->next_seq = PyObject_GetAttrString(recording, RECORDER_FIELD_NEXT_SEQ);
    into->ring = PyObject_GetAttrString(recording, RECORDER_FIELD_RING);
    into->op = PyObject_GetAttrString(recording, RECORDER_FIELD_OP);
    into->dtype = PyObject_GetAttrString(recording, RECORDER_FIELD_DTYPE);
    into->root = PyObject_GetAttrString(recording, RECORDER_FIELD_ROOT);
    into->fail = PyObject_GetAttrString(recording, RECORDER_FIELD_FAIL);
    into->started = PyUnicode_InternFromString(RECORDER_ENTRY_STARTED);
    into->completed = PyUnicode_InternFromString(RECORDER_ENTRY_COMPLETED);
    if (PyErr_Occurred() || into->next_seq == NULL || into->ring == NULL || into->op == NULL ||
        into->dtype == NULL || into->root == NULL || into->fail == NULL || into->started == NULL ||
        into->completed == NULL) {
        commlayer_recording_clear(into);
        return -1;
    }
    if (!PyList_Check(into->ring) || into->capacity < 1) {
        PyErr_SetString(PyExc_ValueError, "flight recorder: a Recording's ring must be a list, its capacity positive");
        commlayer_recording_clear(into);
        return -1;
    }
    // itertools.count().__next__: the fast path advances the iterator itself (no bound-method call).
    PyObject *owner = PyObject_GetAttrString(into->next_seq, "__self__");
    if (owner != NULL && PyIter_Check(owner)) into->sequence = owner;
    else Py_XDECREF(owner);
    PyErr_Clear();
    return 0;
}

// time.monotonic_ns(), which reads the same clock (a new reference).
static inline PyObject *commlayer_monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return PyLong_FromLongLong((long long)now.tv_sec * 1000000000LL + now.tv_nsec);
}

static inline void commlayer_untrack(PyObject *object) {
    if (PyObject_IS_GC(object) && PyObject_GC_IsTracked(object)) PyObject_GC_UnTrack(object);
}

// The ring's evicted entry when nothing but the ring refers to it: rewritten in place, it spares
// a list's allocation and release per call (nobody can see the difference: no one else holds it).
static inline PyObject *commlayer_reusable_entry(PyObject *evicted) {
    if (evicted == NULL || !PyList_CheckExact(evicted) || Py_REFCNT(evicted) != 1) return NULL;
    return PyList_GET_SIZE(evicted) == RECORDER_ENTRY_SLOTS ? evicted : NULL;
}

// A started call entered in the ring (seq, op, shape, dtype, root, started, now, 0, None), the
// payload's `shape` stolen. A new reference to the entry, or NULL with an exception set.
static inline PyObject *commlayer_recorder_enter(const CommlayerRecording *recording, PyObject *shape) {
    PyObject *seq = recording->sequence != NULL ? Py_TYPE(recording->sequence)->tp_iternext(recording->sequence)
                                                : PyObject_CallNoArgs(recording->next_seq);
    if (seq == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "flight recorder: its sequence ended");
        Py_DECREF(shape);
        return NULL;
    }
    Py_ssize_t slot = PyLong_AsSsize_t(seq) % recording->capacity;
    PyObject *queued = slot < 0 ? NULL : commlayer_monotonic_ns();
    PyObject *zero = PyLong_FromLong(0);
    PyObject *items[RECORDER_ENTRY_SLOTS];  // by slot: the order is Python's (ENTRY_FIELDS)
    items[RECORDER_ENTRY_SEQ] = seq;
    items[RECORDER_ENTRY_OP] = recording->op;
    items[RECORDER_ENTRY_SHAPE] = shape;
    items[RECORDER_ENTRY_DTYPE] = recording->dtype;
    items[RECORDER_ENTRY_ROOT] = recording->root;
    items[RECORDER_ENTRY_STATE] = recording->started;
    items[RECORDER_ENTRY_QUEUED_NS] = queued;
    items[RECORDER_ENTRY_COMPLETED_NS] = zero;
    items[RECORDER_ENTRY_WORK] = Py_None;
    PyObject *entry = queued == NULL || slot >= PyList_GET_SIZE(recording->ring)
                          ? NULL
                          : commlayer_reusable_entry(PyList_GET_ITEM(recording->ring, slot));
    int reused = entry != NULL;
    if (queued != NULL && !reused) entry = PyList_New(RECORDER_ENTRY_SLOTS);
    if (entry == NULL) {
        Py_DECREF(seq);
        Py_DECREF(shape);
        Py_XDECREF(queued);
        Py_XDECREF(zero);
        return NULL;
    }
    // Nothing in an entry can refer back to it (ints, strs, a dtype, a shape of ints, a weak
    // reference without callback), so neither it nor its shape can be part of a cycle: untracked,
    // the ring's thousands of objects stay out of every collection's traversal.
    commlayer_untrack(shape);
    PyObject *previous[RECORDER_ENTRY_SLOTS] = {NULL};
    for (int index = 0; index < RECORDER_ENTRY_SLOTS; index++) {
        // seq, shape, queued and zero are new references (stolen); the rest are borrowed.
        if (index != RECORDER_ENTRY_SEQ && index != RECORDER_ENTRY_SHAPE && index != RECORDER_ENTRY_QUEUED_NS &&
            index != RECORDER_ENTRY_COMPLETED_NS) {
            Py_INCREF(items[index]);
        }
        if (reused) previous[index] = PyList_GET_ITEM(entry, index);
        PyList_SET_ITEM(entry, index, items[index]);
    }
    if (reused) {  // the ring keeps its reference; the old fields go once all new ones are in
        for (int index = 0; index < RECORDER_ENTRY_SLOTS; index++) Py_XDECREF(previous[index]);
        return Py_NewRef(entry);
    }
    PyObject_GC_UnTrack(entry);
    if (PyList_SetItem(recording->ring, slot, Py_NewRef(entry)) != 0) {  // drops the evicted entry
        Py_DECREF(entry);
        return NULL;
    }
    return entry;
}

// An async call's Work, tracked weakly by its entry (the ring must not keep its tensors alive);
// -1 with an exception set.
static inline int commlayer_recorder_track(PyObject *entry, PyObject *work) {
    PyObject *weak = PyWeakref_NewRef(work, NULL);
    if (weak == NULL) return -1;
    commlayer_untrack(weak);  // as the entry: it has no callback and refers to the Work weakly
    PyList_SetItem(entry, RECORDER_ENTRY_WORK, weak);
    return 0;
}

// A blocking call's entry marked completed; -1 with an exception set.
static inline int commlayer_recorder_complete(const CommlayerRecording *recording, PyObject *entry) {
    PyObject *now = commlayer_monotonic_ns();
    if (now == NULL) return -1;
    PyList_SetItem(entry, RECORDER_ENTRY_STATE, Py_NewRef(recording->completed));
    PyList_SetItem(entry, RECORDER_ENTRY_COMPLETED_NS, now);
    return 0;
}

// With an exception set: hand it to fail(error), which raises it or its typed translation, as the
// Python fast paths do inside their except block (fail runs as if in one). Other BaseExceptions
// pass through. Always NULL, with the exception to raise set.
static inline PyObject *commlayer_recorder_fail(const CommlayerRecording *recording) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL) PyException_SetTraceback(value, traceback);
    PyObject *handled = PyErr_GetHandledException();
    PyErr_SetHandledException(value);
    PyObject *returned = PyObject_CallOneArg(recording->fail, value);
    PyErr_SetHandledException(handled);
    Py_XDECREF(handled);
    if (returned != NULL) {  // fail() must raise; if it did not, the original error stands
        Py_DECREF(returned);
        PyErr_Restore(type, value, traceback);
        return NULL;
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    return NULL;
}
