#include "model/safetensors.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "nlohmann/json.hpp"

namespace kvpage::internal {
namespace {

// Bits per element of every dtype the format defines (the Dtype enum of the reference
// implementation, huggingface/safetensors). Sub-byte types pack elements into whole bytes.
int32_t DtypeBits(absl::string_view dtype) {
  static constexpr std::pair<absl::string_view, int32_t> kBits[] = {
      {"BOOL", 8},     {"F4", 4},       {"F6_E2M3", 6},     {"F6_E3M2", 6},
      {"U8", 8},       {"I8", 8},       {"F8_E5M2", 8},     {"F8_E4M3", 8},
      {"F8_E8M0", 8},  {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},
      {"U16", 16},     {"F16", 16},     {"BF16", 16},       {"I32", 32},
      {"U32", 32},     {"F32", 32},     {"C64", 64},        {"F64", 64},
      {"I64", 64},     {"U64", 64}};
  for (const auto& [name, bits] : kBits) {
    if (name == dtype) return bits;
  }
  return 0;
}

struct Tensor {
  std::string name;
  int64_t begin = 0;
  int64_t end = 0;
};

// A non-negative integer that fits int64_t, or an error naming `field` of `tensor`.
absl::StatusOr<int64_t> Count(const nlohmann::json& v, absl::string_view source,
                              const std::string& tensor, absl::string_view field) {
  if (!v.is_number_unsigned() || v.get<uint64_t>() > uint64_t{INT64_MAX}) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": tensor '", tensor, "': ", field,
                                                   " must be a non-negative integer, got ",
                                                   v.dump()));
  }
  return static_cast<int64_t>(v.get<uint64_t>());
}

// One entry of the header: checks dtype, shape and offsets, and returns its byte range.
absl::StatusOr<Tensor> ParseTensor(const std::string& name, const nlohmann::json& entry,
                                   absl::string_view source) {
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": tensor '", name, "': ", what));
  };
  if (!entry.is_object()) return error("is not an object");
  const auto dtype = entry.find("dtype");
  const auto shape = entry.find("shape");
  const auto offsets = entry.find("data_offsets");
  if (dtype == entry.end() || !dtype->is_string()) return error("dtype must be a string");
  if (shape == entry.end() || !shape->is_array()) return error("shape must be an array");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2) {
    return error("data_offsets must be [begin, end]");
  }
  const int32_t bits = DtypeBits(dtype->get<std::string>());
  if (bits == 0) return error(absl::StrCat("unknown dtype '", dtype->get<std::string>(), "'"));
  Tensor t{.name = name};
  KVPAGE_ASSIGN_OR_RETURN(t.begin, Count((*offsets)[0], source, name, "data_offsets[0]"));
  KVPAGE_ASSIGN_OR_RETURN(t.end, Count((*offsets)[1], source, name, "data_offsets[1]"));
  if (t.end < t.begin) return error(absl::StrCat("data_offsets end ", t.end, " < begin ", t.begin));
  // Elements, saturating: a shape whose size passes 2^62 cannot match any real range below.
  int64_t elements = 1;
  for (size_t i = 0; i < shape->size(); ++i) {
    KVPAGE_ASSIGN_OR_RETURN(const int64_t d,
                            Count((*shape)[i], source, name, absl::StrCat("shape[", i, "]")));
    elements = (d != 0 && elements > (int64_t{1} << 62) / d) ? (int64_t{1} << 62) : elements * d;
  }
  const int64_t expected = elements >= (int64_t{1} << 62) / 64 ? -1 : (elements * bits + 7) / 8;
  if (expected != t.end - t.begin) {
    return error(absl::StrCat("holds ", t.end - t.begin, " bytes but its shape ", shape->dump(),
                              " of ", dtype->get<std::string>(), " needs ",
                              expected < 0 ? std::string("more") : absl::StrCat(expected)));
  }
  return t;
}

}  // namespace

absl::StatusOr<SafetensorsFile> ParseSafetensorsHeader(absl::string_view header_json,
                                                       int64_t data_bytes,
                                                       absl::string_view source) {
  const nlohmann::json root =
      nlohmann::json::parse(header_json, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the header is not a JSON object"));
  }
  SafetensorsFile file;
  file.weights.num_files = 1;
  std::vector<Tensor> tensors;
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") continue;
    KVPAGE_ASSIGN_OR_RETURN(Tensor t, ParseTensor(name, entry, source));
    file.weights.bytes_by_dtype[entry["dtype"].get<std::string>()] += t.end - t.begin;
    file.weights.total_bytes += t.end - t.begin;
    file.names.insert(name);
    tensors.push_back(std::move(t));
  }
  file.weights.num_tensors = static_cast<int64_t>(tensors.size());
  // The tensors tile the data section: no gap, no overlap, nothing past its end.
  std::sort(tensors.begin(), tensors.end(),
            [](const Tensor& a, const Tensor& b) { return a.begin < b.begin; });
  int64_t next = 0;
  for (const Tensor& t : tensors) {
    if (t.begin != next) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": tensor '", t.name, "': data_offsets begin ", t.begin,
          t.begin < next ? " overlaps the previous tensor, which ends at "
                         : " leaves a gap after the previous tensor, which ends at ",
          next));
    }
    next = t.end;
  }
  if (next != data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": the tensors cover ", next, " bytes of a ", data_bytes, "-byte data section"));
  }
  return file;
}

absl::StatusOr<SafetensorsFile> ReadSafetensorsFile(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  if (ec || !in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  std::array<unsigned char, 8> prefix{};
  if (size < 8 || !in.read(reinterpret_cast<char*>(prefix.data()), 8)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", size, " bytes, shorter than the 8-byte header length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];  // little-endian
  if (n > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes) || n > size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", n,
                                                   " exceeds the file (", size,
                                                   " bytes) or the format's limit"));
  }
  std::string header(n, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(n))) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read its ", n, "-byte header"));
  }
  return ParseSafetensorsHeader(header, static_cast<int64_t>(size - 8 - n), path);
}

}  // namespace kvpage::internal
