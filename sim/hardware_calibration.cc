#include "sim/hardware_calibration.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "model/bundled_data.h"
#include "nlohmann/json.hpp"

namespace kvpage::sim {
namespace {

using Json = nlohmann::json;

absl::Status FieldError(absl::string_view source, absl::string_view field,
                        absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": calibration field '", field, "' ", what));
}

absl::StatusOr<const Json*> Member(const Json& obj, absl::string_view source,
                                   const std::string& field) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return FieldError(source, field, "is missing");
  return &*it;
}

absl::StatusOr<double> Number(const Json& obj, absl::string_view source,
                              const std::string& field, double lo, double hi) {
  KVPAGE_ASSIGN_OR_RETURN(const Json* v, Member(obj, source, field));
  if (!v->is_number()) {
    return FieldError(source, field, absl::StrCat("must be a number, got ", v->dump()));
  }
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) {
    return FieldError(source, field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", x));
  }
  return x;
}

// A non-empty array of numbers in [lo, hi], increasing (strictly when `strict`, else
// non-decreasing) when `ordered`.
absl::StatusOr<std::vector<double>> Numbers(const Json& obj, absl::string_view source,
                                            const std::string& field, double lo, double hi,
                                            bool ordered, bool strict) {
  KVPAGE_ASSIGN_OR_RETURN(const Json* v, Member(obj, source, field));
  if (!v->is_array() || v->empty()) return FieldError(source, field, "must be a non-empty array");
  std::vector<double> out;
  for (const Json& e : *v) {
    if (!e.is_number()) {
      return FieldError(source, field, absl::StrCat("must hold numbers, got ", e.dump()));
    }
    const double x = e.get<double>();
    if (!(x >= lo && x <= hi)) {
      return FieldError(source, field,
                        absl::StrCat("values must be in [", lo, ", ", hi, "], got ", x));
    }
    if (ordered && !out.empty() && (strict ? x <= out.back() : x < out.back())) {
      return FieldError(source, field,
                        absl::StrCat("must be ", strict ? "increasing" : "non-decreasing",
                                     ", got ", x, " after ", out.back()));
    }
    out.push_back(x);
  }
  return out;
}

absl::StatusOr<int32_t> Tp(const Json& obj, absl::string_view source, int32_t min_tp) {
  KVPAGE_ASSIGN_OR_RETURN(double tp, Number(obj, source, "tp", min_tp, 1024));
  if (tp != std::floor(tp)) {
    return FieldError(source, "tp", absl::StrCat("must be an integer, got ", tp));
  }
  return static_cast<int32_t>(tp);
}

absl::StatusOr<GemmCurve> ParseGemm(const Json& obj, const std::string& source) {
  if (!obj.is_object()) return FieldError(source, "gemm", "must hold objects");
  GemmCurve c;
  KVPAGE_ASSIGN_OR_RETURN(c.tp, Tp(obj, source, 1));
  KVPAGE_ASSIGN_OR_RETURN(double launch_us, Number(obj, source, "launch_us", 0, 1e6));
  c.launch_s = launch_us * 1e-6;
  KVPAGE_ASSIGN_OR_RETURN(c.hbm_efficiency, Number(obj, source, "hbm_efficiency", 1e-6, 1));
  KVPAGE_ASSIGN_OR_RETURN(c.tokens, Numbers(obj, source, "tokens", 1, 1e9, true, true));
  KVPAGE_ASSIGN_OR_RETURN(c.efficiency,
                          Numbers(obj, source, "efficiency", 1e-6, 1, false, false));
  if (c.tokens.size() != c.efficiency.size()) {
    return FieldError(source, "efficiency",
                      absl::StrCat("must have one value per token count (", c.tokens.size(),
                                   "), got ", c.efficiency.size()));
  }
  return c;
}

