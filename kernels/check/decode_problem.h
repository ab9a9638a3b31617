// A random paged-decode problem and its comparison with the CPU reference. Host-only (no CUDA)
// so the GPU checks and the host emulation test build the same inputs.
#ifndef KVPAGE_KERNELS_CHECK_DECODE_PROBLEM_H_
#define KVPAGE_KERNELS_CHECK_DECODE_PROBLEM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kvpage/dtype.h"
#include "kvpage/kernel_layout.h"

namespace kvpage::cuda::check {

struct DecodeCase {
  DType dtype = DType::kBF16;  // q and out; also the cache unless fp8_kv
  int32_t num_seqs = 0;
  int32_t num_kv_heads = 0;
  int32_t group = 1;  // query heads per KV head
  int32_t head_dim = 128;
  int32_t block_size = 16;
  int32_t max_len = 0;  // longest sequence; the first sequences take edge lengths
  int32_t window_left = -1;
  int32_t num_splits = 0;  // 0: PlanDecode for the machine; n: about n splits
  // 0: plan for the batch's longest attended range; n: plan as if it were n tokens (a plan
  // captured in a graph for shorter sequences, replayed after they grew).
  int32_t plan_tokens = 0;
  bool tensor_cores = false;  // the plan asks for the tensor-core kernel
  // An fp8 e4m3 cache with per-tensor scales kFp8KScale / kFp8VScale (values stored as
  // WriteKvFp8 stores them); q and out stay in `dtype`.
  bool fp8_kv = false;
  // Absorbed MLA (PagedDecodeMla): num_kv_heads 1 and head_dim the latent row (576); the
  // output keeps the first kMlaLatentDim values.
  bool mla = false;
  // The plan forces the CUDA-core kernel (DecodePlan::force_cuda_cores).
  bool cuda_cores = false;
  std::string Name() const;
  // Whether PagedDecodeMla runs this mla case on tensor cores on an sm_80+ device
  // (UseMlaTensorCores: forced, or chosen for more than 4 query heads).
  bool MlaTensorCores() const {
    return tensor_cores || (!cuda_cores && num_kv_heads * group > 4);
  }
};

// Output values per head of an mla case (DeepSeek's kv_lora_rank).
inline constexpr int32_t kMlaLatentDim = 512;

// The scales of fp8_kv cases: not powers of two, so a missing or misplaced scale shows.
inline constexpr float kFp8KScale = 0.0213f;
inline constexpr float kFp8VScale = 0.0087f;

// Inputs of one case:
// - lengths 1, bs-1, bs, bs+1, max_len and 0 first (clamped to max_len), then uniform;
// - a block table that is a random permutation of the pool (block 0 is the null block, 8
//   blocks stay unused); entries wholly before a sliding window point at the null block;
// - every cache element that is not a real token's K or V (tails of last blocks, unused and
//   null blocks) is NaN, so reading one poisons the output;
// - random normal q, K, V rounded once to the case's dtype (K/V: FloatToE4m3(x / scale) for
//   fp8_kv, whose NaN filler is the byte 0xff).
struct DecodeProblem {
  DecodeCase c;
  std::vector<int32_t> lens;
  std::vector<int32_t> table;  // [num_seqs][max_blocks]
  int32_t max_blocks = 0;
  int32_t num_blocks = 0;
  std::vector<uint16_t> cache;  // blocks-first NHD (bytes of it for fp8_kv)
  std::vector<uint16_t> q;      // [num_seqs][num_q_heads][head_dim]
  DecodeParams params;
  DecodePlan plan;

  int32_t num_q_heads() const { return c.num_kv_heads * c.group; }
  int32_t out_dim() const { return c.mla ? kMlaLatentDim : c.head_dim; }
  int64_t out_elements() const {
    return static_cast<int64_t>(c.num_seqs) * num_q_heads() * out_dim();
  }
  KvCacheView View(void* base) const {
    if (c.mla) return MlaKvCache(base, num_blocks, c.block_size, c.head_dim, c.dtype);
    return BlocksFirstKvCache(base, num_blocks, c.block_size, c.num_kv_heads, c.head_dim,
                              c.fp8_kv ? DType::kFP8 : c.dtype);
  }
};

// num_sms and ctas_per_sm (the decode kernel's occupancy) feed PlanDecode when
// c.num_splits == 0.
absl::Status MakeDecodeProblem(const DecodeCase& c, uint32_t seed, int32_t num_sms,
                               int32_t ctas_per_sm, DecodeProblem* p);

// Compares a kernel output ([num_seqs][num_q_heads][out_dim()] bits of c.dtype) with the CPU
// reference: |err| <= tol + tol*|ref| per element (bf16 1e-2, fp16 2e-3; NaN fails) and a
// relative L2 error <= 5e-3 (bf16) / 1e-3 (fp16). Internal naming the first bad element.
absl::Status CompareDecode(const DecodeProblem& p, const std::vector<uint16_t>& got,
                           double* max_abs_err);

}  // namespace kvpage::cuda::check

#endif  // KVPAGE_KERNELS_CHECK_DECODE_PROBLEM_H_
