// write_kv: the step's K/V rows -> paged cache slots (include/kvpage/cuda/write_kv.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_status.h"
#include "kernels/write_kv_kernel.cuh"
#include "kvpage/cuda/write_kv.h"

namespace kvpage::cuda {
namespace {

using internal::kWriteKvThreads;
using internal::MakeWriteKvArgs;
using internal::WriteKvArgs;
using internal::WriteKvFp8Args;
using internal::WriteKvFp8Kernel;
using internal::WriteKvKernel;
using internal::MakeWriteKvFp8Args;

// Checks shared by WriteKv and WriteKvFp8 (the view itself is validated by the caller).
absl::Status CheckInputs(const void* k, const void* v, int64_t k_token_stride,
                         int64_t v_token_stride, const int64_t* slot_mapping, int32_t num_tokens,
                         const KvCacheView& cache, const char* what) {
  absl::Status status = ValidateWriteKvArgs(k, v, slot_mapping, num_tokens, cache, what);
  if (!status.ok()) return status;
  if (reinterpret_cast<uintptr_t>(k) % 16 != 0 || reinterpret_cast<uintptr_t>(v) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": k or v is not 16-byte aligned"));
  }
  if (k_token_stride % 8 != 0 || v_token_stride % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": token strides ", k_token_stride,
                                                   " / ", v_token_stride,
                                                   " are not multiples of 8 elements"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteKv(const void* k, const void* v, int64_t k_token_stride,
                     int64_t v_token_stride, const int64_t* slot_mapping, int32_t num_tokens,
                     const KvCacheView& cache, cudaStream_t stream) {
  absl::Status status = ValidateKvCacheView(cache);
  if (!status.ok()) return status;
  if (cache.dtype == DType::kFP8) {
    return absl::InvalidArgumentError("WriteKv: the cache is fp8; use WriteKvFp8");
  }
  const absl::Status inputs = CheckInputs(k, v, k_token_stride, v_token_stride, slot_mapping,
                                          num_tokens, cache, "WriteKv");
  if (!inputs.ok()) return inputs;
  if (num_tokens == 0) return absl::OkStatus();
  const WriteKvArgs a =
      MakeWriteKvArgs(k, v, k_token_stride, v_token_stride, slot_mapping, cache);
  WriteKvKernel<<<num_tokens, kWriteKvThreads, 0, stream>>>(a);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return internal::CudaStatus(err, "WriteKvKernel");
  return absl::OkStatus();
}

absl::Status WriteKvFp8(const void* k, const void* v, int64_t k_token_stride,
                        int64_t v_token_stride, const int64_t* slot_mapping, int32_t num_tokens,
                        DType input_dtype, float k_scale, float v_scale,
                        const KvCacheView& cache, cudaStream_t stream) {
  absl::Status status = ValidateWriteKvFp8(cache, input_dtype, k_scale, v_scale);
  if (!status.ok()) return status;
  const absl::Status inputs = CheckInputs(k, v, k_token_stride, v_token_stride, slot_mapping,
                                          num_tokens, cache, "WriteKvFp8");
  if (!inputs.ok()) return inputs;
  if (num_tokens == 0) return absl::OkStatus();
  const WriteKvFp8Args a = MakeWriteKvFp8Args(k, v, k_token_stride, v_token_stride,
                                              slot_mapping, k_scale, v_scale, cache);
  if (input_dtype == DType::kBF16) {
    WriteKvFp8Kernel<__nv_bfloat16><<<num_tokens, kWriteKvThreads, 0, stream>>>(a);
  } else {
    WriteKvFp8Kernel<__half><<<num_tokens, kWriteKvThreads, 0, stream>>>(a);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return internal::CudaStatus(err, "WriteKvFp8Kernel");
  return absl::OkStatus();
}

}  // namespace kvpage::cuda