absl::StatusOr<SmallOpCost> ParseSmallOp(const Json& obj, const std::string& source) {
  if (!obj.is_object()) return FieldError(source, "small_ops", "must hold objects");
  SmallOpCost s;
  KVPAGE_ASSIGN_OR_RETURN(const Json* op, Member(obj, source, "op"));
  if (!op->is_string()) return FieldError(source, "op", "must be a string");
  s.op = op->get<std::string>();
  KVPAGE_ASSIGN_OR_RETURN(const Json* width, Member(obj, source, "width"));
  KVPAGE_ASSIGN_OR_RETURN(const Json* per, Member(obj, source, "per"));
  if (*width != "hidden" && *width != "hidden_per_tp") {
    return FieldError(source, "width",
                      absl::StrCat("must be \"hidden\" or \"hidden_per_tp\", got ", width->dump()));
  }
  if (*per != "layer" && *per != "step") {
    return FieldError(source, "per",
                      absl::StrCat("must be \"layer\" or \"step\", got ", per->dump()));
  }
  s.split_by_tp = *width == "hidden_per_tp";
  s.per_step = *per == "step";
  KVPAGE_ASSIGN_OR_RETURN(double launch_us, Number(obj, source, "launch_us", 0, 1e6));
  KVPAGE_ASSIGN_OR_RETURN(double ns_per_k, Number(obj, source, "ns_per_kilo_element", 0, 1e9));
  s.launch_s = launch_us * 1e-6;
  s.seconds_per_element = ns_per_k * 1e-12;
  return s;
}

absl::StatusOr<AllReduceTable> ParseAllReduce(const Json& obj, const std::string& source) {
  if (!obj.is_object()) return FieldError(source, "all_reduce", "must hold objects");
  AllReduceTable t;
  KVPAGE_ASSIGN_OR_RETURN(t.tp, Tp(obj, source, 2));
  KVPAGE_ASSIGN_OR_RETURN(t.bytes, Numbers(obj, source, "bytes", 1, 1e15, true, true));
  KVPAGE_ASSIGN_OR_RETURN(std::vector<double> us,
                          Numbers(obj, source, "us", 1e-3, 1e9, true, false));
  if (us.size() != t.bytes.size()) {
    return FieldError(source, "us", absl::StrCat("must have one value per size (",
                                                 t.bytes.size(), "), got ", us.size()));
  }
  for (double u : us) t.seconds.push_back(u * 1e-6);
  return t;
}

absl::StatusOr<int32_t> PositiveInt(const Json& obj, absl::string_view source,
                                    const std::string& field) {
  KVPAGE_ASSIGN_OR_RETURN(double x, Number(obj, source, field, 1, 1e6));
  if (x != std::floor(x)) {
    return FieldError(source, field, absl::StrCat("must be an integer, got ", x));
  }
  return static_cast<int32_t>(x);
}

absl::StatusOr<TileQuantization> ParseTiles(const Json& obj, const std::string& source) {
  if (!obj.is_object()) return FieldError(source, "tiles", "must be an object or null");
  TileQuantization q;
  KVPAGE_ASSIGN_OR_RETURN(q.sm_count, PositiveInt(obj, source, "sm_count"));
  KVPAGE_ASSIGN_OR_RETURN(q.k_multiple, PositiveInt(obj, source, "k_multiple"));
  if (auto s = obj.find("split_k"); s != obj.end() && !s->is_null()) {
    KVPAGE_ASSIGN_OR_RETURN(q.split_k, PositiveInt(obj, source, "split_k"));
    if (q.split_k > 64) {
      return FieldError(source, "split_k", absl::StrCat("must be at most 64, got ", q.split_k));
    }
  }
  KVPAGE_ASSIGN_OR_RETURN(const Json* tiles, Member(obj, source, "tiles"));
  if (!tiles->is_array() || tiles->empty()) {
    return FieldError(source, "tiles.tiles", "must be a non-empty array of [tm, tn]");
  }
  for (const Json& t : *tiles) {
    if (!t.is_array() || t.size() != 2 || !t[0].is_number_integer() ||
        !t[1].is_number_integer() || t[0].get<int64_t>() < 1 || t[1].get<int64_t>() < 1 ||
        t[0].get<int64_t>() > 65536 || t[1].get<int64_t>() > 65536) {
      return FieldError(source, "tiles.tiles",
                        absl::StrCat("must hold [tm, tn] pairs of integers in [1, 65536], got ",
                                     t.dump()));
    }
    q.tiles.emplace_back(t[0].get<int32_t>(), t[1].get<int32_t>());
  }
  return q;
}

