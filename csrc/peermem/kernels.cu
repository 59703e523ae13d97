// Intra-host collectives over peer-mapped device memory (CUDA IPC), built at first use.
//
// Every rank owns one region, mapped into every peer of the group:
//   [flags: MAX_BLOCKS x MAX_RANKS words][private words][half 0][half 1]
// A call stages what its peers read into the half picked by the call's epoch parity, raises a flag
// in every peer (block b raises flag [b][rank]) and waits for theirs, then reads peers' halves.
// Parity makes an end-of-call barrier unnecessary: a rank writes a half again only two calls
// later, after every peer has entered the call in between and so has finished reading it.
// The epoch lives on the device (graph replays advance it) and moves on when a kernel's last
// block ends. Reductions run in float in rank order 0..n-1, the same code on every rank, so
// results are bitwise equal everywhere and equal to a host loop in that order.
#include <Python.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#define MAX_RANKS 8
#define MAX_BLOCKS 128
#define THREADS 512
#define FLAG_BYTES (MAX_BLOCKS * MAX_RANKS * 4)
#define PRIVATE_BYTES 4096
#define DATA_OFFSET (FLAG_BYTES + PRIVATE_BYTES)

enum Kind { ONE_SHOT = 0, TWO_SHOT = 1, ALL_GATHER = 2, REDUCE_SCATTER = 3, TWO_SHOT_PUSH = 4, REDUCE_SCATTER_PUSH = 5 };
enum Op { SUM = 0, PRODUCT = 1, MIN = 2, MAX = 3, AVG = 4 };
enum Dtype { F32 = 0, BF16 = 1, F16 = 2 };

struct Args {
  char* base[MAX_RANKS];  // every rank's region, mapped here
  uint32_t* priv;         // [0] epoch, [1] blocks done, [2] broken
  int* host_error;        // host-mapped: [0] set, [1] missing peer, [2] block
  unsigned long long timeout_ns;
  unsigned long long half_bytes;
  int rank, world;
};

struct Comm {
  Args args;
  int device;
  char* region;
  int* host_error;
};

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

// Raise this block's flag in every peer, wait for every peer's; false when one never came.
// `pushed`: this block's threads wrote into peers' regions, which each thread fences first.
__device__ bool block_barrier(const Args& a, uint32_t value, bool* ok, bool pushed = false) {
  if (pushed) __threadfence_system();
  __syncthreads();
  int t = threadIdx.x;
  if (t < a.world) {
    uint32_t* remote = (uint32_t*)a.base[t] + blockIdx.x * MAX_RANKS + a.rank;
    store_release(remote, value);
    const uint32_t* mine = (const uint32_t*)a.base[a.rank] + blockIdx.x * MAX_RANKS + t;
    uint64_t start = 0;
    for (uint32_t spins = 0; (int32_t)(load_acquire(mine) - value) < 0; ++spins) {
      if ((spins & 1023) == 1023) {
        uint64_t clock = now_ns();
        if (start == 0) start = clock;
        else if (clock - start > a.timeout_ns) {
          a.host_error[1] = t;
          a.host_error[2] = blockIdx.x;
          __threadfence_system();
          a.host_error[0] = 1;
          a.priv[2] = 1;
          *ok = false;
          break;
        }
      }
    }
  }
  __syncthreads();
  return *ok;
}

template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

template <int OP> __device__ __forceinline__ float combine(float a, float b) {
  if (OP == SUM || OP == AVG) return __fadd_rn(a, b);
  if (OP == PRODUCT) return __fmul_rn(a, b);
  if (OP == MIN) return fminf(a, b);
  return fmaxf(a, b);
}

// One 16-byte unit reduced over the ranks in order; rank p's unit is at src[p] + off (own + off
// for this rank, which reads its input rather than its staged copy).
template <typename T, int OP>
__device__ __forceinline__ uint4 reduce_unit(const char* const* src, const char* own, int rank, int world,
                                             size_t off) {
  constexpr int N = 16 / sizeof(T);
  uint4 units[MAX_RANKS];
#pragma unroll
  for (int p = 0; p < MAX_RANKS; ++p)
    if (p < world) units[p] = *(const uint4*)((p == rank ? own : src[p]) + off);
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

__device__ __forceinline__ void copy_range(char* dst, const char* src, size_t bytes) {
  for (size_t off = first_unit(); off < bytes; off += unit_stride()) *(uint4*)(dst + off) = *(const uint4*)(src + off);
}

// Ends a call: the last block to finish moves the epoch on for the next kernel on this stream.
__device__ __forceinline__ void finish(const Args& a, uint32_t epoch) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&a.priv[1], 1u) == gridDim.x - 1) {
      a.priv[1] = 0;
      a.priv[0] = epoch + 1;
    }
  }
}

