// Where a peermem kernel's fixed cost goes: kernels that do only parts of a call, timed in CUDA
// graphs on every GPU of this host at once (one process, peer access between the GPUs).
//
//   nvcc -O3 -arch=sm_90 -o /tmp/barrier_profile benchmarks/gpu/barrier_profile.cu && /tmp/barrier_profile
//
// Each row is one kernel shape, run 200 times back to back in a graph per GPU, us per kernel (the
// slowest GPU, best of 5 replays). The barrier rows use peermem's own barrier (common.cuh), with
// and without the call's prologue and epilogue (start_call, finish); the "relaxed" rows a barrier
// that orders nothing, as a call's first barrier may be; "cas" rows torch's signal-pad style. The
// "zero-copy" rows rebuild the in-place all_reduce of 16 bytes step by step (each rank's tensor in a
// registered segment, slot 0 of the peers' tables), ending with the kernel's own body.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../../csrc/peermem/in_place.cuh"

#define CUDA(call)                                                                    \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

enum Shape {
  EMPTY,          // launch only
  CALL,           // start_call + finish
  BARRIER,        // one release barrier
  CALL_BARRIER,   // start_call, one release barrier, finish
  CALL_BARRIER2,  // start_call, two release barriers, finish
  CALL_LOAD,      // start_call, barrier, a 16-byte load from every peer, barrier, finish
  CALL_STORE,     // start_call, barrier, a 16-byte store into every peer, barrier, finish
  RELAXED,        // one barrier with relaxed flags
  RELAXED2,       // relaxed barrier, then a release barrier
  RELAXED_STORE,  // relaxed barrier, a 16-byte store into every peer, release barrier
  CAS2,           // two barriers of compare-and-swap signals (relaxed, then acquire-release)
  PROLOGUE,       // start_call, and the block's count kept
  GREET,          // start_call, the in-place call's greeting, release barrier, finish
  GREET_LOAD,     // the greeting, each peer's tensor found in the table and 16 bytes loaded, barrier
  GREET_REDUCE,   // the greeting, one thread reducing 16 bytes of every peer and storing the sum into
                  // every peer's tensor (the one unit of a 16-byte call), barrier
  ZERO_COPY,      // start_call, all_reduce_in_place on 16 bytes of bf16, finish
  SHAPES
};
static const char* NAMES[SHAPES] = {"empty kernel", "prologue+epilogue", "1 release barrier",
                                    "call: 1 barrier", "call: 2 barriers", "call: barrier, load, barrier",
                                    "call: barrier, store, barrier", "1 relaxed barrier", "relaxed + release",
                                    "relaxed, store, release", "cas: relaxed + acq_rel",
                                    "prologue only", "call: greeting, barrier",
                                    "zero-copy: greeting, load, barrier", "zero-copy: greeting, reduce, barrier",
                                    "zero-copy all_reduce, 16 B"};

__device__ __forceinline__ void relaxed_barrier(const Args& a, Sync* sync) {
  __syncthreads();
  const uint32_t value = sync->count + 1;
  const int t = threadIdx.x;
  if (t < a.world) {
    uint32_t* remote = (uint32_t*)a.base[t] + blockIdx.x * MAX_RANKS + a.rank;
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(remote), "r"(value) : "memory");
    const uint32_t* mine = (const uint32_t*)a.base[a.rank] + blockIdx.x * MAX_RANKS + t;
    uint32_t seen;
    do {
      asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(seen) : "l"(mine) : "memory");
    } while ((int32_t)(seen - value) < 0);
  }
  __syncthreads();
  if (t == 0) sync->count = value;
}

// Swaps `from` for `to` at `pad` until it holds `from`, relaxed or acquire-release.
template <bool ACQ_REL>
__device__ __forceinline__ void swap_until(uint32_t* pad, uint32_t from, uint32_t to) {
  uint32_t old;
  do {
    if (ACQ_REL)
      asm volatile("atom.acq_rel.sys.global.cas.b32 %0, [%1], %2, %3;" : "=r"(old) : "l"(pad), "r"(from), "r"(to) : "memory");
    else
      asm volatile("atom.relaxed.sys.global.cas.b32 %0, [%1], %2, %3;" : "=r"(old) : "l"(pad), "r"(from), "r"(to) : "memory");
  } while (old != from);
}

// Torch-style: put = CAS 0 -> 1 on the peer's pad, wait = CAS 1 -> 0 on this rank's pad.
template <bool ACQ_REL>
__device__ __forceinline__ void cas_barrier(const Args& a) {
  const int t = threadIdx.x;
  if (t < a.world) {
    swap_until<ACQ_REL>((uint32_t*)(a.base[t] + DATA_OFFSET) + blockIdx.x * MAX_RANKS + a.rank, 0, 1);
    swap_until<ACQ_REL>((uint32_t*)(a.base[a.rank] + DATA_OFFSET) + blockIdx.x * MAX_RANKS + t, 1, 0);
  }
  __syncthreads();
}

// Each peer's tensor, as the in-place kernel finds it: through the table, at the greeted place.
__device__ __forceinline__ char* peer_tensor(const Args& a, const Place* places, int peer) {
  return peer == a.rank ? mapped(a, peer, 0, 0) : mapped(a, peer, places[peer].in_slot, places[peer].in_off);
}

__device__ void greet_then_reduce(const Args& a, const Place& me, Sync* sync, Place* places, bool store, uint4* sink) {
  if (!greet(a, me, sync, places)) return;
  if (!store && threadIdx.x < a.world) {
    sink[blockIdx.x * MAX_RANKS + threadIdx.x] = *(const uint4*)peer_tensor(a, places, threadIdx.x);
  } else if (store && threadIdx.x == 0 && a.rank == 0) {
    const char* src[MAX_RANKS];
    for (int p = 0; p < MAX_RANKS; ++p) src[p] = p < a.world ? peer_tensor(a, places, p) : nullptr;
    const uint4 sum = reduce_unit<__nv_bfloat16, SUM>(src, a.world, 0);
    for (int p = 0; p < a.world; ++p) *(uint4*)peer_tensor(a, places, p) = sum;
  }
  block_barrier(a, sync);
}

__global__ void __launch_bounds__(THREADS) probe(const __grid_constant__ Args a, int shape, uint4* sink) {
  __shared__ Sync sync;
  __shared__ Place places[MAX_RANKS];
  Epoch epoch = {0, 0};
  const bool call = shape == CALL || shape == CALL_BARRIER || shape == CALL_BARRIER2 || shape == CALL_LOAD ||
                    shape == CALL_STORE || shape >= GREET;
  Place me = {0, 0, 0, 0};
  if (shape == EMPTY) return;
  if (call || shape == PROLOGUE) {
    if (!start_call(a, &epoch, &sync)) return;
  } else if (threadIdx.x == 0) {
    sync.ok = true;
    sync.count = a.priv[COUNTERS_WORD + blockIdx.x];
  }
  const size_t spot = DATA_OFFSET + 4096 + (size_t)(blockIdx.x * MAX_RANKS + a.rank) * 16;
  switch (shape) {
    case BARRIER:
    case CALL_BARRIER: block_barrier(a, &sync); break;
    case CALL_BARRIER2: block_barrier(a, &sync) && block_barrier(a, &sync); break;
    case CALL_LOAD:
      if (block_barrier(a, &sync)) {
        if (threadIdx.x < a.world) sink[blockIdx.x * MAX_RANKS + threadIdx.x] = *(const uint4*)(a.base[threadIdx.x] + spot);
        block_barrier(a, &sync);
      }
      break;
    case CALL_STORE:
      if (block_barrier(a, &sync)) {
        if (threadIdx.x < a.world) *(uint4*)(a.base[threadIdx.x] + spot) = make_uint4(1, 2, 3, 4);
        block_barrier(a, &sync);
      }
      break;
    case RELAXED: relaxed_barrier(a, &sync); break;
    case RELAXED2: relaxed_barrier(a, &sync); block_barrier(a, &sync); break;
    case RELAXED_STORE:
      relaxed_barrier(a, &sync);
      if (threadIdx.x < a.world) *(uint4*)(a.base[threadIdx.x] + spot) = make_uint4(1, 2, 3, 4);
      block_barrier(a, &sync);
      break;
    case CAS2: cas_barrier<false>(a); cas_barrier<true>(a); break;
    case GREET: greet(a, me, &sync, places) && block_barrier(a, &sync); break;
    case GREET_LOAD: greet_then_reduce(a, me, &sync, places, false, sink); break;
    case GREET_REDUCE: greet_then_reduce(a, me, &sync, places, true, sink); break;
    case ZERO_COPY: {
      char* tensor = mapped(a, a.rank, 0, 0);
      all_reduce_in_place<__nv_bfloat16, SUM>(a, me, tensor, tensor, 16, epoch.value & 1, &sync, places);
      break;
    }
    default: break;
  }
  if (threadIdx.x == 0 && places[0].in_slot == 12345) sink[0] = make_uint4(0, 0, 0, 0);  // keeps the greeting
  if (call) {
    finish(a, epoch, &sync);
  } else {
    __syncthreads();
    if (threadIdx.x == 0) a.priv[COUNTERS_WORD + blockIdx.x] = sync.count;
  }
}

