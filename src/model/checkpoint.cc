#include "kvpage/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace kvpage {
namespace {

constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";

// The weight_map of an index: file name → the tensors it must hold. A file name must be a
// plain name inside the checkpoint directory (no '/', no "..").
absl::StatusOr<std::map<std::string, std::set<std::string>>> ReadIndex(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json root =
      nlohmann::json::parse(text.str(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  const auto map = root.find("weight_map");
  if (map == root.end() || !map->is_object() || map->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": weight_map must be a non-empty object of tensor name -> file"));
  }
  std::map<std::string, std::set<std::string>> files;
  for (const auto& [tensor, file] : map->items()) {
    if (!file.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": weight_map[\"", tensor, "\"] is not a file name"));
    }
    const std::string name = file.get<std::string>();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": weight_map[\"", tensor, "\"] = \"", name, "\" is not a file of the checkpoint"));
    }
    files[name].insert(tensor);
  }
  return files;
}

void Add(const CheckpointWeights& from, CheckpointWeights& to) {
  to.total_bytes += from.total_bytes;
  to.num_tensors += from.num_tensors;
  to.num_files += from.num_files;
  for (const auto& [dtype, bytes] : from.bytes_by_dtype) to.bytes_by_dtype[dtype] += bytes;
}

}  // namespace

absl::StatusOr<CheckpointWeights> ReadCheckpointWeights(const std::string& dir) {
  std::error_code ec;
  const std::filesystem::path root(dir);
  if (!std::filesystem::is_directory(root, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory '", dir, "' does not exist"));
  }
  const std::filesystem::path index = root / kIndexFile;
  if (!std::filesystem::is_regular_file(index, ec)) {
    const std::filesystem::path single = root / kSingleFile;
    if (!std::filesystem::is_regular_file(single, ec)) {
      return absl::NotFoundError(absl::StrCat("'", dir, "' holds neither ", kIndexFile, " nor ",
                                              kSingleFile));
    }
    KVPAGE_ASSIGN_OR_RETURN(const internal::SafetensorsFile file,
                            internal::ReadSafetensorsFile(single.string()));
    return file.weights;
  }
  KVPAGE_ASSIGN_OR_RETURN(const auto files, ReadIndex(index.string()));
  CheckpointWeights total;
  for (const auto& [name, tensors] : files) {
    const std::string path = (root / name).string();
    absl::StatusOr<internal::SafetensorsFile> file = internal::ReadSafetensorsFile(path);
    if (absl::IsNotFound(file.status())) {
      return absl::InvalidArgumentError(
          absl::StrCat(index.string(), " names ", name, ", which cannot be read"));
    }
    KVPAGE_RETURN_IF_ERROR(file.status());
    for (const std::string& tensor : tensors) {
      if (!file->names.contains(tensor)) {
        return absl::InvalidArgumentError(absl::StrCat(
            index.string(), ": tensor '", tensor, "' is mapped to ", name, ", which lacks it"));
      }
    }
    Add(file->weights, total);
  }
  return total;
}

}  // namespace kvpage
