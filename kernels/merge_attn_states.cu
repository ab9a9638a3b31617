// merge_attn_states: combines split-KV partial (o, lse) states
// (include/kvpage/cuda/paged_decode.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_status.h"
#include "kvpage/cuda/paged_decode.h"

namespace kvpage::cuda {
namespace {

constexpr int kThreads = 128;

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromFloat(float x) {
  return __float2half_rn(x);
}

// grid.x = sequence * num_heads + head. Every thread finds the row's maximum lse (the splits
// are few and the loads hit L1), then owns head_dim elements i, i + kThreads, ...
template <typename T>
__global__ void __launch_bounds__(kThreads)
    MergeKernel(T* out, float* lse_out, const float* partial_o, const float* partial_lse,
                int32_t num_splits, int32_t head_dim) {
  const int64_t row = blockIdx.x;
  const float* lse = partial_lse + row * num_splits;
  float max_lse = -INFINITY;
  for (int32_t s = 0; s < num_splits; ++s) max_lse = fmaxf(max_lse, lse[s]);
  float total = 0.0f;
  if (max_lse != -INFINITY) {
    for (int32_t s = 0; s < num_splits; ++s) total += __expf(lse[s] - max_lse);
  }
  const float inv_total = total > 0.0f ? 1.0f / total : 0.0f;
  for (int32_t i = threadIdx.x; i < head_dim; i += kThreads) {
    float acc = 0.0f;
    if (max_lse != -INFINITY) {
      for (int32_t s = 0; s < num_splits; ++s) {
        const float w = __expf(lse[s] - max_lse);  // 0 for an empty split
        if (w > 0.0f) acc += w * partial_o[(row * num_splits + s) * head_dim + i];
      }
    }
    out[row * head_dim + i] = FromFloat<T>(acc * inv_total);
  }
  if (lse_out != nullptr && threadIdx.x == 0) {
    lse_out[row] = max_lse == -INFINITY ? -INFINITY : max_lse + logf(total);
  }
}

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
    MergeKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
        static_cast<__nv_bfloat16*>(out), lse_out, partial_o, partial_lse, num_splits, head_dim);
  } else {
    MergeKernel<__half><<<grid, kThreads, 0, stream>>>(static_cast<__half*>(out), lse_out,
                                                       partial_o, partial_lse, num_splits,
                                                       head_dim);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return internal::CudaStatus(err, "MergeKernel");
  return absl::OkStatus();
}

}  // namespace kvpage::cuda
