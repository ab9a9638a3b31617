// A KV-aware router's mirror of one replica's prefix cache, built only from the KV events the
// replica publishes (decoded vLLM KVEventBatch payloads, kvpage/kv_event_wire.h).
//
// Like Dynamo's indexer, the index does not trust the engine's block hashes for matching: it
// rehashes the token ids each BlockStored carries, chained block by block,
//
//   key(block 0) = XXH3-64(tokens of block 0, seed kRootKey)
//   key(block i) = XXH3-64(tokens of block i, seed key(block i − 1))      (tokens as uint32)
//
// and keeps the engine's hashes only as ids: to find a stored block's parent and to apply a
// BlockRemoved. A request's prompt is hashed the same way (PromptKeys) and matched block by
// block from the start. A BlockStored whose parent the index never saw is ignored (counted in
// orphan_blocks) — its chain key cannot be known; so is an event of another layer group than
// the one indexed (the fleet indexes the first full-attention or MLA group, whose cache holds
// whole prefixes; a sliding-window group drops the blocks its window has left), and so is every
// event of a host tier (medium "CPU"): the index mirrors the device cache.
//
// Thread-compatible.
#ifndef KVPAGE_SIM_KV_EVENT_INDEX_H_
#define KVPAGE_SIM_KV_EVENT_INDEX_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kvpage/kv_event_wire.h"

namespace kvpage::sim {

class KvEventIndex {
 public:
  static constexpr uint64_t kRootKey = 0x6b7670616765726fULL;  // the parent of block 0
  static constexpr const char* kHostMedium = "CPU";  // the medium of host-tier events

  // Indexes the events of layer group `group`. REQUIRES: block_size >= 1.
  explicit KvEventIndex(int32_t block_size, int32_t group = 0)
      : block_size_(block_size), group_(group) {}

  // Applies one decoded batch, oldest event first. InvalidArgument naming the event for a
  // BlockStored whose block size differs from the index's, or whose token ids do not fill
  // exactly its blocks.
  absl::Status Apply(const WireKvEventBatch& batch);

  // The chain keys of the full blocks of `prompt`, at most (prompt.size() − 1) / block_size
  // of them: the last prompt token is always recomputed, as in the KV cache manager.
  std::vector<uint64_t> PromptKeys(absl::Span<const int32_t> prompt) const;
  // How many of `keys`, from the first, the replica holds.
  int64_t MatchBlocks(absl::Span<const uint64_t> keys) const;

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t orphan_blocks() const { return orphan_blocks_; }
  int32_t block_size() const { return block_size_; }

 private:
  struct Block {
    uint64_t key = 0;     // chain key
    int32_t copies = 0;   // stored minus removed under this engine hash
  };
  absl::Status ApplyStored(const WireKvEvent& event);
  void Remove(uint64_t engine_hash);

  int32_t block_size_;
  int32_t group_;
  absl::flat_hash_map<uint64_t, Block> blocks_;   // engine hash -> block
  absl::flat_hash_map<uint64_t, int32_t> keys_;   // chain key -> blocks holding it
  int64_t orphan_blocks_ = 0;
};

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_KV_EVENT_INDEX_H_
