// commlayer.backends.ccl._C: a thin pybind11 binding of oneCCL's C++ API.
//
// Python hands in raw data pointers (tensor.data_ptr()), element counts and a
// dtype; no torch C++ API is used, so the extension builds against any torch.
// Every operation is non-blocking and returns an Event; Python keeps the
// tensors alive until the Event completes. Blocking calls (wait, communicator
// creation) release the GIL so other Python threads, and the watchdog that
// enforces the group timeout, keep running.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <oneapi/ccl.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// A pointer crosses the boundary as a Python int (tensor.data_ptr()).
using Address = std::uintptr_t;

void* as_pointer(Address address) { return reinterpret_cast<void*>(address); }

class Kvs {
public:
    explicit Kvs(std::shared_ptr<ccl::kvs> kvs) : kvs_(std::move(kvs)) {}

    // An abandoned KVS is leaked: its teardown talks to the KVS server, and when that
    // server's process is already gone oneCCL aborts the whole process.
    ~Kvs() {
        if (abandoned_) {
            new std::shared_ptr<ccl::kvs>(std::move(kvs_));
        }
    }

    void abandon() { abandoned_ = true; }

    py::bytes address() const {
        const ccl::kvs::address_type addr = kvs_->get_address();
        return py::bytes(addr.data(), addr.size());
    }

    std::shared_ptr<ccl::kvs> handle() const { return kvs_; }

private:
    std::shared_ptr<ccl::kvs> kvs_;
    bool abandoned_ = false;
};

Kvs create_main_kvs() {
    py::gil_scoped_release no_gil;
    return Kvs(ccl::create_main_kvs());
}

Kvs create_kvs(const std::string& address) {
    ccl::kvs::address_type addr{};
    if (address.size() != addr.size()) {
        throw py::value_error("create_kvs: argument 'address' must be exactly " +
                              std::to_string(addr.size()) + " bytes (from Kvs.address()), got " +
                              std::to_string(address.size()) + " bytes");
    }
    std::memcpy(addr.data(), address.data(), addr.size());
    py::gil_scoped_release no_gil;
    return Kvs(ccl::create_kvs(addr));
}

// Set from Python (set_abort) when the peer monitor reports a dead rank: every wait_for then
// returns false at its next poll instead of blocking until its deadline.
std::atomic<bool> g_abort{false};

// An op that oneCCL only offers as a call that blocks until every rank joined (barrier),
// run on a detached thread so that waiting for it can have a deadline like any other op.
struct ThreadedOp {
    std::atomic<bool> done{false};
    std::exception_ptr error;
};

// Threads still inside a oneCCL call that blocks (a barrier whose peer never came): oneCCL's
// static teardown at process exit crashes under such a thread (SIGSEGV after the script ended,
// whatever its exit status), so a process that has one leaves through _Exit with its status.
std::atomic<int> g_threads_in_ccl{0};

void exit_before_ccl_teardown(int status, void*) {
    if (g_threads_in_ccl.load() > 0) {
        std::fflush(nullptr);
        std::_Exit(status);
    }
}

// Registered once oneCCL is initialised, so it runs before the teardown it skips (exit handlers
// run in reverse order of registration); on_exit, unlike atexit, is told the exit status.
void skip_ccl_teardown_while_threads_block() {
    static const bool registered = on_exit(exit_before_ccl_teardown, nullptr) == 0;
    (void)registered;
}

// An in-flight oneCCL operation. test() and wait_for() may be called from several
// threads (Work.get_future waits on a helper thread), so each poll of the oneCCL
// event holds a lock; completion is latched in an atomic flag.
// Set once any op of a communicator was abandoned unfinished (its Event destroyed
// before completion, typically after a timeout).
using AbandonedFlag = std::shared_ptr<std::atomic<bool>>;

class Event {
public:
    Event(ccl::event event, AbandonedFlag abandoned)
        : event_(std::move(event)), abandoned_(std::move(abandoned)) {}

    Event(std::shared_ptr<ThreadedOp> threaded, AbandonedFlag abandoned)
        : abandoned_(std::move(abandoned)), threaded_(std::move(threaded)) {}

    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;

    // Destroying an incomplete oneCCL event can block forever (seen with 2021.14 when a
    // peer never joined the op), so an abandoned event is leaked instead: after a timeout
    // the communicator is unusable anyway, and the leak is one small object.
    ~Event() {
        if (!done_) {
            *abandoned_ = true;
            if (!threaded_) {
                new ccl::event(std::move(event_));
            }
        }
    }

    bool test() {
        if (done_) {
            return true;
        }
        py::gil_scoped_release no_gil;
        return poll();
    }

