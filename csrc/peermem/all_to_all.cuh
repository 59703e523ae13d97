// all_to_all_single with even or uneven splits, in one of two ways every rank agrees on at the
// call's first barrier:
//  - pushed (every chunk at most the push limit): each sender writes its chunk for a peer into
//    that peer's region, at the sender's slot of the half's upper part, before the barrier; after
//    it each receiver copies its slots out. One barrier, and no peer reads a sender's input.
//  - pulled: every receiver copies its chunk out of every sender's input where it lies (a
//    registered segment), or out of the sender's region, which the sender fills with windows of
//    its input (in the half's lower part), one round per window, when its input is not mapped.
// A barrier orders only block b's writes before block b's reads, so a pushed chunk is split into
// the same block ranges on both sides, from its length alone.
#pragma once
#include "in_place.cuh"

struct Splits {
  u64 send_off[MAX_RANKS], send_len[MAX_RANKS];
  u64 recv_off[MAX_RANKS], recv_len[MAX_RANKS];
};

// The units of [lo, hi) (offsets into a window that starts at 0), each copied by the thread that
// staged it (unit u: thread u mod grid), from src + offset to dst + offset - lo.
__device__ void copy_out_of_window(char* dst, const char* src, size_t lo, size_t hi) {
  const size_t threads = (size_t)gridDim.x * blockDim.x;
  const size_t me = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t first = lo / 16, last = (hi + 15) / 16;
  size_t u = first + (me + threads - first % threads) % threads;
  for (; u < last; u += threads) {
    size_t b = u * 16 > lo ? u * 16 : lo, e = u * 16 + 16 < hi ? u * 16 + 16 : hi;
    char* d = dst + (b - lo);
    if (e - b == 16 && ((uintptr_t)d & 15) == 0) *(uint4*)d = *(const uint4*)(src + b);
    else
      for (size_t i = b; i < e; ++i) d[i - b] = src[i];
  }
}

// Stages [0, bytes) of in at stage in 16-byte units (unit u by thread u mod grid), the tail too.
__device__ void stage_window(char* stage, const char* in, size_t bytes) {
  const size_t whole = bytes / 16 * 16;
  copy_range(stage, in, whole);
  const size_t threads = (size_t)gridDim.x * blockDim.x;
  const size_t me = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (whole < bytes && me == (whole / 16) % threads)
    for (size_t i = whole; i < bytes; ++i) stage[i] = in[i];
}

// Block j of a share's [lo, hi) of a chunk of `len` bytes: 16-byte-aligned ranges by length only.
__device__ __forceinline__ void block_range(size_t len, const Share& share, size_t* lo, size_t* hi) {
  const size_t members = share.threads / blockDim.x, j = share.thread / blockDim.x;
  const size_t per = ((len + members - 1) / members + 15) / 16 * 16;
  *lo = min_size(j * per, len);
  *hi = min_size(*lo + per, len);
}

// Where pushed chunks live in a half: the upper part, one slot per sender.
struct PushArea {
  size_t start, slot;
};
__device__ __forceinline__ PushArea push_area(const Args& a) {
  const size_t start = a.half_bytes / 2 / 16 * 16;
  return {start, (a.half_bytes - start) / a.world / 16 * 16};
}

// Writes this rank's chunk for each peer into the peer's slot (the share's loop of the pull path).
__device__ void push_chunks(const Args& a, const char* in, const Splits& sp, size_t half, const Share& share, int parts) {
  const PushArea area = push_area(a);
  for (int k = share.part; k < a.world; k += parts) {
    const int q = (a.rank + k) % a.world;
    if (q == a.rank) continue;
    size_t lo, hi;
    block_range(sp.send_len[q], share, &lo, &hi);
    char* slot = a.base[q] + half + area.start + (size_t)a.rank * area.slot;
    if (lo < hi) copy_any(slot + lo, in + sp.send_off[q] + lo, hi - lo, threadIdx.x, blockDim.x);
  }
}

