// The shared prefill sweep and the two host forms of a prefill batch.
#include "kernels/check/prefill_sweep.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

namespace kvpage::cuda::check {

std::vector<PrefillSweepCase> PrefillSweepCases() {
  std::vector<PrefillSweepCase> cases;
  for (int32_t seqs : {1, 4}) {
    for (int32_t chunk : {512, 2048}) {
      for (int32_t prefix : {0, 4096}) {
        for (int32_t group : {4, 8}) cases.push_back({seqs, chunk, prefix, group});
      }
    }
  }
  return cases;
}

std::string PrefillSweepConfig(const PrefillSweepCase& c) {
  char s[96];
  std::snprintf(s, sizeof(s), "bf16 B=%d chunk=%d prefix=%d Hkv=%d G=%d D=%d bs=%d", c.seqs,
                c.chunk, c.prefix, kPrefillSweepKvHeads, c.group, kPrefillSweepHeadDim,
                kPrefillSweepBlockSize);
  return s;
}

double PrefillSweepFlops(const PrefillSweepCase& c) {
  // sum over i in [0, chunk) of (prefix + i + 1) = chunk·prefix + chunk·(chunk + 1) / 2.
  const double chunk = c.chunk;
  const double pairs = chunk * c.prefix + chunk * (chunk + 1) / 2;
  return 4.0 * kPrefillSweepHeadDim * c.num_q_heads() * pairs * c.seqs;
}

double PrefillSweepBytes(const PrefillSweepCase& c) {
  const double kv = 2.0 * c.seqs * (c.prefix + c.chunk) * kPrefillSweepKvHeads *
                    kPrefillSweepHeadDim * 2;
  const double q_and_out = 2.0 * c.seqs * c.chunk * c.num_q_heads() * kPrefillSweepHeadDim * 2;
  return kv + q_and_out;
}

PrefillBatch MakePrefillBatch(const std::vector<PrefillChunk>& chunks, int32_t block_size,
                              std::mt19937& rng) {
  PrefillBatch b;
  b.block_size = block_size;
  b.query_start_loc = {0};
  b.page_indptr = {0};
  for (const PrefillChunk& c : chunks) {
    const int32_t len = c.prefix + c.chunk;
    const int32_t blocks = (len + block_size - 1) / block_size;
    b.seq_lens.push_back(len);
    b.query_start_loc.push_back(b.query_start_loc.back() + c.chunk);
    b.page_indptr.push_back(b.page_indptr.back() + blocks);
    b.last_page_len.push_back(len - (blocks - 1) * block_size);
    b.max_blocks = std::max(b.max_blocks, blocks);
  }
  b.num_blocks = b.page_indptr.back();
  b.page_indices.resize(static_cast<size_t>(b.num_blocks));
  std::iota(b.page_indices.begin(), b.page_indices.end(), 0);
  std::shuffle(b.page_indices.begin(), b.page_indices.end(), rng);
  b.table.assign(static_cast<size_t>(b.num_seqs()) * b.max_blocks, 0);
  for (int32_t s = 0; s < b.num_seqs(); ++s) {
    std::copy(b.page_indices.begin() + b.page_indptr[s],
              b.page_indices.begin() + b.page_indptr[s + 1],
              b.table.begin() + static_cast<size_t>(s) * b.max_blocks);
  }
  return b;
}

}  // namespace kvpage::cuda::check
