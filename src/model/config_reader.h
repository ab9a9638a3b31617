// Typed, error-reporting access to a Hugging Face config.json.
//
// Multimodal configs nest the language model under "text_config"; a field is looked up there
// first and then at the top level (Gemma 3 keeps torch_dtype at the top, its layer shapes in
// text_config). Every error names the field and the source file.
#ifndef KVPAGE_MODEL_CONFIG_READER_H_
#define KVPAGE_MODEL_CONFIG_READER_H_

#include <cstdint>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvpage::internal {

// Every integer a config holds (sizes, counts, positions) fits in int32; larger values are
// rejected so shapes can be stored as int32_t without silent truncation.
inline constexpr int64_t kMaxConfigInt = 2147483647;

class ConfigReader {
 public:
  // Parses `text`; InvalidArgument naming `source` if it is not a JSON object.
  static absl::StatusOr<ConfigReader> Parse(absl::string_view text, absl::string_view source);

  bool Has(absl::string_view field) const;  // present and not null

  // Required positive integer. Errors: missing, null, not an integer, <= 0 or > kMaxConfigInt.
  absl::StatusOr<int64_t> PositiveInt(absl::string_view field) const;
  // Optional integer that must be positive when present (and not null).
  absl::StatusOr<std::optional<int64_t>> OptionalPositiveInt(absl::string_view field) const;
  // Optional non-negative integer (0 allowed), e.g. first_k_dense_replace.
  absl::StatusOr<int64_t> NonNegativeIntOr(absl::string_view field, int64_t fallback) const;
  absl::StatusOr<std::optional<std::string>> OptionalString(absl::string_view field) const;
  absl::StatusOr<bool> BoolOr(absl::string_view field, bool fallback) const;
  // The raw value (text_config first), or nullptr when absent.
  const nlohmann::json* Find(absl::string_view field) const;

  // InvalidArgument("<source>: field '<field>' <what>").
  absl::Status Error(absl::string_view field, absl::string_view what) const;
  const std::string& source() const { return source_; }

 private:
  ConfigReader(nlohmann::json root, std::string source);

  nlohmann::json root_;
  const nlohmann::json* text_ = nullptr;  // root_["text_config"] when it is an object
  std::string source_;
};

}  // namespace kvpage::internal

#endif  // KVPAGE_MODEL_CONFIG_READER_H_
