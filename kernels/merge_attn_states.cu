// merge_attn_states: combines split-KV partial (o, lse) states
// (include/kvpage/cuda/paged_decode.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_status.h"
#include "kernels/merge_attn_states_kernel.cuh"
#include "kvpage/cuda/paged_decode.h"

namespace kvpage::cuda {
namespace {

using internal::kMergeThreads;
using internal::MergeKernel;

}  // namespace

absl::Status MergeAttnStates(void* out, float* lse_out, const float* partial_o,
                             const float* partial_lse, int32_t num_seqs, int32_t num_heads,
                             int32_t num_splits, int32_t head_dim, DType dtype,
                             cudaStream_t stream) {
  if (num_seqs < 0 || num_heads <= 0 || num_splits <= 0 || head_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MergeAttnStates: bad sizes (num_seqs ", num_seqs, ", num_heads ",
                     num_heads, ", num_splits ", num_splits, ", head_dim ", head_dim, ")"));
  }
  if (dtype != DType::kBF16 && dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("MergeAttnStates: dtype ", DTypeName(dtype), " is not f16 or bf16"));
  }
  if (out == nullptr || partial_o == nullptr || partial_lse == nullptr) {
    return absl::InvalidArgumentError("MergeAttnStates: null out or partial state");
  }
  const int64_t rows = static_cast<int64_t>(num_seqs) * num_heads;
  if (rows == 0) return absl::OkStatus();
  if (rows > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("MergeAttnStates: ", rows, " rows"));
  }
  const dim3 grid(static_cast<uint32_t>(rows));
  if (dtype == DType::kBF16) {
    MergeKernel<__nv_bfloat16><<<grid, kMergeThreads, 0, stream>>>(
        static_cast<__nv_bfloat16*>(out), lse_out, partial_o, partial_lse, num_splits, head_dim);
  } else {
    MergeKernel<__half><<<grid, kMergeThreads, 0, stream>>>(static_cast<__half*>(out), lse_out,
                                                       partial_o, partial_lse, num_splits,
                                                       head_dim);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return internal::CudaStatus(err, "MergeKernel");
  return absl::OkStatus();
}

}  // namespace kvpage::cuda
