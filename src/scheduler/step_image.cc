// LayoutStepImage and WriteStepImage: one step's arrays packed back to back.
#include "kvpage/step_image.h"

#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace kvpage {

static_assert(std::is_trivially_copyable_v<TableRun> && sizeof(TableRun) == 16);
static_assert(std::is_trivially_copyable_v<SlotToZero> && sizeof(SlotToZero) == 8);

namespace {

// Calls f(layout's entry, the values it places) for every array of `out`, in image order: the
// one list of the image's arrays that laying out and writing both follow. The arrays the
// attention and state kernels read come first: their sizes depend only on the (padded) row
// and token counts, so a CUDA graph captured on one step finds them at the same offsets in
// every step of its size. The table runs and slots to zero, which vary per step and are
// applied before the forward pass, follow.
template <typename F>
void ForEachArray(const SchedulerOutput& out, StepImageLayout& l, F&& f) {
  l.attention.resize(out.attention.size());
  l.states.resize(out.states.size());
  f(l.query_start_loc, out.query_start_loc);
  f(l.seq_lens, out.seq_lens);
  for (size_t a = 0; a < out.attention.size(); ++a) {
    f(l.attention[a].slot_mapping, out.attention[a].slot_mapping);
  }
  for (size_t s = 0; s < out.states.size(); ++s) {
    f(l.states[s].read_slots, out.states[s].read_slots);
    f(l.states[s].write_slots, out.states[s].write_slots);
  }
  for (size_t a = 0; a < out.attention.size(); ++a) {
    f(l.attention[a].table_runs, out.attention[a].table_runs);
    f(l.attention[a].table_values, out.attention[a].table_values);
  }
  f(l.slots_to_zero, out.slots_to_zero);
}

}  // namespace

StepImageLayout LayoutStepImage(const SchedulerOutput& out) {
  StepImageLayout l;
  ForEachArray(out, l, [&l](ImageArray& a, const auto& values) {
    a = ImageArray{.offset = l.bytes, .count = static_cast<int64_t>(values.size())};
    const int64_t bytes = a.count * static_cast<int64_t>(sizeof(values[0]));
    l.bytes += (bytes + kStepImageAlignment - 1) / kStepImageAlignment * kStepImageAlignment;
  });
  return l;
}

absl::StatusOr<StepImageLayout> WriteStepImage(const SchedulerOutput& out,
                                               absl::Span<std::byte> image) {
  StepImageLayout layout = LayoutStepImage(out);
  if (static_cast<int64_t>(image.size()) < layout.bytes) {
    return absl::InvalidArgumentError(absl::StrCat("step ", out.step, "'s image of ",
                                                   layout.bytes, " bytes does not fit in ",
                                                   image.size()));
  }
  ForEachArray(out, layout, [image](ImageArray& a, const auto& values) {
    const size_t bytes = values.size() * sizeof(values[0]);
    if (bytes > 0) std::memcpy(image.data() + a.offset, values.data(), bytes);
  });
  return layout;
}

}  // namespace kvpage
