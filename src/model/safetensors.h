// One safetensors file's header: its tensors, their dtypes and byte sizes
// (format: kvpage/checkpoint.h).
#ifndef KVPAGE_MODEL_SAFETENSORS_H_
#define KVPAGE_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvpage/checkpoint.h"

namespace kvpage::internal {

// The format's own bound on a header (safetensors' MAX_HEADER_SIZE, 100,000,000 bytes).
inline constexpr int64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsFile {
  CheckpointWeights weights;    // num_files 1
  std::set<std::string> names;  // tensor names, "__metadata__" excluded
};

// Parses the JSON header of a file whose data section (what follows the header) is
// `data_bytes` long. Tensors must tile the data section exactly, as the format requires:
// sorted by offset they start at 0, each begins where the previous one ends, the last ends at
// `data_bytes`; and each one's size must be ceil(elements × bits / 8) for its dtype.
// Errors: InvalidArgument naming `source`, the tensor and the field.
absl::StatusOr<SafetensorsFile> ParseSafetensorsHeader(absl::string_view header_json,
                                                       int64_t data_bytes,
                                                       absl::string_view source);

// Reads the length prefix and header of the file at `path` (not its data).
// Errors: NotFound if it cannot be opened; InvalidArgument for a short file, a header length
// beyond the file or kMaxSafetensorsHeaderBytes, or ParseSafetensorsHeader's errors.
absl::StatusOr<SafetensorsFile> ReadSafetensorsFile(const std::string& path);

}  // namespace kvpage::internal

#endif  // KVPAGE_MODEL_SAFETENSORS_H_