template <typename T, typename Parse>
absl::StatusOr<std::vector<T>> ParseArray(const Json& cal, const std::string& source,
                                          const std::string& field, bool required, Parse parse) {
  std::vector<T> out;
  auto it = cal.find(field);
  if (it == cal.end() || it->is_null()) {
    if (required) return FieldError(source, field, "is missing");
    return out;
  }
  if (!it->is_array()) return FieldError(source, field, "must be an array");
  for (const Json& e : *it) {
    KVPAGE_ASSIGN_OR_RETURN(T v, parse(e, absl::StrCat(source, " ", field, "[", out.size(), "]")));
    out.push_back(std::move(v));
  }
  return out;
}

bool GpuMatches(const Json& root, absl::string_view file_stem, const std::string& wanted) {
  if (wanted == file_stem) return true;
  auto name = root.find("name");
  if (name != root.end() && name->is_string() &&
      absl::AsciiStrToLower(name->get<std::string>()) == wanted) {
    return true;
  }
  auto aliases = root.find("aliases");
  if (aliases == root.end() || !aliases->is_array()) return false;
  for (const Json& a : *aliases) {
    if (a.is_string() && absl::AsciiStrToLower(a.get<std::string>()) == wanted) return true;
  }
  return false;
}

}  // namespace

double GemmCurve::EfficiencyAt(double num_tokens) const {
  if (num_tokens <= tokens.front()) return efficiency.front();
  if (num_tokens >= tokens.back()) return efficiency.back();
  const size_t i = static_cast<size_t>(
      std::upper_bound(tokens.begin(), tokens.end(), num_tokens) - tokens.begin() - 1);
  const double f = std::log2(num_tokens / tokens[i]) / std::log2(tokens[i + 1] / tokens[i]);
  return efficiency[i] + f * (efficiency[i + 1] - efficiency[i]);
}

double TileQuantization::Factor(double m, double n, double k, double groups) const {
  const double sms = sm_count;
  double best = 0;
  for (int32_t s = 1; s <= split_k; ++s) {
    const double k_slice = std::ceil(std::ceil(k / s) / k_multiple) * k_multiple;
    for (const auto& [tm, tn] : tiles) {
      const double tiles_out = std::ceil(groups * std::ceil(m / tm) * std::ceil(n / tn));
      const double work = std::ceil(tiles_out * s / sms) * tm * tn * k_slice;
      if (best == 0 || work < best) best = work;
    }
  }
  return best * sms / (groups * m * n * k);
}

double AllReduceTable::SecondsFor(double message_bytes) const {
  if (message_bytes <= bytes.front()) return seconds.front();
  if (message_bytes >= bytes.back()) return seconds.back() * message_bytes / bytes.back();
  const size_t i = static_cast<size_t>(
      std::upper_bound(bytes.begin(), bytes.end(), message_bytes) - bytes.begin() - 1);
  const double f = std::log(message_bytes / bytes[i]) / std::log(bytes[i + 1] / bytes[i]);
  return std::exp(std::log(seconds[i]) + f * std::log(seconds[i + 1] / seconds[i]));
}

const GemmCurve* GpuCalibration::GemmFor(int32_t tp) const {
  for (const GemmCurve& c : gemm) {
    if (c.tp == tp) return &c;
  }
  return nullptr;
}

const AllReduceTable* GpuCalibration::AllReduceFor(int32_t tp) const {
  for (const AllReduceTable& t : all_reduce) {
    if (t.tp == tp) return &t;
  }
  return nullptr;
}

