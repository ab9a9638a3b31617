// paged_prefill launcher (include/kvpage/cuda/paged_prefill.h); the kernel and its design
// notes are in paged_prefill_kernel.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_status.h"
#include "kernels/paged_decode_launch.h"
#include "kernels/paged_prefill_kernel.cuh"
#include "kernels/paged_prefill_tiled_kernel.cuh"
#include "kvpage/cuda/paged_decode.h"
#include "kvpage/cuda/paged_prefill.h"

namespace kvpage::cuda {
namespace {

using TiledKernelFn = void (*)(internal::PrefillTiledArgs);

template <typename T>
TiledKernelFn TiledKernelFor(int32_t head_dim) {
  switch (head_dim) {
    case 64:
      return internal::PagedPrefillTiledKernel<T, 64>;
    case 128:
      return internal::PagedPrefillTiledKernel<T, 128>;
    default:
      return internal::PagedPrefillTiledKernel<T, 256>;
  }
}

// The tiled path (paged_prefill_tiled_kernel.cuh): the work list into the front of the
// workspace, then one CTA per tile, KV head and split, and with splits the merge of the
// partials kept in split_workspace. REQUIRES: arguments validated, tensor cores allowed for
// this cache (f16/bf16, head_dim 64/128/256, block_size % 16 == 0).
absl::Status LaunchTiledPrefill(void* out, const void* q, int64_t q_token_stride,
                                const int32_t* query_start_loc, int32_t total_tokens,
                                const KvCacheView& cache, const BlockTableView& table,
                                const DecodeParams& params, const DecodePlan& plan,
                                int32_t* work, void* split_workspace, cudaStream_t stream) {
  const internal::PrefillTiledArgs a =
      internal::MakePrefillTiledArgs(out, q, q_token_stride, query_start_loc, total_tokens,
                                     cache, table, params, plan, work, split_workspace);
  const int32_t tile_tokens = internal::TileTokens(a.group_size);
  internal::PrefillWorkListKernel<<<1, internal::kWorkListThreads, 0, stream>>>(
      query_start_loc, table.num_seqs, total_tokens, tile_tokens, work);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return internal::CudaStatus(err, "PrefillWorkListKernel");
  const dim3 grid(
      static_cast<unsigned int>(internal::MaxPrefillTiles(total_tokens, table.num_seqs,
                                                          tile_tokens)),
      static_cast<unsigned int>(cache.num_kv_heads), static_cast<unsigned int>(plan.num_splits));
  const TiledKernelFn kernel = cache.dtype == DType::kBF16
                                   ? TiledKernelFor<__nv_bfloat16>(cache.head_dim)
                                   : TiledKernelFor<__half>(cache.head_dim);
  kernel<<<grid, internal::kPrefillThreads, 0, stream>>>(a);
  err = cudaGetLastError();
  if (err != cudaSuccess) return internal::CudaStatus(err, "PagedPrefillTiledKernel");
  if (plan.num_splits == 1) return absl::OkStatus();
  return MergeAttnStates(out, nullptr, a.ws_o, a.ws_lse, total_tokens, params.num_q_heads,
                         plan.num_splits, cache.head_dim, cache.dtype, stream);
}

}  // namespace

int64_t PrefillWorkspaceBytes(const DecodePlan& plan, int32_t total_tokens,
                              int32_t num_q_heads, int32_t head_dim) {
  return internal::PrefillRowsBytes(total_tokens) +
         DecodeWorkspaceBytes(plan, total_tokens, num_q_heads, head_dim);
}

absl::Status PagedPrefill(void* out, const void* q, int64_t q_token_stride,
                          const int32_t* query_start_loc, int32_t total_tokens,
                          const KvCacheView& cache, const BlockTableView& table,
                          const DecodeParams& params, const DecodePlan& plan, void* workspace,
                          int64_t workspace_bytes, cudaStream_t stream) {
  if (query_start_loc == nullptr) {
    return absl::InvalidArgumentError("PagedPrefill: null query_start_loc");
  }
  if (total_tokens < 0 || total_tokens > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedPrefill: total_tokens ", total_tokens, " is outside [0, 65535]"));
  }
  if (table.num_seqs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedPrefill: num_seqs ", table.num_seqs, " is negative"));
  }
  const int32_t head_dim = cache.head_dim;
  const int64_t needed = PrefillWorkspaceBytes(plan, total_tokens, params.num_q_heads, head_dim);
  if (needed > 0 && (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 != 0 ||
                     workspace_bytes < needed)) {
    return absl::InvalidArgumentError(absl::StrCat("PagedPrefill: workspace of ",
                                                   workspace_bytes,
                                                   " bytes (16-byte aligned) needed ", needed));
  }
  int32_t* rows = static_cast<int32_t*>(workspace);
  int32_t* lens = rows + total_tokens;
  const int64_t rows_bytes = internal::PrefillRowsBytes(total_tokens);
  void* decode_ws = static_cast<char*>(workspace) + rows_bytes;
  // One decode row per query token, reading its sequence's table row.
  const BlockTableView per_token{table.table, table.row_stride,
                                 table.seq_lens != nullptr ? lens : nullptr, total_tokens};
  absl::Status status =
      internal::ValidatePagedDecode("PagedPrefill", out, q, q_token_stride, cache, per_token,
                                    params, plan, decode_ws, workspace_bytes - rows_bytes);
  if (!status.ok() || total_tokens == 0) return status;
  if (internal::UseTiledPrefill(cache, params, plan)) {
    // The work list (at most total_tokens entries and a count) fits the rows and lengths.
    return LaunchTiledPrefill(out, q, q_token_stride, query_start_loc, total_tokens, cache,
                              table, params, plan, rows, decode_ws, stream);
  }
  const int blocks =
      (total_tokens + internal::kPrefillRowsThreads - 1) / internal::kPrefillRowsThreads;
  internal::PrefillRowsKernel<<<blocks, internal::kPrefillRowsThreads, 0, stream>>>(
      query_start_loc, table.seq_lens, table.num_seqs, total_tokens, rows, lens);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return internal::CudaStatus(err, "PrefillRowsKernel");
  return internal::LaunchPagedDecode("PagedPrefill", out, q, q_token_stride, cache, per_token,
                                     rows, params, plan, decode_ws,
                                     workspace_bytes - rows_bytes, stream);
}

}  // namespace kvpage::cuda
