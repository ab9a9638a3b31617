// kvpage's own reservation: one pool per layer group, nothing padded.
//
// This is the formula the block manager is designed to meet; once the manager lands, the
// planner must take these numbers from a dry run of it instead (see docs/capacity_planning.md).

#include "internal/status_macros.h"
#include "planner/policies.h"

namespace kvpage::internal {

absl::StatusOr<PlanRow> PlanKvpageRow(const ModelSpec& model, const PlanOptions& options,
                                      int64_t context, std::optional<int64_t> budget) {
  const DType dtype = options.ResolvedKvDtype(model.dtype);
  const int64_t bs = options.block_size;
  PlanRow row;
  row.context = context;
  for (const LayerGroup& group : model.groups) {
    const LayerSpec& spec = group.spec;
    GroupReservation g;
    g.kind = spec.kind;
    g.num_layers = group.num_layers();
    if (spec.kind == LayerKind::kLinearAttention) {
      // One live state per request in its native dtypes. A prefix-cache snapshot is a copy of
      // it, held by the cache (and evictable), not by the request.
      const int64_t state = spec.linear.NativeBytes() * g.num_layers;
      g.blocks = 1;
      g.reserved_bytes = state;
      row.state_bytes += state;
      if (options.enable_prefix_caching) row.snapshot_bytes += state;
    } else {
      KVPAGE_ASSIGN_OR_RETURN(int64_t token_bytes, AttentionTokenBytes(spec.attention, dtype));
      const int64_t block_bytes = bs * token_bytes * g.num_layers;  // one block id, all layers
      g.block_size = static_cast<int32_t>(bs);
      if (spec.kind == LayerKind::kSlidingWindow) {
        g.blocks = SlidingWindowBlocks(context, spec.sliding_window, bs);
        // Tokens being computed in a step may sit beyond the window's blocks until the step
        // ends; their blocks come from an allowance shared by every request of the pool,
        // bounded by the step's token budget.
        row.shared_bytes += CeilDiv(options.max_num_batched_tokens, bs) * block_bytes;
      } else {
        g.blocks = CeilDiv(context, bs);
      }
      g.reserved_bytes = g.blocks * block_bytes;
    }
    row.reserved_bytes += g.reserved_bytes;
    row.groups.push_back(g);
  }
  if (budget.has_value()) {
    const int64_t room = *budget - row.shared_bytes;
    row.max_concurrency = (room <= 0 || row.reserved_bytes == 0) ? 0 : room / row.reserved_bytes;
  }
  return row;
}

}  // namespace kvpage::internal
