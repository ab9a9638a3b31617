// KV cache events: what a KV-aware router needs to mirror the prefix cache of this server.
//
// The vocabulary follows vLLM, SGLang and TensorRT-LLM (stored / removed / all cleared), so
// existing routers can consume it. Events are recorded only while the log is enabled and are
// drained by the caller; the block manager never blocks on them.
#ifndef KVPAGE_KV_EVENTS_H_
#define KVPAGE_KV_EVENTS_H_

#include <cstdint>
#include <vector>

#include "kvpage/types.h"

namespace kvpage {

struct KvEvent {
  enum class Type : uint8_t {
    kStored,      // a block became reusable under `hash` (its prefix parent is `parent`)
    kRemoved,     // the block cached under `hash` was evicted or its hash dropped
    kAllCleared,  // the whole prefix cache was reset
  };
  Type type = Type::kStored;
  GroupId group;      // the layer group whose cache changed (unset for kAllCleared)
  BlockHash hash;
  BlockHash parent;   // kStored only

  friend bool operator==(const KvEvent&, const KvEvent&) = default;
};

class KvEventLog {
 public:
  explicit KvEventLog(bool enabled = false) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }
  void set_enabled(bool enabled) { enabled_ = enabled; }
  void Add(const KvEvent& event) {
    if (enabled_) events_.push_back(event);
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
