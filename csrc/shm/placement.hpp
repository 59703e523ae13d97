// Where the ranks of a group run, for the waits of the communicator.
//
// Ranks that spin while they wait need a core each. Two ranks that talked through sleeping waits
// before (gloo over loopback, for one) are often placed on one CPU by the scheduler (it wakes a
// task next to its waker) and stay there while they spin: then every op takes turns through
// sched_yield, ~10 us per op on a 2-core VM instead of ~1 us. A waiting rank that finds its peer
// on its own CPU therefore moves itself to an allowed CPU where no rank of its group was seen
// (its affinity mask is restored at once: only the placement changes), and spins briefly before
// yielding as long as it shares a CPU with a peer (more ranks than cores: yielding is what helps).
#pragma once

#include <vector>

namespace commlayer::shm {

// The CPU the calling thread runs on now (-1 if unknown).
int current_cpu();

// An allowed CPU of the calling thread other than `taken` ones, or -1 if there is none.
int free_cpu(const std::vector<int>& taken);

// Moves the calling thread onto `cpu` and restores its affinity mask; false if it could not.
bool move_to_cpu(int cpu);

}  // namespace commlayer::shm
