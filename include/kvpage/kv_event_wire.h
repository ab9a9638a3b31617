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
// the batch `array_like`, events tagged maps with defaults omitted, so a field with no
// default, such as lora_id, is present as nil and group_idx is present only when known).
// Integers take msgpack's shortest form, the timestamp is a float64.
//
// Block ids. A router sees the unsigned 64-bit `ExternalBlockId` of kvpage's 128-bit block
// hash: its low 64 bits (`BlockHash::lo`). For XXH3-128 (the default) that is the hash's
// low64 half; for SHA-256 it is bytes 0-7 of the digest read little-endian (kvpage keeps the
// first 16 bytes; vLLM's id, the big-endian low 64 bits, would need bytes 24-31). kvpage's
// hash input is its own (src/block/block_hash.cc), so ids never equal vLLM's for the same
// tokens: routers use them only as opaque names linking Stored, Removed and parents, and match
// prompts by hashing `token_ids` themselves. Ids depend on the algorithm, the hash seed
// (KvCacheConfig::hash_seed: set it, or every restart draws a new random root and renames
// every block) and the tokens, so replicas that share a seed publish equal ids for equal
// prefixes.
//
// Thread-safe: the functions hold no state.
#ifndef KVPAGE_KV_EVENT_WIRE_H_
#define KVPAGE_KV_EVENT_WIRE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/kv_events.h"
#include "kvpage/types.h"

namespace kvpage {

// The 64-bit id a router sees for a block hash (hash.lo; see the top of this file): stable for
// a given hash algorithm, seed and token sequence, so equal across restarts and replicas that
// share `hash_seed`.
uint64_t ExternalBlockId(BlockHash hash);

// What a router needs to know of one layer group, in group order (group_idx = index).
struct KvEventGroupInfo {
  // Tokens per block of the group: the block_size of its events that carry no token ids (a
  // bare BlockPool's). Events with token ids give the tokens their one hash covers instead.
  int32_t block_size = 0;
  std::string kind;                   // vLLM's KVCacheSpecKind value, e.g. "full_attention"
  std::optional<int32_t> sliding_window;  // sliding-window groups only
};

// vLLM's KVCacheSpecKind value for a layer kind: "full_attention", "sliding_window",
// "mla_attention", or "mamba" (vLLM's kind for linear-attention state, Gated DeltaNet included).
std::string KvCacheSpecKindName(LayerKind kind);

// The group table of a manager, in group order: its kinds, windows and block sizes (a state
// group gets the hash block size, the block size of the attention groups).
std::vector<KvEventGroupInfo> KvEventGroupInfos(const KvCacheManager& manager);

struct KvEventWireOptions {
  std::string medium = "GPU";          // device events; host-tier events are always "CPU"
  // The batch's third element; nullopt omits it, as msgspec omits a None default.
  std::optional<int32_t> data_parallel_rank = 0;
  // lora_name of a Stored event by its LoRA id. Routers hash a LoRA block's tokens with the
  // adapter's name; an id not listed here goes out with lora_name nil.
  absl::flat_hash_map<int64_t, std::string> lora_names;
};

// Encodes `events` (oldest first) as one batch payload. Consecutive kStored events of one
// group that extend each other (each one's parent is the previous one's hash, same LoRA id,
// same tokens per hash) become one BlockStored with several block hashes, as vLLM emits them
// per step; consecutive kRemoved events of one group become one BlockRemoved. `groups` must
// cover every group an event names.
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
  std::optional<std::string> lora_name;        // BlockStored
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
// InvalidArgument naming the offset or field for anything that is not such a payload (bad
// msgpack, trailing bytes, a wrong type, a missing "type" or block_hashes, an unknown event
// type). Sizes are bounded by the payload's, so no input makes it allocate more than a small
// multiple of the payload.
absl::StatusOr<WireKvEventBatch> DecodeKvEventBatch(std::string_view payload);

}  // namespace kvpage

#endif  // KVPAGE_KV_EVENT_WIRE_H_
