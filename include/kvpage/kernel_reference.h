// CPU reference implementations of the kvpage CUDA kernels (write_kv, paged_decode,
// merge_attn_states, copy_slots / copy_blocks, zero_slots).
//
// Plain C++ with double accumulation and no CUDA dependency: they build and run in every
// configuration (including -DKVPAGE_BUILD_CUDA=OFF) and are the oracle the GPU tests compare
// against. They read and write host memory through the same views the kernels take
// (kernel_layout.h); a view's `base` must point to host memory here.
//
// 16-bit values are carried as their bit patterns (uint16_t) so nothing here depends on
// cuda_fp16.h / cuda_bf16.h. Not thread-safe across calls that write the same buffers.
#ifndef KVPAGE_KERNEL_REFERENCE_H_
#define KVPAGE_KERNEL_REFERENCE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kvpage/kernel_layout.h"

namespace kvpage::ref {

// IEEE binary16 and bfloat16 conversions, round-to-nearest-even; NaN stays NaN (quiet),
// overflow goes to infinity.
uint16_t FloatToBf16(float x);
float Bf16ToFloat(uint16_t bits);
uint16_t FloatToF16(float x);
float F16ToFloat(uint16_t bits);

// fp8 e4m3 ("fn": no infinity, NaN = 0x7f / 0xff, largest finite 448), as CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3): round-to-nearest-even, saturating to
// +-448 (infinities too); NaN gives 0x7f.
uint8_t FloatToE4m3(float x);
float E4m3ToFloat(uint8_t bits);

// Value of one 16-bit element of `dtype` (f16 or bf16), and the reverse.
float HalfToFloat(uint16_t bits, DType dtype);
uint16_t FloatToHalf(float x, DType dtype);

// Scatters the step's new K and V rows into the cache.
//   k: [num_tokens][num_kv_heads][head_dim] with token stride k_token_stride (elements),
//      head_dim contiguous, head stride head_dim; same for v.
//   slot_mapping: int64 [num_tokens]; slot = block_id * block_size + offset; < 0 skips.
// v must be null for an MLA view (kv_stride 0: only the latent row is written) and non-null
// otherwise (ValidateWriteKvArgs, the launchers' rule).
// InvalidArgument for an invalid or fp8 view (see WriteKvFp8), a slot past
// num_blocks * block_size (naming the token and slot), a null k, or a v that does not match
// the view.
absl::Status WriteKv(const uint16_t* k, const uint16_t* v, int64_t k_token_stride,
                     int64_t v_token_stride, const int64_t* slot_mapping, int32_t num_tokens,
                     const KvCacheView& cache);

// WriteKv for an fp8 (e4m3) cache with per-tensor scales (vLLM's convention: the stored value
// is x / scale, the dequantised value stored * scale). Inputs are `input_dtype` (f16/bf16)
// bits, laid out as for WriteKv; each value is stored as FloatToE4m3(x * (1.0f / scale)) with
// the reciprocal and the product computed in float, exactly as the kernel does.
// InvalidArgument as WriteKv, and for a cache that is not fp8 or a scale that is not a
// positive finite number.
absl::Status WriteKvFp8(const uint16_t* k, const uint16_t* v, int64_t k_token_stride,
                        int64_t v_token_stride, const int64_t* slot_mapping, int32_t num_tokens,
                        DType input_dtype, float k_scale, float v_scale,
                        const KvCacheView& cache);

// Decode attention, one query token per sequence.
//   q: [num_seqs][num_q_heads][head_dim] (bits of DecodeQueryDType(cache, params): the cache's
//      dtype, or params.fp8_query_dtype for an fp8 cache), sequence stride q_seq_stride.
//   An fp8 cache's values read as E4m3ToFloat(stored) * params.k_scale (K) or v_scale (V),
//   in double.
//   out: [num_seqs][num_q_heads][head_dim] double; lse: [num_seqs][num_q_heads] natural-log
//   sum of exp(score), -inf for an empty range (then out is 0). lse may be null.
// Query head h reads KV head h / (num_q_heads / num_kv_heads). Only tokens of
// AttendedRange(seq_len, window_left) are read; blocks outside it are never dereferenced.
// InvalidArgument for an invalid view, params ValidateDecodeParams rejects (num_q_heads not a
// multiple of num_kv_heads, bad scales or query dtype), or a block id outside
// [0, num_blocks) inside the attended range (naming sequence and position).
absl::Status PagedDecode(const uint16_t* q, int64_t q_seq_stride, const KvCacheView& cache,
                         const BlockTableView& table, const DecodeParams& params, double* out,
                         double* lse);

// Absorbed MLA decode (the DeepSeek form): every query head attends to the one latent row of
// each token, K = the whole row (latent ++ rope), V = its first latent_dim values.
//   cache: an MLA view (MlaKvCache: kv_stride 0, one head of row_dim = latent_dim + rope_dim).
//   q: [num_seqs][num_q_heads][row_dim] (bits of DecodeQueryDType(cache, params)), sequence
//      stride q_seq_stride: q_nope already multiplied into the latent space (W_UK absorbed),
//      then q_pe.
//   out: [num_seqs][num_q_heads][latent_dim] double, softmax(scale * q.row) . row[0,
//      latent_dim); lse as PagedDecode (nullable).
// InvalidArgument as PagedDecode, for a view with a V half, or latent_dim outside
// (0, row_dim].
absl::Status PagedDecodeMla(const uint16_t* q, int64_t q_seq_stride, const KvCacheView& cache,
                            const BlockTableView& table, const DecodeParams& params,
                            int32_t latent_dim, double* out, double* lse);

// Attention for a batch of variable-length query chunks over the paged cache: prefill chunks
// with cached prefixes and decodes in one call (the batches the scheduler emits).
//   q: [total_tokens][num_q_heads][head_dim] (bits of DecodeQueryDType), token stride
//      q_token_stride; sequence b's queries are tokens [query_start_loc[b],
//      query_start_loc[b + 1]), the last q_len of its table.seq_lens[b] positions (their K/V
//      already written).
//   out: [total_tokens][num_q_heads][head_dim] double; lse: [total_tokens][num_q_heads] (may
//   be null).
// The query at position p attends to AttendedRange(p + 1, window_left): causal within the
// chunk, the cached prefix in full (within the window). Each query is computed exactly as
// PagedDecode computes a sequence of length p + 1, so a token's output does not depend on how
// its sequence was chunked. InvalidArgument as PagedDecode, and for decreasing query offsets
// or a chunk longer than its sequence (naming the sequence).
absl::Status PagedPrefill(const uint16_t* q, int64_t q_token_stride,
                          const int32_t* query_start_loc, const KvCacheView& cache,
                          const BlockTableView& table, const DecodeParams& params, double* out,
                          double* lse);

// Merges split-KV partial states.
//   partial_o: [num_seqs][num_heads][num_splits][head_dim] float (each split normalised),
//   partial_lse: [num_seqs][num_heads][num_splits] float natural-log; -inf = empty split.
//   out: [num_seqs][num_heads][head_dim] double; lse_out (nullable) [num_seqs][num_heads].
// An all-empty row gives out 0 and lse -inf.
void MergeAttnStates(const float* partial_o, const float* partial_lse, int32_t num_seqs,
                     int32_t num_heads, int32_t num_splits, int32_t head_dim, double* out,
                     double* lse_out);

// Copies slot src[i] to slot dst[i] in every tensor, for i < num_pairs. Pairs with a negative
// id or src == dst are skipped.
// InvalidArgument for an invalid descriptor, an id >= num_slots, a slot that is both a source
// and a destination, or a duplicate destination (naming the pair) — nothing is copied then.
absl::Status CopySlots(absl::Span<const SlotTensor> tensors, const int32_t* src,
                       const int32_t* dst, int32_t num_pairs);

// Zeroes copy_bytes of slot slots[i] in every tensor; negative ids are skipped.
// InvalidArgument for an invalid descriptor or an id >= num_slots.
absl::Status ZeroSlots(absl::Span<const SlotTensor> tensors, const int32_t* slots,
                       int32_t num_slots);

}  // namespace kvpage::ref

#endif  // KVPAGE_KERNEL_REFERENCE_H_
