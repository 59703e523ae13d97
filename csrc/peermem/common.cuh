// What every peer-memory kernel shares: the region layout, the cross-rank barrier, the inbox through
// which a call tells its peers where its tensors are, and float math in rank order.
//
// Every rank owns one region, mapped into every peer of the group:
//   [flags: MAX_BLOCKS x MAX_RANKS words][inboxes: 2 x MAX_RANKS][private words]
//   [greetings: MAX_BLOCKS x MAX_RANKS places][half 0][half 1]
// Block b of rank r raises flag [b][r] in every peer and waits for the peers' flags in its own
// region; at an in-place call's first barrier it leaves greeting [b][r] instead (greeting.cuh). A
// flag's value counts the barriers block b has passed (the count lives in the private words
// between calls): every rank launches the same grid for a call, so block b's count is the same
// everywhere, and no rank's runs more than one barrier ahead of another's, which keeps the
// wrapping comparison exact however long the group lives. A flag may skip the values of
// greetings: a waiter only asks that it has reached its own. Staged data goes to the half picked
// by the epoch's parity: a rank writes a half again only two calls later, after every peer has
// entered the call in between and so has finished reading it.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define MAX_RANKS 8
#define MAX_BLOCKS 128
#define THREADS 512
#define MAX_SLOTS 512
#define MAX_DESCS 4096
#define INBOX_BYTES 64
#define FLAG_BYTES (MAX_BLOCKS * MAX_RANKS * 4)
#define INBOX_OFFSET FLAG_BYTES
#define PRIVATE_OFFSET (INBOX_OFFSET + 2 * MAX_RANKS * INBOX_BYTES)
#define PRIVATE_BYTES 4096
#define GREETING_WORDS 4
#define GREETING_OFFSET (PRIVATE_OFFSET + PRIVATE_BYTES)
#define GREETING_BYTES (MAX_BLOCKS * MAX_RANKS * GREETING_WORDS * 8)
#define DATA_OFFSET (GREETING_OFFSET + GREETING_BYTES)
#define COUNTERS_WORD 16  // private words [16, 16 + MAX_BLOCKS): each block's barrier count

typedef unsigned long long u64;

// Where one rank's tensors are for one call: a registered segment (slot >= 0, read or written in
// place by peers) or the rank's own region (slot < 0, staged).
struct Place {
  int in_slot, out_slot;
  u64 in_off, out_off;
};

// What a rank posts into each peer's region at a call's first barrier.
struct __align__(16) Inbox {
  Place place;
  u64 chunk_off, chunk_len;  // all_to_all: the receiver's chunk in the sender's input
  u64 staged;                // all_to_all: bytes of input the sender stages (0: read in place)
  u64 pushed;                // all_to_all: 1 when the sender pushed every chunk to its receiver
};
static_assert(sizeof(Inbox) == INBOX_BYTES, "inbox layout");

// Every kernel takes it as `const __grid_constant__ Args`: the kernels index `base` by rank at run
// time and pass the struct by reference, which would otherwise copy it onto every thread's stack
// at each launch.
struct Args {
  char* base[MAX_RANKS];  // every rank's region, mapped here
  char* const* table;     // [MAX_RANKS][MAX_SLOTS]: peers' registered segments, mapped here
  const Place* descs;     // places of calls captured in CUDA graphs, filled in once registered
  uint32_t* priv;         // [0] epoch, [1] tickets taken, [2] broken, [COUNTERS_WORD + b] block b's count
  int* host_error;        // host-mapped: [0] set, [1] missing peer, [2] block
  u64 timeout_ns;
  u64 half_bytes;
  int rank, world;
};

// The call's place: given inline, or (desc >= 0) read from the graph descriptors at run time.
struct CallPlace {
  Place place;
  int desc;
};

__device__ __forceinline__ Place resolve(const Args& a, const CallPlace& p) {
  if (p.desc < 0) return p.place;
  const volatile Place* d = (const volatile Place*)&a.descs[p.desc];
  Place out;
  out.in_slot = d->in_slot;
  out.out_slot = d->out_slot;
  out.in_off = d->in_off;
  out.out_off = d->out_off;
  return out;
}

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ Inbox* inbox_in(const Args& a, int owner, int parity, int sender) {
  return (Inbox*)(a.base[owner] + INBOX_OFFSET) + parity * MAX_RANKS + sender;
}

// A block's state in shared memory: its barrier count, false once a peer never came, and the
// call's epoch and whether an earlier call broke the group (read once, by thread 0).
struct Sync {
  uint32_t count, epoch;
  bool ok, broken;
};

