// The router's own index of one replica's cache (see kv_event_index.h).
#include "sim/kv_event_index.h"

#include <xxhash.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvpage::sim {
namespace {

// Token ids hash as little-endian uint32 (every vocabulary fits), the same for the int64 ids
// of an event and the int32 ids of a prompt.
uint64_t ChainKey(uint64_t parent, absl::Span<const uint32_t> tokens) {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size() * sizeof(uint32_t), parent);
}

}  // namespace

absl::Status KvEventIndex::Apply(const WireKvEventBatch& batch) {
  for (size_t i = 0; i < batch.events.size(); ++i) {
    const WireKvEvent& e = batch.events[i];
    if (e.type != WireKvEvent::Type::kAllBlocksCleared && e.group_idx.value_or(0) != group_) {
      continue;
    }
    // The host tier's events carry hashes alone, and its removals name blocks the device may
    // still hold: the index mirrors the device cache only.
    if (e.medium == kHostMedium) continue;
    switch (e.type) {
      case WireKvEvent::Type::kBlockStored:
        if (absl::Status s = ApplyStored(e); !s.ok()) {
          return absl::InvalidArgumentError(absl::StrCat("event ", i, ": ", s.message()));
        }
        break;
      case WireKvEvent::Type::kBlockRemoved:
        for (uint64_t h : e.block_hashes) Remove(h);
        break;
      case WireKvEvent::Type::kAllBlocksCleared:
        blocks_.clear();
        keys_.clear();
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status KvEventIndex::ApplyStored(const WireKvEvent& e) {
  if (e.block_size != block_size_) {
    return absl::InvalidArgumentError(absl::StrCat("BlockStored of block size ", e.block_size,
                                                   ", the index's is ", block_size_));
  }
  if (e.token_ids.size() != e.block_hashes.size() * static_cast<size_t>(block_size_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockStored of ", e.block_hashes.size(), " blocks carries ",
                     e.token_ids.size(), " token ids, not ", block_size_, " per block"));
  }
  uint64_t parent = kRootKey;
  if (e.parent_block_hash.has_value()) {
    auto it = blocks_.find(*e.parent_block_hash);
    if (it == blocks_.end()) {
      orphan_blocks_ += static_cast<int64_t>(e.block_hashes.size());
      return absl::OkStatus();
    }
    parent = it->second.key;
  }
  std::vector<uint32_t> tokens(static_cast<size_t>(block_size_));
  for (size_t b = 0; b < e.block_hashes.size(); ++b) {
    for (size_t k = 0; k < tokens.size(); ++k) {
      tokens[k] = static_cast<uint32_t>(e.token_ids[b * tokens.size() + k]);
    }
    parent = ChainKey(parent, tokens);
    Block& block = blocks_[e.block_hashes[b]];
    block.key = parent;
    ++block.copies;
    ++keys_[parent];
  }
  return absl::OkStatus();
}

void KvEventIndex::Remove(uint64_t engine_hash) {
  auto it = blocks_.find(engine_hash);
  if (it == blocks_.end()) return;  // stored under an unknown parent, or never seen
  auto key = keys_.find(it->second.key);
  if (key != keys_.end() && --key->second == 0) keys_.erase(key);
  if (--it->second.copies == 0) blocks_.erase(it);
}

std::vector<uint64_t> KvEventIndex::PromptKeys(absl::Span<const int32_t> prompt) const {
  std::vector<uint64_t> keys;
  if (prompt.empty()) return keys;
  const size_t n = (prompt.size() - 1) / static_cast<size_t>(block_size_);
  keys.reserve(n);
  std::vector<uint32_t> tokens(static_cast<size_t>(block_size_));
  uint64_t parent = kRootKey;
  for (size_t b = 0; b < n; ++b) {
    for (size_t k = 0; k < tokens.size(); ++k) {
      tokens[k] = static_cast<uint32_t>(prompt[b * tokens.size() + k]);
    }
    parent = ChainKey(parent, tokens);
    keys.push_back(parent);
  }
  return keys;
}

int64_t KvEventIndex::MatchBlocks(absl::Span<const uint64_t> keys) const {
  int64_t n = 0;
  while (n < static_cast<int64_t>(keys.size()) && keys_.contains(keys[n])) ++n;
  return n;
}

}  // namespace kvpage::sim
