// The batch's device-ready tables: one persistent row per running request, in every attention
// group, copied from the KV cache's tables as they change.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "scheduler/scheduler_impl.h"

namespace kvpage {

using internal::SchedRequest;

void Scheduler::Impl::InitTables() {
  const size_t rows = static_cast<size_t>(config.max_num_seqs);
  SchedulerOutput& out = outputs[0];
  out.attention.clear();
  for (GroupInfo& g : attention) {
    g.stride = static_cast<int32_t>((max_model_len + g.block_size - 1) / g.block_size) * g.ratio;
    g.table.assign(rows * static_cast<size_t>(g.stride), 0);
    g.sync.assign(rows, internal::RowSync{});
    g.changed.assign(rows, {0, 0});
    g.changed_rows.clear();
    out.attention.push_back(AttentionBatch{.group = g.id,
                                           .kind = kv->group_kind(g.id),
                                           .kernel_block_size = g.block_size / g.ratio,
                                           .window = kv->group_window(g.id),
                                           .max_blocks_per_row = g.stride});
  }
  out.states.clear();
  for (GroupId g : state_groups) out.states.push_back(StateBatch{.group = g});
  outputs[1] = out;
  row_owner.reserve(rows);
}

void Scheduler::Impl::TakeRow(int32_t q) {
  SchedRequest& r = reqs[q];
  r.row = static_cast<int32_t>(row_owner.size());
  row_owner.push_back(q);
  for (GroupInfo& g : attention) g.sync[r.row] = internal::RowSync{};
  r.row_stale = true;
}

void Scheduler::Impl::FreeRow(int32_t q) {
  SchedRequest& r = reqs[q];
  const int32_t row = r.row;
  const int32_t last = static_cast<int32_t>(row_owner.size()) - 1;
  const int32_t mover = row_owner[last];
  for (GroupInfo& g : attention) {
    int32_t* dst = g.table.data() + static_cast<size_t>(row) * g.stride;
    int32_t* src = g.table.data() + static_cast<size_t>(last) * g.stride;
    const int32_t freed = g.sync[row].blocks * g.ratio;
    std::fill(dst, dst + freed, 0);
    g.MarkChanged(row, 0, freed);
    if (row != last) {
      const int32_t used = g.sync[last].blocks * g.ratio;
      std::copy_n(src, used, dst);
      std::fill(src, src + used, 0);
      g.MarkChanged(row, 0, used);
      g.MarkChanged(last, 0, used);
      g.sync[row] = g.sync[last];
    }
    g.sync[last] = internal::RowSync{};
  }
  if (row != last) {
    row_owner[row] = mover;
    reqs[mover].row = row;
    pending_row_moves.emplace_back(last, row);
  }
  row_owner.pop_back();
  r.row = -1;
}

void Scheduler::Impl::SyncRow(SchedRequest& r) {
  for (GroupInfo& g : attention) {
    const absl::StatusOr<absl::Span<const BlockId>> blocks = kv->BlockTable(r.kv, g.id);
    KVPAGE_DCHECK(blocks.ok());
    if (!blocks.ok()) continue;
    const absl::Span<const BlockId> table = *blocks;
    const int32_t size = static_cast<int32_t>(table.size());
    int32_t* const row = g.table.data() + static_cast<size_t>(r.row) * g.stride;
    internal::RowSync& sync = g.sync[r.row];
    // Blocks a window released since the last copy are null now.
    const int32_t released = sync.released;
    while (sync.released < size && table[sync.released] == kNullBlock) {
      std::fill_n(row + static_cast<size_t>(sync.released) * g.ratio, g.ratio, 0);
      ++sync.released;
    }
    g.MarkChanged(r.row, released * g.ratio, std::min(sync.released, sync.blocks) * g.ratio);
    const int32_t first_new = std::max(sync.blocks, sync.released);
    g.MarkChanged(r.row, first_new * g.ratio, size * g.ratio);
    for (int32_t i = first_new; i < size; ++i) {
      if (table[i] == kNullBlock) continue;
      int32_t* const entries = row + static_cast<size_t>(i) * g.ratio;
      for (int32_t k = 0; k < g.ratio; ++k) {
        entries[k] = KvCacheManager::KernelBlock(table[i], g.ratio, k);
      }
    }
    sync.blocks = std::max(sync.blocks, size);
    // Slots run on within a block: the last one's slot of p is p plus this.
    const int64_t last_start = int64_t{size - 1} * g.block_size;
    sync.last_block_offset =
        size > 0 ? KvCacheManager::SlotOf(table[size - 1], g.block_size, last_start) - last_start
                 : 0;
  }
  r.row_stale = false;
}

void Scheduler::Impl::GroupInfo::MarkChanged(int32_t row, int32_t lo, int32_t hi) {
  if (lo >= hi) return;
  std::pair<int32_t, int32_t>& c = changed[row];
  if (c.first >= c.second) {
    changed_rows.push_back(row);
    c = {lo, hi};
  } else {
    c = {std::min(c.first, lo), std::max(c.second, hi)};
  }
}

void Scheduler::Impl::WriteTableRuns(GroupInfo& g, AttentionBatch& batch) {
  batch.table_runs.clear();
  batch.table_values.clear();
  for (int32_t row : g.changed_rows) {
    auto& [lo, hi] = g.changed[row];
    const int32_t offset = static_cast<int32_t>(batch.table_values.size());
    batch.table_runs.push_back(
        TableRun{.row = row, .first = lo, .count = hi - lo, .value_offset = offset});
    const int32_t* entries = g.table.data() + static_cast<size_t>(row) * g.stride;
    batch.table_values.insert(batch.table_values.end(), entries + lo, entries + hi);
    lo = hi = 0;
  }
  g.changed_rows.clear();
}

absl::Status ApplyTableRuns(const AttentionBatch& batch, absl::Span<int32_t> table) {
  const int64_t stride = batch.max_blocks_per_row;
  for (const TableRun& run : batch.table_runs) {
    const int64_t begin = run.row * stride + run.first;
    if (run.row < 0 || run.first < 0 || run.count < 0 || run.first + int64_t{run.count} > stride ||
        begin + run.count > static_cast<int64_t>(table.size()) || run.value_offset < 0 ||
        run.value_offset + int64_t{run.count} > static_cast<int64_t>(batch.table_values.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table run (row ", run.row, ", first ", run.first, ", count ", run.count,
          ", value offset ", run.value_offset, ") falls outside a table of ", table.size(),
          " entries in rows of ", stride, " or ", batch.table_values.size(), " values"));
    }
    std::copy_n(batch.table_values.begin() + run.value_offset, run.count, table.begin() + begin);
  }
  return absl::OkStatus();
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
    for (const GroupInfo& g : attention) {
      KVPAGE_ASSIGN_OR_RETURN(absl::Span<const BlockId> table, kv->BlockTable(r.kv, g.id));
      const int32_t* data = g.table.data() + row * static_cast<size_t>(g.stride);
      for (int32_t i = 0; i < g.stride; ++i) {
        const size_t block = static_cast<size_t>(i / g.ratio);
        const int32_t want = block < table.size() && table[block] != kNullBlock
                                 ? KvCacheManager::KernelBlock(table[block], g.ratio, i % g.ratio)
                                 : 0;
        if (data[i] != want) {
          return absl::InternalError(absl::StrCat("row ", row, " of group ", g.id.value,
                                                  " has ", data[i], " at ", i, " where request ",
                                                  r.id.value, "'s table gives ", want));
        }
      }
    }
  }
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