int main(int argc, char** argv) {
  int world = 0;
  CUDA(cudaGetDeviceCount(&world));
  if (argc > 1) world = atoi(argv[1]);
  if (world < 2 || world > MAX_RANKS) {
    fprintf(stderr, "needs 2-%d GPUs\n", MAX_RANKS);
    return 1;
  }
  const size_t region_bytes = DATA_OFFSET + (1 << 20);
  std::vector<Args> args(world);
  std::vector<char*> regions(world);
  std::vector<uint4*> sinks(world);
  std::vector<char*> tensors(world), tables(world);  // each rank's registered tensor; its peers' table
  std::vector<cudaStream_t> streams(world);
  for (int r = 0; r < world; ++r) {
    CUDA(cudaSetDevice(r));
    for (int p = 0; p < world; ++p)
      if (p != r) CUDA(cudaDeviceEnablePeerAccess(p, 0));
    CUDA(cudaMalloc(&regions[r], region_bytes));
    CUDA(cudaMemset(regions[r], 0, region_bytes));
    CUDA(cudaMalloc(&sinks[r], MAX_BLOCKS * MAX_RANKS * sizeof(uint4)));
    CUDA(cudaMalloc(&tensors[r], 1 << 16));
    CUDA(cudaMemset(tensors[r], 0, 1 << 16));
    CUDA(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
  }
  for (int r = 0; r < world; ++r) {
    CUDA(cudaSetDevice(r));
    Args& a = args[r];
    memset(&a, 0, sizeof(a));
    for (int p = 0; p < world; ++p) a.base[p] = regions[p];
    std::vector<char*> table(MAX_RANKS * MAX_SLOTS, nullptr);
    for (int p = 0; p < world; ++p) table[p * MAX_SLOTS] = tensors[p];
    CUDA(cudaMalloc(&tables[r], table.size() * sizeof(char*)));
    CUDA(cudaMemcpy(tables[r], table.data(), table.size() * sizeof(char*), cudaMemcpyHostToDevice));
    a.table = (char* const*)tables[r];
    a.priv = (uint32_t*)(regions[r] + PRIVATE_OFFSET);
    int* host_error;
    CUDA(cudaHostAlloc((void**)&host_error, 4 * sizeof(int), cudaHostAllocMapped));
    CUDA(cudaHostGetDevicePointer((void**)&a.host_error, host_error, 0));
    a.timeout_ns = 10ull * 1000 * 1000 * 1000;
    a.half_bytes = 1 << 19;
    a.rank = r;
    a.world = world;
    CUDA(cudaDeviceSynchronize());
  }
  const int calls = 200;
  printf("world %d, us per kernel (slowest GPU, best of 5 replays of %d)\n", world, calls);
  printf("%-32s %10s %10s\n", "shape", "1 block", "32 blocks");
  for (int shape = 0; shape < SHAPES; ++shape) {
    printf("%-32s", NAMES[shape]);
    for (int blocks : {1, 32}) {
      std::vector<cudaGraphExec_t> graphs(world);
      for (int r = 0; r < world; ++r) {
        CUDA(cudaSetDevice(r));
        cudaGraph_t g;
        CUDA(cudaStreamBeginCapture(streams[r], cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < calls; ++i) probe<<<blocks, THREADS, 0, streams[r]>>>(args[r], shape, sinks[r]);
        CUDA(cudaStreamEndCapture(streams[r], &g));
        CUDA(cudaGraphInstantiate(&graphs[r], g, 0));
        CUDA(cudaGraphDestroy(g));
      }
      float best = 1e30f;
      for (int rep = 0; rep < 6; ++rep) {
        std::vector<cudaEvent_t> begin(world), end(world);
        for (int r = 0; r < world; ++r) {
          CUDA(cudaSetDevice(r));
          CUDA(cudaEventCreate(&begin[r]));
          CUDA(cudaEventCreate(&end[r]));
          CUDA(cudaEventRecord(begin[r], streams[r]));
          CUDA(cudaGraphLaunch(graphs[r], streams[r]));
          CUDA(cudaEventRecord(end[r], streams[r]));
        }
        float slowest = 0;
        for (int r = 0; r < world; ++r) {
          CUDA(cudaSetDevice(r));
          CUDA(cudaEventSynchronize(end[r]));
          float ms;
          CUDA(cudaEventElapsedTime(&ms, begin[r], end[r]));
          slowest = ms > slowest ? ms : slowest;
          CUDA(cudaEventDestroy(begin[r]));
          CUDA(cudaEventDestroy(end[r]));
        }
        if (rep > 0 && slowest < best) best = slowest;  // the first replay warms up
      }
      printf(" %10.2f", best * 1000.0f / calls);
      for (int r = 0; r < world; ++r) CUDA(cudaGraphExecDestroy(graphs[r]));
    }
    printf("\n");
    fflush(stdout);
  }
  return 0;
}