    // Polls until completion or until `timeout_s` passes; returns false on timeout.
    // Waiting by polling (instead of ccl::event::wait) is what makes a deadline
    // possible: oneCCL's own wait has none. The first polls spin for latency; then
    // each poll yields the core, so other ranks and oneCCL's worker threads run on a
    // machine with fewer cores than ranks. Without worker threads
    // (CCL_WORKER_OFFLOAD=0) these polls are what moves the data, so they only turn
    // into sleeps after a second, when a peer is late rather than the transfer long.
    bool wait_for(double timeout_s) {
        if (done_) {
            return true;
        }
        py::gil_scoped_release no_gil;
        const auto start = std::chrono::steady_clock::now();
        const auto deadline = start + std::chrono::duration<double>(timeout_s);
        for (unsigned polls = 0; !poll(); ++polls) {
            const auto now = std::chrono::steady_clock::now();
            if (now >= deadline || g_abort.load(std::memory_order_relaxed)) {
                return false;
            }
            if (polls < kSpinPolls) {
                continue;
            }
            if (now - start < kYieldPhase) {
                std::this_thread::yield();
            } else {
                std::this_thread::sleep_for(kSleepStep);
            }
        }
        return true;
    }

    bool completed() const { return done_; }

private:
    static constexpr unsigned kSpinPolls = 64;
    static constexpr std::chrono::milliseconds kYieldPhase{1000};
    static constexpr std::chrono::microseconds kSleepStep{50};

    bool poll() {
        std::lock_guard<std::mutex> guard(mutex_);
        if (!done_ && (threaded_ ? threaded_->done.load() : event_.test())) {
            done_ = true;
            if (threaded_ && threaded_->error) {
                std::rethrow_exception(threaded_->error);
            }
        }
        return done_;
    }

    std::mutex mutex_;
    ccl::event event_;
    AbandonedFlag abandoned_;
    std::shared_ptr<ThreadedOp> threaded_;
    std::atomic<bool> done_{false};
};

class Communicator {
public:
    explicit Communicator(ccl::communicator comm)
        : comm_(std::make_shared<ccl::communicator>(std::move(comm))) {}

    Communicator(const Communicator&) = delete;
    Communicator& operator=(const Communicator&) = delete;

    // Destroying a communicator with an op still in flight crashes oneCCL 2021.14, so one
    // whose op was abandoned is leaked (its worker threads end with the process).
    // Destruction also talks to the KVS server; Python orders teardown so it is still up.
    ~Communicator() {
        if (*abandoned_) {
            new std::shared_ptr<ccl::communicator>(std::move(comm_));
        }
    }

    bool abandoned() const { return *abandoned_; }

    // Leak this communicator instead of destroying it (see ~Communicator); used when a
    // peer or the KVS server may be gone.
    void abandon() { *abandoned_ = true; }

    int rank() const { return comm_->rank(); }
    int size() const { return comm_->size(); }

    std::unique_ptr<Event> allreduce(Address send, Address recv, size_t count, ccl::datatype dtype,
                    ccl::reduction op) {
        return run([&] {
            return ccl::allreduce(as_pointer(send), as_pointer(recv), count, dtype, op, *comm_);
        });
    }

    std::unique_ptr<Event> reduce(Address send, Address recv, size_t count, ccl::datatype dtype,
                 ccl::reduction op, int root) {
        return run([&] {
            return ccl::reduce(as_pointer(send), as_pointer(recv), count, dtype, op, root, *comm_);
        });
    }

    std::unique_ptr<Event> allgather(Address send, Address recv, size_t send_count, ccl::datatype dtype) {
        return run([&] {
            return ccl::allgather(as_pointer(send), as_pointer(recv), send_count, dtype, *comm_);
        });
    }

    std::unique_ptr<Event> allgatherv(Address send, size_t send_count, Address recv,
                     const std::vector<size_t>& recv_counts, ccl::datatype dtype) {
        expect_per_rank("allgatherv", "recv_counts", recv_counts);
        return run([&] {
            return ccl::allgatherv(
                as_pointer(send), send_count, as_pointer(recv), recv_counts, dtype, *comm_);
        });
    }

    std::unique_ptr<Event> reduce_scatter(Address send, Address recv, size_t recv_count, ccl::datatype dtype,
                         ccl::reduction op) {
        return run([&] {
            return ccl::reduce_scatter(
                as_pointer(send), as_pointer(recv), recv_count, dtype, op, *comm_);
        });
    }

    std::unique_ptr<Event> broadcast(Address buffer, size_t count, ccl::datatype dtype, int root) {
        return run([&] { return ccl::broadcast(as_pointer(buffer), count, dtype, root, *comm_); });
    }

