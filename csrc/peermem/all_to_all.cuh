// all_to_all_single with even or uneven splits, by pulling: every receiver copies its chunk out of
// every sender's input where it lies (a registered segment), or out of the sender's region, which
// the sender fills with windows of its input, one round per window, when its input is not mapped.
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

__global__ void __launch_bounds__(THREADS)
    all_to_all(Args a, CallPlace call, const char* in, char* out, u64 in_bytes, Splits sp) {
  __shared__ Sync sync;
  __shared__ Inbox boxes[MAX_RANKS], post[MAX_RANKS];
  uint32_t epoch;
  if (!start_call(a, &epoch, &sync)) return;
  const Place me = resolve(a, call);
  const int rank = a.rank, world = a.world, parity = epoch & 1;
  const size_t half = DATA_OFFSET + parity * a.half_bytes;
  const size_t cap = a.half_bytes / 16 * 16;
  if (threadIdx.x < world) {
    Inbox e = {};
    e.place = me;
    e.chunk_off = sp.send_off[threadIdx.x];
    e.chunk_len = sp.send_len[threadIdx.x];
    e.staged = me.in_slot >= 0 ? 0 : in_bytes;
    post[threadIdx.x] = e;
  }
  if (block_barrier(a, &sync, post, parity)) {
    read_inboxes(a, parity, boxes);
    size_t rounds = 0;
    for (int p = 0; p < world; ++p) {
      size_t r = (boxes[p].staged + cap - 1) / cap;
      rounds = r > rounds ? r : rounds;
    }
    // Every sender's chunk at once, each on its share of the grid (with fewer blocks than ranks,
    // one after another).
    const int parts = world < (int)gridDim.x ? world : 1;
    const Share share = peer_share(parts);
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
