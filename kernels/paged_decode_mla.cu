// PagedDecodeMla launcher (include/kvpage/cuda/paged_decode.h); the kernel and its design
// notes are in paged_decode_mla_kernel.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_status.h"
#include "kernels/paged_decode_mla_kernel.cuh"
#include "kvpage/cuda/paged_decode.h"

namespace kvpage::cuda {
namespace {

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

absl::Status CheckMlaArgs(void* out, const void* q, int64_t q_seq_stride,
                          const KvCacheView& cache, const BlockTableView& table,
                          const DecodeParams& params, const DecodePlan& plan, void* workspace,
                          int64_t workspace_bytes) {
  if (absl::Status s = ValidateKvCacheView(cache); !s.ok()) return s;
  if (cache.kv_stride != 0 || cache.head_dim != internal::kMlaRowDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedDecodeMla: needs an MLA view (kv_stride 0) of row ", internal::kMlaRowDim,
        ", not kv_stride ", cache.kv_stride, " head_dim ", cache.head_dim));
  }
  if (cache.dtype != DType::kBF16 && cache.dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedDecodeMla: dtype ", DTypeName(cache.dtype), " is not f16 or bf16"));
  }
  if (absl::Status s = ValidateDecodeParams(cache, params, "PagedDecodeMla"); !s.ok()) return s;
  if (plan.use_tensor_cores) {
    return absl::InvalidArgumentError("PagedDecodeMla: there is no tensor-core MLA kernel");
  }
  if (out == nullptr || q == nullptr || table.table == nullptr || table.seq_lens == nullptr) {
    return absl::InvalidArgumentError("PagedDecodeMla: null out, q, table or seq_lens");
  }
  if (!Aligned16(out) || !Aligned16(q) || q_seq_stride % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedDecodeMla: out/q must be 16-byte aligned and q_seq_stride (", q_seq_stride,
        ") a multiple of 8"));
  }
  if (table.num_seqs < 0 || table.num_seqs > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedDecodeMla: num_seqs ", table.num_seqs, " is outside [0, 65535]"));
  }
  if (plan.num_splits < 1 || plan.num_splits > 65535 ||
      (plan.num_splits > 1 && plan.chunk_tokens <= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedDecodeMla: plan num_splits ", plan.num_splits, " chunk_tokens ",
        plan.chunk_tokens));
  }
  const int64_t needed = DecodeWorkspaceBytes(plan, table.num_seqs, params.num_q_heads,
                                              internal::kMlaLatentDim);
  if (needed > 0 && (workspace == nullptr || !Aligned16(workspace) || workspace_bytes < needed)) {
    return absl::InvalidArgumentError(absl::StrCat("PagedDecodeMla: workspace of ",
                                                   workspace_bytes,
                                                   " bytes (16-byte aligned) needed ", needed));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PagedDecodeMla(void* out, const void* q, int64_t q_seq_stride,
                            const KvCacheView& cache, const BlockTableView& table,
                            const DecodeParams& params, const DecodePlan& plan, void* workspace,
                            int64_t workspace_bytes, cudaStream_t stream) {
  if (absl::Status s = CheckMlaArgs(out, q, q_seq_stride, cache, table, params, plan,
                                    workspace, workspace_bytes);
      !s.ok()) {
    return s;
  }
  if (table.num_seqs == 0) return absl::OkStatus();
  const internal::DecodeLaunch l = internal::MakeMlaDecodeLaunch(
      out, q, q_seq_stride, cache, table, params, plan, workspace);
  const dim3 grid(l.grid[0], l.grid[1], l.grid[2]);
  if (cache.dtype == DType::kBF16) {
    internal::PagedDecodeMlaKernel<__nv_bfloat16><<<grid, l.threads, 0, stream>>>(l.args);
  } else {
    internal::PagedDecodeMlaKernel<__half><<<grid, l.threads, 0, stream>>>(l.args);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return internal::CudaStatus(err, "PagedDecodeMlaKernel");
  if (plan.num_splits == 1) return absl::OkStatus();
  return MergeAttnStates(out, nullptr, l.args.ws_o, l.args.ws_lse, table.num_seqs,
                         params.num_q_heads, plan.num_splits, internal::kMlaLatentDim,
                         cache.dtype, stream);
}

}  // namespace kvpage::cuda
