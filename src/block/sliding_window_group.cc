// Sliding-window groups: window-bounded hits, releases and reserves.
#include "block/sliding_window_group.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvpage::internal {

int64_t SlidingWindowGroup::WindowBlocks() const {
  return (layout().window - 1 + layout().block_size - 1) / layout().block_size;
}

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
      BlocksFor(std::min<int64_t>(layout().window - 1 + in_flight, ctx().max_model_len)) + 1;
  const int64_t skipped =
      std::max<int64_t>(0, step.computed - layout().window + 1) / layout().block_size;
  const int64_t wanted = std::min(BlocksFor(step.total + step.reserve) - skipped, cap);
  return std::max<int64_t>(0, wanted - (LengthAfter(r, step) - skipped));
}

void SlidingWindowGroup::Release(const RequestView& r, int64_t processed) {
  TableState& t = table(r.slot);
  // The first unprocessed token attends to [p − W + 1, p]; blocks wholly before are dead.
  const int64_t skipped = std::max<int64_t>(0, processed - layout().window + 1);
  const int64_t dead = std::min<int64_t>(skipped / layout().block_size,
                                         static_cast<int64_t>(t.blocks.size()));
  // Last to first, so the later blocks of the prefix are evicted first; blocks before
  // num_released went in earlier calls.
  for (int64_t i = dead - 1; i >= t.num_released; --i) {
    pool().Free({t.blocks[i]});
    t.blocks[i] = kNullBlock;
  }
  t.num_released = std::max(t.num_released, dead);
}

int64_t SlidingWindowGroup::NextEvent(const RequestView& r) const {
  // Block f dies once (p − W + 1) / bs > f, i.e. at p >= (f + 1)·bs + W − 1: a step starting
  // there, so ending one token later at least, must hear of it.
  const int64_t release =
      (table(r.slot).num_released + 1) * layout().block_size + layout().window - 1;
  return std::min(AttentionGroup::NextEvent(r), release + 1);
}

absl::Status SlidingWindowGroup::CheckRollback(int32_t slot, RequestId id, int64_t keep) const {
  // Token keep − 1 is computed again next and reads [keep − W, keep − 1]; released blocks are
  // the table's leading nulls.
  const int64_t needed = std::max<int64_t>(0, keep - layout().window) / layout().block_size;
  const absl::Span<const BlockId> blocks = Table(slot);
  if (needed < static_cast<int64_t>(blocks.size()) && blocks[needed] == kNullBlock) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot roll back request ", id.value, " to ", keep, " tokens: block ", needed,
        " of sliding-window group ", layout().id.value, ", which the window of token ",
        keep - 1, " reads, is already freed"));
  }
  return absl::OkStatus();
}

}  // namespace kvpage::internal
