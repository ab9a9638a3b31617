// CUDA-graph padding: a step's arrays grown to the captured sizes at or above its own, with
// the padding inert for the kernels (vLLM's model runner pads the same way: query_start_loc
// repeated, seq_lens 0, slot_mapping -1).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "scheduler/scheduler_impl.h"

namespace kvpage {

namespace internal {

absl::Status ValidateCaptureSizes(absl::string_view name, absl::Span<const int32_t> sizes,
                                  absl::string_view limit_name, int32_t limit) {
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 1 || sizes[i] > limit) {
      return absl::InvalidArgumentError(absl::StrCat(name, "[", i, "] = ", sizes[i],
                                                     " must be in [1, ", limit_name, " = ",
                                                     limit, "]"));
    }
    if (i > 0 && sizes[i] <= sizes[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(name, "[", i, "] = ", sizes[i],
                                                     " must be above ", name, "[", i - 1,
                                                     "] = ", sizes[i - 1],
                                                     " (sizes strictly increasing)"));
    }
  }
  return absl::OkStatus();
}

int32_t PaddedSize(absl::Span<const int32_t> sizes, int32_t n) {
  if (sizes.empty()) return n;
  const auto it = std::lower_bound(sizes.begin(), sizes.end(), n);
  return it == sizes.end() ? -1 : *it;
}

}  // namespace internal

void Scheduler::Impl::PadForCudaGraph() {
  SchedulerOutput& o = Out();
  const int32_t tokens = static_cast<int32_t>(o.total_num_scheduled_tokens);
  o.padded = false;
  o.num_padded_rows = o.num_rows;
  o.num_padded_tokens = tokens;
  if (config.cuda_graph_row_sizes.empty() && config.cuda_graph_token_sizes.empty()) return;
  const int32_t rows = internal::PaddedSize(config.cuda_graph_row_sizes, o.num_rows);
  const int32_t padded_tokens = internal::PaddedSize(config.cuda_graph_token_sizes, tokens);
  if (rows < 0 || padded_tokens < 0) return;  // above the largest captured size: eager
  o.padded = true;
  o.num_padded_rows = rows;
  o.num_padded_tokens = padded_tokens;
  const size_t r = static_cast<size_t>(rows);
  o.query_start_loc.resize(r + 1, tokens);
  o.seq_lens.resize(r, 0);
  for (size_t a = 0; a < attention.size(); ++a) {
    // Rows past the running ones are all zeros (CheckTables), and the table has max_num_seqs
    // rows, at least any configured row size.
    o.attention[a].block_table = absl::MakeConstSpan(attention[a].table.data(),
                                                     r * static_cast<size_t>(attention[a].stride));
    o.attention[a].slot_mapping.resize(static_cast<size_t>(padded_tokens), -1);
  }
  for (StateBatch& sb : o.states) {
    sb.read_slots.resize(r, -1);
    sb.write_slots.resize(r, -1);
  }
}

}  // namespace kvpage