// Spins until `arrived()` holds for peer `peer`; false, with the group marked broken and the host
// told which peer and block, when it does not within the group's timeout.
template <typename Arrived>
__device__ __forceinline__ bool wait_for_peer(const Args& a, Sync* sync, int peer, Arrived arrived) {
  uint64_t start = 0;
  for (uint32_t spins = 0; !arrived(); ++spins) {
    if ((spins & 1023) != 1023) continue;
    const uint64_t clock = now_ns();
    if (start == 0) {
      start = clock;
    } else if (clock - start > a.timeout_ns) {
      a.host_error[1] = peer;
      a.host_error[2] = blockIdx.x;
      __threadfence_system();
      a.host_error[0] = 1;
      a.priv[2] = 1;
      sync->ok = false;
      return false;
    }
  }
  return true;
}

// Ends a barrier once the waiting threads are done: every thread learns whether all peers came,
// and the block's count moves on to `value`.
__device__ __forceinline__ bool end_barrier(Sync* sync, uint32_t value) {
  __syncthreads();
  const bool ok = sync->ok;
  __syncthreads();
  if (threadIdx.x == 0) sync->count = value;
  return ok;
}

// Raise this block's flag in every peer, wait for every peer's; false when one never came.
// `post`: per peer, the inbox entry to leave in that peer's region before its flag (or null).
// Every write the block made before the call, into its own memory or a peer's, is visible to a
// peer that sees the flag: __syncthreads orders them before the flag's release, which is
// cumulative, so no thread fences on its own.
__device__ bool block_barrier(const Args& a, Sync* sync, const Inbox* post = nullptr, int parity = 0) {
  __syncthreads();
  const uint32_t value = sync->count + 1;  // thread 0 moves it on only after the last sync below
  const int t = threadIdx.x;
  if (t < a.world) {
    if (post != nullptr) *inbox_in(a, t, parity, a.rank) = post[t];
    uint32_t* remote = (uint32_t*)a.base[t] + blockIdx.x * MAX_RANKS + a.rank;
    store_release(remote, value);
    const uint32_t* mine = (const uint32_t*)a.base[a.rank] + blockIdx.x * MAX_RANKS + t;
    wait_for_peer(a, sync, t, [&] { return (int32_t)(load_acquire(mine) - value) >= 0; });
  }
  return end_barrier(sync, value);
}

// Copies every peer's inbox entry for this call into shared memory (after a posting barrier).
__device__ __forceinline__ void read_inboxes(const Args& a, int parity, Inbox* boxes) {
  if (threadIdx.x < a.world) boxes[threadIdx.x] = *inbox_in(a, a.rank, parity, threadIdx.x);
  __syncthreads();
}

template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

enum Op { SUM = 0, PRODUCT = 1, MIN = 2, MAX = 3, AVG = 4 };
enum Dtype { F32 = 0, BF16 = 1, F16 = 2 };

template <int OP> __device__ __forceinline__ float combine(float a, float b) {
  if (OP == SUM || OP == AVG) return __fadd_rn(a, b);
  if (OP == PRODUCT) return __fmul_rn(a, b);
  if (OP == MIN) return fminf(a, b);
  return fmaxf(a, b);
}

// One 16-byte unit reduced over the ranks in order 0..world-1 from src[p] + off.
template <typename T, int OP>
__device__ __forceinline__ uint4 reduce_unit(const char* const* src, int world, size_t off) {
  constexpr int N = 16 / sizeof(T);
  uint4 units[MAX_RANKS];
#pragma unroll
  for (int p = 0; p < MAX_RANKS; ++p)
    if (p < world) units[p] = *(const uint4*)(src[p] + off);
  float acc[N];
  const T* first = (const T*)&units[0];
#pragma unroll
  for (int j = 0; j < N; ++j) acc[j] = to_float<T>(first[j]);
#pragma unroll
  for (int p = 1; p < MAX_RANKS; ++p) {
    if (p < world) {
      const T* e = (const T*)&units[p];
#pragma unroll
      for (int j = 0; j < N; ++j) acc[j] = combine<OP>(acc[j], to_float<T>(e[j]));
    }
  }
  uint4 out;
  T* o = (T*)&out;
#pragma unroll
  for (int j = 0; j < N; ++j) o[j] = from_float<T>(OP == AVG ? __fdiv_rn(acc[j], (float)world) : acc[j]);
  return out;
}

__device__ __forceinline__ size_t first_unit() { return ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 16; }
__device__ __forceinline__ size_t unit_stride() { return (size_t)gridDim.x * blockDim.x * 16; }

// Four units in flight per thread (loads first, then stores): a peer's memory is microseconds
// away, so one load at a time leaves the links idle. Unit u is still copied by thread u mod grid.
__device__ __forceinline__ void copy_range(char* dst, const char* src, size_t bytes) {
  const size_t stride = unit_stride();
  size_t off = first_unit();
  for (; off + 3 * stride < bytes; off += 4 * stride) {
    uint4 a = *(const uint4*)(src + off), b = *(const uint4*)(src + off + stride);
    uint4 c = *(const uint4*)(src + off + 2 * stride), d = *(const uint4*)(src + off + 3 * stride);
    *(uint4*)(dst + off) = a;
    *(uint4*)(dst + off + stride) = b;
    *(uint4*)(dst + off + 2 * stride) = c;
    *(uint4*)(dst + off + 3 * stride) = d;
  }
  for (; off < bytes; off += stride) *(uint4*)(dst + off) = *(const uint4*)(src + off);
}

