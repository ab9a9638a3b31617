// The scheduler's device-ready rows: one per running request, kept equal to the KV cache's
// block tables by copying only what changed.
#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "model/kv_sizing.h"
#include "scheduler/scheduler_impl.h"

namespace kvpage {

using internal::SchedRequest;

void Scheduler::Impl::InitTables() {
  const size_t rows = static_cast<size_t>(config.max_num_seqs);
  out.attention.clear();
  for (GroupInfo& g : attention) {
    g.max_manager_blocks = static_cast<int32_t>(internal::CeilDiv(max_model_len, g.block_size));
    g.stride = g.max_manager_blocks * g.ratio;
    g.table.assign(rows * static_cast<size_t>(g.stride), 0);
    AttentionBatch batch;
    batch.group = g.id;
    batch.kind = g.kind;
    batch.kernel_block_size = g.block_size / g.ratio;
    batch.window = g.window;
    batch.max_blocks_per_row = g.stride;
    out.attention.push_back(std::move(batch));
  }
  out.states.clear();
  for (GroupId g : state_groups) out.states.push_back(StateBatch{.group = g});
  row_owner.reserve(rows);
  fast_rows = (attention.size() == 1 || attention.size() == 2) && state_groups.empty() &&
              config.num_speculative_tokens == 0;
  one_plain_group = attention.size() == 1 && attention[0].ratio == 1 &&
                    attention[0].kind != LayerKind::kSlidingWindow;
}

void Scheduler::Impl::TakeRow(int32_t q) {
  SchedRequest& r = reqs[q];
  r.row = static_cast<int32_t>(row_owner.size());
  row_owner.push_back(q);
  std::fill(r.synced_blocks.begin(), r.synced_blocks.end(), 0);
  std::fill(r.synced_released.begin(), r.synced_released.end(), 0);
  r.decode_from = std::numeric_limits<int32_t>::max();
  r.sync_tokens = 0;
  r.sync_release = 0;
  r.RefreshSteadyUntil();
}

void Scheduler::Impl::FreeRow(int32_t q) {
  rows_match_output = false;
  static_rows = false;
  SchedRequest& r = reqs[q];
  const int32_t row = r.row;
  const int32_t last = static_cast<int32_t>(row_owner.size()) - 1;
  const int32_t mover = row_owner[last];
  for (size_t a = 0; a < attention.size(); ++a) {
    GroupInfo& g = attention[a];
    int32_t* dst = g.table.data() + static_cast<size_t>(row) * g.stride;
    int32_t* src = g.table.data() + static_cast<size_t>(last) * g.stride;
    std::fill(dst, dst + static_cast<size_t>(r.synced_blocks[a]) * g.ratio, 0);
    if (row != last) {
      const size_t used = static_cast<size_t>(reqs[mover].synced_blocks[a]) * g.ratio;
      std::memcpy(dst, src, used * sizeof(int32_t));
      std::fill(src, src + used, 0);
    }
  }
  if (row != last) {
    row_owner[row] = mover;
    reqs[mover].row = row;
    pending_row_moves.emplace_back(last, row);
  }
  row_owner.pop_back();
  r.row = -1;
}

bool Scheduler::Impl::SyncOneNewBlock(SchedRequest& r) {
  if (!one_plain_group) return false;
  GroupInfo& g = attention[0];
  const absl::Span<const BlockId> blocks = kv->BlockTableOrEmpty(r.id, g.id, r.kv_handle);
  const int32_t size = static_cast<int32_t>(blocks.size());
  int32_t& synced = r.synced_blocks[0];
  if (size == 0 || size != synced + 1) return false;
  // What SyncRow's loop does for that block, with no window to release and one group.
  const int32_t last = size - 1;
  const int32_t id = blocks.data()[last].value;
  KVPAGE_DCHECK(id != kNullBlock.value);
  g.table[static_cast<size_t>(r.row) * g.stride + static_cast<size_t>(last)] = id;
  out.attention[0].new_block_ids.push_back(id);
  synced = size;
  r.slot_delta0 = (int64_t{id} - last) * g.block_size;
  r.decode_from = last * g.block_size;  // less than max_model_len
  r.sync_tokens = std::min<int64_t>(max_model_len, int64_t{size} * g.block_size);
  r.sync_release = max_model_len + 1;
  r.RefreshSteadyUntil();
  return true;
}

void Scheduler::Impl::SyncRow(SchedRequest& r) {
  if (SyncOneNewBlock(r)) return;
  // While copying, the bounds until which the row stays current: tokens up to the shortest
  // table (every group has the blocks), and, for a sliding window, the first unprocessed
  // token p at which the cache frees the next block f: p − W + 1 >= (f + 1)·bs.
  // In steady decode this runs once per block a request crosses: one new block per group.
  int64_t tokens = max_model_len;
  int64_t release = max_model_len + 1;
  int64_t tail_from = 0;
  int32_t* const synced_blocks = r.synced_blocks.data();
  int32_t* const synced_released = r.synced_released.data();
  const size_t num_attention = attention.size();
  for (size_t a = 0; a < num_attention; ++a) {
    GroupInfo& g = attention[a];
    const absl::Span<const BlockId> blocks = kv->BlockTableOrEmpty(r.id, g.id, r.kv_handle);
    const BlockId* const table = blocks.data();
    const int32_t size = static_cast<int32_t>(blocks.size());
    const int32_t ratio = g.ratio;
    int32_t* const row = g.table.data() + static_cast<size_t>(r.row) * g.stride;
    // Blocks a window released since the last copy are null now. (Only a window releases:
    // other tables are not read there, a line far from their end.)
    int32_t released = synced_released[a];
    while (g.kind == LayerKind::kSlidingWindow && released < size &&
           table[released] == kNullBlock) {
      std::fill(row + static_cast<size_t>(released) * ratio,
                row + static_cast<size_t>(released + 1) * ratio, 0);
      ++released;
    }
    synced_released[a] = released;
    std::vector<int32_t>& new_ids = out.attention[a].new_block_ids;
    for (int32_t i = std::max(synced_blocks[a], released); i < size; ++i) {
      if (table[i] == kNullBlock) continue;
      if (ratio == 1) {
        row[i] = table[i].value;
        new_ids.push_back(table[i].value);
        continue;
      }
      for (int32_t k = 0; k < ratio; ++k) {
        const int32_t id = table[i].value * ratio + k;
        row[static_cast<size_t>(i) * ratio + k] = id;
        new_ids.push_back(id);
      }
    }
    const int32_t synced = std::max(synced_blocks[a], size);
    synced_blocks[a] = synced;
    tokens = std::min<int64_t>(tokens, int64_t{synced} * g.block_size);
    if (g.kind == LayerKind::kSlidingWindow) {
      release = std::min<int64_t>(release, int64_t{released + 1} * g.block_size + g.window - 1);
    }
    if (a < 2) {
      // Block b covers positions [b·bs, (b + 1)·bs) at slots from id·bs.
      if (size > 0) {
        const int64_t last = size - 1;
        tail_from = std::max(tail_from, last * g.block_size);
        r.SlotDelta(a) = (int64_t{table[last].value} - last) * g.block_size;
      } else {
        tail_from = max_model_len;
        r.SlotDelta(a) = 0;
      }
    }
  }
  r.decode_from = static_cast<int32_t>(tail_from);  // at most max_model_len
  r.sync_tokens = tokens;
  r.sync_release = release;
  r.RefreshSteadyUntil();
}

absl::Status Scheduler::Impl::CheckTables() const {
  if (row_owner.size() != running.size()) {
    return absl::InternalError(absl::StrCat(row_owner.size(), " rows for ", running.size(),
                                            " running requests"));
  }
  for (size_t row = 0; row < row_owner.size(); ++row) {
    const SchedRequest& r = reqs[row_owner[row]];
    if (r.row != static_cast<int32_t>(row) || r.status != internal::RequestStatus::kRunning) {
      return absl::InternalError(absl::StrCat("row ", row, " belongs to request ", r.id.value,
                                              " whose row is ", r.row));
    }
    if (r.steady_until != r.SteadyBound()) {
      return absl::InternalError(absl::StrCat("request ", r.id.value, " keeps steady_until ",
                                              r.steady_until, ", not the least of its bounds"));
    }
    for (size_t a = 0; a < attention.size(); ++a) {
      const GroupInfo& g = attention[a];
      KVPAGE_ASSIGN_OR_RETURN(absl::Span<const BlockId> table, kv->BlockTable(r.id, g.id));
      const int32_t* data = g.table.data() + row * static_cast<size_t>(g.stride);
      for (int32_t i = 0; i < g.stride; ++i) {
        const size_t block = static_cast<size_t>(i / g.ratio);
        const int32_t want = block < table.size() && table[block] != kNullBlock
                                 ? table[block].value * g.ratio + i % g.ratio
                                 : 0;
        if (data[i] != want) {
          return absl::InternalError(absl::StrCat("row ", row, " of group ", g.id.value,
                                                  " has ", data[i], " at ", i, " where request ",
                                                  r.id.value, "'s table gives ", want));
        }
      }
    }
  }
  // Rows past the running requests stay zero (the next request starts from a clean row).
  for (const GroupInfo& g : attention) {
    const size_t begin = row_owner.size() * static_cast<size_t>(g.stride);
    const size_t end = std::min(g.table.size(), begin + (size_t{1} << 20));
    for (size_t i = begin; i < end; ++i) {
      if (g.table[i] != 0) {
        return absl::InternalError(absl::StrCat("unused table entry ", i, " of group ",
                                                g.id.value, " is ", g.table[i]));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvpage
