// DeviceStepTables: a scheduler step's batch on the GPU, uploaded with one copy per step.
//
// Each Upload packs the output into its step image (kvpage/step_image.h) in pinned host memory,
// copies it to the device with one cudaMemcpyAsync on the server's stream, and patches the
// persistent per-group block tables with the step's table runs (kvpage/cuda/table_runs.h). The
// accessors then give device pointers for the kernels of that step. A decode step moves
// O(rows) bytes of offsets, lengths and slots plus 20 bytes per row whose table changed, never
// the whole tables (docs/integration.md §2.1).
//
//   auto tables = kvpage::cuda::DeviceStepTables::Create(config.max_num_seqs);
//   const kvpage::SchedulerOutput& out = scheduler.Schedule();
//   KVPAGE_RETURN_IF_ERROR((*tables)->Upload(out, stream).status());
//   // kernels on `stream`: (*tables)->block_table(0), slot_mapping(0), seq_lens(), ...
//
// Run the step's kernels on `stream` (or make their stream wait on it): the next Upload
// overwrites the device image. Two pinned buffers alternate, so packing step k + 1 waits only
// for step k − 1's copy. Built only with KVPAGE_BUILD_CUDA; not thread-safe.
#ifndef KVPAGE_CUDA_DEVICE_STEP_TABLES_H_
#define KVPAGE_CUDA_DEVICE_STEP_TABLES_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvpage/scheduler.h"
#include "kvpage/step_image.h"

namespace kvpage::cuda {

class DeviceStepTables {
 public:
  // Tables for up to `max_rows` rows (SchedulerConfig::max_num_seqs), allocated on the current
  // device at the first Upload. InvalidArgument for max_rows < 1.
  static absl::StatusOr<std::unique_ptr<DeviceStepTables>> Create(int32_t max_rows);
  ~DeviceStepTables();
  DeviceStepTables(const DeviceStepTables&) = delete;
  DeviceStepTables& operator=(const DeviceStepTables&) = delete;

  // Uploads `out` on `stream` and returns the bytes copied. InvalidArgument when `out` has more
  // rows than max_rows or other groups or row strides than the first upload's; a CUDA error
  // (out of memory, no device) otherwise, after which the tables must be recreated.
  absl::StatusOr<int64_t> Upload(const SchedulerOutput& out, cudaStream_t stream);

  // Device pointers of the last upload (null before it). Per attention group a, in
  // SchedulerOutput::attention order: int32 [max_rows, max_blocks_per_row] and int64 [tokens].
  const int32_t* block_table(size_t a) const;
  const int64_t* slot_mapping(size_t a) const;
  const int32_t* query_start_loc() const;  // int32 [num_padded_rows + 1]
  const int32_t* seq_lens() const;         // int32 [num_padded_rows]
  // Per state group s: int32 [num_padded_rows].
  const int32_t* read_slots(size_t s) const;
  const int32_t* write_slots(size_t s) const;
  const StepImageLayout& layout() const { return layout_; }

 private:
  explicit DeviceStepTables(int32_t max_rows) : max_rows_(max_rows) {}
  absl::Status AllocateTables(const SchedulerOutput& out);
  absl::Status Reserve(int64_t bytes, cudaStream_t stream);
  template <typename T>
  const T* At(const ImageArray& a) const;

  struct Pinned {
    std::byte* data = nullptr;
    int64_t capacity = 0;
    cudaEvent_t copied = nullptr;  // the last copy out of it
  };
  const int32_t max_rows_;
  std::vector<int32_t> strides_;    // per attention group, from the first upload
  std::vector<int32_t*> tables_;    // per attention group, on the device
  Pinned pinned_[2];
  int next_pinned_ = 0;
  std::byte* image_ = nullptr;      // on the device
  int64_t image_capacity_ = 0;
  StepImageLayout layout_;
  bool allocated_ = false;
  bool uploaded_ = false;
};

}  // namespace kvpage::cuda

#endif  // KVPAGE_CUDA_DEVICE_STEP_TABLES_H_
