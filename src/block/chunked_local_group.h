// ChunkedLocalGroup: attention within a token's own chunk of C tokens (internal).
//
// Llama 4's RoPE layers: a token at position p reads [⌊p/C⌋·C, p], C = attention_chunk_size.
// A request's table keeps one entry per block like full attention; once its computed tokens
// cross a chunk boundary, the blocks wholly before the boundary are freed and their entries
// become null blocks. A prefix hit of L blocks needs only the cached run from the chunk that
// holds token L·bs: the blocks before it are past (vLLM's ChunkedLocalAttentionManager).
#ifndef KVPAGE_BLOCK_CHUNKED_LOCAL_GROUP_H_
#define KVPAGE_BLOCK_CHUNKED_LOCAL_GROUP_H_

#include <cstdint>
#include <vector>

#include "block/attention_group.h"

namespace kvpage::internal {

class ChunkedLocalGroup final : public AttentionGroup {
 public:
  using AttentionGroup::AttentionGroup;

  // The first unprocessed token p reads from its chunk's start: the tokens before are skipped.
  int64_t SkippedTokens(int64_t processed) const override {
    return processed / chunk() * chunk();
  }
  int hit_rank() const override { return 1; }
  int64_t HitLength(absl::Span<const BlockHash> hashes, int64_t max_blocks,
                    HitScope scope) const override;
  std::vector<int64_t> HitKeys(int64_t length) const override;
  int64_t Reserve(const RequestView& r, const StepArgs& step) const override;
  int64_t NextEvent(const RequestView& r) const override;
  absl::Status CheckRecompute(const RequestView& r, RequestId id, int64_t c) const override;

 private:
  int64_t chunk() const { return layout().chunk_size; }
  // Blocks wholly before the chunk holding token `tokens` (the first token after a prefix).
  int64_t PastBlocks(int64_t tokens) const { return SkippedTokens(tokens) / layout().block_size; }
};

}  // namespace kvpage::internal

#endif  // KVPAGE_BLOCK_CHUNKED_LOCAL_GROUP_H_
