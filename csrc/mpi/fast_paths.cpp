// The mpi backend's fast paths in C: ``run(async_op, *tensors)`` of one planned kind of call
// (backends/mpi/native_fast_paths.py builds them; backends/mpi/fast_paths.py has the Python twin and the rules).
//
// Why C: at 1-2 MiB an MPI collective on one host takes 17-60 us, and the backend's Python path
// (plan, flight-recorder entry, mismatch check, buffer message, executor) added ~2.8 us to each,
// more than raw mpi4py's own call. This function does what that path does -- publish the call's
// signature, enter the recorder, read the peers' signatures, stamp the watchdog, make the blocking
// MPI call without the GIL -- with no Python frame, and calls MPI's C function directly.
//
// No MPI headers: the library mpi4py loaded is not known at build time, so the caller hands over
// the function's address and the handles as integers (mpi_abi.hpp). Anything out of the ordinary
// -- an async op, a call behind queued ones, a CUDA tensor, uneven splits, a count over INT_MAX, a
// peer over 10 ms late or disagreeing -- goes to Python (``otherwise``, ``verify``), which keeps
// every rule.
//
// Speculation: where MPI never writes the call's input (broadcast from its root, all_gather,
// reduce_scatter and all_to_all on separate buffers), a rank that finds every peer that has
// published in agreement enters MPI without waiting for the rest, and compares after the call;
// a peer that disagrees completes the call on scratch memory, then every rank raises
// (commlayer/contract/mismatch/shared_slots.py has the protocol). Raw back-to-back MPI calls overlap one
// call's tail with the next call's start; a wait for every peer's signature would take that away.
#include <pybind11/pybind11.h>

#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/recording.hpp"
#include "mpi_abi.hpp"
#include "shared_slots.hpp"

namespace py = pybind11;