template <typename T, int OP>
__global__ void __launch_bounds__(THREADS) collective(Args a, int kind, const char* in, char* out, size_t bytes) {
  __shared__ bool ok;
  if (threadIdx.x == 0) ok = true;
  const uint32_t epoch = *(volatile uint32_t*)&a.priv[0];
  if (*(volatile uint32_t*)&a.priv[2]) {
    finish(a, epoch);
    return;
  }
  const size_t half = (epoch & 1) * a.half_bytes + DATA_OFFSET;
  char* stage = a.base[a.rank] + half;
  const char* src[MAX_RANKS];
#pragma unroll
  for (int p = 0; p < MAX_RANKS; ++p) src[p] = p < a.world ? a.base[p] + half : nullptr;
  const uint32_t flag = epoch * 2u + 1u;
  if (kind == ONE_SHOT) {  // bytes: the whole tensor
    copy_range(stage, in, bytes);
    if (block_barrier(a, flag, &ok)) {
      for (size_t off = first_unit(); off < bytes; off += unit_stride())
        *(uint4*)(out + off) = reduce_unit<T, OP>(src, in, a.rank, a.world, off);
    }
  } else if (kind == TWO_SHOT) {  // bytes: the whole tensor, in slices of ceil(bytes / world)
    size_t slice = ((bytes + a.world - 1) / a.world + 15) / 16 * 16;
    for (int s = 0; s < a.world; ++s) {
      size_t begin = s * slice < bytes ? s * slice : bytes;
      size_t len = (begin + slice < bytes ? begin + slice : bytes) - begin;
      if (s != a.rank) copy_range(stage + begin, in + begin, len);
    }
    size_t mine = a.rank * slice < bytes ? a.rank * slice : bytes;
    size_t mine_len = (mine + slice < bytes ? mine + slice : bytes) - mine;
    if (block_barrier(a, flag, &ok)) {
      for (size_t off = first_unit(); off < mine_len; off += unit_stride()) {
        uint4 r = reduce_unit<T, OP>(src, in, a.rank, a.world, mine + off);
        *(uint4*)(stage + mine + off) = r;
        *(uint4*)(out + mine + off) = r;
      }
      if (block_barrier(a, flag + 1u, &ok)) {
        for (int s = 0; s < a.world; ++s) {
          if (s == a.rank) continue;
          size_t begin = s * slice < bytes ? s * slice : bytes;
          size_t len = (begin + slice < bytes ? begin + slice : bytes) - begin;
          copy_range(out + begin, a.base[s] + half + begin, len);
        }
      }
    }
  } else if (kind == TWO_SHOT_PUSH) {  // bytes: the whole tensor, in slices of ceil(bytes / world)
    // The push variant: each rank writes its part of slice s into rank s's slot [rank], reduces its
    // own slice from local slots, writes the result into every peer's gather area [rank], and
    // finally copies the gathered slices out of its own region. Only posted writes cross NVLink.
    size_t slice = ((bytes + a.world - 1) / a.world + 15) / 16 * 16;
    char* gather = stage + a.world * slice;
    for (int s = 0; s < a.world; ++s) {
      if (s == a.rank) continue;
      size_t begin = s * slice < bytes ? s * slice : bytes;
      size_t len = (begin + slice < bytes ? begin + slice : bytes) - begin;
      copy_range(a.base[s] + half + a.rank * slice, in + begin, len);
    }
    size_t mine = a.rank * slice < bytes ? a.rank * slice : bytes;
    size_t mine_len = (mine + slice < bytes ? mine + slice : bytes) - mine;
    if (block_barrier(a, flag, &ok, true)) {
      const char* slots[MAX_RANKS];
#pragma unroll
      for (int p = 0; p < MAX_RANKS; ++p) slots[p] = stage + p * slice;
      for (size_t off = first_unit(); off < mine_len; off += unit_stride()) {
        uint4 r = reduce_unit<T, OP>(slots, in + mine, a.rank, a.world, off);
        *(uint4*)(out + mine + off) = r;
#pragma unroll
        for (int q = 0; q < MAX_RANKS; ++q)
          if (q < a.world && q != a.rank) *(uint4*)(a.base[q] + half + (a.world + a.rank) * slice + off) = r;
      }
      if (block_barrier(a, flag + 1u, &ok, true)) {
        for (int s = 0; s < a.world; ++s) {
          if (s == a.rank) continue;
          size_t begin = s * slice < bytes ? s * slice : bytes;
          size_t len = (begin + slice < bytes ? begin + slice : bytes) - begin;
          copy_range(out + begin, gather + s * slice, len);
        }
      }
    }
  } else if (kind == ALL_GATHER) {  // bytes: one rank's chunk
    copy_range(stage, in, bytes);
    if (block_barrier(a, flag, &ok)) {
      for (size_t off = first_unit(); off < bytes; off += unit_stride()) {
        uint4 units[MAX_RANKS];
#pragma unroll
        for (int p = 0; p < MAX_RANKS; ++p)
          if (p < a.world) units[p] = *(const uint4*)((p == a.rank ? in : src[p]) + off);
#pragma unroll
        for (int p = 0; p < MAX_RANKS; ++p)
          if (p < a.world) *(uint4*)(out + p * bytes + off) = units[p];
      }
    }
  } else if (kind == REDUCE_SCATTER_PUSH) {  // bytes: one rank's output chunk; TWO_SHOT_PUSH's first half
    for (int s = 0; s < a.world; ++s)
      if (s != a.rank) copy_range(a.base[s] + half + a.rank * bytes, in + s * bytes, bytes);
    if (block_barrier(a, flag, &ok, true)) {
      const char* slots[MAX_RANKS];
#pragma unroll
      for (int p = 0; p < MAX_RANKS; ++p) slots[p] = stage + p * bytes;
      for (size_t off = first_unit(); off < bytes; off += unit_stride())
        *(uint4*)(out + off) = reduce_unit<T, OP>(slots, in + a.rank * bytes, a.rank, a.world, off);
    }
  } else {  // REDUCE_SCATTER; bytes: one rank's output chunk
    for (int s = 0; s < a.world; ++s)
      if (s != a.rank) copy_range(stage + s * bytes, in + s * bytes, bytes);
    if (block_barrier(a, flag, &ok)) {
      for (size_t off = first_unit(); off < bytes; off += unit_stride())
        *(uint4*)(out + off) = reduce_unit<T, OP>(src, in, a.rank, a.world, a.rank * bytes + off);
    }
  }
  finish(a, epoch);
}

