#include <algorithm>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvpage/catalog.h"
#include "model/bundled_data.h"

namespace kvpage {

std::vector<std::string> BundledModelNames() {
  std::vector<std::string> names;
  for (const internal::BundledFile& f : internal::BundledModelFiles()) {
    names.emplace_back(f.name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<ModelSpec> LoadModel(absl::string_view name_or_path) {
  for (const internal::BundledFile& f : internal::BundledModelFiles()) {
    if (f.name == name_or_path) {
      return ParseModelSpec(f.text, f.name, absl::StrCat("bundled:", f.name));
    }
  }
  std::error_code ec;
  if (std::filesystem::is_regular_file(std::string(name_or_path), ec)) {
    return LoadModelSpecFromFile(std::string(name_or_path));
  }
  return absl::NotFoundError(absl::StrCat("unknown model '", name_or_path,
                                          "': not a bundled model (",
                                          absl::StrJoin(BundledModelNames(), ", "),
                                          ") and not a readable config.json path"));
}

}  // namespace kvpage