// Copies what every sender pushed into this rank's slots (and its own chunk) to the output.
__device__ void take_pushed(const Args& a, const char* in, char* out, const Splits& sp, const Inbox* boxes, size_t half,
                            const Share& share, int parts) {
  const PushArea area = push_area(a);
  for (int k = share.part; k < a.world; k += parts) {
    const int p = (a.rank - k + a.world) % a.world;
    if (p == a.rank) {
      copy_any(out + sp.recv_off[p], in + sp.send_off[p], min_size(sp.send_len[p], sp.recv_len[p]), share.thread,
               share.threads);
      continue;
    }
    size_t lo, hi;
    block_range(boxes[p].chunk_len, share, &lo, &hi);
    hi = min_size(hi, sp.recv_len[p]);
    const char* slot = a.base[a.rank] + half + area.start + (size_t)p * area.slot;
    if (lo < hi) copy_any(out + sp.recv_off[p] + lo, slot + lo, hi - lo, threadIdx.x, blockDim.x);
  }
}

__global__ void __launch_bounds__(THREADS)
    all_to_all(const __grid_constant__ Args a, CallPlace call, const char* in, char* out, u64 in_bytes, Splits sp,
               u64 push_limit) {
  __shared__ Sync sync;
  __shared__ Inbox boxes[MAX_RANKS], post[MAX_RANKS];
  Epoch epoch;
  if (!start_call(a, &epoch, &sync)) return;
  const Place me = resolve(a, call);
  const int rank = a.rank, world = a.world, parity = epoch.value & 1;
  const size_t half = DATA_OFFSET + parity * a.half_bytes;
  const size_t cap = push_area(a).start;
  const u64 limit = min_size(push_limit, push_area(a).slot);
  bool pushes = true;
  for (int q = 0; q < world; ++q) pushes = pushes && (q == rank || sp.send_len[q] <= limit);
  // Every sender's chunk at once, each on its share of the grid (with fewer blocks than ranks,
  // one after another).
  const int parts = world < (int)gridDim.x ? world : 1;
  const Share share = peer_share(parts);
  if (pushes) push_chunks(a, in, sp, half, share, parts);
  if (threadIdx.x < world) {
    Inbox e = {};
    e.place = me;
    e.chunk_off = sp.send_off[threadIdx.x];
    e.chunk_len = sp.send_len[threadIdx.x];
    e.staged = me.in_slot >= 0 ? 0 : in_bytes;
    e.pushed = pushes;
    post[threadIdx.x] = e;
  }
  if (block_barrier(a, &sync, post, parity)) {
    read_inboxes(a, parity, boxes);
    bool all_pushed = true;
    for (int p = 0; p < world; ++p) all_pushed = all_pushed && boxes[p].pushed;
    if (all_pushed) {
      take_pushed(a, in, out, sp, boxes, half, share, parts);
      finish(a, epoch, &sync);
      return;
    }
    size_t rounds = 0;
    for (int p = 0; p < world; ++p) {
      size_t r = (boxes[p].staged + cap - 1) / cap;
      rounds = r > rounds ? r : rounds;
    }
    for (int k = share.part; k < world; k += parts) {
      const int q = (rank + k) % world;
      const Inbox& box = boxes[q];
      const size_t len = min_size(box.chunk_len, sp.recv_len[q]);
      if (q == rank)
        copy_any(out + sp.recv_off[q], in + sp.send_off[q], min_size(sp.send_len[q], sp.recv_len[q]), share.thread,
                 share.threads);
      else if (box.staged == 0)
        copy_any(out + sp.recv_off[q], mapped(a, q, box.place.in_slot, box.place.in_off + box.chunk_off), len,
                 share.thread, share.threads);
    }
    bool alive = true;
    for (size_t k = 0; k < rounds && alive; ++k) {
      const size_t window = k * cap;
      if (me.in_slot < 0 && window < in_bytes) stage_window(a.base[rank] + half, in + window, min_size(cap, in_bytes - window));
      alive = block_barrier(a, &sync);
      for (int q = 0; q < world && alive; ++q) {
        const Inbox& box = boxes[q];
        if (q == rank || box.staged == 0) continue;
        size_t end = box.chunk_off + min_size(box.chunk_len, sp.recv_len[q]);
        size_t lo = box.chunk_off > window ? box.chunk_off : window;
        size_t hi = end < window + cap ? end : window + cap;
        if (lo < hi) copy_out_of_window(out + sp.recv_off[q] + (lo - box.chunk_off), a.base[q] + half, lo - window, hi - window);
      }
      alive = alive && block_barrier(a, &sync);
    }
    // No peer reads this rank's input after this.
    if (alive && rounds == 0) block_barrier(a, &sync);
  }
  finish(a, epoch, &sync);
}
