#include "model/config_reader.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvpage::internal {

ConfigReader::ConfigReader(nlohmann::json root, std::string source)
    : root_(std::move(root)), source_(std::move(source)) {
  auto it = root_.find("text_config");
  if (it != root_.end() && it->is_object()) text_ = &*it;
}

absl::StatusOr<ConfigReader> ConfigReader::Parse(absl::string_view text,
                                                 absl::string_view source) {
  nlohmann::json root = nlohmann::json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected a JSON object at the top level"));
  }
  // A multimodal config nests the language model's fields in text_config; anything but an
  // object there would be ignored silently and the top-level fields (if any) read instead.
  if (auto it = root.find("text_config"); it != root.end() && !it->is_null() && !it->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": field 'text_config' must be an object, got ", it->dump().substr(0, 80)));
  }
  return ConfigReader(std::move(root), std::string(source));
}

const nlohmann::json* ConfigReader::Find(absl::string_view field) const {
  const std::string key(field);
  if (text_ != nullptr) {
    auto it = text_->find(key);
    if (it != text_->end() && !it->is_null()) return &*it;
  }
  auto it = root_.find(key);
  if (it != root_.end() && !it->is_null()) return &*it;
  return nullptr;
}

bool ConfigReader::Has(absl::string_view field) const { return Find(field) != nullptr; }

absl::Status ConfigReader::Error(absl::string_view field, absl::string_view what) const {
  return absl::InvalidArgumentError(absl::StrCat(source_, ": field '", field, "' ", what));
}

absl::StatusOr<std::optional<int64_t>> ConfigReader::OptionalPositiveInt(
    absl::string_view field) const {
  const nlohmann::json* v = Find(field);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->is_number_integer()) {
    return Error(field, absl::StrCat("must be an integer, got ", v->dump()));
  }
  const int64_t value = v->get<int64_t>();
  if (value <= 0) return Error(field, absl::StrCat("must be positive, got ", value));
  if (value > kMaxConfigInt) {
    return Error(field, absl::StrCat("is implausibly large (", value, " > ", kMaxConfigInt, ")"));
  }
  return std::optional<int64_t>(value);
}

absl::StatusOr<int64_t> ConfigReader::PositiveInt(absl::string_view field) const {
  auto value = OptionalPositiveInt(field);
  if (!value.ok()) return value.status();
  if (!value->has_value()) return Error(field, "is missing");
  return **value;
}

absl::StatusOr<int64_t> ConfigReader::NonNegativeIntOr(absl::string_view field,
                                                       int64_t fallback) const {
  const nlohmann::json* v = Find(field);
  if (v == nullptr) return fallback;
  if (!v->is_number_integer()) {
    return Error(field, absl::StrCat("must be an integer, got ", v->dump()));
  }
  const int64_t value = v->get<int64_t>();
  if (value < 0) return Error(field, absl::StrCat("must be >= 0, got ", value));
  if (value > kMaxConfigInt) {
    return Error(field, absl::StrCat("is implausibly large (", value, " > ", kMaxConfigInt, ")"));
  }
  return value;
}

absl::StatusOr<std::optional<std::string>> ConfigReader::OptionalString(
    absl::string_view field) const {
  const nlohmann::json* v = Find(field);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return Error(field, absl::StrCat("must be a string, got ", v->dump()));
  return std::optional<std::string>(v->get<std::string>());
}

absl::StatusOr<bool> ConfigReader::BoolOr(absl::string_view field, bool fallback) const {
  const nlohmann::json* v = Find(field);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return Error(field, absl::StrCat("must be true or false, got ", v->dump()));
  return v->get<bool>();
}

}  // namespace kvpage::internal
