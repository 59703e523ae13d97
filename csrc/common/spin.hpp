// The one instruction a waiting loop runs between polls of shared memory (csrc/shm, csrc/mpi).
#pragma once

namespace commlayer::common {

// Tells the CPU this is a spin-wait: the polls stop filling the pipeline with speculative loads,
// and the core's sibling hyperthread gets the cycles.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
}

}  // namespace commlayer::common
