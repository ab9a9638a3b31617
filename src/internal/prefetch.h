// Prefetch / PrefetchForWrite: start loading a cache line that a later step of a software
// pipeline will read or write. No effect on program state.
//
// Why not __builtin_prefetch directly: GCC 12 at -O2 deletes a prefetch that sits in a small
// inlined function (under a condition, its address computed from the function's arguments):
// it treats the prefetch as free of side effects and the code around it as dead. The prefix
// cache's bucket prefetch vanished that way from the -O2 build, while -O3 kept it, which
// doubled the decode step's cost of caching blocks. The empty volatile asm marks the call as
// having an effect, so it is never deleted; it emits no instruction and orders no memory
// access.
#ifndef KVPAGE_INTERNAL_PREFETCH_H_
#define KVPAGE_INTERNAL_PREFETCH_H_

namespace kvpage {

inline void Prefetch(const void* p) {
  __builtin_prefetch(p, 0, 3);
  asm volatile("");
}

inline void PrefetchForWrite(const void* p) {
  __builtin_prefetch(p, 1, 3);
  asm volatile("");
}

// Into the L2 cache only (x86 prefetcht1): for a line needed thousands of instructions later,
// among more lines than the L1 cache holds.
inline void PrefetchToL2(const void* p) {
  __builtin_prefetch(p, 0, 2);
  asm volatile("");
}

}  // namespace kvpage

#endif  // KVPAGE_INTERNAL_PREFETCH_H_
