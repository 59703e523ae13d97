// Copies between a process's memory and a peer's shared-memory window.
#pragma once

#include <cstddef>

namespace commlayer::shm {

// Below this many bytes a copy is memcpy: source and destination of two ranks at once still fit
// a server's last-level cache. From it on, stores bypass the cache (see copy.cpp).
constexpr std::size_t kStreamingCopyBytes = std::size_t{16} << 20;

// dst[0, bytes) = src[0, bytes); the ranges must not overlap.
void copy_bytes(void* dst, const void* src, std::size_t bytes);

}  // namespace commlayer::shm
