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

bool view_of(PyObject* tensor, PyObject* dtype_codes, TensorView& view) {
    unsigned long long address = 0, count = 0;
    if (!call_for_integer(tensor, names().data_ptr, address) || !call_for_integer(tensor, names().numel, count)) {
        return false;
    }
    PyObject* dtype = PyObject_GetAttr(tensor, names().dtype);
    if (dtype == nullptr) return false;
    PyObject* code = PyDict_GetItemWithError(dtype_codes, dtype);  // borrowed
    if (code == nullptr && !PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, dtype);
    Py_DECREF(dtype);
    if (code == nullptr) return false;
    view.data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(address));
    view.count = static_cast<std::size_t>(count);
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

// time.monotonic_ns(), which reads the same clock.
PyObject* monotonic_ns() {
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    return PyLong_FromLongLong(static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec);
}

// Enters a started call in the ring; a new reference to its entry, or nullptr with an exception.
PyObject* enter(const RecordingSpec& recording, PyObject* payload) {
    PyObject* seq = PyObject_CallNoArgs(recording.next_seq);
    if (seq == nullptr) return nullptr;
    const Py_ssize_t slot = PyLong_AsSsize_t(seq) % recording.capacity;
    PyObject* shape = PyObject_GetAttr(payload, names().shape);
    PyObject* entry = shape == nullptr || PyErr_Occurred() ? nullptr : PyList_New(kFields);
    if (entry == nullptr) {
        Py_DECREF(seq);
        Py_XDECREF(shape);
        return nullptr;
    }
    PyObject* fields[kFields] = {seq, Py_NewRef(recording.op), shape, Py_NewRef(recording.dtype),
                                 Py_NewRef(recording.root), Py_NewRef(recording.started), monotonic_ns(),
                                 PyLong_FromLong(0), Py_NewRef(Py_None)};
    for (Py_ssize_t field = 0; field < kFields; ++field) PyList_SET_ITEM(entry, field, fields[field]);
    if (fields[kQueuedNs] == nullptr || fields[kCompletedNs] == nullptr ||
        PyList_SetItem(recording.ring, slot, Py_NewRef(entry)) != 0) {
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

PyObject* run_recorded(const Launcher& launcher, bool async_op, PyObject* const* tensors,
                       const TensorView& output, const TensorView& input) {
    const LaunchSpec& spec = launcher.spec;
    PyObject* entry = nullptr;
    if (spec.recording.next_seq != nullptr) {
        entry = enter(spec.recording, tensors[spec.recording.payload]);
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
    const auto* launcher = static_cast<const Launcher*>(PyCapsule_GetPointer(self, kCapsuleName));
    if (launcher == nullptr) return nullptr;
    const LaunchSpec& spec = launcher->spec;
    const Py_ssize_t tensors = takes_two_tensors(spec.kind) ? 2 : 1;
    if (nargs != 1 + tensors) {
        return PyErr_Format(PyExc_TypeError, "shm launcher: expected (async_op, %zd tensor(s)), received %zd arguments",
                            tensors, nargs);
    }
    const int async_op = PyObject_IsTrue(args[0]);
    TensorView output, input;
    if (async_op < 0 || !view_of(args[1], spec.dtype_codes, output)) return nullptr;
    if (tensors == 2 && !view_of(args[2], spec.dtype_codes, input)) return nullptr;
    return run_recorded(*launcher, async_op != 0, args + 1, output, input);
}

PyMethodDef run_def = {"shm_launcher", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run)),
                       METH_FASTCALL, "run(async_op, *tensors): one shm op, completed on return"};

// The recording's references (all null when it records nothing), owned by the launcher.
std::array<PyObject*, 8> references(const RecordingSpec& recording) {
    return {recording.next_seq, recording.ring, recording.op,      recording.dtype,
            recording.root,     recording.fail, recording.started, recording.completed};
}

void destroy(PyObject* capsule) {
    auto* launcher = static_cast<Launcher*>(PyCapsule_GetPointer(capsule, kCapsuleName));
    if (launcher == nullptr) return;
    Py_XDECREF(launcher->spec.owner);
    Py_XDECREF(launcher->spec.dtype_codes);
    Py_XDECREF(launcher->spec.completed);
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
