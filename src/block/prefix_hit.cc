// The longest prefix every layer group can serve from the cache.
//
// Each group answers "given at most L blocks, how many leading blocks can I serve?" (full
// attention: every block from the start; a sliding window: the blocks its window reaches from
// the hit's end; a recurrent group: a state snapshot taken exactly at the hit's end). The
// answers shrink one another, so they are applied in turn until none shrinks: a fixed point.
// Full attention only gets trimmed after its first answer, so it is asked first; its first
// answer is also the longest prefix any one group serves (vLLM's shared-prefix junction).
#include <algorithm>

#include "block/manager_impl.h"

namespace kvpage {

using internal::RequestState;

CacheHit KvCacheManager::Impl::FindLongestHit(const RequestState& st) const {
  CacheHit hit;
  hit.blocks.resize(groups.size());
  const absl::Span<const BlockHash> hashes = st.hashes.hashes();
  const int64_t max_blocks = MaxHitBlocks(st);
  if (max_blocks <= 0) return hit;
  int64_t length = max_blocks;
  int64_t longest = 0;  // the longest prefix one group serves alone
  length = LongestHitLength(hashes, length, &longest);
  hit.num_tokens = hit.match_tokens = std::max<int64_t>(length, 0) * block_size;
  if (prefill_alignment > 0) {
    // Where prefill chunks stop so that later requests resume there (Scheduler). vllm mode:
    // vLLM's shared-prefix junction, where full attention's hit ends.
    hit.match_tokens = config.mode == AccountingMode::kKvpage
                           ? std::max(hit.num_tokens, KnownLength(hashes, max_blocks) * block_size)
                           : longest * block_size;
  }
  if (length <= 0) return hit;
  for (const auto& g : groups) hit.blocks[g->layout().id.value] = g->HitBlocks(hashes, length);
  return hit;
}

int64_t KvCacheManager::Impl::MaxHitBlocks(const RequestState& st) const {
  if (!config.enable_prefix_caching || st.skip_prefix_cache_read) return 0;
  // The last token is always recomputed: its logits are needed.
  return std::max<int64_t>(0, std::min<int64_t>((NumTokens(st.slot) - 1) / block_size,
                                                static_cast<int64_t>(st.hashes.hashes().size())));
}

bool KvCacheManager::Impl::HitWaitsForStep(const RequestState& st) const {
  // Recurrent groups note the step's snapshots under vLLM 0.33's align bookkeeping only:
  // kvpage accounting admits the request with the shorter hit the completed steps give.
  if (!context.align_state_blocks) return false;
  const absl::Span<const BlockHash> hashes = st.hashes.hashes();
  const int64_t max_blocks = MaxHitBlocks(st);
  // vLLM checks the last block of its hit, where a recurrent group's snapshot sits.
  const int64_t length =
      LongestHitLength(hashes, max_blocks, nullptr, internal::HitScope::kDeviceAndStep);
  if (length <= 0) return false;
  for (const auto& g : groups) {
    if (g->CachedThisStep(hashes[length - 1])) return true;
  }
  return false;
}

int64_t KvCacheManager::Impl::KnownLength(absl::Span<const BlockHash> hashes,
                                          int64_t max_blocks) const {
  std::vector<internal::RequestView> in_flight;
  in_flight.reserve(pending_commits.size());
  for (int32_t slot : pending_commits) in_flight.push_back(View(*states[slot]));
  int64_t known = 0;
  for (const auto& g : groups) known = std::max(known, g->KnownLength(hashes, max_blocks, in_flight));
  return known;
}

int64_t KvCacheManager::Impl::LongestHitLength(absl::Span<const BlockHash> hashes,
                                              int64_t length, int64_t* longest_alone,
                                              internal::HitScope scope) const {
  int64_t longest = 0;  // answers only shrink: this is the first group's first answer
  for (int64_t previous = -1; length > 0 && length != previous;) {
    previous = length;
    for (const internal::GroupManager* g : hit_order) {
      length = std::min(length, g->HitLength(hashes, length, scope));
      longest = std::max(longest, length);
    }
  }
  if (longest_alone != nullptr) *longest_alone = longest;
  return length;
}

int64_t KvCacheManager::CachedPrefixTokens(absl::Span<const int32_t> prompt_tokens,
                                           const BlockHashExtras& extras) const {
  const Impl& m = *impl_;
  if (!m.config.enable_prefix_caching || prompt_tokens.size() < 2) return 0;
  // Items outside the prompt would leave blocks they claim out of the hashes.
  if (!extras.Validate(static_cast<int64_t>(prompt_tokens.size())).ok()) return 0;
  const int64_t length = (static_cast<int64_t>(prompt_tokens.size()) - 1) / m.block_size;
  if (length <= 0) return 0;
  // Only the blocks a hit could cover are hashed.
  RequestBlockHashes hashes(m.block_size, extras);
  hashes.Update(*m.hasher, prompt_tokens.first(static_cast<size_t>(length * m.block_size)));
  return m.LongestHitLength(hashes.hashes(), length) * m.block_size;
}

}  // namespace kvpage
