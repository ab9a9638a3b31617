// LayoutStepImage and WriteStepImage: one step's arrays packed back to back.
#include "kvpage/step_image.h"

#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace kvpage {

static_assert(std::is_trivially_copyable_v<TableRun> && sizeof(TableRun) == 16);
static_assert(std::is_trivially_copyable_v<SlotToZero> && sizeof(SlotToZero) == 8);
static_assert(std::is_trivially_copyable_v<StateCopy> && sizeof(StateCopy) == 12);

namespace {

// Hands out aligned byte offsets in order.
class Packer {
 public:
  template <typename T>
  ImageArray Add(size_t count) {
    const ImageArray a{.offset = end_, .count = static_cast<int64_t>(count)};
    const int64_t bytes = a.count * static_cast<int64_t>(sizeof(T));
    end_ += (bytes + kStepImageAlignment - 1) / kStepImageAlignment * kStepImageAlignment;
    return a;
  }
  int64_t end() const { return end_; }

 private:
  int64_t end_ = 0;
};

template <typename T>
void Put(absl::Span<std::byte> image, const ImageArray& a, const T* data) {
  if (a.count > 0) std::memcpy(image.data() + a.offset, data, a.count * sizeof(T));
}

}  // namespace

StepImageLayout LayoutStepImage(const SchedulerOutput& out) {
  Packer p;
  StepImageLayout l;
  l.query_start_loc = p.Add<int32_t>(out.query_start_loc.size());
  l.seq_lens = p.Add<int32_t>(out.seq_lens.size());
  for (const AttentionBatch& g : out.attention) {
    l.attention.push_back({.slot_mapping = p.Add<int64_t>(g.slot_mapping.size()),
                           .table_runs = p.Add<TableRun>(g.table_runs.size()),
                           .table_values = p.Add<int32_t>(g.table_values.size())});
  }
  for (const StateBatch& s : out.states) {
    l.states.push_back({.read_slots = p.Add<int32_t>(s.read_slots.size()),
                        .write_slots = p.Add<int32_t>(s.write_slots.size())});
  }
  l.slots_to_zero = p.Add<SlotToZero>(out.slots_to_zero.size());
  l.state_copies = p.Add<StateCopy>(out.state_copies.size());
  l.bytes = p.end();
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
  Put(image, layout.query_start_loc, out.query_start_loc.data());
  Put(image, layout.seq_lens, out.seq_lens.data());
  for (size_t a = 0; a < out.attention.size(); ++a) {
    const AttentionBatch& g = out.attention[a];
    Put(image, layout.attention[a].slot_mapping, g.slot_mapping.data());
    Put(image, layout.attention[a].table_runs, g.table_runs.data());
    Put(image, layout.attention[a].table_values, g.table_values.data());
  }
  for (size_t s = 0; s < out.states.size(); ++s) {
    Put(image, layout.states[s].read_slots, out.states[s].read_slots.data());
    Put(image, layout.states[s].write_slots, out.states[s].write_slots.data());
  }
  Put(image, layout.slots_to_zero, out.slots_to_zero.data());
  Put(image, layout.state_copies, out.state_copies.data());
  return layout;
}

}  // namespace kvpage
