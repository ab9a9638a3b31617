// KV cache events on the wire: vLLM 0.33's `KVEventBatch` msgpack payload, encoded and decoded.
//
// What KV-aware routers (NVIDIA Dynamo's KV router and standalone indexer, vllm-router's
// kv_aware policy, llm-d's kv-cache indexer) read from a vLLM engine's ZeroMQ stream is one
// msgpack payload per batch:
//
//   [ts: float64, events: [event...], data_parallel_rank: int]      (an array, not a map)
//
// where every event is a msgpack map whose first key is "type":
//
//   {"type": "BlockStored", "block_hashes": [u64...], "parent_block_hash": u64 | nil,
//    "token_ids": [int...], "block_size": int, "lora_id": int | nil, "medium": "GPU",
//    "lora_name": str | nil, "group_idx": int, "kv_cache_spec_kind": str,
//    "kv_cache_spec_sliding_window": int}          (the last only for sliding-window groups)
//   {"type": "BlockRemoved", "block_hashes": [u64...], "medium": "GPU", "group_idx": int}
//   {"type": "AllBlocksCleared"}
//
// Field names and order follow vllm/distributed/kv_events.py of vLLM 0.33 (msgspec structs:
// the batch `array_like`, events tagged maps with defaults omitted). Block ids are the
// unsigned 64-bit `ExternalBlockId` of kvpage's block hashes (below).
//
// Thread-safe: the functions hold no state.
#ifndef KVPAGE_KV_EVENT_WIRE_H_
#define KVPAGE_KV_EVENT_WIRE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvpage/kv_events.h"
#include "kvpage/types.h"

namespace kvpage {

// The 64-bit id a router sees for a block hash: stable for a given hash algorithm, seed and
// token sequence, so equal across restarts and replicas that share `hash_seed`.
uint64_t ExternalBlockId(BlockHash hash);

// What a router needs to know of one layer group, in group order (group_idx = index).
struct KvEventGroupInfo {
  int32_t block_size = 0;             // tokens per block of the group
  std::string kind;                   // vLLM's KVCacheSpecKind value, e.g. "full_attention"
  std::optional<int32_t> sliding_window;  // sliding-window groups only
};

struct KvEventWireOptions {
  std::string medium = "GPU";          // "GPU" for HBM, "CPU" for a host tier
  std::optional<int32_t> data_parallel_rank = 0;
};

// Encodes `events` (oldest first) as one batch payload. Consecutive kStored events of one
// group that extend each other (each one's parent is the previous one's hash) become one
// BlockStored with several block hashes, as vLLM emits them per step. `groups` must cover
// every group an event names.
// InvalidArgument naming the event and group when a group is not in `groups`.
absl::StatusOr<std::string> EncodeKvEventBatch(double ts, absl::Span<const KvEvent> events,
                                               absl::Span<const KvEventGroupInfo> groups,
                                               const KvEventWireOptions& options = {});

// One decoded event, as a consumer sees it.
struct WireKvEvent {
  enum class Type : uint8_t { kBlockStored, kBlockRemoved, kAllBlocksCleared };
  Type type = Type::kBlockStored;
  std::vector<uint64_t> block_hashes;
  std::optional<uint64_t> parent_block_hash;   // BlockStored
  std::vector<int64_t> token_ids;              // BlockStored
  int32_t block_size = 0;                      // BlockStored
  std::optional<int64_t> lora_id;              // BlockStored
  std::optional<std::string> medium;
  std::optional<int32_t> group_idx;
  std::optional<std::string> kv_cache_spec_kind;           // BlockStored
  std::optional<int32_t> kv_cache_spec_sliding_window;     // BlockStored
};

struct WireKvEventBatch {
  double ts = 0;
  std::vector<WireKvEvent> events;
  std::optional<int32_t> data_parallel_rank;
};

// Decodes one payload (vLLM's or kvpage's); unknown map keys are skipped, as routers do.
// InvalidArgument naming the offset or field for anything that is not such a payload.
absl::StatusOr<WireKvEventBatch> DecodeKvEventBatch(std::string_view payload);

}  // namespace kvpage

#endif  // KVPAGE_KV_EVENT_WIRE_H_
