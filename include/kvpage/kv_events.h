// KV cache events: what a KV-aware router needs to mirror the prefix cache of this server.
//
// The vocabulary follows vLLM, SGLang and TensorRT-LLM (stored / removed / all cleared), so
// existing routers can consume it. Events are recorded only while the log is enabled and are
// drained by the caller; the block manager never blocks on them.
#ifndef KVPAGE_KV_EVENTS_H_
#define KVPAGE_KV_EVENTS_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kvpage/types.h"

namespace kvpage {

// Where a cached block lives: device memory (HBM), or the manager's host-memory tier
// (KvCacheConfig::host_cache), which vLLM's offloading connector names medium "CPU".
enum class KvMedium : uint8_t { kDevice, kHost };

// One change to the prefix cache of one layer group.
//
// Each group's stream is consistent on its own: a kStored event's parent (when it has one) was
// stored by the same group earlier and not removed since, and a kRemoved event names a hash the
// group stored. A KvCacheManager fills every field; a bare BlockPool (no request at hand)
// records only type, group, hash and parent.
struct KvEvent {
  enum class Type : uint8_t {
    kStored,      // a block became reusable under `hash` (its prefix parent is `parent`)
    kRemoved,     // the block cached under `hash` was evicted or its hash dropped
    kAllCleared,  // the whole prefix cache was reset
  };
  Type type = Type::kStored;
  GroupId group;      // the layer group whose cache changed (unset for kAllCleared)
  BlockHash hash;
  // kStored: the hash this block extends. Meaningful when has_parent, or from a bare pool.
  BlockHash parent;
  // kStored, from a KvCacheManager: whether the block has a parent in this group's stream.
  // An attention block's parent is the previous block; a recurrent state snapshot's is the
  // latest earlier snapshot of the same prefix that the group still holds, if any.
  bool has_parent = false;
  // kStored: BlockHashExtras::lora_id of the request (0 = no adapter).
  int64_t lora_id = 0;
  // kStored: the token ids from the parent's end (or position 0) to this block's end. An
  // attention block covers exactly block_size tokens; a state snapshot covers every token
  // since its parent snapshot, a multiple of the block size.
  std::vector<int32_t> token_ids;
  // kStored / kRemoved: the tier whose cache changed. Host-tier events carry the hash alone
  // (no parent, no token ids), as vLLM's offloading connector publishes its CPU tier; each
  // tier's stream is consistent on its own.
  KvMedium medium = KvMedium::kDevice;

  friend bool operator==(const KvEvent&, const KvEvent&) = default;
};

class KvEventLog {
 public:
  explicit KvEventLog(bool enabled = false) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }
  void set_enabled(bool enabled) { enabled_ = enabled; }
  void Add(KvEvent event) {
    if (enabled_) events_.push_back(std::move(event));
  }
  // Returns the events recorded since the last Drain, oldest first.
  std::vector<KvEvent> Drain() {
    std::vector<KvEvent> out;
    out.swap(events_);
    return out;
  }
  size_t size() const { return events_.size(); }

 private:
  bool enabled_;
  std::vector<KvEvent> events_;
};

}  // namespace kvpage

#endif  // KVPAGE_KV_EVENTS_H_