namespace commlayer::mpi {

namespace {

namespace common = commlayer::common;

constexpr const char* kCapsuleName = "commlayer.mpi.fast_path";

struct FastPath {
    MpiCall mpi;
    int size = 1;
    std::size_t item_size = 1;      // bytes per element of this plan's dtype
    PyObject* queue = nullptr;      // the ordered executor's deque: not empty -> ``otherwise``
    PyObject* otherwise = nullptr;  // the Python fast path, for everything but the plain case
    PyObject* watchdog = nullptr;   // its ``op``, ``limit`` and ``started`` bound a blocking call
    PyObject* op = nullptr;
    PyObject* limit = nullptr;
    PyObject* error_type = nullptr;  // MPI.Exception, made from a failed call's error code
    bool checked = false;
    bool on_cpu = false;  // this plan's tensors were seen on the CPU
    SharedSlots slots;
    common::RecordingSpec recording;
    PyObject* last_shape = nullptr;
};

bool takes_two_tensors(Kind kind) { return kind != Kind::all_reduce && kind != Kind::broadcast; }


// --- the watchdog ----------------------------------------------------------------------------

struct WatchdogNames {
    PyObject* op = PyUnicode_InternFromString("op");
    PyObject* limit = PyUnicode_InternFromString("limit");
    PyObject* started = PyUnicode_InternFromString("started");
};

const WatchdogNames& watchdog_names() {
    static const WatchdogNames interned;
    return interned;
}

// Stamps the call in progress (see backends/mpi/ordered.py's _Watchdog), as OrderedExecutor.run does.
bool stamp(const FastPath& fast_path, double started) {
    const WatchdogNames& name = watchdog_names();
    PyObject* now = PyFloat_FromDouble(started);
    if (now == nullptr) return false;
    const bool done = PyObject_SetAttr(fast_path.watchdog, name.op, fast_path.op) == 0 &&
                      PyObject_SetAttr(fast_path.watchdog, name.limit, fast_path.limit) == 0 &&
                      PyObject_SetAttr(fast_path.watchdog, name.started, now) == 0;
    Py_DECREF(now);
    return done;
}

// Clears the watchdog's stamp (no call in progress), keeping the call's exception if it raised.
bool unstamp(const FastPath& fast_path) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject* idle = PyFloat_FromDouble(0.0);
    const bool done = idle != nullptr && PyObject_SetAttr(fast_path.watchdog, watchdog_names().started, idle) == 0;
    Py_XDECREF(idle);
    if (type != nullptr) PyErr_Restore(type, value, traceback);
    return done;
}

// The blocking call; false with MPI's exception set.
bool call(const FastPath& fast_path, void* output, const void* input, int count) {
    const int code = call_without_gil(fast_path.mpi, output, input, count);
    if (code == 0) return true;
    PyObject* error = PyObject_CallFunction(fast_path.error_type, "i", code);
    if (error != nullptr) {
        PyErr_SetObject(fast_path.error_type, error);
        Py_DECREF(error);
    }
    return false;
}

// --- one call --------------------------------------------------------------------------------

struct Call {
    void* output = nullptr;
    const void* input = nullptr;
    std::size_t output_count = 0, input_count = 0;
};

// Whether MPI leaves this call's input unwritten: its kind allows it, and for two tensors the
// buffers do not overlap.
bool input_stays(const FastPath& fast_path, const Call& call) {
    if (!fast_path.slots.speculates) return false;
    if (!takes_two_tensors(fast_path.mpi.kind)) return true;
    const auto output = reinterpret_cast<std::uintptr_t>(call.output);
    const auto input = reinterpret_cast<std::uintptr_t>(call.input);
    const std::size_t item = fast_path.item_size;
    return output + call.output_count * item <= input || input + call.input_count * item <= output;
}

// The mismatch check (when on) and the blocking call, speculating where the input stays.
bool checked_call(const FastPath& fast_path, const Call& args, std::int64_t sequence, long long signature, int count) {
    const SharedSlots& slots = fast_path.slots;
    if (!fast_path.checked) return call(fast_path, args.output, args.input, count);
    if (input_stays(fast_path, args)) {
        const Seen seen = look_around(slots, sequence, signature);
        if (seen == Seen::all_agree) return call(fast_path, args.output, args.input, count);
        if (seen == Seen::some_missing) {
            mark_speculated(slots, sequence);
            return call(fast_path, args.output, args.input, count) &&
                   (peers_agree(slots, sequence, signature) || verify_in_python(slots.speculated, sequence, signature));
        }
        // A disagreement: the waiting path below, whose Python side refuses and raises.
    }
    return (peers_agree(slots, sequence, signature) || verify_in_python(slots.verify, sequence, signature)) &&
           call(fast_path, args.output, args.input, count);
}

// The signature's element count and MPI's, as the Python fast path passes them; false: not a plain case.
bool counts_of(const FastPath& fast_path, const Call& call, long long& signature, int& count) {
    std::size_t mpi_count = call.output_count;
    signature = static_cast<long long>(call.output_count);
    if (fast_path.mpi.kind == Kind::all_gather || fast_path.mpi.kind == Kind::all_to_all) {
        signature = static_cast<long long>(call.input_count);
        mpi_count = call.input_count;
    }
    if (fast_path.mpi.kind == Kind::all_to_all) {
        if (call.input_count % static_cast<std::size_t>(fast_path.size) != 0) return false;
        mpi_count = call.input_count / static_cast<std::size_t>(fast_path.size);
    }
    if (mpi_count > static_cast<std::size_t>(INT_MAX)) return false;
    count = static_cast<int>(mpi_count);
    return true;
}

// 1: a CUDA tensor (Python's path), 0: not, -1: an exception.
int on_cuda(PyObject* tensor) {
    PyObject* flag = PyObject_GetAttr(tensor, common::names().is_cuda);
    if (flag == nullptr) return -1;
    const int cuda = PyObject_IsTrue(flag);
    Py_DECREF(flag);
    return cuda;
}

// Reads the tensors; 1: a plain case (``call`` filled, ``shape`` a new reference), 0: not, -1: an error.
int read_call(FastPath& fast_path, PyObject* const* tensors, Py_ssize_t count, Call& call, PyObject*& shape) {
    // A plan serves one device (the facade's key holds it): once its tensors were seen on the CPU
    // they always are.
    for (Py_ssize_t index = 0; index < count && !fast_path.on_cpu; ++index) {
        const int cuda = on_cuda(tensors[index]);
        if (cuda != 0) return cuda < 0 ? -1 : 0;
    }
    fast_path.on_cpu = true;
    const int payload = fast_path.recording.payload;
    shape = PyObject_GetAttr(tensors[payload], common::names().shape);
    if (shape == nullptr) return -1;
    void* input = nullptr;
    if (!common::address_and_count(tensors[0], payload == 0 ? shape : nullptr, call.output, call.output_count) ||
        (count == 2 && !common::address_and_count(tensors[1], payload == 1 ? shape : nullptr, input,
                                                  call.input_count))) {
        Py_CLEAR(shape);
        return -1;
    }
    call.input = input;
    return 1;
}

// Publish, enter, check, call, complete: the plain synchronous case.
PyObject* run_plain(FastPath& fast_path, const Call& call_args, PyObject* shape, long long signature, int count) {
    std::int64_t sequence = 0;
    if (fast_path.checked) {
        PyObject* next = Py_TYPE(fast_path.slots.sequence)->tp_iternext(fast_path.slots.sequence);
        if (next == nullptr) {
            Py_DECREF(shape);
            return nullptr;
        }
        sequence = PyLong_AsLongLong(next);
        Py_DECREF(next);
        publish(fast_path.slots, sequence, signature);
    }
    PyObject* entry = common::enter(fast_path.recording, common::shared_shape(fast_path.last_shape, shape));
    if (entry == nullptr) return nullptr;
    // The watchdog watches the check's wait too, as in OrderedExecutor.run: a peer that never
    // comes ends the job at the group's timeout, whichever wait it leaves hanging.
    bool done = stamp(fast_path, monotonic_s());
    if (done) {
        done = checked_call(fast_path, call_args, sequence, signature, count);
        done = unstamp(fast_path) && done;
    }
    PyObject* result = nullptr;
    if (done) {
        if (common::complete(fast_path.recording, entry)) result = Py_NewRef(Py_None);
    } else {
        common::fail(fast_path.recording);
    }
    Py_DECREF(entry);
    return result;
}

PyObject* run(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    auto* fast_path = static_cast<FastPath*>(PyCapsule_GetPointer(self, kCapsuleName));
    if (fast_path == nullptr) return nullptr;
    const Py_ssize_t tensors = takes_two_tensors(fast_path->mpi.kind) ? 2 : 1;
    // all_to_all_single also passes (output_split_sizes, input_split_sizes): uneven splits are Python's.
    const bool splits = fast_path->mpi.kind == Kind::all_to_all && nargs == 3 + tensors;
    if (nargs != 1 + tensors && !splits) {
        return PyErr_Format(PyExc_TypeError, "mpi fast_path: expected (async_op, %zd tensor(s)), received %zd arguments",
                            tensors, nargs);
    }
    const int async_op = PyObject_IsTrue(args[0]);
    if (async_op < 0) return nullptr;
    const bool even = !splits || (args[1 + tensors] == Py_None && args[2 + tensors] == Py_None);
    // Ordered mode runs a synchronous call in place only when nothing is queued before it.
    const Py_ssize_t queued = async_op || !even ? 0 : PyObject_Length(fast_path->queue);
    if (queued < 0) return nullptr;
    Call call;
    PyObject* shape = nullptr;
    const int plain = async_op || !even || queued ? 0 : read_call(*fast_path, args + 1, tensors, call, shape);
    if (plain < 0) return nullptr;
    long long signature = 0;
    int count = 0;
    if (plain && counts_of(*fast_path, call, signature, count)) {
        return run_plain(*fast_path, call, shape, signature, count);
    }
    Py_XDECREF(shape);
    return PyObject_Vectorcall(fast_path->otherwise, args, static_cast<std::size_t>(nargs), nullptr);
}

PyMethodDef run_def = {"mpi_fast_path", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run)),
                       METH_FASTCALL, "run(async_op, *tensors): one mpi op through its plan"};

