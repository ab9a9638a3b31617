// DeviceStepTables (include/kvpage/cuda/device_step_tables.h).
#include "kvpage/cuda/device_step_tables.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kvpage/cuda/table_runs.h"

namespace kvpage::cuda {
namespace {

static_assert(sizeof(TableRun) == sizeof(TableRunView) &&
              offsetof(TableRun, value_offset) == offsetof(TableRunView, value_offset));

absl::Status Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string msg = absl::StrCat("DeviceStepTables: ", what, ": ", cudaGetErrorName(err));
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    return absl::UnavailableError(msg);
  }
  return absl::InternalError(msg);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceStepTables>> DeviceStepTables::Create(int32_t max_rows) {
  if (max_rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_rows must be >= 1, got ", max_rows));
  }
  return std::unique_ptr<DeviceStepTables>(new DeviceStepTables(max_rows));
}

DeviceStepTables::~DeviceStepTables() {
  for (Pinned& p : pinned_) {
    if (p.copied != nullptr) cudaEventSynchronize(p.copied);
    if (p.copied != nullptr) cudaEventDestroy(p.copied);
    if (p.data != nullptr) cudaFreeHost(p.data);
  }
  if (image_ != nullptr) cudaFree(image_);
  for (int32_t* t : tables_) cudaFree(t);
}

absl::Status DeviceStepTables::AllocateTables(const SchedulerOutput& out) {
  for (const AttentionBatch& g : out.attention) {
    const size_t bytes = static_cast<size_t>(max_rows_) * g.max_blocks_per_row * sizeof(int32_t);
    void* table = nullptr;
    absl::Status s = Check(cudaMalloc(&table, bytes), "cudaMalloc of a block table");
    if (!s.ok()) return s;
    tables_.push_back(static_cast<int32_t*>(table));
    strides_.push_back(g.max_blocks_per_row);
    s = Check(cudaMemset(table, 0, bytes), "cudaMemset of a block table");
    if (!s.ok()) return s;
  }
  for (Pinned& p : pinned_) {
    absl::Status s = Check(cudaEventCreateWithFlags(&p.copied, cudaEventDisableTiming),
                           "cudaEventCreate");
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status DeviceStepTables::Reserve(int64_t bytes, cudaStream_t stream) {
  Pinned& p = pinned_[next_pinned_];
  if (p.capacity < bytes) {
    if (p.data != nullptr) cudaFreeHost(p.data);
    p.data = nullptr;
    p.capacity = 0;
    void* data = nullptr;
    absl::Status s = Check(cudaHostAlloc(&data, static_cast<size_t>(bytes) * 2, 0),
                           "cudaHostAlloc of the staging buffer");
    if (!s.ok()) return s;
    p.data = static_cast<std::byte*>(data);
    p.capacity = bytes * 2;
  }
  if (image_capacity_ < bytes) {
    // The previous step's kernels may still read the old image.
    absl::Status s = Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    if (!s.ok()) return s;
    if (image_ != nullptr) cudaFree(image_);
    image_ = nullptr;
    image_capacity_ = 0;
    void* image = nullptr;
    s = Check(cudaMalloc(&image, static_cast<size_t>(bytes) * 2), "cudaMalloc of the image");
    if (!s.ok()) return s;
    image_ = static_cast<std::byte*>(image);
    image_capacity_ = bytes * 2;
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> DeviceStepTables::Upload(const SchedulerOutput& out,
                                                 cudaStream_t stream) {
  const int32_t rows = std::max(out.num_rows, out.num_padded_rows);  // padded for CUDA graphs
  if (rows > max_rows_) {
    return absl::InvalidArgumentError(absl::StrCat("step ", out.step, " has ", rows,
                                                   " rows, more than max_rows ", max_rows_));
  }
  if (!allocated_) {
    allocated_ = true;  // a failure leaves the object unusable (see the header)
    absl::Status s = AllocateTables(out);
    if (!s.ok()) return s;
  }
  for (size_t a = 0; a < out.attention.size() || a < strides_.size(); ++a) {
    if (a >= out.attention.size() || a >= strides_.size() ||
        out.attention[a].max_blocks_per_row != strides_[a]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step ", out.step, " has ", out.attention.size(), " attention groups or strides "
          "other than the first upload's (", strides_.size(), " groups)"));
    }
  }
  // The copy out of this buffer two uploads ago must be done before it is written again.
  Pinned& p = pinned_[next_pinned_];
  absl::Status s = Check(cudaEventSynchronize(p.copied), "cudaEventSynchronize");
  if (!s.ok()) return s;
  const int64_t bytes = LayoutStepImage(out).bytes;
  s = Reserve(bytes, stream);
  if (!s.ok()) return s;
  absl::StatusOr<StepImageLayout> layout =
      WriteStepImage(out, absl::MakeSpan(p.data, static_cast<size_t>(p.capacity)));
  if (!layout.ok()) return layout.status();
  layout_ = *std::move(layout);
  s = Check(cudaMemcpyAsync(image_, p.data, static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                            stream),
            "cudaMemcpyAsync of the step image");
  if (!s.ok()) return s;
  s = Check(cudaEventRecord(p.copied, stream), "cudaEventRecord");
  if (!s.ok()) return s;
  next_pinned_ ^= 1;
  for (size_t a = 0; a < out.attention.size(); ++a) {
    const StepImageLayout::Attention& g = layout_.attention[a];
    s = ApplyTableRuns(At<TableRunView>(g.table_runs), static_cast<int32_t>(g.table_runs.count),
                       At<int32_t>(g.table_values), tables_[a], strides_[a], stream);
    if (!s.ok()) return s;
  }
  uploaded_ = true;
  return bytes;
}

template <typename T>
const T* DeviceStepTables::At(const ImageArray& a) const {
  return reinterpret_cast<const T*>(image_ + a.offset);
}

const int32_t* DeviceStepTables::block_table(size_t a) const {
  return uploaded_ && a < tables_.size() ? tables_[a] : nullptr;
}
const int64_t* DeviceStepTables::slot_mapping(size_t a) const {
  return uploaded_ && a < layout_.attention.size() ? At<int64_t>(layout_.attention[a].slot_mapping)
                                                   : nullptr;
}
const int32_t* DeviceStepTables::query_start_loc() const {
  return uploaded_ ? At<int32_t>(layout_.query_start_loc) : nullptr;
}
const int32_t* DeviceStepTables::seq_lens() const {
  return uploaded_ ? At<int32_t>(layout_.seq_lens) : nullptr;
}
const int32_t* DeviceStepTables::read_slots(size_t s) const {
  return uploaded_ && s < layout_.states.size() ? At<int32_t>(layout_.states[s].read_slots)
                                                : nullptr;
}
const int32_t* DeviceStepTables::write_slots(size_t s) const {
  return uploaded_ && s < layout_.states.size() ? At<int32_t>(layout_.states[s].write_slots)
                                                : nullptr;
}

}  // namespace kvpage::cuda
