// The staged algorithms: a call's data travels through the ranks' regions, one barrier (two for
// two-shot) per call and no barrier at its end. Each block reads after a barrier only what the
// same block index of every rank wrote before it (same thread-to-unit mapping on both sides).
#pragma once
#include "common.cuh"

// bytes: the whole tensor. Every rank stages its input, then reads every peer's staged copy.
template <typename T, int OP>
__device__ void one_shot(const Args& a, const char* in, char* out, size_t bytes, size_t half, Sync* sync) {
  char* stage = a.base[a.rank] + half;
  copy_range(stage, in, bytes);
  if (!block_barrier(a, sync)) return;
  const char* src[MAX_RANKS];
#pragma unroll
  for (int p = 0; p < MAX_RANKS; ++p) src[p] = p == a.rank ? in : (p < a.world ? a.base[p] + half : nullptr);
  for (size_t off = first_unit(); off < bytes; off += unit_stride()) *(uint4*)(out + off) = reduce_unit<T, OP>(src, a.world, off);
}

// bytes: the whole tensor. Every rank writes its input into slot [rank] of every peer's region,
// then reduces the slots of its own region: one barrier, and every read after it is local.
template <typename T, int OP>
__device__ void one_shot_push(const Args& a, const char* in, char* out, size_t bytes, size_t half, Sync* sync) {
  for (int q = 0; q < a.world; ++q)
    if (q != a.rank) copy_range(a.base[q] + half + a.rank * bytes, in, bytes);
  if (!block_barrier(a, sync)) return;
  const char* src[MAX_RANKS];
  const char* stage = a.base[a.rank] + half;
#pragma unroll
  for (int p = 0; p < MAX_RANKS; ++p) src[p] = p == a.rank ? in : stage + p * bytes;
  for (size_t off = first_unit(); off < bytes; off += unit_stride()) *(uint4*)(out + off) = reduce_unit<T, OP>(src, a.world, off);
}

struct Slice {
  size_t begin, len;
};
__device__ __forceinline__ Slice slice_of(size_t bytes, int world, int s) {
  size_t slice = ((bytes + world - 1) / world + 15) / 16 * 16;
  size_t begin = min_size(s * slice, bytes);
  return {begin, min_size(begin + slice, bytes) - begin};
}

// bytes: the whole tensor, in slices of ceil(bytes / world). Reduce-scatter by pulling the
// staged slices, then all-gather by pulling the owners' results.
template <typename T, int OP>
__device__ void two_shot(const Args& a, const char* in, char* out, size_t bytes, size_t half, Sync* sync) {
  char* stage = a.base[a.rank] + half;
  for (int s = 0; s < a.world; ++s) {
    Slice sl = slice_of(bytes, a.world, s);
    if (s != a.rank) copy_range(stage + sl.begin, in + sl.begin, sl.len);
  }
  Slice mine = slice_of(bytes, a.world, a.rank);
  if (!block_barrier(a, sync)) return;
  const char* src[MAX_RANKS];
#pragma unroll
  for (int p = 0; p < MAX_RANKS; ++p)
    src[p] = p == a.rank ? in + mine.begin : (p < a.world ? a.base[p] + half + mine.begin : nullptr);
  for (size_t off = first_unit(); off < mine.len; off += unit_stride()) {
    uint4 r = reduce_unit<T, OP>(src, a.world, off);
    *(uint4*)(stage + mine.begin + off) = r;
    *(uint4*)(out + mine.begin + off) = r;
  }
  if (!block_barrier(a, sync)) return;
  for (int s = 0; s < a.world; ++s) {
    Slice sl = slice_of(bytes, a.world, s);
    if (s != a.rank) copy_range(out + sl.begin, a.base[s] + half + sl.begin, sl.len);
  }
}

