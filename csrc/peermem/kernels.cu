// Intra-host collectives over peer-mapped device memory (CUDA IPC), built at first use.
//
// The layout, barrier and inbox are in common.cuh (the in-place calls' greeting in greeting.cuh);
// staged.cuh holds the algorithms that move data through the ranks' regions, in_place.cuh those
// that read and write the callers' tensors in registered segments, all_to_all.cuh and
// fused_norm.cuh the two other kernels. The epoch lives on the device (graph replays advance it)
// and moves on when the last of a kernel's blocks to start ends. Reductions
// run in float in rank order 0..n-1, the same code on every rank, so results are bitwise equal
// everywhere and equal to a host loop in that order.
#include <Python.h>
#include <cuda.h>
#include <string.h>

#include "all_to_all.cuh"
#include "fused_norm.cuh"

enum Kind {
  ONE_SHOT = 0,
  TWO_SHOT = 1,
  ALL_GATHER = 2,
  REDUCE_SCATTER = 3,
  TWO_SHOT_PUSH = 4,
  REDUCE_SCATTER_PUSH = 5,
  ONE_SHOT_PUSH = 6,
  ALL_REDUCE_IN_PLACE = 7,
  ALL_GATHER_IN_PLACE = 8,
  REDUCE_SCATTER_IN_PLACE = 9
};

template <typename T, int OP>
__global__ void __launch_bounds__(THREADS)
    collective(const __grid_constant__ Args a, int kind, const char* in, char* out, size_t bytes) {
  __shared__ Sync sync;
  Epoch epoch;
  if (!start_call(a, &epoch, &sync)) return;
  const size_t half = DATA_OFFSET + (epoch.value & 1) * a.half_bytes;
  switch (kind) {
    case ONE_SHOT: one_shot<T, OP>(a, in, out, bytes, half, &sync); break;
    case ONE_SHOT_PUSH: one_shot_push<T, OP>(a, in, out, bytes, half, &sync); break;
    case TWO_SHOT: two_shot<T, OP>(a, in, out, bytes, half, &sync); break;
    case TWO_SHOT_PUSH: two_shot_push<T, OP>(a, in, out, bytes, half, &sync); break;
    case ALL_GATHER: all_gather_staged(a, in, out, bytes, half, &sync); break;
    case REDUCE_SCATTER: reduce_scatter_staged<T, OP>(a, in, out, bytes, half, &sync); break;
    default: reduce_scatter_push<T, OP>(a, in, out, bytes, half, &sync); break;
  }
  finish(a, epoch, &sync);
}

template <typename T, int OP>
__global__ void __launch_bounds__(THREADS)
    in_place(const __grid_constant__ Args a, int kind, const char* in, char* out, size_t bytes, CallPlace call) {
  __shared__ Sync sync;
  __shared__ Place places[MAX_RANKS];
  Epoch epoch;
  if (!start_call(a, &epoch, &sync)) return;
  const int parity = epoch.value & 1;
  const Place me = resolve(a, call);
  if (kind == ALL_REDUCE_IN_PLACE)
    all_reduce_in_place<T, OP>(a, me, in, out, bytes, parity, &sync, places);
  else if (kind == ALL_GATHER_IN_PLACE)
    all_gather_in_place(a, me, in, out, bytes, parity, &sync, places);
  else
    reduce_scatter_in_place<T, OP>(a, me, in, out, bytes, parity, &sync, places);
  finish(a, epoch, &sync);
}

struct Comm {
  Args args;
  int device;
  char* region;
  int* host_error;
  char** table;  // device copy of mapped, which the kernels read
  Place* descs;
  char* mapped[MAX_RANKS * MAX_SLOTS];
  cudaStream_t updates;  // table and descriptor writes, off the callers' streams
};

typedef CUresult (*PointerAttributes)(unsigned int, CUpointer_attribute*, void**, CUdeviceptr);
static PointerAttributes pointer_attributes = nullptr;

template <typename T, int OP>
static void launch_typed(Comm* c, int kind, const void* in, void* out, size_t bytes, int blocks, cudaStream_t s,
                         CallPlace call) {
  if (kind >= ALL_REDUCE_IN_PLACE)
    in_place<T, OP><<<blocks, THREADS, 0, s>>>(c->args, kind, (const char*)in, (char*)out, bytes, call);
  else
    collective<T, OP><<<blocks, THREADS, 0, s>>>(c->args, kind, (const char*)in, (char*)out, bytes);
}

template <typename T>
static void launch_op(Comm* c, int kind, int op, const void* in, void* out, size_t bytes, int blocks, cudaStream_t s,
                      CallPlace call) {
  switch (op) {
    case SUM: launch_typed<T, SUM>(c, kind, in, out, bytes, blocks, s, call); break;
    case PRODUCT: launch_typed<T, PRODUCT>(c, kind, in, out, bytes, blocks, s, call); break;
    case MIN: launch_typed<T, MIN>(c, kind, in, out, bytes, blocks, s, call); break;
    case MAX: launch_typed<T, MAX>(c, kind, in, out, bytes, blocks, s, call); break;
    default: launch_typed<T, AVG>(c, kind, in, out, bytes, blocks, s, call); break;
  }
}