template <typename T, int OP>
static void launch_typed(Comm* c, int kind, const void* in, void* out, size_t bytes, int blocks, cudaStream_t s) {
  collective<T, OP><<<blocks, THREADS, 0, s>>>(c->args, kind, (const char*)in, (char*)out, bytes);
}

template <typename T>
static void launch_op(Comm* c, int kind, int op, const void* in, void* out, size_t bytes, int blocks, cudaStream_t s) {
  switch (op) {
    case SUM: launch_typed<T, SUM>(c, kind, in, out, bytes, blocks, s); break;
    case PRODUCT: launch_typed<T, PRODUCT>(c, kind, in, out, bytes, blocks, s); break;
    case MIN: launch_typed<T, MIN>(c, kind, in, out, bytes, blocks, s); break;
    case MAX: launch_typed<T, MAX>(c, kind, in, out, bytes, blocks, s); break;
    default: launch_typed<T, AVG>(c, kind, in, out, bytes, blocks, s); break;
  }
}

extern "C" {

// Allocates this rank's region and writes its IPC handle (64 bytes) into handle_out.
int pm_create(int device, int rank, int world, unsigned long long half_bytes, unsigned long long timeout_ns,
              void** comm_out, void* handle_out) {
  if (world < 1 || world > MAX_RANKS || rank < 0 || rank >= world) return -1;
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return (int)e;
  Comm* c = new Comm();
  memset(c, 0, sizeof(Comm));
  c->device = device;
  size_t total = DATA_OFFSET + 2 * half_bytes;
  if ((e = cudaMalloc((void**)&c->region, total)) != cudaSuccess) { delete c; return (int)e; }
  if ((e = cudaMemset(c->region, 0, total)) != cudaSuccess) return (int)e;
  if ((e = cudaHostAlloc((void**)&c->host_error, 4 * sizeof(int), cudaHostAllocMapped)) != cudaSuccess) return (int)e;
  memset(c->host_error, 0, 4 * sizeof(int));
  int* dev_error = nullptr;
  if ((e = cudaHostGetDevicePointer((void**)&dev_error, c->host_error, 0)) != cudaSuccess) return (int)e;
  cudaIpcMemHandle_t handle;
  if ((e = cudaIpcGetMemHandle(&handle, c->region)) != cudaSuccess) return (int)e;
  if ((e = cudaDeviceSynchronize()) != cudaSuccess) return (int)e;
  memcpy(handle_out, &handle, sizeof(handle));
  c->args.priv = (uint32_t*)(c->region + FLAG_BYTES);
  c->args.host_error = dev_error;
  c->args.timeout_ns = timeout_ns;
  c->args.half_bytes = half_bytes;
  c->args.rank = rank;
  c->args.world = world;
  c->args.base[rank] = c->region;
  *comm_out = c;
  return 0;
}

int pm_open(void* comm, int peer, const void* handle) {
  Comm* c = (Comm*)comm;
  if (peer == c->args.rank) return 0;
  cudaIpcMemHandle_t h;
  memcpy(&h, handle, sizeof(h));
  cudaError_t e = cudaSetDevice(c->device);
  if (e != cudaSuccess) return (int)e;
  void* mapped = nullptr;
  e = cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) return (int)e;
  c->args.base[peer] = (char*)mapped;
  return 0;
}

