// paged_prefill kernel body: attention for the varlen batches the scheduler emits (prefill
// chunks over cached prefixes, and decodes) over the blocks-first paged cache
// (include/kvpage/cuda/paged_prefill.h).
//
// Design: ref::PagedPrefill defines the query at position p as paged decode over a sequence
// of length p + 1, so the decode kernels (paged_decode_kernel.cuh, paged_decode_mma_kernel.cuh)
// run unchanged with one row per query token. PrefillRowsKernel writes, for every token of
// the batch, its sequence (the table row it reads) and p + 1 (the length it attends to);
// the decode launch then reads the table through those rows (DecodeArgs::table_rows). Causal
// masking within a chunk, the full cached prefix and sliding windows all follow from
// AttendedRange(p + 1, window_left), and a token's output does not depend on how its
// sequence was chunked.
//
// Cost: each query token reads its attended K/V range on its own, so a chunk of q tokens over
// n cached ones reads about q·n rows. That is exact and cheap for decodes and short chunks;
// with tensor cores and one split PagedPrefill takes the tiled kernel instead
// (paged_prefill_tiled_kernel.cuh), which shares K/V tiles across a tile's queries.
//
// Device code only; the launcher is in paged_prefill.cu. Kept in a header so the same source
// also compiles on the host against kernels/emulation/cuda_emulation.h (tests/kernels).
#ifndef KVPAGE_KERNELS_PAGED_PREFILL_KERNEL_CUH_
#define KVPAGE_KERNELS_PAGED_PREFILL_KERNEL_CUH_

#include <cstdint>

#include "kernels/paged_decode_kernel.cuh"
#include "kvpage/kernel_layout.h"

namespace kvpage::cuda::internal {

constexpr int kPrefillRowsThreads = 256;

// Token t of the batch: its sequence b (the last with query_start_loc[b] <= t) and
// lens[t] = p + 1 for its position p = seq_lens[b] − q_len_b + (t − query_start_loc[b]).
// Tokens outside [query_start_loc[0], query_start_loc[num_seqs]) (padding) and queries of a
// chunk longer than its sequence get length 0: a zero output.
__global__ void __launch_bounds__(kPrefillRowsThreads)
    PrefillRowsKernel(const int32_t* __restrict__ query_start_loc,
                      const int32_t* __restrict__ seq_lens, int32_t num_seqs,
                      int32_t total_tokens, int32_t* __restrict__ rows,
                      int32_t* __restrict__ lens) {
  const int32_t t = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  if (t >= total_tokens) return;
  int32_t row = 0;
  int32_t len = 0;
  if (num_seqs > 0 && t >= query_start_loc[0] && t < query_start_loc[num_seqs]) {
    int32_t lo = 0;
    int32_t hi = num_seqs - 1;
    while (lo < hi) {
      const int32_t mid = (lo + hi + 1) / 2;
      if (query_start_loc[mid] <= t) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    row = lo;
    const int32_t q_len = query_start_loc[lo + 1] - query_start_loc[lo];
    const int32_t attended = seq_lens[lo] - q_len + (t - query_start_loc[lo]) + 1;
    len = attended > 0 ? attended : 0;
  }
  rows[t] = row;
  lens[t] = len;
}

// Bytes of the rows and lengths at the front of the workspace (16-byte aligned after them).
inline int64_t PrefillRowsBytes(int32_t total_tokens) {
  return (static_cast<int64_t>(total_tokens) * 2 * 4 + 15) / 16 * 16;
}

// The decode launch over one row per query token, once PrefillRowsKernel has written `rows`
// and `lens` (total_tokens each). REQUIRES: arguments validated by PagedPrefill.
inline DecodeLaunch MakePrefillLaunch(void* out, const void* q, int64_t q_token_stride,
                                      const KvCacheView& cache, const BlockTableView& table,
                                      int32_t total_tokens, const int32_t* rows,
                                      const int32_t* lens, const DecodeParams& params,
                                      const DecodePlan& plan, void* decode_workspace) {
  DecodeLaunch l = MakeDecodeLaunch(
      out, q, q_token_stride, cache,
      BlockTableView{table.table, table.row_stride, lens, total_tokens}, params, plan,
      decode_workspace);
  l.args.table_rows = rows;
  return l;
}

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_PAGED_PREFILL_KERNEL_CUH_