// The push variant: each rank writes its part of slice s into rank s's slot [rank], reduces its
// own slice from local slots, writes the result into every peer's gather area [rank], and finally
// copies the gathered slices out of its own region. Only posted writes cross NVLink.
template <typename T, int OP>
__device__ void two_shot_push(const Args& a, const char* in, char* out, size_t bytes, size_t half, Sync* sync) {
  char* stage = a.base[a.rank] + half;
  size_t slice = ((bytes + a.world - 1) / a.world + 15) / 16 * 16;
  char* gather = stage + a.world * slice;
  for (int s = 0; s < a.world; ++s) {
    Slice sl = slice_of(bytes, a.world, s);
    if (s != a.rank) copy_range(a.base[s] + half + a.rank * slice, in + sl.begin, sl.len);
  }
  Slice mine = slice_of(bytes, a.world, a.rank);
  if (!block_barrier(a, sync)) return;
  const char* slots[MAX_RANKS];
#pragma unroll
  for (int p = 0; p < MAX_RANKS; ++p) slots[p] = p == a.rank ? in + mine.begin : stage + p * slice;
  for (size_t off = first_unit(); off < mine.len; off += unit_stride()) {
    uint4 r = reduce_unit<T, OP>(slots, a.world, off);
    *(uint4*)(out + mine.begin + off) = r;
#pragma unroll
    for (int q = 0; q < MAX_RANKS; ++q)
      if (q < a.world && q != a.rank) *(uint4*)(a.base[q] + half + (a.world + a.rank) * slice + off) = r;
  }
  if (!block_barrier(a, sync)) return;
  for (int s = 0; s < a.world; ++s) {
    Slice sl = slice_of(bytes, a.world, s);
    if (s != a.rank) copy_range(out + sl.begin, gather + s * slice, sl.len);
  }
}

// bytes: one rank's chunk. Stage it, then read every peer's.
__device__ void all_gather_staged(const Args& a, const char* in, char* out, size_t bytes, size_t half, Sync* sync) {
  copy_range(a.base[a.rank] + half, in, bytes);
  if (!block_barrier(a, sync)) return;
  for (size_t off = first_unit(); off < bytes; off += unit_stride()) {
    uint4 units[MAX_RANKS];
#pragma unroll
    for (int p = 0; p < MAX_RANKS; ++p)
      if (p < a.world) units[p] = *(const uint4*)((p == a.rank ? in : a.base[p] + half) + off);
#pragma unroll
    for (int p = 0; p < MAX_RANKS; ++p)
      if (p < a.world) *(uint4*)(out + p * bytes + off) = units[p];
  }
}

// bytes: one rank's output chunk. Stage the chunks peers reduce, then pull this rank's chunk.
template <typename T, int OP>
__device__ void reduce_scatter_staged(const Args& a, const char* in, char* out, size_t bytes, size_t half,
                                      Sync* sync) {
  char* stage = a.base[a.rank] + half;
  for (int s = 0; s < a.world; ++s)
    if (s != a.rank) copy_range(stage + s * bytes, in + s * bytes, bytes);
  if (!block_barrier(a, sync)) return;
  const char* src[MAX_RANKS];
#pragma unroll
  for (int p = 0; p < MAX_RANKS; ++p)
    src[p] = (p == a.rank ? in : (p < a.world ? a.base[p] + half : in)) + a.rank * bytes;
  for (size_t off = first_unit(); off < bytes; off += unit_stride()) *(uint4*)(out + off) = reduce_unit<T, OP>(src, a.world, off);
}

// bytes: one rank's output chunk; the first half of two_shot_push.
template <typename T, int OP>
__device__ void reduce_scatter_push(const Args& a, const char* in, char* out, size_t bytes, size_t half,
                                      Sync* sync) {
  for (int s = 0; s < a.world; ++s)
    if (s != a.rank) copy_range(a.base[s] + half + a.rank * bytes, in + s * bytes, bytes);
  if (!block_barrier(a, sync)) return;
  const char* slots[MAX_RANKS];
  const char* stage = a.base[a.rank] + half;
#pragma unroll
  for (int p = 0; p < MAX_RANKS; ++p) slots[p] = p == a.rank ? in + a.rank * bytes : stage + p * bytes;
  for (size_t off = first_unit(); off < bytes; off += unit_stride()) *(uint4*)(out + off) = reduce_unit<T, OP>(slots, a.world, off);
}
