// The prefill TFLOP/s sweep that kvpage_gpu_check (PagedPrefill, tiled) and
// kvpage_flashinfer_peer (FlashInfer's batch prefill) both run, so their rows match by
// config string; and the host form of one batch of prefill chunks on kvpage's paged cache, as
// kvpage's kernels take it (block table, seq_lens, query_start_loc) and as FlashInfer takes it
// (page CSR: indptr, indices, last-page lengths; docs/kernels.md §4). Host-only, no CUDA.
#ifndef KVPAGE_KERNELS_CHECK_PREFILL_SWEEP_H_
#define KVPAGE_KERNELS_CHECK_PREFILL_SWEEP_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace kvpage::cuda::check {

// Every sweep row: bf16, 8 KV heads, head_dim 128, blocks of 16 tokens.
inline constexpr int32_t kPrefillSweepKvHeads = 8;
inline constexpr int32_t kPrefillSweepHeadDim = 128;
inline constexpr int32_t kPrefillSweepBlockSize = 16;

// `seqs` sequences, each a chunk of `chunk` new tokens over `prefix` cached ones, with `group`
// query heads per KV head.
struct PrefillSweepCase {
  int32_t seqs = 1;
  int32_t chunk = 1;
  int32_t prefix = 0;
  int32_t group = 1;
  int32_t num_q_heads() const { return kPrefillSweepKvHeads * group; }
};

// batch 1/4 x chunk 512/2048 x cached prefix 0/4K x GQA 4/8: 16 rows.
std::vector<PrefillSweepCase> PrefillSweepCases();

// The row key both binaries print: "bf16 B=4 chunk=2048 prefix=4096 Hkv=8 G=8 D=128 bs=16".
std::string PrefillSweepConfig(const PrefillSweepCase& c);

// Causal attention FLOPs: query i of a chunk (0-based) sees prefix + i + 1 keys, and each
// (query head, key) pair costs 2·D for QKᵀ and 2·D for PV.
double PrefillSweepFlops(const PrefillSweepCase& c);

// The least a kernel must move: K and V of every token once, q in, out.
double PrefillSweepBytes(const PrefillSweepCase& c);

// One sequence of a batch: `chunk` query tokens after `prefix` cached ones.
struct PrefillChunk {
  int32_t prefix = 0;
  int32_t chunk = 1;
};

// A batch's block ids and offsets. Block ids are a random permutation of [0, num_blocks), the
// pool holding exactly the batch's blocks, so no block is shared.
struct PrefillBatch {
  int32_t block_size = 0;
  int32_t num_blocks = 0;
  int32_t max_blocks = 0;                // table row length
  std::vector<int32_t> seq_lens;         // prefix + chunk, [num_seqs]
  std::vector<int32_t> query_start_loc;  // [num_seqs + 1]
  std::vector<int32_t> table;            // [num_seqs][max_blocks], 0 past a row's blocks
  std::vector<int32_t> page_indptr;      // [num_seqs + 1], prefix sums of the blocks per row
  std::vector<int32_t> page_indices;     // every row's blocks, concatenated
  std::vector<int32_t> last_page_len;    // seq_len - (blocks - 1) * block_size, in [1, bs]

  int32_t num_seqs() const { return static_cast<int32_t>(seq_lens.size()); }
  int32_t total_tokens() const { return query_start_loc.back(); }
};

// REQUIRES: block_size > 0; every chunk >= 1 and prefix >= 0.
PrefillBatch MakePrefillBatch(const std::vector<PrefillChunk>& chunks, int32_t block_size,
                              std::mt19937& rng);

}  // namespace kvpage::cuda::check

#endif  // KVPAGE_KERNELS_CHECK_PREFILL_SWEEP_H_
