// The zero-copy algorithms: peers read and write the callers' tensors where they lie.
//
// A rank whose tensor lies in a segment every peer has mapped (Place slot >= 0) tells its peers
// where, through its greeting, at the call's first barrier; a rank whose tensor does not stages it in
// its region instead, in pieces of the region's size when it is larger. Every rank learns at that
// first barrier whether all tensors are in place and so how many rounds the call takes: the same
// count everywhere. A call ends with a barrier, after which no peer reads this rank's input or
// writes its output any more, so the stream may reuse both at once.
#pragma once
#include "greeting.cuh"
#include "staged.cuh"

__device__ __forceinline__ bool all_in_place(const Place* places, int world, bool inputs, bool outputs) {
  bool direct = true;
  for (int p = 0; p < world; ++p) {
    if (inputs) direct = direct && places[p].in_slot >= 0;
    if (outputs) direct = direct && places[p].out_slot >= 0;
  }
  return direct;
}

// bytes: the whole tensor. Two-shot: rank s reduces slice s of every rank's input and writes the
// result into slice s of every rank's output (or its region's gather area, when staged).
template <typename T, int OP>
__device__ void all_reduce_in_place(const Args& a, const Place& me, const char* in, char* out, size_t bytes, int parity,
                                    Sync* sync, Place* places) {
  const int rank = a.rank, world = a.world;
  const size_t half = DATA_OFFSET + parity * a.half_bytes;
  char* stage = a.base[rank] + half;
  const size_t cap = a.half_bytes / 2 / (16 * (size_t)world) * (16 * (size_t)world);
  if (!greet(a, me, sync, places)) return;
  const bool direct = all_in_place(places, world, true, true);
  const size_t piece = direct ? bytes : cap;
  for (size_t begin = 0; begin < bytes; begin += piece) {
    const size_t len = min_size(piece, bytes - begin);
    if (!direct) {
      if (me.in_slot < 0)
        for (int s = 0; s < world; ++s) {
          Slice sl = slice_of(len, world, s);
          if (s != rank) copy_range(stage + sl.begin, in + begin + sl.begin, sl.len);
        }
      if (!block_barrier(a, sync)) return;
    }
    const Slice mine = slice_of(len, world, rank);
    const char* src[MAX_RANKS];
    char* dst[MAX_RANKS];
#pragma unroll
    for (int p = 0; p < MAX_RANKS; ++p) {
      if (p >= world) continue;
      const Place& pl = places[p];
      if (p == rank) {
        src[p] = in + begin + mine.begin;
        dst[p] = out + begin + mine.begin;
      } else {
        src[p] = pl.in_slot >= 0 ? mapped(a, p, pl.in_slot, pl.in_off + begin + mine.begin) : a.base[p] + half + mine.begin;
        dst[p] = pl.out_slot >= 0 ? mapped(a, p, pl.out_slot, pl.out_off + begin + mine.begin)
                                  : a.base[p] + half + cap + mine.begin;
      }
    }
    // Two units per thread at a time: twice the peers' loads in flight.
    const size_t stride = unit_stride();
    size_t off = first_unit();
    for (; off + stride < mine.len; off += 2 * stride) {
      uint4 r = reduce_unit<T, OP>(src, world, off), s = reduce_unit<T, OP>(src, world, off + stride);
#pragma unroll
      for (int q = 0; q < MAX_RANKS; ++q)
        if (q < world) {
          *(uint4*)(dst[q] + off) = r;
          *(uint4*)(dst[q] + off + stride) = s;
        }
    }
    for (; off < mine.len; off += stride) {
      uint4 r = reduce_unit<T, OP>(src, world, off);
#pragma unroll
      for (int q = 0; q < MAX_RANKS; ++q)
        if (q < world) *(uint4*)(dst[q] + off) = r;
    }
    if (!block_barrier(a, sync)) return;
    if (me.out_slot < 0)
      for (int s = 0; s < world; ++s) {
        Slice sl = slice_of(len, world, s);
        if (s != rank) copy_range(out + begin + sl.begin, stage + cap + sl.begin, sl.len);
      }
  }
}

