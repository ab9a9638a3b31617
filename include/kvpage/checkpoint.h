// The exact weight bytes of a local Hugging Face checkpoint, read from its safetensors files
// without loading a tensor.
//
// A safetensors file starts with an 8-byte little-endian header length N, then N bytes of JSON:
// one entry per tensor, {"dtype": "BF16", "shape": [4096, 4096], "data_offsets": [begin, end]},
// plus an optional "__metadata__" object. A tensor's bytes are `end − begin`, whatever its
// dtype, so quantized checkpoints (U8-packed MXFP4 or GPTQ weights, F8_E4M3, their scales)
// count exactly what they store. A sharded checkpoint lists its files in
// `model.safetensors.index.json` ("weight_map": tensor name → file); a single-file one is
// `model.safetensors`.
//
// The count is every tensor in the checkpoint: vision towers and MTP layers included, which a
// server that skips them does not load.
//
// Thread-safety: ReadCheckpointWeights reads files and holds no state; it is safe to call
// concurrently.
#ifndef KVPAGE_CHECKPOINT_H_
#define KVPAGE_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvpage {

struct CheckpointWeights {
  int64_t total_bytes = 0;  // sum over tensors of data_offsets[1] − data_offsets[0]
  int64_t num_tensors = 0;
  int32_t num_files = 0;
  std::map<std::string, int64_t> bytes_by_dtype;  // safetensors dtype name → bytes
};

// Reads `dir`/model.safetensors.index.json and the header of every file its weight_map names,
// or, without an index, the header of `dir`/model.safetensors.
// Errors: NotFound when `dir` holds neither file (the caller may fall back to a count from
// config.json); InvalidArgument naming the file and the field for a malformed index or header
// (a tensor of the weight_map missing from its file, a file name that leaves `dir`, an unknown
// dtype, offsets that overlap, leave the file or disagree with the shape).
absl::StatusOr<CheckpointWeights> ReadCheckpointWeights(const std::string& dir);

}  // namespace kvpage

#endif  // KVPAGE_CHECKPOINT_H_
