// SlidingWindowGroup: attention over the last `window` tokens (internal).
//
// A request's table keeps one entry per block like full attention, but the blocks its window
// has moved past are freed and their entries become null blocks, so a request holds at most
// cdiv(W − 1, bs) + 1 blocks plus those of the step in flight. A prefix hit needs only the run
// of cached blocks the window reaches from the hit's end.
#ifndef KVPAGE_BLOCK_SLIDING_WINDOW_GROUP_H_
#define KVPAGE_BLOCK_SLIDING_WINDOW_GROUP_H_

#include <algorithm>
#include <cstdint>

#include "block/attention_group.h"

namespace kvpage::internal {

class SlidingWindowGroup final : public AttentionGroup {
 public:
  using AttentionGroup::AttentionGroup;

  int32_t window() const override { return layout().window; }
  // The first unprocessed token p reads [p − W + 1, p]: the tokens before are skipped.
  int64_t SkippedTokens(int64_t processed) const override {
    return std::max<int64_t>(0, processed - reach());
  }
  int hit_rank() const override { return 1; }
  int64_t HitLength(absl::Span<const BlockHash> hashes, int64_t max_blocks,
                    HitScope scope) const override;
  std::vector<int64_t> HitKeys(int64_t length) const override;
  int64_t Reserve(const RequestView& r, const StepArgs& step) const override;
  int64_t NextEvent(const RequestView& r) const override;
  absl::Status CheckRecompute(const RequestView& r, RequestId id, int64_t c) const override;

 private:
  // Earlier tokens a token reads besides itself: W − 1.
  int64_t reach() const { return layout().window - 1; }
  // Blocks a hit must hold at its end: those the window of the next token reaches.
  int64_t WindowBlocks() const;
};

}  // namespace kvpage::internal

#endif  // KVPAGE_BLOCK_SLIDING_WINDOW_GROUP_H_
