// Chunked-local groups: chunk-bounded hits, releases and reserves.
#include "block/chunked_local_group.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvpage::internal {

int64_t ChunkedLocalGroup::HitLength(absl::Span<const BlockHash> hashes, int64_t max_blocks,
                                     HitScope scope) const {
  // The blocks before the chunk of the token after the hit are past: they count as served
  // without a lookup. From there, the run of cached blocks (find_longest_cache_hit).
  const int64_t first = std::min(PastBlocks(max_blocks * layout().block_size), max_blocks);
  int64_t end = first;
  while (end < max_blocks && cached(hashes, end, scope)) ++end;
  return end;
}

std::vector<int64_t> ChunkedLocalGroup::HitKeys(int64_t length) const {
  const int64_t first = std::min(PastBlocks(length * layout().block_size), length);
  std::vector<int64_t> keys(static_cast<size_t>(length), -1);
  for (int64_t i = first; i < length; ++i) keys[i] = i;
  return keys;
}

int64_t ChunkedLocalGroup::Reserve(const RequestView& r, const StepArgs& step) const {
  // kvpage counts only the step: a request holds at most one chunk plus the step in flight.
  // vLLM's full-sequence gate counts the whole sequence, capped by ChunkedLocalAttentionSpec's
  // admission bound cdiv(min(C + T, L), bs), T the tokens in flight (two batches under async
  // scheduling).
  if (!ctx().window_sequence_reserve) return 0;
  const int64_t in_flight =
      int64_t{ctx().max_num_batched_tokens} * (ctx().async_scheduling ? 2 : 1);
  const int64_t cap = BlocksFor(std::min<int64_t>(chunk() + in_flight, ctx().max_model_len));
  return CappedGateBeyondStep(r, step, cap, PastBlocks(step.computed));
}

int64_t ChunkedLocalGroup::NextEvent(const RequestView& r) const {
  // Block f dies once PastBlocks(p) > f, i.e. at the first chunk boundary p >= (f + 1)·bs: a
  // step starting there, so ending one token later at least, must hear of it.
  const int64_t end_of_block = (table(r.slot).num_released + 1) * layout().block_size;
  const int64_t release = (end_of_block + chunk() - 1) / chunk() * chunk();
  return std::min(AttentionGroup::NextEvent(r), release + 1);
}

absl::Status ChunkedLocalGroup::CheckRecompute(const RequestView& r, RequestId id,
                                               int64_t c) const {
  if (c < 0) return absl::OkStatus();
  // Token c reads from its chunk's start on; released blocks are the table's leading nulls.
  const int64_t needed = PastBlocks(c);
  const absl::Span<const BlockId> blocks = Table(r.slot);
  if (needed < static_cast<int64_t>(blocks.size()) && blocks[needed] == kNullBlock) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot compute token ", c, " of request ", id.value, " again: block ", needed,
        " of chunked-local group ", layout().id.value, ", which its chunk reads, is already "
        "freed"));
  }
  return absl::OkStatus();
}

}  // namespace kvpage::internal