// A copy of any alignment: 16-byte units where all three allow it, else the widest that fits.
template <typename W>
__device__ __forceinline__ void copy_words(char* dst, const char* src, size_t bytes, size_t thread, size_t threads) {
  const size_t stride = threads * sizeof(W);
  size_t off = thread * sizeof(W);
  for (; off + 3 * stride < bytes; off += 4 * stride) {
    W a = *(const W*)(src + off), b = *(const W*)(src + off + stride);
    W c = *(const W*)(src + off + 2 * stride), d = *(const W*)(src + off + 3 * stride);
    *(W*)(dst + off) = a;
    *(W*)(dst + off + stride) = b;
    *(W*)(dst + off + 2 * stride) = c;
    *(W*)(dst + off + 3 * stride) = d;
  }
  for (; off < bytes; off += stride) *(W*)(dst + off) = *(const W*)(src + off);
}
// By threads [thread, threads) of a share of the grid (see peer_share), or the whole grid.
__device__ __forceinline__ void copy_any(char* dst, const char* src, size_t bytes, size_t thread, size_t threads) {
  uintptr_t mix = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)bytes;
  if ((mix & 15) == 0) copy_words<uint4>(dst, src, bytes, thread, threads);
  else if ((mix & 7) == 0) copy_words<uint2>(dst, src, bytes, thread, threads);
  else if ((mix & 3) == 0) copy_words<uint32_t>(dst, src, bytes, thread, threads);
  else if ((mix & 1) == 0) copy_words<uint16_t>(dst, src, bytes, thread, threads);
  else copy_words<uint8_t>(dst, src, bytes, thread, threads);
}
__device__ __forceinline__ void copy_any(char* dst, const char* src, size_t bytes) {
  copy_any(dst, src, bytes, (size_t)blockIdx.x * blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x);
}

// The grid split into `parts` shares of whole blocks (block b in share b mod parts), so that a
// copy to or from every peer runs on all links at once rather than one peer after another.
struct Share {
  int part;
  size_t thread, threads;
};
__device__ __forceinline__ Share peer_share(int parts) {
  const int blocks = (int)gridDim.x, part = (int)blockIdx.x % parts;
  const size_t members = (size_t)((blocks - part + parts - 1) / parts);
  return {part, (size_t)(blockIdx.x / parts) * blockDim.x + threadIdx.x, members * blockDim.x};
}

// The call's epoch, and this block's ticket: how many blocks of the call took one before it (held
// by the block's last thread only).
struct Epoch {
  uint32_t value, ticket;
};

// Ends a call: the block keeps its barrier count, and the last block to have started moves the
// epoch on for the next kernel on this stream. No fence: only later kernels read these words, and a
// kernel sees every write of the kernels before it on its stream.
__device__ __forceinline__ void finish(const Args& a, const Epoch& epoch, const Sync* sync) {
  __syncthreads();
  if (threadIdx.x == 0) a.priv[COUNTERS_WORD + blockIdx.x] = sync->count;
  if (threadIdx.x == blockDim.x - 1 && epoch.ticket == gridDim.x - 1) {
    a.priv[1] = 0;
    a.priv[0] = epoch.value + 1;
  }
}

// Reads the epoch, the block's barrier count, and whether an earlier call broke the group (then
// the kernel does nothing). Thread 0 reads them from L2 in two loads at once and shares them. The
// block's ticket is taken once the block has read the epoch, so the block that takes the last one
// may move the epoch on; the block's last thread takes it, and waits for it only in finish(),
// after the call's work (the barriers' release fences run in the first threads).
__device__ __forceinline__ bool start_call(const Args& a, Epoch* epoch, Sync* sync) {
  if (threadIdx.x == 0) {
    const uint4 state = __ldcg((const uint4*)a.priv);  // epoch, tickets taken, broken
    sync->count = __ldcg(&a.priv[COUNTERS_WORD + blockIdx.x]);
    sync->epoch = state.x;
    sync->broken = state.z != 0;
    sync->ok = true;
  }
  __syncthreads();
  epoch->value = sync->epoch;
  epoch->ticket = threadIdx.x == blockDim.x - 1 ? atomicAdd(&a.priv[1], 1u) : 0;
  if (sync->broken) {
    finish(a, *epoch, sync);
    return false;
  }
  return true;
}

// A peer's registered memory, mapped here.
__device__ __forceinline__ char* mapped(const Args& a, int peer, int slot, u64 off) {
  return a.table[peer * MAX_SLOTS + slot] + off;
}

__device__ __forceinline__ size_t min_size(size_t x, size_t y) { return x < y ? x : y; }