    std::unique_ptr<Event> alltoall(Address send, Address recv, size_t count, ccl::datatype dtype) {
        return run([&] {
            return ccl::alltoall(as_pointer(send), as_pointer(recv), count, dtype, *comm_);
        });
    }

    std::unique_ptr<Event> alltoallv(Address send, const std::vector<size_t>& send_counts, Address recv,
                    const std::vector<size_t>& recv_counts, ccl::datatype dtype) {
        expect_per_rank("alltoallv", "send_counts", send_counts);
        expect_per_rank("alltoallv", "recv_counts", recv_counts);
        return run([&] {
            return ccl::alltoallv(
                as_pointer(send), send_counts, as_pointer(recv), recv_counts, dtype, *comm_);
        });
    }

    // One receive buffer per rank: spares the caller a staging copy for all_gather(list).
    std::unique_ptr<Event> allgatherv_list(Address send, size_t send_count,
                                           const std::vector<Address>& recvs,
                                           const std::vector<size_t>& recv_counts,
                                           ccl::datatype dtype) {
        expect_per_rank("allgatherv_list", "recvs", recvs);
        expect_per_rank("allgatherv_list", "recv_counts", recv_counts);
        return run([&] {
            return ccl::allgatherv(
                as_pointer(send), send_count, as_pointers(recvs), recv_counts, dtype, *comm_);
        });
    }

    // oneCCL's barrier blocks inside the posting call until every rank arrives, so a rank that
    // never comes would block this one forever: it runs on a detached thread instead, and the
    // Event it returns is waited for with a deadline like every other op. A barrier abandoned
    // at its deadline marks the communicator abandoned, so the communicator (which the thread
    // still uses) is leaked rather than destroyed under it.
    std::unique_ptr<Event> barrier() {
        auto state = std::make_shared<ThreadedOp>();
        std::shared_ptr<ccl::communicator> comm = comm_;  // outlives this object if need be
        skip_ccl_teardown_while_threads_block();
        ++g_threads_in_ccl;
        std::thread([state, comm] {
            try {
                ccl::barrier(*comm).wait();
            } catch (...) {
                state->error = std::current_exception();
            }
            state->done = true;
            --g_threads_in_ccl;
        }).detach();
        return std::make_unique<Event>(state, abandoned_);
    }

    std::unique_ptr<Event> send(Address buffer, size_t count, ccl::datatype dtype, int peer, int tag) {
        return run([&] {
            return ccl::send(as_pointer(buffer), count, dtype, peer, *comm_, pt2pt_attr(tag));
        });
    }

    std::unique_ptr<Event> recv(Address buffer, size_t count, ccl::datatype dtype, int peer, int tag) {
        return run([&] {
            return ccl::recv(as_pointer(buffer), count, dtype, peer, *comm_, pt2pt_attr(tag));
        });
    }

private:
    // Posting an operation can block briefly inside oneCCL (e.g. on the first
    // use of a communicator), so the GIL is released while it is posted.
    template <class Post>
    std::unique_ptr<Event> run(Post&& post) {
        py::gil_scoped_release no_gil;
        return std::make_unique<Event>(post(), abandoned_);
    }

    static std::vector<void*> as_pointers(const std::vector<Address>& addresses) {
        std::vector<void*> pointers;
        pointers.reserve(addresses.size());
        for (Address address : addresses) {
            pointers.push_back(as_pointer(address));
        }
        return pointers;
    }

    static ccl::pt2pt_attr pt2pt_attr(int tag) {
        // oneCCL carries group_id but does not match on it: messages between two ranks match in
        // the order both posted them (strict order, see backends/ccl/environment.py).
        return ccl::create_operation_attr<ccl::pt2pt_attr>(
            ccl::attr_val<ccl::pt2pt_attr_id::group_id>(tag));
    }

    template <class T>
    void expect_per_rank(const char* op, const char* arg, const std::vector<T>& counts) const {
        if (counts.size() != static_cast<size_t>(comm_->size())) {
            throw py::value_error(std::string(op) + ": argument '" + arg + "' must have one count per rank (" +
                                  std::to_string(comm_->size()) + "), got " +
                                  std::to_string(counts.size()) + " (rank " +
                                  std::to_string(comm_->rank()) + ")");
        }
    }

    std::shared_ptr<ccl::communicator> comm_;
    AbandonedFlag abandoned_ = std::make_shared<std::atomic<bool>>(false);
};

std::unique_ptr<Communicator> create_communicator(int size, int rank, const Kvs& kvs) {
    if (size <= 0 || rank < 0 || rank >= size) {
        throw py::value_error("create_communicator: expected 0 <= rank < size, got rank " +
                              std::to_string(rank) + " and size " + std::to_string(size));
    }
    py::gil_scoped_release no_gil;
    return std::make_unique<Communicator>(ccl::create_communicator(size, rank, kvs.handle()));
}

