// Fused launchers of the shm backend; see launcher.hpp.
#include "launcher.hpp"

#include <array>
#include <cstdint>
#include <ctime>
#include <stdexcept>

namespace commlayer::shm {

namespace {

constexpr const char* kCapsuleName = "commlayer.shm.launcher";

struct Launcher {
    LaunchSpec spec;
    LaunchErrors errors;
    PyObject* last_shape = nullptr;  // the shape entered last, shared by the entries of equal shapes
};

// What an op needs of one tensor; the facade has already checked it is a contiguous CPU tensor.
struct TensorView {
    void* data = nullptr;
    std::size_t count = 0;
    DType dtype = DType::f32;
};

struct Names {
    PyObject* data_ptr = PyUnicode_InternFromString("data_ptr");
    PyObject* numel = PyUnicode_InternFromString("numel");
    PyObject* dtype = PyUnicode_InternFromString("dtype");
    PyObject* shape = PyUnicode_InternFromString("shape");
};

const Names& names() {
    static const Names interned;  // first use is under the GIL, as every call is
    return interned;
}

// A method call returning an int, as an unsigned 64-bit value; false with an exception set.
bool call_for_integer(PyObject* tensor, PyObject* method, unsigned long long& value) {
    PyObject* result = PyObject_CallMethodNoArgs(tensor, method);
    if (result == nullptr) return false;
    value = PyLong_AsUnsignedLongLong(result);
    Py_DECREF(result);
    return !(value == static_cast<unsigned long long>(-1) && PyErr_Occurred());
}

// The product of a torch.Size's dimensions (its element count); false if it is not a tuple of ints.
bool count_of_shape(PyObject* shape, unsigned long long& count) {
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

// `shape`: the tensor's shape when the caller already read it (the recorded payload), else null.
bool view_of(PyObject* tensor, const LaunchSpec& spec, PyObject* shape, TensorView& view) {
    unsigned long long address = 0, count = 0;
    if (!call_for_integer(tensor, names().data_ptr, address) ||
        !(count_of_shape(shape, count) || call_for_integer(tensor, names().numel, count))) {
        return false;
    }
    view.data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(address));
    view.count = static_cast<std::size_t>(count);
    if (spec.dtype >= 0) {  // the plan's key holds the dtype: no attribute read and lookup per call
        view.dtype = static_cast<DType>(spec.dtype);
        return true;
    }
    PyObject* dtype_codes = spec.dtype_codes;
    PyObject* dtype = PyObject_GetAttr(tensor, names().dtype);
    if (dtype == nullptr) return false;
    PyObject* code = PyDict_GetItemWithError(dtype_codes, dtype);  // borrowed
    if (code == nullptr && !PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, dtype);
    Py_DECREF(dtype);
    if (code == nullptr) return false;
    view.dtype = static_cast<DType>(PyLong_AsLong(code));
    return !PyErr_Occurred();
}

// Runs the op; false with a Python exception set (the communicator's errors keep their types).
bool launch(const Launcher& launcher, const TensorView& output, const TensorView& input) {
    const LaunchSpec& spec = launcher.spec;
    try {
        switch (spec.kind) {
            case LaunchKind::all_reduce:
                spec.comm->all_reduce(output.data, output.count, output.dtype, static_cast<Op>(spec.fixed));
                break;
            case LaunchKind::broadcast: spec.comm->broadcast(output.data, output.count, output.dtype, spec.fixed); break;
            case LaunchKind::all_gather: spec.comm->all_gather(output.data, input.data, input.count, input.dtype); break;
            case LaunchKind::reduce_scatter:
                spec.comm->reduce_scatter(output.data, input.data, output.count, input.dtype, static_cast<Op>(spec.fixed));
                break;
        }
        return true;
    } catch (const TimeoutError& error) {
        PyErr_SetString(launcher.errors.timeout, error.what());
    } catch (const PeerError& error) {
        PyErr_SetString(launcher.errors.peer, error.what());
    } catch (const MismatchError& error) {
        PyErr_SetString(launcher.errors.mismatch, error.what());
    } catch (const std::invalid_argument& error) {
        PyErr_SetString(PyExc_ValueError, error.what());
    } catch (const std::exception& error) {
        PyErr_SetString(PyExc_RuntimeError, error.what());
    }
    return false;
}

// An entry's fields, as commlayer.flight_recorder lays them out (SEQ, OP, ... WORK = range(9)).
enum Field : Py_ssize_t { kSeq, kOp, kShape, kDtype, kRoot, kState, kQueuedNs, kCompletedNs, kWork, kFields };

PyObject* zero() {
    static PyObject* const value = PyLong_FromLong(0);  // immortal in practice: small ints are cached
    return value;
}

// time.monotonic_ns(), which reads the same clock.
PyObject* monotonic_ns() {
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    return PyLong_FromLongLong(static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec);
}

// The ring's entry at `slot` when only the ring holds it (nobody can see it change), to be
// rewritten in place: no list allocated and freed per call. A new reference, or nullptr.
PyObject* reusable_entry(const RecordingSpec& recording, Py_ssize_t slot) {
    if (slot >= PyList_GET_SIZE(recording.ring)) return nullptr;
    PyObject* old = PyList_GET_ITEM(recording.ring, slot);
    if (!PyList_CheckExact(old) || Py_REFCNT(old) != 1 || PyList_GET_SIZE(old) != kFields) return nullptr;
    return Py_NewRef(old);
}

PyObject* next_seq(const RecordingSpec& recording) {
    if (recording.sequence != nullptr) return Py_TYPE(recording.sequence)->tp_iternext(recording.sequence);
    return PyObject_CallNoArgs(recording.next_seq);
}

// Enters a started call in the ring, the payload's `shape` stolen; a new reference to its entry,
// or nullptr with an exception.
PyObject* enter(const RecordingSpec& recording, PyObject* shape) {
    PyObject* seq = next_seq(recording);
    if (seq == nullptr) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "shm launcher: the sequence ended");
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
bool complete(const RecordingSpec& recording, PyObject* entry) {
    PyObject* now = monotonic_ns();
    if (now == nullptr) return false;
    PyList_SetItem(entry, kState, Py_NewRef(recording.completed));
    PyList_SetItem(entry, kCompletedNs, now);
    return true;
}

// The pending exception, handed to ``fail``, which raises it or its typed translation.
void fail(const RecordingSpec& recording) {
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

bool takes_two_tensors(LaunchKind kind) { return kind == LaunchKind::all_gather || kind == LaunchKind::reduce_scatter; }

// An async op's completed Work, weakly referenced by its entry if there is one.
PyObject* completed_work(const LaunchSpec& spec, PyObject* output, PyObject* entry) {
    PyObject* results = PyTuple_Pack(1, output);
    if (results == nullptr) return nullptr;
    PyObject* work = PyObject_CallOneArg(spec.completed, results);
    Py_DECREF(results);
    if (work == nullptr || entry == nullptr) return work;
    PyObject* reference = PyWeakref_NewRef(work, nullptr);
    if (reference == nullptr) {
        Py_DECREF(work);
        return nullptr;
    }
    PyList_SetItem(entry, kWork, reference);
    return work;
}

// Whether two shapes (tuples of ints) are equal, without Python's rich comparison.
bool same_shape(PyObject* shape, PyObject* other) {
    const Py_ssize_t dims = PyTuple_GET_SIZE(shape);
    if (other == nullptr || PyTuple_GET_SIZE(other) != dims) return false;
    for (Py_ssize_t dim = 0; dim < dims; ++dim) {
        PyObject *mine = PyTuple_GET_ITEM(shape, dim), *theirs = PyTuple_GET_ITEM(other, dim);
        if (mine != theirs && PyLong_AsLongLong(mine) != PyLong_AsLongLong(theirs)) return false;
    }
    return true;
}

// The shape to enter (stolen, a new reference back): the last one entered when equal, so that the
// entries of a loop over one shape share one object instead of each keeping its own.
PyObject* shared_shape(Launcher& launcher, PyObject* shape) {
    if (!PyTuple_Check(shape)) return shape;
    if (same_shape(shape, launcher.last_shape)) {
        Py_DECREF(shape);
        return Py_NewRef(launcher.last_shape);
    }
    Py_XSETREF(launcher.last_shape, Py_NewRef(shape));
    return shape;
}

// `shape`: the payload's (stolen), when the launcher records; null otherwise.
PyObject* run_recorded(Launcher& launcher, bool async_op, PyObject* const* tensors, PyObject* shape,
                       const TensorView& output, const TensorView& input) {
    const LaunchSpec& spec = launcher.spec;
    PyObject* entry = nullptr;
    if (shape != nullptr) {
        entry = enter(spec.recording, shared_shape(launcher, shape));
        if (entry == nullptr) return nullptr;
    }
    PyObject* result = nullptr;
    if (launch(launcher, output, input)) {
        if (async_op) {
            result = completed_work(spec, tensors[0], entry);
        } else if (entry == nullptr || complete(spec.recording, entry)) {
            result = Py_NewRef(Py_None);
        }
    } else if (entry != nullptr) {
        fail(spec.recording);
    }
    Py_XDECREF(entry);
    return result;
}

PyObject* run(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    auto* launcher = static_cast<Launcher*>(PyCapsule_GetPointer(self, kCapsuleName));
    if (launcher == nullptr) return nullptr;
    const LaunchSpec& spec = launcher->spec;
    const Py_ssize_t tensors = takes_two_tensors(spec.kind) ? 2 : 1;
    if (nargs != 1 + tensors) {
        return PyErr_Format(PyExc_TypeError, "shm launcher: expected (async_op, %zd tensor(s)), received %zd arguments",
                            tensors, nargs);
    }
    const int async_op = PyObject_IsTrue(args[0]);
    if (async_op < 0) return nullptr;
    const int payload = spec.recording.payload;
    PyObject* shape = nullptr;  // the recorded payload's, which also gives its element count
    if (spec.recording.next_seq != nullptr && (shape = PyObject_GetAttr(args[1 + payload], names().shape)) == nullptr) {
        return nullptr;
    }
    TensorView output, input;
    if (!view_of(args[1], spec, payload == 0 ? shape : nullptr, output) ||
        (tensors == 2 && !view_of(args[2], spec, payload == 1 ? shape : nullptr, input))) {
        Py_XDECREF(shape);
        return nullptr;
    }
    return run_recorded(*launcher, async_op != 0, args + 1, shape, output, input);
}

PyMethodDef run_def = {"shm_launcher", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run)),
                       METH_FASTCALL, "run(async_op, *tensors): one shm op, completed on return"};

// The recording's references (all null when it records nothing), owned by the launcher.
std::array<PyObject*, 9> references(const RecordingSpec& recording) {
    return {recording.next_seq, recording.sequence, recording.ring,    recording.op,       recording.dtype,
            recording.root,     recording.fail,     recording.started, recording.completed};
}

void destroy(PyObject* capsule) {
    auto* launcher = static_cast<Launcher*>(PyCapsule_GetPointer(capsule, kCapsuleName));
    if (launcher == nullptr) return;
    Py_XDECREF(launcher->spec.owner);
    Py_XDECREF(launcher->spec.dtype_codes);
    Py_XDECREF(launcher->spec.completed);
    Py_XDECREF(launcher->last_shape);
    for (PyObject* reference : references(launcher->spec.recording)) Py_XDECREF(reference);
    delete launcher;
}

}  // namespace

PyObject* make_launcher(const LaunchSpec& spec, const LaunchErrors& errors) {
    auto* launcher = new Launcher{spec, errors};
    Py_INCREF(spec.owner);
    Py_INCREF(spec.dtype_codes);
    Py_INCREF(spec.completed);
    for (PyObject* reference : references(spec.recording)) Py_XINCREF(reference);
    PyObject* capsule = PyCapsule_New(launcher, kCapsuleName, destroy);
    if (capsule == nullptr) {
        Py_DECREF(spec.owner);
        Py_DECREF(spec.dtype_codes);
        Py_DECREF(spec.completed);
        for (PyObject* reference : references(spec.recording)) Py_XDECREF(reference);
        delete launcher;
        return nullptr;
    }
    PyObject* function = PyCFunction_NewEx(&run_def, capsule, nullptr);
    Py_DECREF(capsule);  // the function holds it
    return function;
}

}  // namespace commlayer::shm
