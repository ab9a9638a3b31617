// Routers of a simulated fleet (fleet.h): which replica serves a request, decided once, at its
// arrival, from the replicas as they are at that instant.
//
// Notation for one request and replica r: P its prompt tokens, B the block size, L_r the
// replica's outstanding tokens (Replica::outstanding_tokens: prompt tokens of its unfinished
// requests not yet prefilled plus their output tokens not yet generated), C_r the prompt
// tokens replica r's prefix cache would serve. Every router breaks ties by the lowest index.
//
//   round-robin    request i (in arrival order) goes to replica i mod N.
//   least-loaded   argmin_r L_r.
//   prefix-aware   argmin_r cost_r, then the lower L_r, with
//                    cost_r = w · (P − C_r) / B + L_r / B
//                  where C_r is read from the replica's real KvCacheManager
//                  (CachedPrefixTokens: the hit admission would get now, nothing allocated).
//   kv-events      the same cost, with C_r from the router's own index of the replica's cache,
//                  built only from the KV events the replica publishes (kv_event_index.h)
//                  for one layer group.
//
// The cost is Dynamo's KV router logit (ai-dynamo/dynamo, lib/llm/src/kv_router/scheduler.rs,
// DefaultWorkerSelector: logit = overlap_score_weight · potential_prefill_blocks +
// decode_blocks, the lowest wins at temperature 0): the first term is the prefill this
// request adds on r, the second the replica's load in blocks. Dynamo's load counts the KV
// blocks of the worker's active requests plus its queued prefill tokens; the simulator uses
// L_r, the same load least-loaded balances. w = FleetConfig::overlap_weight (Dynamo's
// --kv-overlap-score-weight, 1 by default): 0 balances load only.
//
// Thread-compatible.
#ifndef KVPAGE_SIM_ROUTER_H_
#define KVPAGE_SIM_ROUTER_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sim/fleet.h"
#include "sim/replica.h"

namespace kvpage::sim {

// What a router knows of a request when it arrives.
struct RouteRequest {
  int64_t index = 0;                  // trace index
  absl::Span<const int32_t> prompt;   // its prompt token ids
};

class Router {
 public:
  virtual ~Router() = default;
  // The replica for `request`. REQUIRES: replicas non-empty, the size Create was given.
  virtual int32_t Pick(const RouteRequest& request, absl::Span<const Replica* const> replicas) = 0;
  // Whether the fleet must publish each replica's KV events to Observe.
  virtual bool wants_kv_events() const { return false; }
  // One batch payload (vLLM's KVEventBatch msgpack) replica `replica` published.
  // InvalidArgument for a payload that does not decode or names another block size.
  virtual absl::Status Observe(int32_t replica, std::string_view payload);
};

// A router of `kind` for `replicas` replicas whose caches use `block_size` tokens per block;
// kv-events indexes the events of layer group `indexed_group`.
// InvalidArgument for replicas < 1, block_size < 1, or a negative or non-finite weight.
absl::StatusOr<std::unique_ptr<Router>> CreateRouter(RouterKind kind, int32_t replicas,
                                                     double overlap_weight, int32_t block_size,
                                                     int32_t indexed_group = 0);

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_ROUTER_H_
