// paged_decode launcher (include/kvpage/cuda/paged_decode.h); the kernel and its design
// notes are in paged_decode_kernel.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_status.h"
#include "kernels/paged_decode_kernel.cuh"
#include "kernels/paged_decode_launch.h"
#include "kernels/paged_decode_mma_kernel.cuh"
#include "kvpage/cuda/paged_decode.h"

namespace kvpage::cuda {
namespace {

using internal::DecodeArgs;
using internal::kDecodeThreads;
using internal::DecodeLaunch;
using internal::MakeDecodeLaunch;
using internal::DecodeKernelFn;
using internal::Fp8E4m3;

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool CudaCoreHeadDim(int32_t d) {
  return d == 64 || d == 80 || d == 96 || d == 128 || d == 192 || d == 256;
}
bool TensorCoreHeadDim(int32_t d) { return d == 64 || d == 128 || d == 256; }

template <typename T>
DecodeKernelFn MmaKernelFor(int32_t head_dim) {
  switch (head_dim) {
    case 64:
      return internal::PagedDecodeMmaKernel<T, 64>;
    case 128:
      return internal::PagedDecodeMmaKernel<T, 128>;
    default:
      return internal::PagedDecodeMmaKernel<T, 256>;
  }
}

// The kernel PagedDecode launches. REQUIRES: a combination CheckKernelChoice accepts.
DecodeKernelFn KernelFor(DType cache_dtype, DType q_dtype, int32_t head_dim, int32_t group_tile,
                         bool tensor_cores) {
  const bool bf16 = q_dtype == DType::kBF16;
  if (tensor_cores) {
    return bf16 ? MmaKernelFor<__nv_bfloat16>(head_dim) : MmaKernelFor<__half>(head_dim);
  }
  if (cache_dtype == DType::kFP8) {
    return bf16 ? internal::CudaCoreDecodeKernel<__nv_bfloat16, Fp8E4m3>(head_dim, group_tile)
                : internal::CudaCoreDecodeKernel<__half, Fp8E4m3>(head_dim, group_tile);
  }
  return bf16 ? internal::CudaCoreDecodeKernel<__nv_bfloat16, __nv_bfloat16>(head_dim, group_tile)
              : internal::CudaCoreDecodeKernel<__half, __half>(head_dim, group_tile);
}

// Which kernels exist: the CUDA-core one for f16/bf16/fp8 caches and head_dim 64, 80, 96,
// 128, 192, 256; the tensor-core one for f16/bf16 caches and head_dim 64, 128, 256.
absl::Status CheckKernelChoice(DType cache_dtype, int32_t head_dim, bool tensor_cores,
                               const char* what) {
  if (cache_dtype != DType::kBF16 && cache_dtype != DType::kF16 &&
      cache_dtype != DType::kFP8) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": dtype ", DTypeName(cache_dtype),
                                                   " is not f16, bf16 or fp8"));
  }
  if (!tensor_cores && !CudaCoreHeadDim(head_dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": head_dim ", head_dim, " is not 64, 80, 96, 128, 192 or 256"));
  }
  if (tensor_cores && !TensorCoreHeadDim(head_dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the tensor-core kernel needs head_dim 64, 128 or 256, not ", head_dim));
  }
  if (tensor_cores && cache_dtype == DType::kFP8) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the tensor-core kernel reads no fp8 cache"));
  }
  return absl::OkStatus();
}

// CheckKernelChoice for the kernel `plan` asks for; a plan may not force both paths.
absl::Status CheckPlanKernel(DType cache_dtype, int32_t head_dim, const DecodePlan& plan,
                             const char* what) {
  if (plan.use_tensor_cores && plan.force_cuda_cores) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": plan sets both use_tensor_cores and force_cuda_cores"));
  }
  return CheckKernelChoice(cache_dtype, head_dim, plan.use_tensor_cores, what);
}

}  // namespace

int32_t DecodeGroupTile(int32_t group_size) { return internal::GroupTile(group_size); }

int32_t DecodeHeadTiles(int32_t group_size) { return internal::HeadTiles(group_size); }

int64_t DecodeWorkspaceBytes(const DecodePlan& plan, int32_t num_seqs, int32_t num_q_heads,
                             int32_t head_dim) {
  if (plan.num_splits <= 1) return 0;
  return static_cast<int64_t>(num_seqs) * num_q_heads * plan.num_splits * (head_dim + 1) *
         static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<int32_t> DecodeCtasPerSm(DType dtype, int32_t head_dim, int32_t group_size,
                                        bool tensor_cores) {
  absl::Status status = CheckKernelChoice(dtype, head_dim, tensor_cores, "DecodeCtasPerSm");
  if (!status.ok()) return status;
  if (group_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecodeCtasPerSm: group_size ", group_size, " must be positive"));
  }
  const int32_t tile = internal::GroupTile(group_size);
  // An fp8 cache's kernels differ by q dtype only in conversions; the bf16 one stands for both.
  const DType q_dtype = dtype == DType::kFP8 ? DType::kBF16 : dtype;
  const DecodeKernelFn kernel = KernelFor(dtype, q_dtype, head_dim, tile, tensor_cores);
  const int threads =
      tensor_cores ? internal::MmaDecodeThreads(head_dim) : internal::kDecodeThreads;
  int ctas = 0;
  const cudaError_t err =
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, threads, 0);
  if (err != cudaSuccess) return internal::CudaStatus(err, "DecodeCtasPerSm");
  return ctas;
}

