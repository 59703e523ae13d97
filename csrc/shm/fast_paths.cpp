// The shm backend's fast paths; see fast_paths.hpp.
#include "fast_paths.hpp"

#include <stdexcept>

namespace commlayer::shm {

namespace {

constexpr const char* kCapsuleName = "commlayer.shm.fast_path";

struct FastPath {
    FastPathSpec spec;
    FastPathErrors errors;
    PyObject* last_shape = nullptr;  // the shape entered last, shared by the entries of equal shapes
};

// What an op needs of one tensor; the facade has already checked it is a contiguous CPU tensor.
struct TensorView {
    void* data = nullptr;
    std::size_t count = 0;
    DType dtype = DType::f32;
};

// `shape`: the tensor's shape when the caller already read it (the recorded payload), else null.
bool view_of(PyObject* tensor, const FastPathSpec& spec, PyObject* shape, TensorView& view) {
    if (!common::address_and_count(tensor, shape, view.data, view.count)) return false;
    if (spec.dtype >= 0) {  // the plan's key holds the dtype: no attribute read and lookup per call
        view.dtype = static_cast<DType>(spec.dtype);
        return true;
    }
    PyObject* dtype_codes = spec.dtype_codes;
    PyObject* dtype = PyObject_GetAttr(tensor, common::names().dtype);
    if (dtype == nullptr) return false;
    PyObject* code = PyDict_GetItemWithError(dtype_codes, dtype);  // borrowed
    if (code == nullptr && !PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, dtype);
    Py_DECREF(dtype);
    if (code == nullptr) return false;
    view.dtype = static_cast<DType>(PyLong_AsLong(code));
    return !PyErr_Occurred();
}

// Runs the op; false with a Python exception set (the communicator's errors keep their types).
bool run_op(const FastPath& fast_path, const TensorView& output, const TensorView& input) {
    const FastPathSpec& spec = fast_path.spec;
    try {
        switch (spec.kind) {
            case OpKind::all_reduce:
                spec.comm->all_reduce(output.data, output.count, output.dtype, static_cast<Op>(spec.fixed));
                break;
            case OpKind::broadcast: spec.comm->broadcast(output.data, output.count, output.dtype, spec.fixed); break;
            case OpKind::all_gather: spec.comm->all_gather(output.data, input.data, input.count, input.dtype); break;
            case OpKind::reduce_scatter:
                spec.comm->reduce_scatter(output.data, input.data, output.count, input.dtype, static_cast<Op>(spec.fixed));
                break;
        }
        return true;
    } catch (const TimeoutError& error) {
        PyErr_SetString(fast_path.errors.timeout, error.what());
    } catch (const PeerError& error) {
        PyErr_SetString(fast_path.errors.peer, error.what());
    } catch (const MismatchError& error) {
        PyErr_SetString(fast_path.errors.mismatch, error.what());
    } catch (const std::invalid_argument& error) {
        PyErr_SetString(PyExc_ValueError, error.what());
    } catch (const std::exception& error) {
        PyErr_SetString(PyExc_RuntimeError, error.what());
    }
    return false;
}

bool takes_two_tensors(OpKind kind) { return kind == OpKind::all_gather || kind == OpKind::reduce_scatter; }

// An async op's completed Work, weakly referenced by its entry if there is one.
PyObject* completed_work(const FastPathSpec& spec, PyObject* output, PyObject* entry) {
    PyObject* results = PyTuple_Pack(1, output);
    if (results == nullptr) return nullptr;
    PyObject* work = PyObject_CallOneArg(spec.completed, results);
    Py_DECREF(results);
    if (work == nullptr || entry == nullptr) return work;
    if (!common::track(entry, work)) {
        Py_DECREF(work);
        return nullptr;
    }
    return work;
}

// `shape`: the payload's (stolen), when the fast path records; null otherwise.
PyObject* run_recorded(FastPath& fast_path, bool async_op, PyObject* const* tensors, PyObject* shape,
                       const TensorView& output, const TensorView& input) {
    const FastPathSpec& spec = fast_path.spec;
    PyObject* entry = nullptr;
    if (shape != nullptr) {
        entry = common::enter(spec.recording, common::shared_shape(fast_path.last_shape, shape));
        if (entry == nullptr) return nullptr;
    }
    PyObject* result = nullptr;
    if (run_op(fast_path, output, input)) {
        if (async_op) {
            result = completed_work(spec, tensors[0], entry);
        } else if (entry == nullptr || common::complete(spec.recording, entry)) {
            result = Py_NewRef(Py_None);
        }
    } else if (entry != nullptr) {
        common::fail(spec.recording);
    }
    Py_XDECREF(entry);
    return result;
}

PyObject* run(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    auto* fast_path = static_cast<FastPath*>(PyCapsule_GetPointer(self, kCapsuleName));
    if (fast_path == nullptr) return nullptr;
    const FastPathSpec& spec = fast_path->spec;
    const Py_ssize_t tensors = takes_two_tensors(spec.kind) ? 2 : 1;
    if (nargs != 1 + tensors) {
        return PyErr_Format(PyExc_TypeError, "shm fast path: expected (async_op, %zd tensor(s)), received %zd arguments",
                            tensors, nargs);
    }
    const int async_op = PyObject_IsTrue(args[0]);
    if (async_op < 0) return nullptr;
    const int payload = spec.recording.payload;
    PyObject* shape = nullptr;  // the recorded payload's, which also gives its element count
    if (spec.recording.on && (shape = PyObject_GetAttr(args[1 + payload], common::names().shape)) == nullptr) {
        return nullptr;
    }
    TensorView output, input;
    if (!view_of(args[1], spec, payload == 0 ? shape : nullptr, output) ||
        (tensors == 2 && !view_of(args[2], spec, payload == 1 ? shape : nullptr, input))) {
        Py_XDECREF(shape);
        return nullptr;
    }
    return run_recorded(*fast_path, async_op != 0, args + 1, shape, output, input);
}

PyMethodDef run_def = {"shm_fast_path", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run)),
                       METH_FASTCALL, "run(async_op, *tensors): one shm op, completed on return"};

void destroy(PyObject* capsule) {
    auto* fast_path = static_cast<FastPath*>(PyCapsule_GetPointer(capsule, kCapsuleName));
    if (fast_path == nullptr) return;
    Py_XDECREF(fast_path->spec.owner);
    Py_XDECREF(fast_path->spec.dtype_codes);
    Py_XDECREF(fast_path->spec.completed);
    Py_XDECREF(fast_path->last_shape);
    common::release(fast_path->spec.recording);
    delete fast_path;
}

}  // namespace

PyObject* make_fast_path(const FastPathSpec& spec, const FastPathErrors& errors) {
    auto* made = new FastPath{spec, errors};
    Py_INCREF(spec.owner);
    Py_INCREF(spec.dtype_codes);
    Py_INCREF(spec.completed);
    PyObject* capsule = PyCapsule_New(made, kCapsuleName, destroy);
    if (capsule == nullptr) {
        Py_DECREF(spec.owner);
        Py_DECREF(spec.dtype_codes);
        Py_DECREF(spec.completed);
        common::release(made->spec.recording);
        delete made;
        return nullptr;
    }
    PyObject* function = PyCFunction_NewEx(&run_def, capsule, nullptr);
    Py_DECREF(capsule);  // the function holds it
    return function;
}

}  // namespace commlayer::shm