static CallPlace call_place(int in_slot, int out_slot, u64 in_off, u64 out_off, int desc) {
  CallPlace p;
  p.place.in_slot = in_slot;
  p.place.out_slot = out_slot;
  p.place.in_off = in_off;
  p.place.out_off = out_off;
  p.desc = desc;
  return p;
}

#define CHECK(call)                          \
  do {                                       \
    cudaError_t e_ = (call);                 \
    if (e_ != cudaSuccess) return (int)e_;   \
  } while (0)

extern "C" {

// Allocates this rank's region and writes its IPC handle (64 bytes) into handle_out.
int pm_create(int device, int rank, int world, unsigned long long half_bytes, unsigned long long timeout_ns,
              void** comm_out, void* handle_out) {
  if (world < 1 || world > MAX_RANKS || rank < 0 || rank >= world) return -1;
  CHECK(cudaSetDevice(device));
  Comm* c = new Comm();
  memset(c, 0, sizeof(Comm));
  c->device = device;
  size_t total = DATA_OFFSET + 2 * half_bytes;
  cudaError_t e = cudaMalloc((void**)&c->region, total);
  if (e != cudaSuccess) {
    delete c;
    return (int)e;
  }
  CHECK(cudaMemset(c->region, 0, total));
  CHECK(cudaMalloc((void**)&c->table, sizeof(c->mapped)));
  CHECK(cudaMemset(c->table, 0, sizeof(c->mapped)));
  CHECK(cudaMalloc((void**)&c->descs, MAX_DESCS * sizeof(Place)));
  CHECK(cudaMemset(c->descs, 0xff, MAX_DESCS * sizeof(Place)));  // slot -1: staged, until registered
  CHECK(cudaStreamCreateWithFlags(&c->updates, cudaStreamNonBlocking));
  CHECK(cudaHostAlloc((void**)&c->host_error, 4 * sizeof(int), cudaHostAllocMapped));
  memset(c->host_error, 0, 4 * sizeof(int));
  int* dev_error = nullptr;
  CHECK(cudaHostGetDevicePointer((void**)&dev_error, c->host_error, 0));
  cudaIpcMemHandle_t handle;
  CHECK(cudaIpcGetMemHandle(&handle, c->region));
  CHECK(cudaDeviceSynchronize());
  if (pointer_attributes == nullptr) {
    cudaDriverEntryPointQueryResult found;
    CHECK(cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", (void**)&pointer_attributes, 12000,
                                           cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess) return -4;
  }
  memcpy(handle_out, &handle, sizeof(handle));
  c->args.priv = (uint32_t*)(c->region + PRIVATE_OFFSET);
  c->args.table = c->table;
  c->args.descs = c->descs;
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
  CHECK(cudaSetDevice(c->device));
  void* mapped = nullptr;
  CHECK(cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess));
  c->args.base[peer] = (char*)mapped;
  return 0;
}

int pm_handle_bytes(void) { return (int)sizeof(cudaIpcMemHandle_t); }
int pm_max_slots(void) { return MAX_SLOTS; }
int pm_max_descs(void) { return MAX_DESCS; }

// The allocation holding ptr: out = {buffer id, base, size, 1 if cudaIpcGetMemHandle can share it}.
int pm_segment(const void* ptr, unsigned long long* out) {
  CUpointer_attribute which[4] = {CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                  CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
  unsigned long long id = 0, base = 0, size = 0;
  int capable = 0;
  void* values[4] = {&id, &base, &size, &capable};
  CUresult r = pointer_attributes(4, which, values, (CUdeviceptr)ptr);
  if (r != CUDA_SUCCESS) return -(int)r - 1000;
  out[0] = id;
  out[1] = base;
  out[2] = size;
  out[3] = capable ? 1 : 0;
  return 0;
}

// This rank's segment at base, for peers to map.
int pm_export(const void* base, void* handle_out) {
  cudaIpcMemHandle_t h;
  CHECK(cudaIpcGetMemHandle(&h, (void*)base));
  memcpy(handle_out, &h, sizeof(h));
  return 0;
}

// Maps a peer's registered segment as its slot, for the kernels to read and write in place.
int pm_import(void* comm, int peer, int slot, const void* handle) {
  Comm* c = (Comm*)comm;
  if (peer < 0 || peer >= c->args.world || peer == c->args.rank || slot < 0 || slot >= MAX_SLOTS) return -1;
  cudaIpcMemHandle_t h;
  memcpy(&h, handle, sizeof(h));
  CHECK(cudaSetDevice(c->device));
  void* mapped = nullptr;
  CHECK(cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess));
  int index = peer * MAX_SLOTS + slot;
  c->mapped[index] = (char*)mapped;
  CHECK(cudaMemcpyAsync(c->table + index, &c->mapped[index], sizeof(char*), cudaMemcpyHostToDevice, c->updates));
  CHECK(cudaStreamSynchronize(c->updates));
  return 0;
}

