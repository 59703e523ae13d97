// commlayer.backends.shm._C: pybind11 binding of the shared-memory communicator.
//
// Tensors cross as raw addresses (tensor.data_ptr()) plus element counts and dtype/op codes, so
// the extension needs no torch headers and builds with a compiler and pybind11 alone. Ops keep
// the GIL while they spin (most small ops finish there) and release it only once a wait starts
// yielding the core, so other Python threads run during long waits without every op paying.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "comm.hpp"
#include "kernels.hpp"
#include "fast_paths.hpp"
#include "segment.hpp"
#include "window_copies.hpp"

namespace py = pybind11;
using namespace commlayer::shm;

namespace {

using Address = std::uintptr_t;

void* ptr(Address address) { return reinterpret_cast<void*>(address); }

thread_local PyThreadState* released_state = nullptr;

SlowWaitHooks gil_hooks() {
    return SlowWaitHooks{[] { released_state = PyEval_SaveThread(); },
                         [] {
                             PyEval_RestoreThread(released_state);
                             released_state = nullptr;
                         }};
}

// A communicator plus the mapping its regions live in.
class Group {
public:
    Group(std::string group, std::vector<int> ranks, int rank, int size, std::shared_ptr<Mapping> mapping,
          std::vector<pid_t> pids, std::size_t small_bytes, std::size_t chunk_bytes, double timeout_s, int spins)
        : mapping_(std::move(mapping)),
          comm_(std::move(group), std::move(ranks), rank, size, regions(*mapping_, size, Layout{small_bytes, chunk_bytes}),
                std::move(pids), Layout{small_bytes, chunk_bytes}, WaitPolicy{timeout_s, spins}) {
        comm_.set_hooks(gil_hooks());
    }

    Comm& comm() { return comm_; }

private:
    static std::vector<char*> regions(const Mapping& mapping, int size, const Layout& layout) {
        if (mapping.bytes() < layout.region_bytes() * static_cast<std::size_t>(size)) {
            throw std::invalid_argument("shm: segment too small for the group's layout");
        }
        std::vector<char*> result;
        for (int r = 0; r < size; ++r) result.push_back(mapping.data() + layout.region_bytes() * r);
        return result;
    }

