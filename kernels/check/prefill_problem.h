// A random paged-prefill problem (varlen query chunks over the paged cache) and its
// comparison with ref::PagedPrefill. Host-only (no CUDA) so the GPU check and the host
// emulation test build the same inputs.
#ifndef KVPAGE_KERNELS_CHECK_PREFILL_PROBLEM_H_
#define KVPAGE_KERNELS_CHECK_PREFILL_PROBLEM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kvpage/dtype.h"
#include "kvpage/kernel_layout.h"

namespace kvpage::cuda::check {

struct PrefillCase {
  DType dtype = DType::kBF16;
  int32_t num_kv_heads = 1;
  int32_t group = 1;  // query heads per KV head
  int32_t head_dim = 128;
  int32_t block_size = 16;
  int32_t window_left = -1;
  bool tensor_cores = false;
  int32_t num_splits = 1;  // 1, or splits of 32 tokens per query
  std::string Name() const;
};

// Eight sequences as (seq_len, q_len): a whole prompt (37, 37), chunks over cached prefixes
// (50, 13), (64, 16), (100, 5), decodes (20, 1), (129, 1), a one-token prompt (1, 1) and an
// empty sequence (0, 0); then 3 padding tokens, whose outputs must be zero. Block ids are a
// random permutation; table entries wholly before the first query's window are -1, and the
// null block and every slot past a sequence's end hold NaN, so reading one poisons the output.
struct PrefillProblem {
  PrefillCase c;
  std::vector<int32_t> lens;             // seq_lens [num_seqs]
  std::vector<int32_t> query_start_loc;  // [num_seqs + 1]
  std::vector<int32_t> table;            // [num_seqs][max_blocks]
  int32_t max_blocks = 0;
  int32_t num_blocks = 0;
  int32_t real_tokens = 0;
  int32_t total_tokens = 0;  // real tokens + padding
  std::vector<uint16_t> cache;  // blocks-first NHD, bits of c.dtype
  std::vector<uint16_t> q;      // [total_tokens][num_q_heads][head_dim]
  std::vector<double> want;     // ref::PagedPrefill, [real_tokens][num_q_heads][head_dim]
  DecodeParams params;
  DecodePlan plan;

  int32_t num_seqs() const { return static_cast<int32_t>(lens.size()); }
  int32_t num_q_heads() const { return c.num_kv_heads * c.group; }
  KvCacheView View(void* base) const;
};

// InvalidArgument for an unsupported case; the reference's error otherwise.
absl::Status MakePrefillProblem(const PrefillCase& c, uint32_t seed, PrefillProblem* p);

// Compares a kernel output ([total_tokens][num_q_heads][head_dim] bits of c.dtype) with the
// reference (padding tokens: zero): |err| <= tol + tol·|want| per element, bf16 1e-2 and
// f16 2e-3. Internal naming the first bad element and the count.
absl::Status ComparePrefill(const PrefillProblem& p, const std::vector<uint16_t>& got);

}  // namespace kvpage::cuda::check

#endif  // KVPAGE_KERNELS_CHECK_PREFILL_PROBLEM_H_