// Its references but the recording's (released by common::release).
std::vector<PyObject*> owned(const FastPath& fast_path) {
    return {fast_path.queue,    fast_path.otherwise,      fast_path.watchdog,
            fast_path.op,       fast_path.limit,          fast_path.error_type,
            fast_path.slots.sequence, fast_path.slots.verify, fast_path.slots.speculated};
}

void destroy(PyObject* capsule) {
    auto* fast_path = static_cast<FastPath*>(PyCapsule_GetPointer(capsule, kCapsuleName));
    if (fast_path == nullptr) return;
    for (PyObject* reference : owned(*fast_path)) Py_XDECREF(reference);
    Py_XDECREF(fast_path->last_shape);
    common::release(fast_path->recording);
    delete fast_path;
}

Kind kind_of(const std::string& op) {
    if (op == "all_reduce") return Kind::all_reduce;
    if (op == "broadcast") return Kind::broadcast;
    if (op == "all_gather_into_tensor") return Kind::all_gather;
    if (op == "reduce_scatter_tensor") return Kind::reduce_scatter;
    if (op == "all_to_all_single") return Kind::all_to_all;
    throw std::invalid_argument("mpi fast_path: no fused fast_path for op '" + op + "'");
}

std::int64_t* address_of(const py::handle& value) {
    return reinterpret_cast<std::int64_t*>(static_cast<std::uintptr_t>(value.cast<unsigned long long>()));
}