absl::Status PlanDecodeForDevice(DecodePlanInputs in, DType dtype, int32_t head_dim,
                                 int32_t group_size, DecodePlan* plan) {
  // Sized for the kernel PagedDecode will run with the plan.
  const bool tensor_cores =
      in.tensor_cores ||
      (!in.force_cuda_cores &&
       internal::AutoDecodeTensorCores(dtype, head_dim, group_size, in.block_size,
                                       internal::CurrentDeviceCcMajor()));
  absl::StatusOr<int32_t> ctas = DecodeCtasPerSm(dtype, head_dim, group_size, tensor_cores);
  if (!ctas.ok()) return ctas.status();
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  if (err != cudaSuccess) return internal::CudaStatus(err, "PlanDecodeForDevice");
  in.num_sms = sms;
  in.ctas_per_sm = *ctas;
  const absl::Status status = PlanDecode(in, plan);
  plan->force_cuda_cores = in.force_cuda_cores;
  return status;
}

absl::Status internal::ValidatePagedDecode(const char* what, const void* out, const void* q,
                                          int64_t q_seq_stride, const KvCacheView& cache,
                                          const BlockTableView& table,
                                          const DecodeParams& params, const DecodePlan& plan,
                                          const void* workspace, int64_t workspace_bytes) {
  if (absl::Status s = ValidateKvCacheView(cache); !s.ok()) return s;
  const int32_t d = cache.head_dim;
  if (absl::Status s = CheckPlanKernel(cache.dtype, d, plan, what); !s.ok()) {
    return s;
  }
  if (cache.kv_stride == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": MLA views (kv_stride 0) are not supported"));
  }
  if (absl::Status s = ValidateDecodeParams(cache, params, what); !s.ok()) return s;
  if (plan.use_tensor_cores && cache.block_size % internal::kMmaStepTokens != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the tensor-core kernel needs a "
                                                   "block_size multiple of 16, not ",
                                                   cache.block_size));
  }
  const int32_t hq = params.num_q_heads;
  if (out == nullptr || q == nullptr || table.table == nullptr || table.seq_lens == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null out, q, table or seq_lens"));
  }
  if (!Aligned16(out) || !Aligned16(q) || q_seq_stride % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": out/q must be 16-byte aligned and q_seq_stride (", q_seq_stride,
        ") a multiple of 8"));
  }
  if (table.num_seqs < 0 || table.num_seqs > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": num_seqs ", table.num_seqs, " is outside [0, 65535]"));
  }
  if (plan.num_splits < 1 || plan.num_splits > 65535 ||
      (plan.num_splits > 1 && plan.chunk_tokens <= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": plan num_splits ",
                                                   plan.num_splits, " chunk_tokens ",
                                                   plan.chunk_tokens));
  }
  const int64_t needed = DecodeWorkspaceBytes(plan, table.num_seqs, hq, d);
  if (needed > 0 && (workspace == nullptr || !Aligned16(workspace) || workspace_bytes < needed)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": workspace of ", workspace_bytes,
                                                   " bytes (16-byte aligned) needed ", needed));
  }
  return absl::OkStatus();
}

absl::Status internal::LaunchPagedDecode(const char* what, void* out, const void* q,
                                        int64_t q_seq_stride, const KvCacheView& cache,
                                        const BlockTableView& table, const int32_t* table_rows,
                                        const DecodeParams& params, const DecodePlan& plan,
                                        void* workspace, int64_t workspace_bytes,
                                        cudaStream_t stream) {
  absl::Status status = ValidatePagedDecode(what, out, q, q_seq_stride, cache, table, params,
                                            plan, workspace, workspace_bytes);
  if (!status.ok()) return status;
  if (table.num_seqs == 0) return absl::OkStatus();
  const int32_t d = cache.head_dim;
  const int32_t hq = params.num_q_heads;
  DecodeLaunch launch = MakeDecodeLaunch(out, q, q_seq_stride, cache, table, params, plan,
                                         workspace);
  launch.args.table_rows = table_rows;
  const DecodeArgs& a = launch.args;
  const int32_t group_tile = launch.group_tile;
  const dim3 grid(launch.grid[0], launch.grid[1], launch.grid[2]);
  const bool mma = launch.tensor_cores;
  const DType q_dtype = DecodeQueryDType(cache, params);
  const DecodeKernelFn kernel = KernelFor(cache.dtype, q_dtype, d, group_tile, mma);
  kernel<<<grid, launch.threads, 0, stream>>>(a);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return internal::CudaStatus(err, "PagedDecodeKernel");
  if (plan.num_splits == 1) return absl::OkStatus();
  return MergeAttnStates(out, nullptr, a.ws_o, a.ws_lse, table.num_seqs, hq, plan.num_splits, d,
                         q_dtype, stream);
}

absl::Status PagedDecode(void* out, const void* q, int64_t q_seq_stride, const KvCacheView& cache,
                         const BlockTableView& table, const DecodeParams& params,
                         const DecodePlan& plan, void* workspace, int64_t workspace_bytes,
                         cudaStream_t stream) {
  absl::Status status = internal::ValidatePagedDecode(
      "PagedDecode", out, q, q_seq_stride, cache, table, params, plan, workspace,
      workspace_bytes);
  if (!status.ok()) return status;
  // The path chosen now is forced for the launch, which checks its arguments again.
  DecodePlan chosen = plan;
  chosen.use_tensor_cores =
      internal::UseDecodeTensorCores(cache, params, plan, internal::CurrentDeviceCcMajor());
  chosen.force_cuda_cores = !chosen.use_tensor_cores;
  return internal::LaunchPagedDecode("PagedDecode", out, q, q_seq_stride, cache, table,
                                     /*table_rows=*/nullptr, params, chosen, workspace,
                                     workspace_bytes, stream);
}

}  // namespace kvpage::cuda