int pm_handle_bytes(void) { return (int)sizeof(cudaIpcMemHandle_t); }

// kind|dtype<<4|op<<8 in `code`; returns 0, a CUDA error, or -2 when an earlier call timed out.
int pm_launch(void* comm, int code, const void* in, void* out, unsigned long long bytes, int blocks, void* stream) {
  Comm* c = (Comm*)comm;
  if (*(volatile int*)c->host_error) return -2;
  if (((uintptr_t)in | (uintptr_t)out) & 15) return -3;
  int kind = code & 15, dtype = (code >> 4) & 15, op = (code >> 8) & 15;
  cudaStream_t s = (cudaStream_t)stream;
  if (dtype == F32) launch_op<float>(c, kind, op, in, out, bytes, blocks, s);
  else if (dtype == BF16) launch_op<__nv_bfloat16>(c, kind, op, in, out, bytes, blocks, s);
  else launch_op<__half>(c, kind, op, in, out, bytes, blocks, s);
  return (int)cudaGetLastError();
}

// The host-mapped error words, so that Python reads them without a call.
void* pm_error_address(void* comm) { return ((Comm*)comm)->host_error; }

// 0 while no call timed out; else 1, with the peer that never came and the block that waited.
int pm_error(void* comm, int* peer, int* block) {
  Comm* c = (Comm*)comm;
  volatile int* e = c->host_error;
  *peer = e[1];
  *block = e[2];
  return e[0];
}

const char* pm_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

void pm_destroy(void* comm) {
  Comm* c = (Comm*)comm;
  cudaSetDevice(c->device);
  cudaDeviceSynchronize();
  for (int p = 0; p < c->args.world; ++p)
    if (p != c->args.rank && c->args.base[p]) cudaIpcCloseMemHandle(c->args.base[p]);
  cudaFree(c->region);
  cudaFreeHost(c->host_error);
  delete c;
}

}  // extern "C"

// The hot path as a Python function (METH_FASTCALL): launch(comm, code, in, out, bytes, blocks,
// stream) -> pm_launch's return code, with none of ctypes' per-argument conversions.
static PyObject* py_launch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "launch(comm, code, in, out, bytes, blocks, stream) takes 7 arguments");
    return NULL;
  }
  void* comm = PyLong_AsVoidPtr(args[0]);
  int code = (int)PyLong_AsLong(args[1]);
  void* in = PyLong_AsVoidPtr(args[2]);
  void* out = PyLong_AsVoidPtr(args[3]);
  unsigned long long bytes = PyLong_AsUnsignedLongLong(args[4]);
  int blocks = (int)PyLong_AsLong(args[5]);
  void* stream = PyLong_AsVoidPtr(args[6]);
  if (PyErr_Occurred()) return NULL;
  return PyLong_FromLong(pm_launch(comm, code, in, out, bytes, blocks, stream));
}

static PyMethodDef kernel_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))py_launch, METH_FASTCALL, "Start one collective kernel."},
    {NULL, NULL, 0, NULL}};
static struct PyModuleDef kernel_module = {PyModuleDef_HEAD_INIT, "_peermem_kernels", NULL, -1, kernel_methods};
PyMODINIT_FUNC PyInit__peermem_kernels(void) { return PyModule_Create(&kernel_module); }
