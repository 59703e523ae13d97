// Reduction kernels of the shm backend: out[i] = in[0][i] op in[1][i] op ... op in[n-1][i].
//
// Inputs are always combined in the order given, so every rank that reduces the same inputs
// gets bit-identical results. 16-bit floats accumulate in float32 and round once at the end.
// The kernels are compiled three times (AVX-512, AVX2+F16C+FMA, baseline x86-64) and the
// widest one the CPU supports is picked once at load time (see kernels.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace commlayer::shm {

enum class DType : int { f32 = 0, f64, bf16, f16, i8, u8, i32, i64, boolean };
enum class Op : int { sum = 0, avg, product, min, max, band, bor, bxor };

std::size_t element_size(DType dtype);

// `out` may alias any input only if it is that input exactly (in-place elementwise).
// `out2`, when not null, receives a second copy of the result (saves a pass over memory).
// AVG sums and divides by `divisor`.
void reduce(void* out, void* out2, const void* const* inputs, int count_inputs, std::size_t count,
            DType dtype, Op op, int divisor);

// Which instruction set the dispatcher picked: "avx512", "avx2" or "baseline".
const char* kernel_isa();

}  // namespace commlayer::shm
