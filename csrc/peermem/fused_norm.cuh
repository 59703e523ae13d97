// all_reduce + residual add + RMSNorm in one kernel (tensor-parallel decode).
//
// One-shot push: every rank writes its partial rows into slot [rank] of every peer's region, then
// each block takes whole rows: it sums the slots in rank order (float), rounds to the dtype, adds
// the residual (rounded again, the new residual), and normalises the row. Every rank runs the same
// float operations in the same order, so the outputs are bitwise equal everywhere and equal to
// backends/peermem/reference.py's fused_reference: a thread sums the squares of its units (units
// t, t + THREADS, ...) in order, the warp adds its lanes by xor butterfly, the first warp does the
// same over the warps' sums; scale = 1 / sqrt(sum / hidden + eps), all correctly rounded;
// normed = dtype(r * scale * weight), rounded once as torch's rms_norm does.
#pragma once
#include "common.cuh"

__device__ __forceinline__ float butterfly_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The row's sum of squares, equal in every thread of the block. `sums`: THREADS / 32 floats.
__device__ float block_sum(float v, float* sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = butterfly_sum(v);
  if (lane == 0) sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < THREADS / 32 ? sums[lane] : 0.0f;
    w = butterfly_sum(w);
    if (lane == 0) sums[THREADS / 32] = w;
  }
  __syncthreads();
  float total = sums[THREADS / 32];
  __syncthreads();
  return total;
}

template <typename T>
__global__ void __launch_bounds__(THREADS)
    fused_norm(const __grid_constant__ Args a, const char* partial, const char* residual, const char* weight,
               char* normed, char* residual_out, int rows, int hidden, float eps) {
  constexpr int N = 16 / sizeof(T);
  __shared__ Sync sync;
  __shared__ float sums[THREADS / 32 + 1];
  Epoch epoch;
  if (!start_call(a, &epoch, &sync)) return;
  const int parity = epoch.value & 1;
  const size_t half = DATA_OFFSET + parity * a.half_bytes;
  const size_t row_bytes = (size_t)hidden * sizeof(T), bytes = row_bytes * rows;
  const int units = (int)(row_bytes / 16);
  // Block b writes (and every peer's block b reads) rows b, b + grid, ...
  for (int q = 0; q < a.world; ++q) {
    if (q == a.rank) continue;
    char* slot = a.base[q] + half + a.rank * bytes;
    for (int row = blockIdx.x; row < rows; row += gridDim.x)
      for (int u = threadIdx.x; u < units; u += THREADS)
        *(uint4*)(slot + row * row_bytes + u * 16) = *(const uint4*)(partial + row * row_bytes + u * 16);
  }
  if (block_barrier(a, &sync)) {
    const char* src[MAX_RANKS];
    const char* stage = a.base[a.rank] + half;
#pragma unroll
    for (int p = 0; p < MAX_RANKS; ++p) src[p] = p == a.rank ? partial : stage + p * bytes;
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
      float squares = 0.0f;
      for (int u = threadIdx.x; u < units; u += THREADS) {
        const size_t off = row * row_bytes + u * 16;
        uint4 reduced = reduce_unit<T, SUM>(src, a.world, off);
        uint4 res = *(const uint4*)(residual + off), sum;
        const T *r = (const T*)&reduced, *x = (const T*)&res;
        T* s = (T*)&sum;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          s[j] = from_float<T>(__fadd_rn(to_float<T>(x[j]), to_float<T>(r[j])));
          float v = to_float<T>(s[j]);
          squares = __fadd_rn(squares, __fmul_rn(v, v));
        }
        *(uint4*)(residual_out + off) = sum;
      }
      const float total = block_sum(squares, sums);
      const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(total, (float)hidden), eps)));
      for (int u = threadIdx.x; u < units; u += THREADS) {
        const size_t off = row * row_bytes + u * 16;
        uint4 res = *(const uint4*)(residual_out + off), w = *(const uint4*)(weight + u * 16), y;
        const T *x = (const T*)&res, *g = (const T*)&w;
        T* o = (T*)&y;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          o[j] = from_float<T>(__fmul_rn(__fmul_rn(to_float<T>(x[j]), scale), to_float<T>(g[j])));
        }
        *(uint4*)(normed + off) = y;
      }
    }
  }
  finish(a, epoch, &sync);
}
