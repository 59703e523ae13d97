// One shared-memory communicator: the ranks of a group on one host, each owning a region of a
// shared segment that the others read.
//
// Synchronisation is a single monotonically increasing step counter per rank (its own cache
// line): arriving at step s publishes everything the rank wrote before it (release), and a rank
// that saw every peer at step s may read what they wrote before it (acquire). Every op runs the
// same sequence of steps on every rank, so no other state is shared.
//
// Region of one rank (sizes from Layout; per group the memory is size * Layout::region_bytes()):
//   control (256 B) | small[0] | small[1] | stage | result
// - small messages use small[step parity]: one step per op, no "done reading" step, because a
//   buffer is rewritten only two steps later, after every peer has arrived at the step between;
// - large messages go in rounds through `stage` (and `result` for all_reduce), two steps a round.
//
// Mismatch check, always on: each op packs its signature (op, dtype, reduce op, root, element
// count) into 64 bits that a rank stores beside its step counter (one slot per step parity, so a
// peer one step ahead never overwrites the slot being read) before arriving. After seeing a peer
// arrive, a rank compares the peer's signature with its own and throws MismatchError before
// touching any peer data. Cost: one store and one load per peer, on cache lines the step already
// pulls in.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <sys/types.h>
#include <vector>

#include "kernels.hpp"

namespace commlayer::shm {

struct Layout {
    std::size_t small_bytes = 64 * 1024;   // each of the two small buffers
    std::size_t chunk_bytes = 1024 * 1024; // stage and result buffers, each
    static constexpr std::size_t control_bytes = 256;
    std::size_t region_bytes() const;
};

struct WaitPolicy {
    double timeout_s = 1800.0;  // the group's timeout: the deadline of every wait
    int spins = 256;            // busy polls before a waiting rank starts yielding the core
                                // (16 while it shares its CPU with a peer, see placement.hpp)
};

// A peer missed the deadline (maybe a different op order, maybe just slow).
class TimeoutError : public std::runtime_error {
    using std::runtime_error::runtime_error;
};
// A peer's process is gone, or the communicator already failed.
class PeerError : public std::runtime_error {
    using std::runtime_error::runtime_error;
};
// A peer called a different collective (op, dtype, reduce op, root or element count) at this step.
class MismatchError : public std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Called when a wait stops spinning and starts yielding, and when it ends (the binding releases
// and re-takes the GIL there, so short waits never pay for it).
struct SlowWaitHooks {
    std::function<void()> begin;
    std::function<void()> end;
};

class Comm {
public:
    // `regions[i]` is rank i's region, already mapped; `pids[i]` its process (0: do not watch);
    // `ranks[i]` its global rank and `group` the group's name, for messages.
    Comm(std::string group, std::vector<int> ranks, int rank, int size, std::vector<char*> regions,
         std::vector<pid_t> pids, Layout layout, WaitPolicy policy);

    int rank() const { return rank_; }
    int size() const { return size_; }
    std::uint64_t steps() const { return step_; }
    void set_hooks(SlowWaitHooks hooks) { hooks_ = std::move(hooks); }

    // Tells the peers this process is exiting: a peer waiting for it stops at once with PeerError
    // (a rank's interpreter may take longer than the group's timeout to exit, see backend.py).
    void depart();
    // Ends this rank's waits (from any thread): the facade's peer monitor saw a rank die. Checked
    // where a wait yields, so only waits that already gave up spinning pay for it.
    void interrupt() { interrupted_->store(true, std::memory_order_relaxed); }
    // The deadline of every wait; a call with its own timeout lowers it while it runs.
    double timeout() const { return policy_.timeout_s; }
    void set_timeout(double seconds) { policy_.timeout_s = seconds; }

    void barrier();
    void all_reduce(void* data, std::size_t count, DType dtype, Op op);
    void broadcast(void* data, std::size_t count, DType dtype, int root);
    // `output` holds size * count elements, rank-major.
    void all_gather(void* output, const void* input, std::size_t count, DType dtype);
    // `input` holds size * count elements; this rank receives the reduction of block `rank`.
    void reduce_scatter(void* output, const void* input, std::size_t count, DType dtype, Op op);
    // Both hold size blocks of `count` elements; block j of the input goes to rank j.
    void all_to_all(void* output, const void* input, std::size_t count, DType dtype);

private:
    struct Control;
    Control* control(int peer) const;
    char* small(int peer, std::uint64_t step) const;
    char* stage(int peer) const;
    char* result(int peer) const;

    void check_usable(const char* op) const;
    void begin(const char* op, int kind, std::size_t count, DType dtype, int reduce_op, int root);
    void arrive_and_wait(const char* op);
    void check_signature(int peer, std::uint64_t step, const char* op) const;
    void wait_for(int peer, std::uint64_t step, const char* op);
    bool settle_placement(int peer);
    void fail(const std::string& message, bool timeout);
    std::string exited(int peer) const;

    void all_reduce_small(char* data, std::size_t count, DType dtype, Op op);
    void all_reduce_round(char* data, std::size_t count, DType dtype, Op op);
    void reduce_scatter_round(char* out, const char* in, std::size_t stride, std::size_t count,
                              DType dtype, Op op, char* staging, bool fits_small);

    std::string group_;
    std::string label_;
    std::vector<int> ranks_;
    int rank_;
    int size_;
    std::vector<char*> regions_;
    std::vector<pid_t> pids_;
    Layout layout_;
    WaitPolicy policy_;
    SlowWaitHooks hooks_;
    std::uint64_t step_ = 0;
    std::uint64_t signature_ = 0;  // of the op in progress, published at each of its steps
    std::string failure_;
    std::vector<const void*> inputs_;  // scratch for the reduction inputs (no allocation per op)
    bool sharing_cpu_ = false;         // a peer was last seen on this rank's CPU (placement.hpp)
    std::int64_t last_move_ns_ = 0;    // when this rank last moved to another CPU
    // Behind a pointer, so a Comm stays movable (race_check.cpp keeps them in a vector).
    std::unique_ptr<std::atomic<bool>> interrupted_ = std::make_unique<std::atomic<bool>>(false);
};

}  // namespace commlayer::shm