std::string library_version() {
    return ccl::get_library_version().full;
}

void bind_enums(py::module_& m) {
    py::enum_<ccl::datatype>(m, "DataType")
        .value("int8", ccl::datatype::int8)
        .value("uint8", ccl::datatype::uint8)
        .value("int16", ccl::datatype::int16)
        .value("uint16", ccl::datatype::uint16)
        .value("int32", ccl::datatype::int32)
        .value("uint32", ccl::datatype::uint32)
        .value("int64", ccl::datatype::int64)
        .value("uint64", ccl::datatype::uint64)
        .value("float16", ccl::datatype::float16)
        .value("float32", ccl::datatype::float32)
        .value("float64", ccl::datatype::float64)
        .value("bfloat16", ccl::datatype::bfloat16);
    py::enum_<ccl::reduction>(m, "Reduction")
        .value("sum", ccl::reduction::sum)
        .value("prod", ccl::reduction::prod)
        .value("min", ccl::reduction::min)
        .value("max", ccl::reduction::max);
}

void bind_communicator(py::module_& m) {
    py::class_<Communicator>(m, "Communicator")
        .def_property_readonly("rank", &Communicator::rank)
        .def_property_readonly("size", &Communicator::size)
        .def_property_readonly("abandoned", &Communicator::abandoned)
        .def("abandon", &Communicator::abandon)
        .def("allreduce", &Communicator::allreduce, py::arg("send"), py::arg("recv"),
             py::arg("count"), py::arg("dtype"), py::arg("op"))
        .def("reduce", &Communicator::reduce, py::arg("send"), py::arg("recv"), py::arg("count"),
             py::arg("dtype"), py::arg("op"), py::arg("root"))
        .def("allgather", &Communicator::allgather, py::arg("send"), py::arg("recv"),
             py::arg("send_count"), py::arg("dtype"))
        .def("allgatherv", &Communicator::allgatherv, py::arg("send"), py::arg("send_count"),
             py::arg("recv"), py::arg("recv_counts"), py::arg("dtype"))
        .def("reduce_scatter", &Communicator::reduce_scatter, py::arg("send"), py::arg("recv"),
             py::arg("recv_count"), py::arg("dtype"), py::arg("op"))
        .def("broadcast", &Communicator::broadcast, py::arg("buffer"), py::arg("count"),
             py::arg("dtype"), py::arg("root"))
        .def("alltoall", &Communicator::alltoall, py::arg("send"), py::arg("recv"),
             py::arg("count"), py::arg("dtype"))
        .def("alltoallv", &Communicator::alltoallv, py::arg("send"), py::arg("send_counts"),
             py::arg("recv"), py::arg("recv_counts"), py::arg("dtype"))
        .def("allgatherv_list", &Communicator::allgatherv_list, py::arg("send"),
             py::arg("send_count"), py::arg("recvs"), py::arg("recv_counts"), py::arg("dtype"))
        .def("barrier", &Communicator::barrier)
        .def("send", &Communicator::send, py::arg("buffer"), py::arg("count"), py::arg("dtype"),
             py::arg("peer"), py::arg("tag") = 0)
        .def("recv", &Communicator::recv, py::arg("buffer"), py::arg("count"), py::arg("dtype"),
             py::arg("peer"), py::arg("tag") = 0);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
    m.doc() = "oneCCL binding used by commlayer's 'ccl' backend (raw pointers, no torch C++ API).";
    py::register_exception<ccl::exception>(m, "CclError", PyExc_RuntimeError);
    bind_enums(m);

    py::class_<Kvs>(m, "Kvs").def("address", &Kvs::address).def("abandon", &Kvs::abandon);
    m.def("create_main_kvs", &create_main_kvs);
    m.def("create_kvs", &create_kvs, py::arg("address"));

    py::class_<Event>(m, "Event")
        .def("test", &Event::test)
        .def("wait_for", &Event::wait_for, py::arg("timeout_s"))
        .def("wait", [](Event& event) {
            event.wait_for(std::numeric_limits<double>::infinity());
        })
        .def_property_readonly("completed", &Event::completed);

    bind_communicator(m);
    m.def("create_communicator", &create_communicator, py::arg("size"), py::arg("rank"),
          py::arg("kvs"));
    m.def("library_version", &library_version);
    m.def(
        "set_abort", [](bool abort) { g_abort = abort; }, py::arg("abort"),
        "Make every pending and future wait_for return false at once (a peer died), or stop.");
    m.attr("ADDRESS_SIZE") = py::int_(ccl::kvs::address_max_size);
}
