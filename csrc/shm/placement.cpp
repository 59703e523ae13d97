// Thread placement helpers of the shm communicator; see placement.hpp.
#include "placement.hpp"

#include <algorithm>
#include <sched.h>

namespace commlayer::shm {

int current_cpu() { return sched_getcpu(); }

int free_cpu(const std::vector<int>& taken) {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return -1;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &allowed) && std::find(taken.begin(), taken.end(), cpu) == taken.end()) return cpu;
    }
    return -1;
}

bool move_to_cpu(int cpu) {
    cpu_set_t allowed, only;
    CPU_ZERO(&allowed);
    CPU_ZERO(&only);
    CPU_SET(cpu, &only);
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return false;
    // Setting a one-CPU mask migrates the calling thread before the call returns; the original
    // mask then leaves it there, free to move again as the scheduler sees fit.
    const bool moved = sched_setaffinity(0, sizeof(only), &only) == 0;
    sched_setaffinity(0, sizeof(allowed), &allowed);
    return moved;
}

}  // namespace commlayer::shm
