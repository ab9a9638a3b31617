// StepImage: one scheduler step packed into one contiguous buffer, so that a server uploads the
// whole batch description with a single host-to-device copy from pinned memory.
//
// The image holds, in this order, each array at a 16-byte-aligned byte offset:
//   query_start_loc, seq_lens                int32 [num_padded_rows + 1], [num_padded_rows]
//   per attention group: slot_mapping        int64 [num_padded_tokens]
//   per state group:     read_slots, write_slots   int32 [num_padded_rows]
//   per attention group: table_runs          TableRun (4 x int32) [runs]
//                        table_values        int32 [values]
//   slots_to_zero                            SlotToZero (2 x int32)
// What the kernels read comes first, sized by the padded row and token counts alone: two
// steps with the same (num_padded_rows, num_padded_tokens) have those arrays at the same
// offsets, so a CUDA graph captured on one replays on the other
// (SchedulerConfig::cuda_graph_row_sizes). The table runs and slots to zero, applied before
// the forward pass, vary per step and come last.
// The block tables themselves are not in it: the device keeps one persistent copy per
// attention group and patches it with the step's table runs (AttentionBatch::table_runs), so a
// decode step uploads bytes in proportion to the rows that changed, not to
// num_rows x max_blocks_per_row.
//
//   staging.resize(kvpage::LayoutStepImage(out).bytes);   // pinned memory in a real server
//   KVPAGE_ASSIGN_OR_RETURN(kvpage::StepImageLayout layout,
//                           kvpage::WriteStepImage(out, absl::MakeSpan(staging)));
//   cudaMemcpyAsync(device_image, staging.data(), layout.bytes, cudaMemcpyHostToDevice, stream);
//   // then patch each group's table with kvpage::cuda::ApplyTableRuns (kvpage/cuda/table_runs.h)
#ifndef KVPAGE_STEP_IMAGE_H_
#define KVPAGE_STEP_IMAGE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvpage/scheduler.h"

namespace kvpage {

// Where each array of one step sits in its image: a byte offset and an element count.
struct ImageArray {
  int64_t offset = 0;
  int64_t count = 0;
};

struct StepImageLayout {
  struct Attention {
    ImageArray slot_mapping;  // int64
    ImageArray table_runs;    // TableRun
    ImageArray table_values;  // int32
  };
  struct State {
    ImageArray read_slots;   // int32
    ImageArray write_slots;  // int32
  };
  ImageArray query_start_loc;  // int32
  ImageArray seq_lens;         // int32
  std::vector<Attention> attention;  // as SchedulerOutput::attention
  std::vector<State> states;         // as SchedulerOutput::states
  ImageArray slots_to_zero;  // SlotToZero
  int64_t bytes = 0;         // the whole image
};

// Every array's byte offset is a multiple of this.
inline constexpr int64_t kStepImageAlignment = 16;

// The layout of `out`'s image.
StepImageLayout LayoutStepImage(const SchedulerOutput& out);

// Writes `out`'s image to image[0, LayoutStepImage(out).bytes) and returns its layout.
// InvalidArgument if `image` is smaller.
absl::StatusOr<StepImageLayout> WriteStepImage(const SchedulerOutput& out,
                                               absl::Span<std::byte> image);

}  // namespace kvpage

#endif  // KVPAGE_STEP_IMAGE_H_
