// A large copy into or out of a window touches more memory than the cache holds, so regular
// stores only evict useful lines and first read every destination line (write-allocate);
// non-temporal stores write whole lines to memory directly, with AVX2 where the CPU has it, else
// SSE2 (part of x86-64). Other architectures use memcpy throughout.
#include "copy.hpp"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace commlayer::shm {

namespace {

#if defined(__x86_64__)
constexpr std::size_t kLine = 64;

// Two lines per step; the loads may be unaligned, the streaming stores may not.
__attribute__((target("avx2"))) void stream_lines_avx2(char* dst, const char* src, std::size_t lines) {
    for (std::size_t i = 0; i + 1 < lines; i += 2, dst += 2 * kLine, src += 2 * kLine) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32));
        const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 64));
        const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 96));
        _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), a);
        _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32), b);
        _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 64), c);
        _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 96), d);
    }
    if (lines % 2 != 0) std::memcpy(dst, src, kLine);
}

void stream_lines_sse2(char* dst, const char* src, std::size_t lines) {
    for (std::size_t i = 0; i < lines; ++i, dst += kLine, src += kLine) {
        const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
        const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
        const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
    }
}

using StreamLines = void (*)(char*, const char*, std::size_t);

// The widest streaming loop this CPU runs, picked once.
const StreamLines stream_lines = __builtin_cpu_supports("avx2") ? stream_lines_avx2 : stream_lines_sse2;

void streaming_copy(char* dst, const char* src, std::size_t bytes) {
    // Streaming stores need an aligned destination: copy up to the next line plainly.
    const std::size_t head = (kLine - reinterpret_cast<std::uintptr_t>(dst) % kLine) % kLine;
    std::memcpy(dst, src, head);
    const std::size_t lines = (bytes - head) / kLine;
    stream_lines(dst + head, src + head, lines);
    const std::size_t done = head + lines * kLine;
    std::memcpy(dst + done, src + done, bytes - done);
    // Streaming stores are weakly ordered: make them visible before any later store (a signal).
    _mm_sfence();
}
#endif

}  // namespace

void copy_bytes(void* dst, const void* src, std::size_t bytes) {
#if defined(__x86_64__)
    if (bytes >= kStreamingCopyBytes) {
        streaming_copy(static_cast<char*>(dst), static_cast<const char*>(src), bytes);
        return;
    }
#endif
    std::memcpy(dst, src, bytes);
}

}  // namespace commlayer::shm
