// Paged attention for the varlen batches the scheduler emits: prefill chunks over cached
// prefixes and decodes in one launch. Built only with KVPAGE_BUILD_CUDA.
// Layouts: kvpage/kernel_layout.h; CPU oracle: kvpage::ref::PagedPrefill.
#ifndef KVPAGE_CUDA_PAGED_PREFILL_H_
#define KVPAGE_CUDA_PAGED_PREFILL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kvpage/kernel_layout.h"

namespace kvpage::cuda {

// Bytes of workspace PagedPrefill needs: each token's table row and length (8 bytes a token,
// rounded up to 16; the tiled path keeps its work list there), then
// DecodeWorkspaceBytes(plan, total_tokens, num_q_heads, head_dim) for split-KV partials.
int64_t PrefillWorkspaceBytes(const DecodePlan& plan, int32_t total_tokens,
                              int32_t num_q_heads, int32_t head_dim);

// Attention of a batch of variable-length query chunks over the paged cache.
//
//   out: [total_tokens][num_q_heads][head_dim], DecodeQueryDType(cache, params) (the cache's
//        dtype, or params.fp8_query_dtype for an fp8 cache), contiguous.
//   q:   [total_tokens][num_q_heads][head_dim], the same dtype, token stride q_token_stride.
//   cache, params: as PagedDecode (f16/bf16/fp8 caches, head_dim 64-256).
//   query_start_loc: int32 [table.num_seqs + 1] on the device; sequence b's queries are tokens
//      [query_start_loc[b], query_start_loc[b + 1]), the last of its table.seq_lens[b]
//      positions (their K/V already written, e.g. by WriteKv).
//   total_tokens: query tokens in the launch (host value, at most 65535); tokens outside
//      [query_start_loc[0], query_start_loc[num_seqs]) (padding to a CUDA-graph size) get
//      zero outputs.
//   workspace: device memory of PrefillWorkspaceBytes(...) bytes, 16-byte aligned.
//
// The query at position p attends to AttendedRange(p + 1, window_left): causal within its
// chunk, the cached prefix in full, within the sliding window when there is one.
// Two paths (docs/kernels.md, "paged_prefill"):
// - plan.use_tensor_cores and at most 64 query heads per KV head: the tiled tensor-core
//   kernel. Tiles of query tokens x the query heads of one KV head share each K/V tile, so a
//   chunk reads each K/V row once per tile of 64 / group tokens; plan.num_splits splits
//   each tile's key range (merged by MergeAttnStates).
// - otherwise: each query computed as PagedDecode computes a sequence of length p + 1 (same
//   kernels, same plan: plan.num_splits splits each query's range), every query reading its
//   own K/V range; exact and cheap for decodes and short chunks, q·n rows for a long chunk.
// On both, a token's output does not depend on how its sequence was chunked (up to fp
// rounding on the tiled path). REQUIRES: query offsets non-decreasing and every table entry
// in an attended range a valid block id. Asynchronous, never synchronizes, graph-capturable.
// Returns InvalidArgument naming the value as PagedDecode does, and for a null
// query_start_loc, total_tokens outside [0, 65535] or a workspace that is too small; a CUDA
// launch error otherwise.
absl::Status PagedPrefill(void* out, const void* q, int64_t q_token_stride,
                          const int32_t* query_start_loc, int32_t total_tokens,
                          const KvCacheView& cache, const BlockTableView& table,
                          const DecodeParams& params, const DecodePlan& plan, void* workspace,
                          int64_t workspace_bytes, cudaStream_t stream);

}  // namespace kvpage::cuda

#endif  // KVPAGE_CUDA_PAGED_PREFILL_H_
