// Run-time dispatch of the reduction kernels over the CPU's vector width.
#include "kernels.hpp"

#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace commlayer::shm {

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
namespace avx512 {
#include "kernels_impl.inc"
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
#include "kernels_impl.inc"
}  // namespace avx2
#pragma GCC pop_options
#endif

namespace baseline {
#include "kernels_impl.inc"
}  // namespace baseline

namespace {

using Kernel = bool (*)(void*, void*, const void* const*, int, std::size_t, DType, Op, int);

struct Choice {
    Kernel kernel;
    const char* isa;
};

Choice choose() {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
        return {avx512::reduce_any, "avx512"};
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return {avx2::reduce_any, "avx2"};
#endif
    return {baseline::reduce_any, "baseline"};
}

const Choice& chosen() {
    static const Choice choice = choose();
    return choice;
}

}  // namespace

std::size_t element_size(DType dtype) {
    switch (dtype) {
        case DType::f32: case DType::i32: return 4;
        case DType::f64: case DType::i64: return 8;
        case DType::bf16: case DType::f16: return 2;
        case DType::i8: case DType::u8: case DType::boolean: return 1;
    }
    throw std::invalid_argument("shm: unknown dtype code " + std::to_string(static_cast<int>(dtype)));
}

void reduce(void* out, void* out2, const void* const* inputs, int count_inputs, std::size_t count,
            DType dtype, Op op, int divisor) {
    if (!chosen().kernel(out, out2, inputs, count_inputs, count, dtype, op, divisor)) {
        throw std::invalid_argument("shm: reduce op " + std::to_string(static_cast<int>(op)) +
                                    " is not defined for dtype " + std::to_string(static_cast<int>(dtype)));
    }
}

const char* kernel_isa() { return chosen().isa; }

}  // namespace commlayer::shm
