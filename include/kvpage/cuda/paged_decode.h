// Paged decode attention and the split-KV merge. Built only with KVPAGE_BUILD_CUDA.
// Layouts: kvpage/kernel_layout.h; CPU oracle: kvpage/kernel_reference.h.
#ifndef KVPAGE_CUDA_PAGED_DECODE_H_
#define KVPAGE_CUDA_PAGED_DECODE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvpage/kernel_layout.h"

namespace kvpage::cuda {

// Query heads one CTA holds: the GQA group rounded up to 1, 2, 4 or 8. Groups above 8 use
// several CTAs per KV head (head_tiles > 1), each reading the KV head once.
int32_t DecodeGroupTile(int32_t group_size);
int32_t DecodeHeadTiles(int32_t group_size);

// Bytes of float workspace `plan` needs: num_seqs * num_q_heads * num_splits * (head_dim + 1)
// floats (partial outputs, then partial log-sum-exps); 0 when num_splits == 1.
int64_t DecodeWorkspaceBytes(const DecodePlan& plan, int32_t num_seqs, int32_t num_q_heads,
                             int32_t head_dim);

// Resident CTAs per SM of the decode kernel PagedDecode launches for this dtype, head_dim, GQA
// group and kernel (tensor cores or not) on the current device
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor on that instantiation: its registers and
// shared memory). For fp8 the bf16-query kernel stands for both query dtypes.
// InvalidArgument for an unsupported dtype/head_dim/group; the CUDA error (Unavailable
// without a device) otherwise.
absl::StatusOr<int32_t> DecodeCtasPerSm(DType dtype, int32_t head_dim, int32_t group_size,
                                        bool tensor_cores = false);

// PlanDecode for the current device: `in` with num_sms and ctas_per_sm filled from the device
// and DecodeCtasPerSm for the kernel PagedDecode will run with the plan (in.tensor_cores,
// in.force_cuda_cores, or else the automatic choice below), so the split grid fills whole
// waves of the kernel's real occupancy; in.force_cuda_cores is copied to the plan.
// Errors as DecodeCtasPerSm and PlanDecode. Host only; call it outside graph capture.
absl::Status PlanDecodeForDevice(DecodePlanInputs in, DType dtype, int32_t head_dim,
                                 int32_t group_size, DecodePlan* plan);

// One query token per sequence against the paged cache.
//
//   out: [num_seqs][num_q_heads][head_dim], DecodeQueryDType(cache, params), contiguous.
//   q:   [num_seqs][num_q_heads][head_dim], the same dtype, sequence stride q_seq_stride
//        elements.
//   cache: f16 or bf16 (q and out in the same dtype), or fp8 e4m3 as WriteKvFp8 writes it,
//        read with params.k_scale / v_scale, q and out in params.fp8_query_dtype (f16/bf16).
//        head_dim 64, 80, 96, 128, 192 or 256 on the CUDA-core kernel; the tensor-core
//        kernel takes f16/bf16 caches with head_dim 64, 128 or 256 only.
//   table: block ids and seq_lens on the device; seq_len 0 gives a zero output.
//   workspace: device memory of DecodeWorkspaceBytes(plan, ...) bytes, 16-byte aligned;
//      may be null when plan.num_splits == 1.
//
// Grid (kv_head x head tile, sequence, split): the CTA holds every query head of its KV head,
// so each K/V row is read once; scores and the running softmax state are fp32. Two kernels:
// tensor cores (mma.sync m16n8k16, P rounded to the cache dtype, cp.async double buffering;
// block_size a multiple of 16) with plan.use_tensor_cores, CUDA cores (the reference) with
// plan.force_cuda_cores; with neither, tensor cores for a GQA group >= 2 on compute
// capability >= 8.0 where that kernel exists (f16/bf16, head_dim 64/128/256, block_size a
// multiple of 16), CUDA cores otherwise. Only blocks
// of AttendedRange(seq_len, window_left) are looked up, so entries before a sliding window
// may be the null block or -1. With plan.num_splits > 1 each split writes a partial (o, lse)
// to the workspace and MergeAttnStates combines them in a second launch on the same stream
// (programmatic dependent launch on compute capability >= 9.0, as MergeAttnStates says).
//
// Any plan is exact for any seq_lens: the last split runs to the end of its sequence, so a
// graph captured with a plan for a shorter maximum stays correct when replayed (it is only
// less balanced; PlanDecodeForDevice with the batch's maximum keeps it balanced).
// REQUIRES: every table entry in an attended range is a valid block id. Asynchronous, never
// synchronizes, graph-capturable.
// Returns InvalidArgument naming the value for an unsupported head_dim or dtype (or one the
// tensor-core kernel lacks), params ValidateDecodeParams rejects, num_q_heads not a multiple
// of num_kv_heads, null or misaligned pointers, a workspace that is too small,
// or a batch/split count past the grid limit (65535); a CUDA launch error otherwise.
absl::Status PagedDecode(void* out, const void* q, int64_t q_seq_stride, const KvCacheView& cache,
                         const BlockTableView& table, const DecodeParams& params,
                         const DecodePlan& plan, void* workspace, int64_t workspace_bytes,
                         cudaStream_t stream);

// Absorbed MLA decode, the DeepSeek shape: one 576-value latent row per token (512 latent +
// 64 rope) that every query head attends to; ref::PagedDecodeMla with latent_dim 512.
//   cache: an MLA view (MlaKvCache, row 576), f16 or bf16, any block_size.
//   q:   [num_seqs][num_q_heads][576] (q_nope with W_UK absorbed, then q_pe), cache.dtype,
//        sequence stride q_seq_stride elements.
//   out: [num_seqs][num_q_heads][512], cache.dtype, contiguous (the latent output; W_UV is
//        the caller's).
//   workspace: DecodeWorkspaceBytes(plan, num_seqs, num_q_heads, 512) bytes.
// Two kernels, grid (head tiles, sequence, split), MlaDecodeHeadTile heads a CTA:
// - tensor cores (FlashMLA-style): up to 64 query heads a CTA as the rows of mma.sync tiles
//   (QK^T over the 576-value row, PV over its 512 latent values, fp32 accumulation, P rounded
//   to the cache dtype), K tiles gathered with cp.async, so each row is read from memory once
//   per CTA: once per token up to 64 heads, twice at 128. Taken with plan.use_tensor_cores,
//   or when the plan forces neither path, on compute capability >= 8.0 and with more than 4
//   query heads;
// - CUDA cores (4 query heads a CTA, each row read once per 4 heads): the reference, taken
//   with plan.force_cuda_cores and otherwise.
// Plans, splits, windows and graph capture as PagedDecode (DecodePlanInputs::head_tiles =
// MlaDecodeHeadTiles). InvalidArgument naming the value for a view that is not MLA of row
// 576, an fp8 cache, a plan that forces both paths, and the PagedDecode argument errors.
absl::Status PagedDecodeMla(void* out, const void* q, int64_t q_seq_stride,
                            const KvCacheView& cache, const BlockTableView& table,
                            const DecodeParams& params, const DecodePlan& plan, void* workspace,
                            int64_t workspace_bytes, cudaStream_t stream);

// Resident CTAs per SM of the MLA kernel PagedDecodeMla launches for this dtype (f16/bf16)
// and head count on the current device, with tensor cores or not
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor with its dynamic shared memory), for
// DecodePlanInputs::ctas_per_sm. InvalidArgument for another dtype or num_q_heads < 1; the
// CUDA error (Unavailable without a device) otherwise.
absl::StatusOr<int32_t> MlaDecodeCtasPerSm(DType dtype, int32_t num_q_heads, bool tensor_cores);

// Merges split-KV partial states (the (o, lse) merge of FlashInfer's cascade note).
//   partial_o: [num_seqs][num_heads][num_splits][head_dim] float, each split normalised.
//   partial_lse: [num_seqs][num_heads][num_splits] float, natural log; -inf = empty split.
//   out: [num_seqs][num_heads][head_dim] in `dtype` (f16/bf16), contiguous.
//   lse_out: [num_seqs][num_heads] float, nullable.
// All-empty rows give 0 and -inf. Asynchronous, graph-capturable. On a device of compute
// capability >= 9.0 (asked once per device) the merge is launched with programmatic stream
// serialization: it may be scheduled before the previous kernel on the stream has finished,
// and waits (griddepcontrol.wait) for that kernel's completion and memory before it reads or
// writes anything, so stream order holds as for a plain launch.
// Returns InvalidArgument naming the value for a bad size, dtype or null pointer.
absl::Status MergeAttnStates(void* out, float* lse_out, const float* partial_o,
                             const float* partial_lse, int32_t num_seqs, int32_t num_heads,
                             int32_t num_splits, int32_t head_dim, DType dtype,
                             cudaStream_t stream);

}  // namespace kvpage::cuda

#endif  // KVPAGE_CUDA_PAGED_DECODE_H_
