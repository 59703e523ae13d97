// A large copy into or out of a window touches more memory than the cache holds, so regular
// stores only evict useful lines and first read every destination line (write-allocate);
// non-temporal stores write whole lines to memory directly, with AVX2 where the CPU has it, else
// SSE2 (part of x86-64). One sequential stream keeps too few memory requests in flight to fill
// the memory's bandwidth, so a long copy runs as several interleaved streams. Other
// architectures use memcpy throughout.
#include "copy.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace commlayer::shm {

namespace {

#if defined(__x86_64__)
constexpr std::size_t kLine = 64;
constexpr std::size_t kPair = 2 * kLine;
// Each stream is at least this long, so that the hardware prefetcher follows it.
constexpr std::size_t kStreamBytes = std::size_t{8} << 20;
constexpr std::size_t kMaxStreams = 4;
// From here a put's source and destination, for two ranks at once, fill a 32 MiB last-level
// cache. The size is fixed: virtual machines often report the host's whole cache instead.
constexpr std::size_t kStreamingBytes = std::size_t{8} << 20;

// Copies `pairs` two-line blocks from each of `streams` runs `stride` bytes apart, one block of
// every run in turn. The loads may be unaligned, the streaming stores may not.
__attribute__((target("avx2"))) void stream_avx2(char* dst, const char* src, std::size_t pairs,
                                                 std::size_t stride, std::size_t streams) {
    for (std::size_t i = 0; i < pairs; ++i, dst += kPair, src += kPair) {
        for (std::size_t s = 0; s < streams; ++s) {
            const char* from = src + s * stride;
            char* to = dst + s * stride;
            const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from));
            const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + 32));
            const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + 64));
            const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + 96));
            _mm256_stream_si256(reinterpret_cast<__m256i*>(to), a);
            _mm256_stream_si256(reinterpret_cast<__m256i*>(to + 32), b);
            _mm256_stream_si256(reinterpret_cast<__m256i*>(to + 64), c);
            _mm256_stream_si256(reinterpret_cast<__m256i*>(to + 96), d);
        }
    }
}

void stream_sse2(char* dst, const char* src, std::size_t pairs, std::size_t stride, std::size_t streams) {
    for (std::size_t i = 0; i < pairs; ++i, dst += kPair, src += kPair) {
        for (std::size_t s = 0; s < streams; ++s) {
            const char* from = src + s * stride;
            char* to = dst + s * stride;
            for (std::size_t o = 0; o < kPair; o += 16) {
                const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + o));
                _mm_stream_si128(reinterpret_cast<__m128i*>(to + o), v);
            }
        }
    }
}

using Stream = void (*)(char*, const char*, std::size_t, std::size_t, std::size_t);

// The widest streaming loop this CPU runs, picked once.
const Stream stream = __builtin_cpu_supports("avx2") ? stream_avx2 : stream_sse2;

void streaming_copy(char* dst, const char* src, std::size_t bytes) {
    // Streaming stores need an aligned destination: copy up to the next line plainly.
    const std::size_t head = (kLine - reinterpret_cast<std::uintptr_t>(dst) % kLine) % kLine;
    std::memcpy(dst, src, head);
    dst += head, src += head, bytes -= head;
    const std::size_t streams = std::clamp<std::size_t>(bytes / kStreamBytes, 1, kMaxStreams);
    const std::size_t pairs_per_stream = bytes / kPair / streams;
    const std::size_t stride = pairs_per_stream * kPair;
    stream(dst, src, pairs_per_stream, stride, streams);
    const std::size_t done = streams * stride;
    const std::size_t rest_pairs = (bytes - done) / kPair;
    stream(dst + done, src + done, rest_pairs, 0, 1);
    const std::size_t streamed = done + rest_pairs * kPair;
    std::memcpy(dst + streamed, src + streamed, bytes - streamed);
    // Streaming stores are weakly ordered: make them visible before any later store (a signal).
    _mm_sfence();
}
#endif

}  // namespace

void copy_bytes(void* dst, const void* src, std::size_t bytes) {
#if defined(__x86_64__)
    if (bytes >= kStreamingBytes) {
        streaming_copy(static_cast<char*>(dst), static_cast<const char*>(src), bytes);
        return;
    }
#endif
    std::memcpy(dst, src, bytes);
}

}  // namespace commlayer::shm
