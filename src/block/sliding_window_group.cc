// Sliding-window groups: window-bounded hits, releases and reserves.
#include "block/sliding_window_group.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"

namespace kvpage::internal {

int64_t SlidingWindowGroup::WindowBlocks() const { return BlocksFor(reach()); }

int64_t SlidingWindowGroup::HitLength(absl::Span<const BlockHash> hashes, int64_t max_blocks,
                                      HitScope scope) const {
  // Scanned right to left: a run of WindowBlocks() cached blocks ending the hit, or a shorter
  // run that starts at block 0 (it then serves a shorter prefix on its own).
  const int64_t needed = WindowBlocks();
  if (needed == 0) return max_blocks;
  int64_t run = 0;
  for (int64_t i = max_blocks - 1; i >= 0; --i) {
    run = cached(hashes, i, scope) ? run + 1 : 0;
    if (run >= needed) return i + run;
  }
  return run;
}

std::vector<int64_t> SlidingWindowGroup::HitKeys(int64_t length) const {
  const int64_t first = std::max<int64_t>(0, length - WindowBlocks());
  std::vector<int64_t> keys(static_cast<size_t>(length), -1);
  for (int64_t i = first; i < length; ++i) keys[i] = i;
  return keys;
}

int64_t SlidingWindowGroup::Reserve(const RequestView& r, const StepArgs& step) const {
  // kvpage counts only the step: a window holds at most W − 1 + budget tokens whatever the
  // prompt. vLLM's full-sequence gate counts a window's blocks for the whole sequence too,
  // capped by its admission bound cdiv(min(W − 1 + T, L), bs) + 1 with T the tokens in flight
  // (two batches under async scheduling) (vllm.md §1.3, §2.7 step 4).
  if (!ctx().window_sequence_reserve) return 0;
  const int64_t in_flight =
      int64_t{ctx().max_num_batched_tokens} * (ctx().async_scheduling ? 2 : 1);
  const int64_t cap =
      BlocksFor(std::min<int64_t>(reach() + in_flight, ctx().max_model_len)) + 1;
  return CappedGateBeyondStep(r, step, cap, SkippedTokens(step.computed) / layout().block_size);
}

int64_t SlidingWindowGroup::NextEvent(const RequestView& r) const {
  // Block f dies once SkippedTokens(p) / bs > f, i.e. at p >= (f + 1)·bs + W − 1: a step
  // starting there, so ending one token later at least, must hear of it.
  const int64_t release = (table(r.slot).num_released + 1) * layout().block_size + reach();
  return std::min(AttentionGroup::NextEvent(r), release + 1);
}

absl::Status SlidingWindowGroup::CheckRecompute(const RequestView& r, RequestId id,
                                                int64_t c) const {
  if (c < 0) return absl::OkStatus();
  // Token c reads from SkippedTokens(c) on; released blocks are the table's leading nulls.
  const int64_t needed = SkippedTokens(c) / layout().block_size;
  const absl::Span<const BlockId> blocks = Table(r.slot);
  if (needed < static_cast<int64_t>(blocks.size()) && blocks[needed] == kNullBlock) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot compute token ", c, " of request ", id.value, " again: block ", needed,
        " of sliding-window group ", layout().id.value, ", which its window reads, is already "
        "freed"));
  }
  return absl::OkStatus();
}

}  // namespace kvpage::internal