// ``shared``: None (unchecked), or (sequence iterator, own slots' address, peers' addresses, key,
// verify, spin polls, speculates, speculated).
void read_slots(FastPath& fast_path, const py::object& shared) {
    if (shared.is_none()) return;
    const auto fields = shared.cast<py::tuple>();
    if (fields.size() != 8 || !PyIter_Check(fields[0].ptr())) {
        throw std::invalid_argument(
            "mpi fast_path: shared must be (sequence, mine, peers, key, verify, spin polls, speculates, speculated)");
    }
    fast_path.checked = true;
    fast_path.slots.sequence = fields[0].ptr();
    fast_path.slots.mine = address_of(fields[1]);
    for (const py::handle peer : fields[2].cast<py::tuple>()) fast_path.slots.peers.push_back(address_of(peer));
    fast_path.slots.key = fields[3].cast<std::int64_t>();
    fast_path.slots.verify = fields[4].ptr();
    fast_path.slots.spin_polls = fields[5].cast<int>();
    fast_path.slots.speculates = fields[6].cast<bool>();
    fast_path.slots.speculated = fields[7].ptr();
}

// See backends/mpi/native_fast_paths.py, which is the only caller.
py::object make_fast_path(const std::string& op, unsigned long long function, py::tuple handles, bool int_handles,
                         int root, int size, std::size_t item_size, py::object queue, py::object otherwise, py::object watchdog,
                         py::object limit, py::object error_type, py::object shared, py::object recording, int payload) {
    auto fast_path = std::make_unique<FastPath>();
    fast_path->mpi.kind = kind_of(op);
    fast_path->mpi.function = reinterpret_cast<void*>(static_cast<std::uintptr_t>(function));
    fast_path->mpi.handles = Handles{handles[0].cast<std::uintptr_t>(), handles[1].cast<std::uintptr_t>(),
                                    handles[2].cast<std::uintptr_t>(), handles[3].cast<std::uintptr_t>(), int_handles};
    fast_path->mpi.root = root;
    fast_path->size = size;
    fast_path->item_size = item_size;
    fast_path->queue = queue.ptr();
    fast_path->otherwise = otherwise.ptr();
    fast_path->watchdog = watchdog.ptr();
    fast_path->op = py::str(op).release().ptr();  // owned: a new reference
    fast_path->limit = limit.ptr();
    fast_path->error_type = error_type.ptr();
    read_slots(*fast_path, shared);
    if (recording.is_none() || fast_path->mpi.function == nullptr || size < 1 || payload < 0 ||
        payload >= (takes_two_tensors(fast_path->mpi.kind) ? 2 : 1)) {
        throw std::invalid_argument("mpi fast path: needs a recording, its payload's index, an MPI function and a positive size");
    }
    fast_path->recording = common::recording_spec(recording, payload, "mpi fast path");
    for (PyObject* reference : owned(*fast_path)) {
        if (reference != fast_path->op) Py_XINCREF(reference);
    }
    PyObject* capsule = PyCapsule_New(fast_path.get(), kCapsuleName, destroy);
    if (capsule == nullptr) {
        for (PyObject* reference : owned(*fast_path)) Py_XDECREF(reference);
        common::release(fast_path->recording);
        throw py::error_already_set();
    }
    fast_path.release();  // the capsule owns it now
    PyObject* function_object = PyCFunction_NewEx(&run_def, capsule, nullptr);
    Py_DECREF(capsule);  // the function holds it
    if (function_object == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(function_object);
}

}  // namespace

}  // namespace commlayer::mpi

PYBIND11_MODULE(_fast_paths, module) {
    module.doc() = "The mpi backend's fast paths (csrc/mpi/fast_paths.cpp); built by backends/mpi/native_fast_paths.py.";
    module.def("fast_path", &commlayer::mpi::make_fast_path, py::arg("op"), py::arg("function"), py::arg("handles"),
               py::arg("int_handles"), py::arg("root"), py::arg("size"), py::arg("item_size"), py::arg("queue"), py::arg("otherwise"),
               py::arg("watchdog"), py::arg("limit"), py::arg("error_type"), py::arg("shared"),
               py::arg("recording"), py::arg("payload"),
               "run(async_op, *tensors) for one planned kind of call; see backends/mpi/native_fast_paths.py");
}