// bytes: one rank's output chunk. Rank r reduces chunk r of every rank's input where it lies.
template <typename T, int OP>
__device__ void reduce_scatter_in_place(const Args& a, const Place& me, const char* in, char* out, size_t bytes,
                                        int parity, Sync* sync, Place* places) {
  const int rank = a.rank, world = a.world;
  const size_t half = DATA_OFFSET + parity * a.half_bytes;
  char* stage = a.base[rank] + half;
  const size_t cap = a.half_bytes / world / 16 * 16;
  if (!greet(a, me, sync, places)) return;
  const bool direct = all_in_place(places, world, true, false);
  const size_t piece = direct ? bytes : cap;
  for (size_t begin = 0; begin < bytes; begin += piece) {
    const size_t len = min_size(piece, bytes - begin);
    if (!direct) {
      if (me.in_slot < 0)
        for (int s = 0; s < world; ++s)
          if (s != rank) copy_range(stage + s * cap, in + s * bytes + begin, len);
      if (!block_barrier(a, sync)) return;
    }
    const char* src[MAX_RANKS];
#pragma unroll
    for (int p = 0; p < MAX_RANKS; ++p) {
      if (p >= world) continue;
      const Place& pl = places[p];
      if (p == rank) src[p] = in + rank * bytes + begin;
      else if (pl.in_slot >= 0) src[p] = mapped(a, p, pl.in_slot, pl.in_off + rank * bytes + begin);
      else src[p] = a.base[p] + half + rank * cap;
    }
    const size_t stride = unit_stride();
    size_t off = first_unit();
    for (; off + stride < len; off += 2 * stride) {
      uint4 r = reduce_unit<T, OP>(src, world, off), s = reduce_unit<T, OP>(src, world, off + stride);
      *(uint4*)(out + begin + off) = r;
      *(uint4*)(out + begin + off + stride) = s;
    }
    for (; off < len; off += stride) *(uint4*)(out + begin + off) = reduce_unit<T, OP>(src, world, off);
    if (!block_barrier(a, sync)) return;
  }
}

// bytes: one rank's chunk. Every rank writes its chunk into every peer's output where it lies (or
// into the peer's region, which the peer then copies out).
__device__ void all_gather_in_place(const Args& a, const Place& me, const char* in, char* out, size_t bytes, int parity,
                                    Sync* sync, Place* places) {
  const int rank = a.rank, world = a.world;
  const size_t half = DATA_OFFSET + parity * a.half_bytes;
  char* stage = a.base[rank] + half;
  const size_t cap = a.half_bytes / world / 16 * 16;
  if (!greet(a, me, sync, places)) return;
  const bool direct = all_in_place(places, world, false, true);
  const size_t piece = direct ? bytes : cap;
  for (size_t begin = 0; begin < bytes; begin += piece) {
    const size_t len = min_size(piece, bytes - begin);
    // In place, every peer's copy at once on its share of the grid; staged, the receivers copy
    // out with the whole grid's mapping, so the senders write with it too.
    const int parts = direct && world < (int)gridDim.x ? world : 1;
    const Share share = peer_share(parts);
    for (int k = share.part; k < world; k += parts) {
      const int q = (rank + k) % world;
      const Place& pl = places[q];
      char* dst;
      if (q == rank) dst = out + rank * bytes + begin;
      else if (pl.out_slot >= 0) dst = mapped(a, q, pl.out_slot, pl.out_off + rank * bytes + begin);
      else dst = a.base[q] + half + rank * cap;
      if (dst == in + begin) continue;
      if (parts > 1) copy_any(dst, in + begin, len, share.thread, share.threads);
      else copy_range(dst, in + begin, len);
    }
    if (!block_barrier(a, sync)) return;
    if (me.out_slot < 0)
      for (int s = 0; s < world; ++s)
        if (s != rank) copy_range(out + s * bytes + begin, stage + s * cap, len);
    // Senders may refill this region only after its copies are out.
    if (!direct && begin + piece < bytes && !block_barrier(a, sync)) return;
  }
}
