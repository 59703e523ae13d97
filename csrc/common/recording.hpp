// What every fused launcher (a backend's ``recorded_plan``: csrc/shm, csrc/mpi) shares: reading a
// tensor's address and element count through the Python C API, and entering its calls in the
// group's flight recorder (commlayer.core.flight_recorder's Recording, whose steps these follow).
//
// Header-only (inline): each extension compiles its own copy, so its launcher's hot path is
// inlined into one function, as when this code lived in the shm launcher alone.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <ctime>
#include <stdexcept>
#include <string>

namespace commlayer::launch {

// How a launcher enters its calls in the group's flight recorder; next_seq == nullptr: it records nothing.
struct RecordingSpec {
    PyObject* next_seq = nullptr;  // () -> the call's sequence number
    PyObject* sequence = nullptr;  // the iterator next_seq is the bound __next__ of, if it is one
    PyObject* ring = nullptr;      // list of entries, indexed seq % capacity
    Py_ssize_t capacity = 1;
    PyObject* op = nullptr;        // the op's name, as entered
    PyObject* dtype = nullptr;
    PyObject* root = nullptr;      // int
    PyObject* fail = nullptr;      // (error) -> raises it, or its typed translation
    PyObject* started = nullptr;   // the entry states
    PyObject* completed = nullptr;
    int payload = 0;               // which tensor argument the entry describes
};

// ``recording``: None, or (next_seq, ring, capacity, op, dtype, root, fail, payload, started,
// completed): a flight_recorder.Recording, the payload's argument index and the entry states.
// Borrowed references: the caller keeps ``recording`` alive or takes its own (see references()).
inline RecordingSpec recording_spec(const pybind11::object& recording, const char* who) {
    namespace py = pybind11;
    RecordingSpec spec;
    if (recording.is_none()) return spec;
    const auto fields = recording.cast<py::tuple>();
    if (fields.size() != 10 || !PyList_Check(fields[1].ptr())) {
        throw std::invalid_argument(std::string(who) + ": recording must be a 10-tuple whose ring is a list");
    }
    // itertools.count().__next__: the launcher advances the iterator itself (no bound-method call).
    const py::object owner = py::getattr(fields[0], "__self__", py::none());
    PyObject* sequence = !owner.is_none() && PyIter_Check(owner.ptr()) ? owner.ptr() : nullptr;
    spec = RecordingSpec{fields[0].ptr(), sequence,        fields[1].ptr(), fields[2].cast<Py_ssize_t>(),
                         fields[3].ptr(), fields[4].ptr(), fields[5].ptr(), fields[6].ptr(),
                         fields[8].ptr(), fields[9].ptr(), fields[7].cast<int>()};
    if (spec.capacity < 1) throw std::invalid_argument(std::string(who) + ": the ring's capacity must be positive");
    return spec;
}

// The recording's references (all null when it records nothing), which a launcher owns.
inline std::array<PyObject*, 9> references(const RecordingSpec& recording) {
    return {recording.next_seq, recording.sequence, recording.ring,    recording.op,       recording.dtype,
            recording.root,     recording.fail,     recording.started, recording.completed};
}

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

// An entry's fields, as commlayer.core.flight_recorder lays them out (SEQ, OP, ... WORK = range(9)).
enum Field : Py_ssize_t { kSeq, kOp, kShape, kDtype, kRoot, kState, kQueuedNs, kCompletedNs, kWork, kFields };

inline PyObject* zero() {
    static PyObject* const value = PyLong_FromLong(0);  // immortal in practice: small ints are cached
    return value;
}

// time.monotonic_ns(), which reads the same clock.
inline PyObject* monotonic_ns() {
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    return PyLong_FromLongLong(static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec);
}

// The ring's entry at `slot` when only the ring holds it (nobody can see it change), to be
// rewritten in place: no list allocated and freed per call. A new reference, or nullptr.
inline PyObject* reusable_entry(const RecordingSpec& recording, Py_ssize_t slot) {
    if (slot >= PyList_GET_SIZE(recording.ring)) return nullptr;
    PyObject* old = PyList_GET_ITEM(recording.ring, slot);
    if (!PyList_CheckExact(old) || Py_REFCNT(old) != 1 || PyList_GET_SIZE(old) != kFields) return nullptr;
    return Py_NewRef(old);
}

inline PyObject* next_seq(const RecordingSpec& recording) {
    if (recording.sequence != nullptr) return Py_TYPE(recording.sequence)->tp_iternext(recording.sequence);
    return PyObject_CallNoArgs(recording.next_seq);
}

// Enters a started call in the ring, the payload's `shape` stolen; a new reference to its entry,
// or nullptr with an exception.
inline PyObject* enter(const RecordingSpec& recording, PyObject* shape) {
    PyObject* seq = next_seq(recording);
    if (seq == nullptr) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "launcher: the recorder's sequence ended");
        Py_DECREF(shape);
        return nullptr;
    }
    const Py_ssize_t slot = PyLong_AsSsize_t(seq) % recording.capacity;
    PyObject* queued = PyErr_Occurred() ? nullptr : monotonic_ns();
    PyObject* entry = queued == nullptr ? nullptr : reusable_entry(recording, slot);
    const bool reused = entry != nullptr;
    if (queued != nullptr && !reused) entry = PyList_New(kFields);
    if (entry == nullptr) {
        Py_DECREF(seq);
        Py_XDECREF(shape);
        Py_XDECREF(queued);
        return nullptr;
    }
    PyObject* fields[kFields] = {seq, Py_NewRef(recording.op), shape, Py_NewRef(recording.dtype),
                                 Py_NewRef(recording.root), Py_NewRef(recording.started), queued,
                                 Py_NewRef(zero()), Py_NewRef(Py_None)};
    if (reused) {  // the ring keeps its reference: replace the fields, releasing the old ones
        for (Py_ssize_t field = 0; field < kFields; ++field) PyList_SetItem(entry, field, fields[field]);
        return entry;
    }
    for (Py_ssize_t field = 0; field < kFields; ++field) PyList_SET_ITEM(entry, field, fields[field]);
    // Its items (ints, strings, a shape, a dtype, a weak reference) can never lead back to it, so
    // the collector need not scan it: while the ring fills, every call adds an entry, and scanning
    // them all at each young collection cost the first 2000 calls of a group ~0.1 us each.
    PyObject_GC_UnTrack(entry);
    if (PyList_SetItem(recording.ring, slot, Py_NewRef(entry)) != 0) {
        Py_DECREF(entry);
        return nullptr;
    }
    return entry;
}

// Marks a blocking call's entry completed; false with an exception set.
inline bool complete(const RecordingSpec& recording, PyObject* entry) {
    PyObject* now = monotonic_ns();
    if (now == nullptr) return false;
    PyList_SetItem(entry, kState, Py_NewRef(recording.completed));
    PyList_SetItem(entry, kCompletedNs, now);
    return true;
}

// The pending exception, handed to ``fail``, which raises it or its typed translation.
inline void fail(const RecordingSpec& recording) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != nullptr) PyException_SetTraceback(value, traceback);
    PyObject* returned = PyObject_CallOneArg(recording.fail, value);
    if (returned == nullptr) {  // raised, as it should: keep its exception
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        return;
    }
    Py_DECREF(returned);
    PyErr_Restore(type, value, traceback);
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

}  // namespace commlayer::launch
