#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "internal/status_macros.h"
#include "kvpage/catalog.h"
#include "model/bundled_data.h"
#include "nlohmann/json.hpp"

namespace kvpage {
namespace {

absl::Status FieldError(absl::string_view source, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": field '", field, "' ", what));
}

absl::StatusOr<int64_t> ReadCount(const nlohmann::json& obj, absl::string_view source,
                                  const std::string& field, bool allow_zero) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return FieldError(source, field, "is missing");
  if (!it->is_number_integer()) {
    return FieldError(source, field, absl::StrCat("must be an integer, got ", it->dump()));
  }
  const int64_t v = it->get<int64_t>();
  if (v < 0 || (v == 0 && !allow_zero)) {
    return FieldError(source, field,
                      absl::StrCat(allow_zero ? "must be >= 0" : "must be positive", ", got ", v));
  }
  return v;
}

// An optional number in [lo, hi]; `*out` keeps its default when the field is absent.
absl::Status ReadOptionalReal(const nlohmann::json& obj, absl::string_view source,
                              const std::string& field, double lo, double hi, double* out) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) {
    return FieldError(source, field, absl::StrCat("must be a number, got ", it->dump()));
  }
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi)) {
    return FieldError(source, field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
  }
  *out = v;
  return absl::OkStatus();
}

// "roofline": {"mfu", "hbm_efficiency", "step_overhead_us", "layer_overhead_us",
// "request_overhead_us"}. Efficiencies must be in (0, 1]; overheads in [0, 1 s].
absl::Status ReadRoofline(const nlohmann::json& root, absl::string_view source,
                          RooflineFactors* out) {
  auto it = root.find("roofline");
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return FieldError(source, "roofline", "must be an object");
  const std::string src = absl::StrCat(source, " roofline");
  constexpr double kTiny = 1e-6;
  KVPAGE_RETURN_IF_ERROR(ReadOptionalReal(*it, src, "mfu", kTiny, 1.0, &out->mfu));
  KVPAGE_RETURN_IF_ERROR(
      ReadOptionalReal(*it, src, "hbm_efficiency", kTiny, 1.0, &out->hbm_efficiency));
  double us[3] = {out->step_overhead_s * 1e6, out->layer_overhead_s * 1e6,
                  out->request_overhead_s * 1e6};
  const char* names[3] = {"step_overhead_us", "layer_overhead_us", "request_overhead_us"};
  for (int i = 0; i < 3; ++i) {
    KVPAGE_RETURN_IF_ERROR(ReadOptionalReal(*it, src, names[i], 0.0, 1e6, &us[i]));
  }
  out->step_overhead_s = us[0] * 1e-6;
  out->layer_overhead_s = us[1] * 1e-6;
  out->request_overhead_s = us[2] * 1e-6;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GpuSpec> ParseGpuSpec(absl::string_view json_text, absl::string_view source) {
  nlohmann::json root = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  GpuSpec gpu;
  auto name = root.find("name");
  if (name == root.end() || name->is_null()) return FieldError(source, "name", "is missing");
  if (!name->is_string()) return FieldError(source, "name", "must be a string");
  gpu.name = name->get<std::string>();
  if (auto aliases = root.find("aliases"); aliases != root.end()) {
    if (!aliases->is_array()) return FieldError(source, "aliases", "must be an array");
    for (const auto& a : *aliases) {
      if (!a.is_string()) return FieldError(source, "aliases", "must hold strings");
      gpu.aliases.push_back(a.get<std::string>());
    }
  }
  KVPAGE_ASSIGN_OR_RETURN(gpu.memory_bytes, ReadCount(root, source, "memory_bytes", false));
  KVPAGE_ASSIGN_OR_RETURN(gpu.hbm_bandwidth_bytes_per_s,
                          ReadCount(root, source, "hbm_bandwidth_bytes_per_s", false));
  auto flops = root.find("peak_dense_flops");
  if (flops == root.end() || !flops->is_object()) {
    return FieldError(source, "peak_dense_flops", "must be an object");
  }
  const std::string flops_source = absl::StrCat(source, " peak_dense_flops");
  KVPAGE_ASSIGN_OR_RETURN(gpu.peak_dense_flops_bf16, ReadCount(*flops, flops_source, "bf16", false));
  KVPAGE_ASSIGN_OR_RETURN(gpu.peak_dense_flops_fp16, ReadCount(*flops, flops_source, "fp16", false));
  KVPAGE_ASSIGN_OR_RETURN(gpu.peak_dense_flops_fp8, ReadCount(*flops, flops_source, "fp8", true));
  KVPAGE_RETURN_IF_ERROR(ReadRoofline(root, source, &gpu.roofline));
  return gpu;
}

std::vector<std::string> BundledGpuNames() {
  std::vector<std::string> names;
  for (const internal::BundledFile& f : internal::BundledHardwareFiles()) names.emplace_back(f.name);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> BundledGpuAliases() {
  std::vector<std::string> aliases;
  for (const internal::BundledFile& f : internal::BundledHardwareFiles()) {
    auto gpu = ParseGpuSpec(f.text, absl::StrCat("bundled:", f.name));
    aliases.emplace_back(gpu.ok() && !gpu->aliases.empty() ? gpu->aliases.front() : f.name);
  }
  std::sort(aliases.begin(), aliases.end());
  return aliases;
}

absl::StatusOr<GpuSpec> LoadGpu(absl::string_view name_or_path) {
  const std::string wanted = absl::AsciiStrToLower(name_or_path);
  for (const internal::BundledFile& f : internal::BundledHardwareFiles()) {
    auto gpu = ParseGpuSpec(f.text, absl::StrCat("bundled:", f.name));
    if (!gpu.ok()) return gpu.status();  // a broken bundled file is a build defect; say so
    bool match = wanted == f.name || wanted == absl::AsciiStrToLower(gpu->name);
    for (const std::string& alias : gpu->aliases) match |= wanted == absl::AsciiStrToLower(alias);
    if (match) return gpu;
  }
  std::error_code ec;
  if (std::filesystem::is_regular_file(std::string(name_or_path), ec)) {
    std::ifstream in{std::string(name_or_path)};
    std::stringstream text;
    text << in.rdbuf();
    return ParseGpuSpec(text.str(), name_or_path);
  }
  return absl::NotFoundError(absl::StrCat(
      "unknown GPU '", name_or_path, "': not one of ", absl::StrJoin(BundledGpuNames(), ", "),
      " (or their aliases ", absl::StrJoin(BundledGpuAliases(), ", "), ") and not a file"));
}

}  // namespace kvpage
