// write_kv: scatters one step's new K and V rows into the paged KV cache.
// Built only with KVPAGE_BUILD_CUDA. Layouts: kvpage/kernel_layout.h.
#ifndef KVPAGE_CUDA_WRITE_KV_H_
#define KVPAGE_CUDA_WRITE_KV_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kvpage/kernel_layout.h"

namespace kvpage::cuda {

// Copies token t's K row and V row into cache slot slot_mapping[t]
// (block = slot / block_size, offset = slot % block_size), for every KV head.
//
//   k: [num_tokens][num_kv_heads][head_dim], dtype cache.dtype, token stride k_token_stride
//      elements, head stride head_dim (contiguous heads); device memory, 16-byte aligned.
//   v: the same shape with v_token_stride; must be null for an MLA view (kv_stride 0): then
//      only the latent row is written. Non-null otherwise.
//   slot_mapping: int64 [num_tokens] on the device, as the scheduler emits it; -1 (any
//      negative value) skips the token, and so does a slot past num_blocks * block_size.
//
// One CTA per token, 16-byte loads and stores. Asynchronous on `stream`, never synchronizes,
// capturable in a CUDA graph (pad with -1 slots to a fixed num_tokens).
// Returns InvalidArgument naming the value for an invalid or fp8 view (use WriteKvFp8), a null
// or misaligned k/v, a v that does not match the view (ValidateWriteKvArgs), a token stride
// that is not a multiple of 8, or num_tokens < 0; the CUDA launch error (Unavailable without
// a device) otherwise.
absl::Status WriteKv(const void* k, const void* v, int64_t k_token_stride,
                     int64_t v_token_stride, const int64_t* slot_mapping, int32_t num_tokens,
                     const KvCacheView& cache, cudaStream_t stream);

// WriteKv into an fp8 (e4m3) cache with per-tensor scales (vLLM's convention: stored = x /
// scale, dequantised = stored * scale). k and v are `input_dtype` (f16 or bf16) with the
// layout above; each value is stored as e4m3(x * (1/scale)), rounded to nearest even and
// saturated to +-448 (ref::WriteKvFp8 is the bit-exact reference). cache.dtype must be kFP8
// and head_dim a multiple of 16. Same launch shape and errors as WriteKv, plus
// InvalidArgument for a scale that is not a positive finite number.
absl::Status WriteKvFp8(const void* k, const void* v, int64_t k_token_stride,
                        int64_t v_token_stride, const int64_t* slot_mapping, int32_t num_tokens,
                        DType input_dtype, float k_scale, float v_scale,
                        const KvCacheView& cache, cudaStream_t stream);

}  // namespace kvpage::cuda

#endif  // KVPAGE_CUDA_WRITE_KV_H_
