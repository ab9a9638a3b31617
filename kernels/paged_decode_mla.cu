// PagedDecodeMla launcher (include/kvpage/cuda/paged_decode.h); the kernels and their design
// notes are in paged_decode_mla_kernel.cuh (CUDA cores, the reference) and
// paged_decode_mla_mma_kernel.cuh (tensor cores).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_status.h"
#include "kernels/paged_decode_launch.h"
#include "kernels/paged_decode_mla_kernel.cuh"
#include "kernels/paged_decode_mla_mma_kernel.cuh"
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

// The tensor-core kernel for kRowGroups groups of 16 heads, with its dynamic shared memory
// (more than the 48 KiB a launch gets without asking).
template <typename T, int kRowGroups>
cudaError_t LaunchMlaMma(const internal::DecodeLaunch& l, cudaStream_t stream) {
  using C = internal::MlaMmaConfig<kRowGroups>;
  const auto kernel = internal::PagedDecodeMlaMmaKernel<T, kRowGroups>;
  const cudaError_t err = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSharedBytes);
  if (err != cudaSuccess) return err;
  kernel<<<dim3(l.grid[0], l.grid[1], l.grid[2]), C::kThreads, C::kSharedBytes, stream>>>(
      l.args);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchMla(const internal::DecodeLaunch& l, cudaStream_t stream) {
  if (!l.tensor_cores) {
    internal::PagedDecodeMlaKernel<T>
        <<<dim3(l.grid[0], l.grid[1], l.grid[2]), l.threads, 0, stream>>>(l.args);
    return cudaGetLastError();
  }
  if (l.group_tile == 16) return LaunchMlaMma<T, 1>(l, stream);
  if (l.group_tile == 32) return LaunchMlaMma<T, 2>(l, stream);
  return LaunchMlaMma<T, 4>(l, stream);
}

// The kernel and dynamic shared memory the launch takes for `tile` heads a CTA.
template <typename T>
void MlaKernelFor(bool tensor_cores, int32_t tile, const void** kernel, int* threads,
                  int* shared_bytes) {
  using internal::MlaMmaConfig;
  *kernel = reinterpret_cast<const void*>(internal::PagedDecodeMlaKernel<T>);
  *threads = internal::kDecodeThreads;
  *shared_bytes = 0;
  if (!tensor_cores) return;
  *threads = 4 * tile;
  if (tile == 16) {
    *kernel = reinterpret_cast<const void*>(internal::PagedDecodeMlaMmaKernel<T, 1>);
    *shared_bytes = MlaMmaConfig<1>::kSharedBytes;
  } else if (tile == 32) {
    *kernel = reinterpret_cast<const void*>(internal::PagedDecodeMlaMmaKernel<T, 2>);
    *shared_bytes = MlaMmaConfig<2>::kSharedBytes;
  } else {
    *kernel = reinterpret_cast<const void*>(internal::PagedDecodeMlaMmaKernel<T, 4>);
    *shared_bytes = MlaMmaConfig<4>::kSharedBytes;
  }
}

}  // namespace

absl::StatusOr<int32_t> MlaDecodeCtasPerSm(DType dtype, int32_t num_q_heads, bool tensor_cores) {
  if ((dtype != DType::kBF16 && dtype != DType::kF16) || num_q_heads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("MlaDecodeCtasPerSm: dtype ",
                                                   DTypeName(dtype), " num_q_heads ",
                                                   num_q_heads, " (f16/bf16, >= 1 head)"));
  }
  const void* kernel = nullptr;
  int threads = 0, shared_bytes = 0;
  const int32_t tile = MlaDecodeHeadTile(num_q_heads, tensor_cores);
  if (dtype == DType::kBF16) {
    MlaKernelFor<__nv_bfloat16>(tensor_cores, tile, &kernel, &threads, &shared_bytes);
  } else {
    MlaKernelFor<__half>(tensor_cores, tile, &kernel, &threads, &shared_bytes);
  }
  cudaError_t err = cudaSuccess;
  if (shared_bytes > 0) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               shared_bytes);
  }
  int ctas = 0;
  if (err == cudaSuccess) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, threads, shared_bytes);
  }
  if (err != cudaSuccess) return internal::CudaStatus(err, "MlaDecodeCtasPerSm");
  return ctas;
}

absl::Status PagedDecodeMla(void* out, const void* q, int64_t q_seq_stride,
                            const KvCacheView& cache, const BlockTableView& table,
                            const DecodeParams& params, const DecodePlan& plan, void* workspace,
                            int64_t workspace_bytes, cudaStream_t stream) {
  if (plan.use_tensor_cores && plan.force_cuda_cores) {
    return absl::InvalidArgumentError(
        "PagedDecodeMla: plan sets both use_tensor_cores and force_cuda_cores");
  }
  if (absl::Status s = CheckMlaArgs(out, q, q_seq_stride, cache, table, params, plan,
                                    workspace, workspace_bytes);
      !s.ok()) {
    return s;
  }
  if (table.num_seqs == 0) return absl::OkStatus();
  const bool mma =
      internal::UseMlaTensorCores(params, plan, internal::CurrentDeviceCcMajor());
  const auto make_launch =
      mma ? internal::MakeMlaMmaDecodeLaunch : internal::MakeMlaDecodeLaunch;
  const internal::DecodeLaunch l =
      make_launch(out, q, q_seq_stride, cache, table, params, plan, workspace);
  const cudaError_t err = cache.dtype == DType::kBF16 ? LaunchMla<__nv_bfloat16>(l, stream)
                                                      : LaunchMla<__half>(l, stream);
  if (err != cudaSuccess) {
    return internal::CudaStatus(err, mma ? "PagedDecodeMlaMmaKernel" : "PagedDecodeMlaKernel");
  }
  if (plan.num_splits == 1) return absl::OkStatus();
  return MergeAttnStates(out, nullptr, l.args.ws_o, l.args.ws_lse, table.num_seqs,
                         params.num_q_heads, plan.num_splits, internal::kMlaLatentDim,
                         cache.dtype, stream);
}

}  // namespace kvpage::cuda