    std::shared_ptr<Mapping> mapping_;
    Comm comm_;
};

FastPathErrors fast_path_errors;  // the module's exception types, set once at import

OpKind op_kind(const std::string& op) {
    if (op == "all_reduce") return OpKind::all_reduce;
    if (op == "broadcast") return OpKind::broadcast;
    if (op == "all_gather_into_tensor") return OpKind::all_gather;
    if (op == "reduce_scatter_tensor") return OpKind::reduce_scatter;
    throw std::invalid_argument("shm: no fast path for op '" + op + "'");
}

py::object fast_path(py::object self, const std::string& op, int fixed, py::dict dtype_codes, py::object completed,
                     py::object recording, int payload) {
    Group& group = self.cast<Group&>();
    const OpKind kind = op_kind(op);
    const int tensors = kind == OpKind::all_gather || kind == OpKind::reduce_scatter ? 2 : 1;
    if (payload < 0 || payload >= tensors) {
        throw std::invalid_argument("shm fast path: payload index out of range for op '" + op + "'");
    }
    RecordingSpec recorded = commlayer::common::recording_spec(recording, payload, "shm fast path");
    // A recorded fast path serves one plan, whose key holds the dtype of every tensor it gets.
    PyObject* plan_dtype = recorded.recording.dtype;
    const int dtype = plan_dtype != nullptr && dtype_codes.contains(plan_dtype)
                          ? dtype_codes[py::handle(plan_dtype)].cast<int>()
                          : -1;
    const FastPathSpec spec{self.ptr(), &group.comm(), kind, fixed, dtype_codes.ptr(), dtype, completed.ptr(), recorded};
    PyObject* function = make_fast_path(spec, fast_path_errors);  // owns the recording's references now
    if (function == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(function);
}

// A window's put or get that its fast path did not take (window_copies.hpp).
void window_copy(Address dst, Address src, std::size_t bytes) { window_copy_bytes(ptr(dst), ptr(src), bytes); }

// A window's (put, get) fast paths (window_copies.hpp); `reader` is commlayer.core._tensor_meta's.
py::object window_copies(std::vector<Address> addresses, std::vector<long long> sizes, py::dict group_ranks,
                         int scalar_type, int itemsize, py::object reader) {
    auto read = reinterpret_cast<CommlayerTensorMetaReader>(
        PyCapsule_GetPointer(reader.ptr(), COMMLAYER_TENSOR_META_CAPSULE));
    if (read == nullptr) throw py::error_already_set();
    PyObject* pair = make_window_copies(
        WindowCopySpec{std::move(addresses), std::move(sizes), group_ranks.ptr(), scalar_type, itemsize, read});
    if (pair == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(pair);
}

void reduce_local(Address out, const std::vector<Address>& inputs, std::size_t count, int dtype, int op,
                  int divisor) {
    std::vector<const void*> pointers;
    for (Address a : inputs) pointers.push_back(ptr(a));
    reduce(ptr(out), nullptr, pointers.data(), static_cast<int>(pointers.size()), count, static_cast<DType>(dtype),
           static_cast<Op>(op), divisor);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
    m.doc() = "commlayer shared-memory communicator (csrc/shm)";
    // Native errors surface as commlayer's public types themselves (no private subclasses), so
    // users see CommTimeoutError, not a name inside this extension, and ops need no translating.
    const py::module_ errors = py::module_::import("commlayer.core.errors");
    fast_path_errors.timeout = py::object(errors.attr("CommTimeoutError")).release().ptr();
    fast_path_errors.peer = py::object(errors.attr("CommError")).release().ptr();
    fast_path_errors.mismatch = py::object(errors.attr("CollectiveMismatchError")).release().ptr();
    py::register_exception_translator([](std::exception_ptr raised) {
        try {
            if (raised) std::rethrow_exception(raised);
        } catch (const TimeoutError& error) {
            PyErr_SetString(fast_path_errors.timeout, error.what());
        } catch (const PeerError& error) {
            PyErr_SetString(fast_path_errors.peer, error.what());
        } catch (const MismatchError& error) {
            PyErr_SetString(fast_path_errors.mismatch, error.what());
        }
    });

    py::class_<Mapping, std::shared_ptr<Mapping>>(m, "Mapping")
        .def(py::init<const std::string&, std::size_t, bool>(), py::arg("name"), py::arg("bytes"),
             py::arg("create"))
        .def_property_readonly("bytes", &Mapping::bytes)
        .def("touch", &Mapping::touch, py::arg("offset"), py::arg("bytes"));
    m.def("unlink_segment", &unlink_segment, py::arg("name"));
    m.def("region_bytes",
          [](std::size_t small_bytes, std::size_t chunk_bytes) { return Layout{small_bytes, chunk_bytes}.region_bytes(); });
    m.def("kernel_isa", &kernel_isa);
    m.def("copy", &window_copy, py::arg("dst"), py::arg("src"), py::arg("bytes"),
          "dst[0, bytes) = src[0, bytes), for windows (copy.hpp)");
    m.def("window_copies", &window_copies, py::arg("addresses"), py::arg("sizes"), py::arg("group_ranks"),
          py::arg("scalar_type"), py::arg("itemsize"), py::arg("reader"),
          "(put, get) of a window: f(tensor, rank, offset) -> bool (window_copies.hpp)");
    m.def("reduce", &reduce_local, py::arg("out"), py::arg("inputs"), py::arg("count"), py::arg("dtype"),
          py::arg("op"), py::arg("divisor"));

    py::class_<Group>(m, "Comm")
        .def(py::init<std::string, std::vector<int>, int, int, std::shared_ptr<Mapping>, std::vector<pid_t>,
                      std::size_t, std::size_t, double, int>(),
             py::arg("group"), py::arg("ranks"), py::arg("rank"), py::arg("size"), py::arg("mapping"), py::arg("pids"),
             py::arg("small_bytes"), py::arg("chunk_bytes"), py::arg("timeout_s"), py::arg("spins"))
        .def_property_readonly("steps", [](Group& g) { return g.comm().steps(); })
        .def_property(
            "timeout_s", [](Group& g) { return g.comm().timeout(); },
            [](Group& g, double seconds) { g.comm().set_timeout(seconds); }, "the deadline of every wait, in seconds")
        .def("barrier", [](Group& g) { g.comm().barrier(); })
        .def("depart", [](Group& g) { g.comm().depart(); }, "tell the peers this process is exiting")
        .def("interrupt", [](Group& g) { g.comm().interrupt(); }, "end this rank's waits: a peer died")
        .def("fast_path", &fast_path, py::arg("op"), py::arg("fixed"), py::arg("dtype_codes"), py::arg("completed"),
             py::arg("recording") = py::none(), py::arg("payload") = 0,
             "run(async_op, *tensors) for one planned kind of call (fast_paths.hpp)")
        .def("all_reduce",
             [](Group& g, Address data, std::size_t count, int dtype, int op) {
                 g.comm().all_reduce(ptr(data), count, static_cast<DType>(dtype), static_cast<Op>(op));
             })
        .def("broadcast",
             [](Group& g, Address data, std::size_t count, int dtype, int root) {
                 g.comm().broadcast(ptr(data), count, static_cast<DType>(dtype), root);
             })
        .def("all_gather",
             [](Group& g, Address out, Address in, std::size_t count, int dtype) {
                 g.comm().all_gather(ptr(out), ptr(in), count, static_cast<DType>(dtype));
             })
        .def("reduce_scatter",
             [](Group& g, Address out, Address in, std::size_t count, int dtype, int op) {
                 g.comm().reduce_scatter(ptr(out), ptr(in), count, static_cast<DType>(dtype), static_cast<Op>(op));
             })
        .def("all_to_all", [](Group& g, Address out, Address in, std::size_t count, int dtype) {
            g.comm().all_to_all(ptr(out), ptr(in), count, static_cast<DType>(dtype));
        });
}
