// Copies between a process's memory and a peer's shared-memory window.
#pragma once

#include <cstddef>

namespace commlayer::shm {

// dst[0, bytes) = src[0, bytes); the ranges must not overlap. Copies whose source and
// destination, for two ranks at once, would not fit the last-level cache bypass it (copy.cpp).
void copy_bytes(void* dst, const void* src, std::size_t bytes);

}  // namespace commlayer::shm
