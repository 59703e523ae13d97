// The mismatch check's side of the mpi fast path (csrc/mpi/fast_paths.cpp): this rank's and its
// peers' slots in the communicator's shared window, the waits for a peer's signature, and the
// look without waiting that speculation needs (commlayer/contract/mismatch/shared_slots.py has the protocol).
#pragma once

#include <Python.h>

#include <cstdint>
#include <ctime>
#include <sched.h>
#include <vector>

#include "../common/spin.hpp"

namespace commlayer::mpi {

// A peer's slot is polled kHeldPolls times holding the GIL (a peer already in its call is seen
// at once), then without it: spinning (pause) for the fast path's ``spin_polls`` (few where the
// group's ranks outnumber the CPUs: a peer may need this one), then yielding the CPU between
// polls until kYieldSeconds have passed. After that Python waits (it sleeps, watches peer
// failures and the deadline, raises the typed errors): a peer that late is rare.
constexpr int kHeldPolls = 64;
constexpr double kYieldSeconds = 0.01;

// The mismatch check's slots in the communicator's shared window (commlayer/contract/mismatch/shared_slots.py):
// 8 int64 words per slot, two slots per rank; word 0 the sequence, 1 the key, 2 the count, 3 the
// decision (sequence * 4 + kSpeculated, or Python's "refused").
constexpr std::int64_t kSpeculated = 1;

struct SharedSlots {
    std::int64_t* mine = nullptr;
    std::vector<const std::int64_t*> peers;
    PyObject* sequence = nullptr;     // the itertools.count both paths take sequence numbers from
    PyObject* verify = nullptr;       // (sequence, count) -> waits, compares, raises: the Python path
    PyObject* speculated = nullptr;   // (sequence, count) -> the same, after a speculative call
    std::int64_t key = 0;
    int spin_polls = 0;
    bool speculates = false;  // this kind of call leaves its input unwritten (see the header)
};

// --- the mismatch check through shared memory ------------------------------------------------

// Writes this rank's signature for ``sequence`` (the sequence word last, with release order: a
// peer that sees it sees the signature).
inline void publish(const SharedSlots& slots, std::int64_t sequence, std::int64_t count) {
    std::int64_t* slot = slots.mine + (sequence & 1) * 8;
    slot[1] = slots.key;
    slot[2] = count;
    __atomic_store_n(&slot[0], sequence, __ATOMIC_RELEASE);
}

inline double monotonic_s() {
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

inline bool published(const std::int64_t* slot, std::int64_t sequence) {
    return __atomic_load_n(&slot[0], __ATOMIC_ACQUIRE) == sequence;
}

// Waits for ``slot`` to reach ``sequence``, without the GIL (called with it released).
inline bool wait_published(const std::int64_t* slot, std::int64_t sequence, int spin_polls) {
    for (int polls = 0; polls < spin_polls; ++polls) {
        if (published(slot, sequence)) return true;
        common::cpu_relax();
    }
    const double until = monotonic_s() + kYieldSeconds;
    for (;;) {
        for (int polls = 0; polls < 64; ++polls) {
            if (published(slot, sequence)) return true;
            sched_yield();
        }
        if (monotonic_s() > until) return false;
    }
}

// Whether every peer has published ``sequence`` with the same signature, waiting a while for
// late ones; false means "let Python decide" (wait longer, or raise the mismatch).
inline bool peers_agree(const SharedSlots& slots, std::int64_t sequence, std::int64_t count) {
    const std::size_t at = (sequence & 1) * 8;
    for (const std::int64_t* peer : slots.peers) {
        const std::int64_t* slot = peer + at;
        bool arrived = false;
        for (int polls = 0; polls < kHeldPolls && !arrived; ++polls) arrived = published(slot, sequence);
        if (!arrived) {
            Py_BEGIN_ALLOW_THREADS;
            arrived = wait_published(slot, sequence, slots.spin_polls);
            Py_END_ALLOW_THREADS;
        }
        if (!arrived || slot[1] != slots.key || slot[2] != count) return false;
    }
    return true;
}

enum class Seen { all_agree, some_missing, disagree };

// Which peers have published ``sequence``, and whether they agree, without waiting. The fence
// orders this rank's publication before its reads: of two ranks that speculate, at least one
// sees the other (store, fence, load), so speculators never disagree among themselves.
inline Seen look_around(const SharedSlots& slots, std::int64_t sequence, std::int64_t count) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    const std::size_t at = (sequence & 1) * 8;
    Seen seen = Seen::all_agree;
    for (const std::int64_t* peer : slots.peers) {
        const std::int64_t* slot = peer + at;
        if (!published(slot, sequence)) {
            seen = Seen::some_missing;
        } else if (slot[1] != slots.key || slot[2] != count) {
            return Seen::disagree;
        }
    }
    return seen;
}

inline void mark_speculated(const SharedSlots& slots, std::int64_t sequence) {
    __atomic_store_n(&slots.mine[(sequence & 1) * 8 + 3], sequence * 4 + kSpeculated, __ATOMIC_RELEASE);
}

// ``check(sequence, count)`` in Python (``verify`` or ``speculated``): waits for the late peers
// (bounded by the group's timeout) and raises the typed mismatch; false with that exception set.
inline bool verify_in_python(PyObject* check, std::int64_t sequence, std::int64_t count) {
    PyObject* result = PyObject_CallFunction(check, "LL", static_cast<long long>(sequence),
                                             static_cast<long long>(count));
    Py_XDECREF(result);
    return result != nullptr;
}

}  // namespace commlayer::mpi