// Fills in a captured call's place (call between replays: a running replay may read it).
int pm_set_place(void* comm, int desc, int in_slot, int out_slot, unsigned long long in_off, unsigned long long out_off) {
  Comm* c = (Comm*)comm;
  if (desc < 0 || desc >= MAX_DESCS) return -1;
  Place p = call_place(in_slot, out_slot, in_off, out_off, -1).place;
  CHECK(cudaMemcpyAsync(c->descs + desc, &p, sizeof(Place), cudaMemcpyHostToDevice, c->updates));
  CHECK(cudaStreamSynchronize(c->updates));
  return 0;
}

// kind|dtype<<4|op<<8 in `code`; returns 0, a CUDA error, -2 when an earlier call timed out, -3
// when a tensor is not 16-byte aligned.
int pm_launch(void* comm, int code, const void* in, void* out, unsigned long long bytes, int blocks, void* stream,
              int in_slot, int out_slot, unsigned long long in_off, unsigned long long out_off, int desc) {
  Comm* c = (Comm*)comm;
  if (*(volatile int*)c->host_error) return -2;
  if (((uintptr_t)in | (uintptr_t)out) & 15) return -3;
  int kind = code & 15, dtype = (code >> 4) & 15, op = (code >> 8) & 15;
  cudaStream_t s = (cudaStream_t)stream;
  CallPlace call = call_place(in_slot, out_slot, in_off, out_off, desc);
  if (dtype == F32) launch_op<float>(c, kind, op, in, out, bytes, blocks, s, call);
  else if (dtype == BF16) launch_op<__nv_bfloat16>(c, kind, op, in, out, bytes, blocks, s, call);
  else launch_op<__half>(c, kind, op, in, out, bytes, blocks, s, call);
  return (int)cudaGetLastError();
}

// Stream order for the calls that run on the group's own stream, without torch's Python
// objects: record `event` on `stream`, and make `stream` wait for the last record of `event`.
int pm_record(void* event, void* stream) { return (int)cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream); }
int pm_wait(void* stream, void* event) { return (int)cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0); }

// splits: send_off, send_len, recv_off, recv_len, MAX_RANKS each, in bytes.
int pm_all_to_all(void* comm, const void* in, void* out, unsigned long long in_bytes, const unsigned long long* splits,
                  int blocks, void* stream, int in_slot, unsigned long long in_off, int desc,
                  unsigned long long push_limit) {
  Comm* c = (Comm*)comm;
  if (*(volatile int*)c->host_error) return -2;
  if (((uintptr_t)in | (uintptr_t)out) & 15) return -3;
  Splits sp;
  memcpy(&sp, splits, sizeof(sp));
  CallPlace call = call_place(in_slot, -1, in_off, 0, desc);
  all_to_all<<<blocks, THREADS, 0, (cudaStream_t)stream>>>(c->args, call, (const char*)in, (char*)out, in_bytes, sp,
                                                          push_limit);
  return (int)cudaGetLastError();
}

int pm_fused_norm(void* comm, int dtype, const void* partial, const void* residual, const void* weight, void* normed,
                  void* residual_out, int rows, int hidden, float eps, int blocks, void* stream) {
  Comm* c = (Comm*)comm;
  if (*(volatile int*)c->host_error) return -2;
  if (((uintptr_t)partial | (uintptr_t)residual | (uintptr_t)weight | (uintptr_t)normed | (uintptr_t)residual_out) & 15)
    return -3;
  cudaStream_t s = (cudaStream_t)stream;
  const char *p = (const char*)partial, *r = (const char*)residual, *w = (const char*)weight;
  char *n = (char*)normed, *ro = (char*)residual_out;
  if (dtype == F32) fused_norm<float><<<blocks, THREADS, 0, s>>>(c->args, p, r, w, n, ro, rows, hidden, eps);
  else if (dtype == BF16) fused_norm<__nv_bfloat16><<<blocks, THREADS, 0, s>>>(c->args, p, r, w, n, ro, rows, hidden, eps);
  else fused_norm<__half><<<blocks, THREADS, 0, s>>>(c->args, p, r, w, n, ro, rows, hidden, eps);
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

const char* pm_error_string(int code) {
  if (code == -4) return "the CUDA driver has no cuPointerGetAttributes";
  if (code <= -1000) return "cuPointerGetAttributes failed";
  return cudaGetErrorString((cudaError_t)code);
}

void pm_destroy(void* comm) {
  Comm* c = (Comm*)comm;
  cudaSetDevice(c->device);
  cudaDeviceSynchronize();
  for (int i = 0; i < MAX_RANKS * MAX_SLOTS; ++i)
    if (c->mapped[i]) cudaIpcCloseMemHandle(c->mapped[i]);
  for (int p = 0; p < c->args.world; ++p)
    if (p != c->args.rank && c->args.base[p]) cudaIpcCloseMemHandle(c->args.base[p]);
  cudaFree(c->region);
  cudaFree(c->table);
  cudaFree(c->descs);
  cudaStreamDestroy(c->updates);
  cudaFreeHost(c->host_error);
  delete c;
}

}  // extern "C"

#include "python_module.h"