std::vector<int32_t> GpuCalibration::ProfiledTp() const {
  std::vector<int32_t> out;
  for (const GemmCurve& c : gemm) {
    if (c.tp == 1 || AllReduceFor(c.tp) != nullptr) out.push_back(c.tp);
  }
  return out;
}

absl::StatusOr<GpuCalibration> ParseGpuCalibration(absl::string_view json_text,
                                                   absl::string_view source) {
  const Json root = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  auto it = root.find("calibration");
  if (it == root.end() || it->is_null()) {
    return absl::NotFoundError(absl::StrCat(
        source, " has no \"calibration\" object (scripts/fit_cost_model.py --write adds one)"));
  }
  if (!it->is_object()) return FieldError(source, "calibration", "must be an object");
  const Json& cal = *it;
  const std::string src(source);
  GpuCalibration out;
  out.source = src;
  KVPAGE_ASSIGN_OR_RETURN(out.gemm, ParseArray<GemmCurve>(cal, src, "gemm", true, ParseGemm));
  if (out.gemm.empty()) return FieldError(source, "gemm", "must not be empty");
  KVPAGE_ASSIGN_OR_RETURN(out.small_ops,
                          ParseArray<SmallOpCost>(cal, src, "small_ops", false, ParseSmallOp));
  KVPAGE_ASSIGN_OR_RETURN(
      out.all_reduce, ParseArray<AllReduceTable>(cal, src, "all_reduce", false, ParseAllReduce));
  auto by_tp = [](const auto& a, const auto& b) { return a.tp < b.tp; };
  std::sort(out.gemm.begin(), out.gemm.end(), by_tp);
  std::sort(out.all_reduce.begin(), out.all_reduce.end(), by_tp);
  if (auto t = cal.find("tiles"); t != cal.end() && !t->is_null()) {
    KVPAGE_ASSIGN_OR_RETURN(out.tiles, ParseTiles(*t, src));
  }
  KVPAGE_ASSIGN_OR_RETURN(const Json* attention, Member(cal, source, "attention"));
  if (!attention->is_object()) return FieldError(source, "attention", "must be an object");
  KVPAGE_ASSIGN_OR_RETURN(out.attention_prefill_efficiency,
                          Number(*attention, absl::StrCat(source, " attention"),
                                 "prefill_efficiency", 1e-6, 1));
  return out;
}

absl::StatusOr<GpuCalibration> BundledCalibration(const GpuSpec& gpu) {
  const std::string wanted = absl::AsciiStrToLower(gpu.name);
  for (const internal::BundledFile& f : internal::BundledHardwareFiles()) {
    const Json root = Json::parse(f.text, nullptr, /*allow_exceptions=*/false);
    if (root.is_object() && GpuMatches(root, f.name, wanted)) {
      return ParseGpuCalibration(f.text, absl::StrCat("bundled:", f.name));
    }
  }
  return absl::NotFoundError(absl::StrCat("no bundled calibration for GPU '", gpu.name, "'"));
}

absl::StatusOr<GpuCalibration> LoadGpuCalibration(absl::string_view name_or_path) {
  const std::string wanted = absl::AsciiStrToLower(name_or_path);
  for (const internal::BundledFile& f : internal::BundledHardwareFiles()) {
    const Json root = Json::parse(f.text, nullptr, /*allow_exceptions=*/false);
    if (root.is_object() && GpuMatches(root, f.name, wanted)) {
      return ParseGpuCalibration(f.text, absl::StrCat("bundled:", f.name));
    }
  }
  std::error_code ec;
  if (std::filesystem::is_regular_file(std::string(name_or_path), ec)) {
    std::ifstream in{std::string(name_or_path)};
    std::stringstream text;
    text << in.rdbuf();
    return ParseGpuCalibration(text.str(), name_or_path);
  }
  return absl::NotFoundError(absl::StrCat("unknown GPU '", name_or_path,
                                          "': not a bundled GPU and not a file"));
}

}  // namespace kvpage::sim
