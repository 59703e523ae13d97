// The first barrier of an in-place call, which also tells every peer where this rank's tensors lie.
//
// Block b of rank r writes its place into greeting [b][r] of every peer as four 64-bit words, each
// carrying the barrier's tag in its high half. A reader that sees the tag in all four words has the
// whole place, so no fence has to order the place before a flag: the greeting is the flag, and the
// call's first barrier costs one crossing of the links instead of a write and its acknowledgement
// before the flag. No release is needed either: the tensors a peer reads were written by kernels
// that ended before this one began. The reader clears its greetings once read, before its next
// barrier's release, so a word it sees later carries a tag either zero or this call's.
#pragma once
#include "common.cuh"

__device__ __forceinline__ u64* greeting_in(const Args& a, int owner, int sender) {
  return (u64*)(a.base[owner] + GREETING_OFFSET) + ((size_t)blockIdx.x * MAX_RANKS + sender) * GREETING_WORDS;
}

__device__ __forceinline__ u64 tagged(uint32_t tag, uint32_t payload) { return (u64)tag << 32 | payload; }

// Offsets below 2^48 and slots below 2^16 - 1 fit; a segment is far smaller and MAX_SLOTS is 512.
__device__ __forceinline__ void pack_place(const Place& p, uint32_t tag, u64* words) {
  const uint32_t high = (uint32_t)((p.in_off >> 32) & 0xffff) << 16 | (uint32_t)((p.out_off >> 32) & 0xffff);
  words[0] = tagged(tag, (uint32_t)p.in_off);
  words[1] = tagged(tag, (uint32_t)p.out_off);
  words[2] = tagged(tag, high);
  words[3] = tagged(tag, (uint32_t)(p.in_slot + 1) << 16 | (uint32_t)(p.out_slot + 1));
}

__device__ __forceinline__ Place unpack_place(const u64* words) {
  const uint32_t high = (uint32_t)words[2], slots = (uint32_t)words[3];
  Place p;
  p.in_off = (u64)(high >> 16) << 32 | (uint32_t)words[0];
  p.out_off = (u64)(high & 0xffff) << 32 | (uint32_t)words[1];
  p.in_slot = (int)(slots >> 16) - 1;
  p.out_slot = (int)(slots & 0xffff) - 1;
  return p;
}

__device__ __forceinline__ void store_word(u64* p, u64 v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// Relaxed: acquire loads would wait for one another, four round trips a poll instead of one.
__device__ __forceinline__ u64 load_word(const u64* p) {
  u64 v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Whether all four words carry `tag`; fills `words` either way.
__device__ __forceinline__ bool greeted(const u64* box, uint32_t tag, u64* words) {
  bool all = true;
#pragma unroll
  for (int w = 0; w < GREETING_WORDS; ++w) {
    words[w] = load_word(box + w);
    all = all && (uint32_t)(words[w] >> 32) == tag;
  }
  return all;
}

// Posts this rank's place to every peer and waits for theirs into `places` (the call's first
// barrier); false when a peer never came.
__device__ bool greet(const Args& a, const Place& me, Sync* sync, Place* places) {
  __syncthreads();
  const uint32_t value = sync->count + 1;
  const uint32_t tag = 0x80000000u | (value & 0x7fffffffu);  // never zero, the cleared word
  const int t = threadIdx.x;
  if (t < a.world) {
    u64 words[GREETING_WORDS];
    pack_place(me, tag, words);
    u64* remote = greeting_in(a, t, a.rank);
#pragma unroll
    for (int w = 0; w < GREETING_WORDS; ++w) store_word(remote + w, words[w]);
    u64* box = greeting_in(a, a.rank, t);
    if (wait_for_peer(a, sync, t, [&] { return greeted(box, tag, words); })) {
      places[t] = unpack_place(words);
#pragma unroll
      for (int w = 0; w < GREETING_WORDS; ++w) box[w] = 0;
    }
  }
  return end_barrier(sync, value);
}
