// What every C++ fast path (a backend's ``recorded_plan``: csrc/shm, csrc/mpi) shares: reading a
// tensor's address and element count through the Python C API, and entering its calls in the
// group's flight recorder through the steps of recorder.h (commlayer.core.flight_recorder's
// Recording, read by name into a RecordingSpec).
//
// Header-only (inline): each extension compiles its own copy, so its fast path's hot path is
// inlined into one function.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "recorder.h"

namespace commlayer::common {

// How a fast path enters its calls in the group's flight recorder: the Recording (strong
// references, owned by the fast path: release() them) and which tensor argument the entry
// describes. ``on`` is false for a fast path that records nothing.
struct RecordingSpec {
    CommlayerRecording recording{};
    int payload = 0;
    bool on = false;
};

// ``recording``: None, or a flight_recorder.Recording; ``payload``: the index of the tensor
// argument its entries describe.
inline RecordingSpec recording_spec(const pybind11::object& recording, int payload, const char* who) {
    RecordingSpec spec;
    if (recording.is_none()) return spec;
    if (commlayer_recording_read(recording.ptr(), &spec.recording) < 0) throw pybind11::error_already_set();
    if (payload < 0) {
        commlayer_recording_clear(&spec.recording);
        throw std::invalid_argument(std::string(who) + ": the payload index must not be negative");
    }
    spec.payload = payload;
    spec.on = true;
    return spec;
}

inline void release(RecordingSpec& spec) { commlayer_recording_clear(&spec.recording); }

// A started call entered in the ring, the payload's `shape` stolen (recorder.h).
inline PyObject* enter(const RecordingSpec& spec, PyObject* shape) {
    return commlayer_recorder_enter(&spec.recording, shape);
}

// A blocking call's entry marked completed; false with an exception set.
inline bool complete(const RecordingSpec& spec, PyObject* entry) {
    return commlayer_recorder_complete(&spec.recording, entry) == 0;
}

// An async call's Work, tracked weakly by its entry; false with an exception set.
inline bool track(PyObject* entry, PyObject* work) { return commlayer_recorder_track(entry, work) == 0; }

// The pending exception, handed to ``fail``, which raises it or its typed translation.
inline void fail(const RecordingSpec& spec) { commlayer_recorder_fail(&spec.recording); }

struct Names {
    PyObject* data_ptr = PyUnicode_InternFromString("data_ptr");
    PyObject* numel = PyUnicode_InternFromString("numel");
    PyObject* dtype = PyUnicode_InternFromString("dtype");
    PyObject* shape = PyUnicode_InternFromString("shape");
    PyObject* is_cuda = PyUnicode_InternFromString("is_cuda");
};

inline const Names& names() {
    static const Names interned;  // first use is under the GIL, as every call is
    return interned;
}

// A method call returning an int, as an unsigned 64-bit value; false with an exception set.
inline bool call_for_integer(PyObject* tensor, PyObject* method, unsigned long long& value) {
    PyObject* result = PyObject_CallMethodNoArgs(tensor, method);
    if (result == nullptr) return false;
    value = PyLong_AsUnsignedLongLong(result);
    Py_DECREF(result);
    return !(value == static_cast<unsigned long long>(-1) && PyErr_Occurred());
}

// The product of a torch.Size's dimensions (its element count); false if it is not a tuple of ints.
inline bool count_of_shape(PyObject* shape, unsigned long long& count) {
    if (shape == nullptr || !PyTuple_Check(shape)) return false;
    count = 1;
    for (Py_ssize_t dim = 0; dim < PyTuple_GET_SIZE(shape); ++dim) {
        const long long extent = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, dim));
        if (extent < 0) {
            PyErr_Clear();
            return false;
        }
        count *= static_cast<unsigned long long>(extent);
    }
    return true;
}

// A tensor's address and element count; `shape`: its shape when the caller already read it (the
// recorded payload), else null. False with an exception set.
inline bool address_and_count(PyObject* tensor, PyObject* shape, void*& data, std::size_t& count) {
    unsigned long long address = 0, elements = 0;
    if (!call_for_integer(tensor, names().data_ptr, address) ||
        !(count_of_shape(shape, elements) || call_for_integer(tensor, names().numel, elements))) {
        return false;
    }
    data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(address));
    count = static_cast<std::size_t>(elements);
    return true;
}

// Whether two shapes (tuples of ints) are equal, without Python's rich comparison.
inline bool same_shape(PyObject* shape, PyObject* other) {
    const Py_ssize_t dims = PyTuple_GET_SIZE(shape);
    if (other == nullptr || PyTuple_GET_SIZE(other) != dims) return false;
    for (Py_ssize_t dim = 0; dim < dims; ++dim) {
        PyObject *mine = PyTuple_GET_ITEM(shape, dim), *theirs = PyTuple_GET_ITEM(other, dim);
        if (mine != theirs && PyLong_AsLongLong(mine) != PyLong_AsLongLong(theirs)) return false;
    }
    return true;
}

// The shape to enter (stolen, a new reference back): `last` (the one entered last) when equal, so
// that the entries of a loop over one shape share one object instead of each keeping its own.
inline PyObject* shared_shape(PyObject*& last, PyObject* shape) {
    if (!PyTuple_Check(shape)) return shape;
    if (same_shape(shape, last)) {
        Py_DECREF(shape);
        return Py_NewRef(last);
    }
    Py_XSETREF(last, Py_NewRef(shape));
    return shape;
}

}  // namespace commlayer::common
