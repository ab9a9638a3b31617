// The Mooncake JSON Lines reader (see trace_readers.h and ParseTrace in trace.h).
//
// Each row is parsed as a stream of JSON values (nlohmann's SAX interface) straight from the
// input, so neither the line nor a document of it is ever held: a row's hash ids are kept as
// they come (at most kMaxMooncakeHashIds of them), its other fields as small values. The
// checks and messages are those of the earlier whole-document reader: a repeated key takes
// its last value, as a document did.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "nlohmann/json.hpp"
#include "sim/trace_readers.h"

namespace kvpage::sim {
namespace {

using json = nlohmann::json;

// The bytes of one row, handed to the parser through RowBytes::Iterator. A NUL byte or a
// token longer than kMaxJsonTokenBytes ends them early; the reader then reports that.
class RowBytes {
 public:
  explicit RowBytes(TraceInput& in) : in_(in) { Advance(); }

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = char;
    using difference_type = std::ptrdiff_t;
    using pointer = const char*;
    using reference = char;
    Iterator() = default;
    explicit Iterator(RowBytes* row) : row_(row) {}
    char operator*() const { return static_cast<char>(row_->byte_); }
    Iterator& operator++() {
      row_->Advance();
      return *this;
    }
    bool operator==(const Iterator& o) const { return AtEnd() == o.AtEnd(); }
    bool operator!=(const Iterator& o) const { return !(*this == o); }

   private:
    bool AtEnd() const { return row_ == nullptr || row_->byte_ < 0; }
    RowBytes* row_ = nullptr;
  };

  Iterator begin() { return Iterator(this); }
  static Iterator end() { return Iterator(); }

  // A value (or the structure around one) has been parsed: the next token starts here.
  void Mark() { since_mark_ = 0; }
  // Reads the rest of the line, looking for a NUL byte (after a parse that stopped early).
  void Drain() {
    for (int c = in_.NextInLine(); c >= 0 && nul_column_ == 0; c = in_.NextInLine()) {
      if (c == 0) nul_column_ = in_.column();
    }
  }
  int64_t nul_column() const { return nul_column_; }
  int64_t long_token_column() const { return long_column_; }
  // Bytes of the line the parser never saw (taken by TakeIds).
  int64_t skipped() const { return skipped_; }
  // The row's first 80 bytes, for messages.
  std::string head() const { return std::string(absl::StripTrailingAsciiWhitespace(head_)); }

  // Called when the parser has read the '[' of a row's hash ids: takes ids here while each
  // is a plain integer followed by a comma and another integer, appending the first
  // kMaxMooncakeHashIds to *ids, and hands the parser the rest from the first element it
  // has not taken. The parser then sees "[" + rest, which is valid exactly when the whole
  // list is. (nlohmann's reader takes about 15 ns a byte: minutes for a 1 GiB list.)
  void TakeIds(std::vector<uint64_t>& ids) {
    if (replay_pos_ < replay_.size()) return;  // a list inside the bytes handed back: leave it
    std::string& kept = replay_;  // bytes read since the last id taken
    kept.clear();
    int c = byte_;
    while (IsSpace(c)) c = Next(kept, c);
    while (IsDigit(c)) {
      const bool leading_zero = c == '0';
      uint64_t v = 0;
      bool plain = true;
      int digits = 0;
      for (; IsDigit(c); c = Next(kept, c), ++digits) {
        const auto d = static_cast<uint64_t>(c - '0');
        if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) plain = false;
        v = v * 10 + d;
      }
      if (!plain || (leading_zero && digits > 1)) break;  // the parser names these
      while (IsSpace(c)) c = Next(kept, c);
      if (c != ',') break;
      c = Next(kept, c);
      while (IsSpace(c)) c = Next(kept, c);
      if (!IsDigit(c)) break;
      if (static_cast<int64_t>(ids.size()) < kMaxMooncakeHashIds) ids.push_back(v);
      skipped_ += static_cast<int64_t>(kept.size());
      kept.clear();
    }
    if (c >= 0) kept.push_back(static_cast<char>(c));
    byte_ = kept.empty() ? -1 : static_cast<unsigned char>(kept[0]);
    replay_pos_ = 1;
    since_mark_ = 0;
  }

 private:
  static bool IsDigit(int c) { return c >= '0' && c <= '9'; }
  static bool IsSpace(int c) { return c == ' ' || c == '\t' || c == '\r'; }
  // Keeps `c` and reads the next byte for TakeIds: -1 at the line's end, at a NUL byte, or
  // past kMaxJsonTokenBytes kept.
  int Next(std::string& kept, int c) {
    kept.push_back(static_cast<char>(c));
    if (static_cast<int64_t>(kept.size()) > kMaxJsonTokenBytes) {
      long_column_ = in_.column();
      return -1;
    }
    const int next = in_.NextInLine();
    if (next == 0) {
      nul_column_ = in_.column();
      return -1;
    }
    return next;
  }
  void Advance() {
    if (replay_pos_ < replay_.size()) {
      byte_ = static_cast<unsigned char>(replay_[replay_pos_++]);
      return;
    }
    if (nul_column_ > 0 || long_column_ > 0) {  // TakeIds met one
      byte_ = -1;
      return;
    }
    byte_ = in_.NextInLine();
    if (byte_ < 0) return;
    if (byte_ == 0) {
      nul_column_ = in_.column();
      byte_ = -1;
    } else if (++since_mark_ > kMaxJsonTokenBytes) {
      long_column_ = in_.column();
      byte_ = -1;
    } else if (head_.size() < 80) {
      head_.push_back(static_cast<char>(byte_));
    }
  }

  TraceInput& in_;
  int byte_ = -1;
  int64_t since_mark_ = 0;
  int64_t nul_column_ = 0;
  int64_t long_column_ = 0;
  int64_t skipped_ = 0;
  std::string head_;
  std::string replay_;  // bytes TakeIds read but did not take, served first
  size_t replay_pos_ = 0;
};

// A JSON value built from parser events, with at most kMaxNodes nodes: what a message
// quotes of a field that is not what it should be.
class BoundedValue {
 public:
  void Start(bool object) {
    if (Full()) {
      ++skipped_;
      return;
    }
    stack_.push_back(Place(object ? json::object() : json::array()));
  }
  void Key(std::string key) { key_ = std::move(key); }
  void Add(json v) {
    if (!Full()) Place(std::move(v));
  }
  void End() {
    if (skipped_ > 0) {
      --skipped_;
    } else {
      stack_.pop_back();
    }
  }
  // The value as the message shows it ("..." when cut).
  std::string Dump() const { return root_.dump() + (truncated_ ? "..." : ""); }
  json Take() { return std::move(root_); }
  bool truncated() const { return truncated_; }

 private:
  static constexpr int kMaxNodes = 64;
  bool Full() {
    if (nodes_ < kMaxNodes) return false;
    truncated_ = true;
    return true;
  }
  json* Place(json v) {
    ++nodes_;
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *stack_.back();
    if (parent.is_object()) return &(parent[key_] = std::move(v));
    parent.push_back(std::move(v));
    return &parent.back();
  }

  json root_;
  std::vector<json*> stack_;
  std::string key_;
  int nodes_ = 0;
  int skipped_ = 0;
  bool truncated_ = false;
};

// nlohmann's message "parse error at line 1, column N: ..." with N + `shift`: the parser
// counts the bytes it saw, and RowBytes::TakeIds took `shift` of them before it.
std::string ShiftColumn(absl::string_view message, int64_t shift) {
  constexpr absl::string_view kColumn = ", column ";
  const size_t at = message.find(kColumn);
  if (shift == 0 || at == message.npos) return std::string(message);
  size_t end = at + kColumn.size();
  int64_t column = 0;
  while (end < message.size() && absl::ascii_isdigit(static_cast<unsigned char>(message[end]))) {
    column = column * 10 + (message[end++] - '0');
  }
  return absl::StrCat(message.substr(0, at + kColumn.size()), column + shift,
                      message.substr(end));
}

enum class Field : uint8_t { kOther, kTimestamp, kInputLength, kOutputLength, kHashIds, kBadId };

// A field's value: absent, or a JSON value (cut when large, see BoundedValue).
struct FieldValue {
  std::optional<json> value;
  std::string dump;  // value->dump(), or the cut dump of a large container
};

// The fields of one row, from the parser's events.
class MooncakeRow final : public nlohmann::json_sax<json> {
 public:
  explicit MooncakeRow(RowBytes& bytes) : bytes_(bytes) {}

  bool is_object = false;
  FieldValue timestamp, input_length, output_length;
  bool ids_are_array = false;  // the last 'hash_ids' holds an array
  std::vector<uint64_t> ids;   // its first kMaxMooncakeHashIds ids
  FieldValue bad_id;           // its first id that is not a non-negative integer
  std::string syntax_error;    // the parser's message, when the row is not JSON

  bool null() override { return Scalar(json(nullptr)); }
  bool boolean(bool v) override { return Scalar(json(v)); }
  bool number_integer(number_integer_t v) override { return Scalar(json(v)); }
  bool number_unsigned(number_unsigned_t v) override {
    if (!building_ && in_ids_ && depth_ == 2) {  // the common case: one hash id
      bytes_.Mark();
      if (static_cast<int64_t>(ids.size()) < kMaxMooncakeHashIds) ids.push_back(v);
      return true;
    }
    return Scalar(json(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return Scalar(json(v)); }
  bool string(string_t& v) override { return Scalar(json(std::move(v))); }
  bool binary(binary_t&) override { return true; }  // not produced by the JSON parser
  bool start_object(std::size_t) override { return Start(true); }
  bool start_array(std::size_t) override { return Start(false); }
  bool end_object() override { return End(); }
  bool end_array() override { return End(); }
  bool key(string_t& k) override {
    bytes_.Mark();
    if (building_) {
      value_.Key(std::move(k));
    } else if (is_object && depth_ == 1) {
      field_ = FieldNamed(k);
      if (field_ != Field::kOther) Slot(field_) = FieldValue{};
      if (field_ == Field::kHashIds) {  // a repeated key: the last one counts
        ids_are_array = false;
        ids.clear();
        bad_id = FieldValue{};
      }
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    absl::string_view what = e.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 3: ..." -> from "parse".
    if (const size_t end = what.find("] "); absl::StartsWith(what, "[json.") && end != what.npos) {
      what.remove_prefix(end + 2);
    }
    syntax_error = ShiftColumn(what, bytes_.skipped());
    return false;
  }

 private:
  static Field FieldNamed(absl::string_view k) {
    if (k == "timestamp") return Field::kTimestamp;
    if (k == "input_length") return Field::kInputLength;
    if (k == "output_length") return Field::kOutputLength;
    if (k == "hash_ids") return Field::kHashIds;
    return Field::kOther;
  }
  FieldValue& Slot(Field f) {
    switch (f) {
      case Field::kTimestamp: return timestamp;
      case Field::kInputLength: return input_length;
      case Field::kOutputLength: return output_length;
      default: return bad_id;
    }
  }
  // The value starting here is kept for field f: a scalar field's value, or a bad hash id.
  bool Keeps(Field f) const {
    return f == Field::kTimestamp || f == Field::kInputLength || f == Field::kOutputLength ||
           (f == Field::kBadId && !bad_id.value.has_value());
  }
  // Which field a value at the current depth belongs to.
  Field Target() const {
    if (!is_object) return Field::kOther;
    if (depth_ == 1) return field_ == Field::kHashIds ? Field::kOther : field_;
    if (depth_ == 2 && in_ids_) return Field::kBadId;
    return Field::kOther;
  }
  bool Scalar(json v) {
    bytes_.Mark();
    if (building_) {
      value_.Add(std::move(v));
    } else if (const Field f = Target(); Keeps(f)) {
      FieldValue& slot = Slot(f);
      slot.dump = v.dump();
      slot.value = std::move(v);
    }
    return true;
  }
  bool Start(bool object) {
    bytes_.Mark();
    if (building_) {
      value_.Start(object);
    } else if (depth_ == 0) {
      is_object = object;
    } else if (is_object && depth_ == 1 && field_ == Field::kHashIds) {
      ids_are_array = !object;
      in_ids_ = !object;
      if (in_ids_) bytes_.TakeIds(ids);
    } else if (const Field f = Target(); Keeps(f)) {
      building_ = true;
      build_field_ = f;
      build_depth_ = depth_;
      value_ = BoundedValue();
      value_.Start(object);
    }
    ++depth_;
    return true;
  }
  bool End() {
    bytes_.Mark();
    --depth_;
    if (building_) {
      value_.End();
      if (depth_ == build_depth_) {
        building_ = false;
        FieldValue& slot = Slot(build_field_);
        slot.dump = value_.Dump();
        slot.value = value_.Take();
      }
    } else if (depth_ == 1) {
      in_ids_ = false;
    }
    return true;
  }

  RowBytes& bytes_;
  int depth_ = 0;                 // containers open
  Field field_ = Field::kOther;   // the top-level key last read
  bool in_ids_ = false;           // inside the 'hash_ids' array
  bool building_ = false;         // value_ is being built
  Field build_field_ = Field::kOther;
  int build_depth_ = 0;
  BoundedValue value_;
};

absl::StatusOr<int32_t> JsonCount(const FieldValue& f, const char* field,
                                  absl::string_view source, int64_t line) {
  if (!f.value.has_value() || f.value->is_null()) {
    return LineError(source, line, absl::StrCat("field '", field, "' is missing"));
  }
  if (!f.value->is_number_integer()) {
    return LineError(source, line,
                     absl::StrCat("field '", field, "' must be an integer, got ", f.dump));
  }
  return ParseCount(absl::StrCat(f.value->get<int64_t>()), field, source, line);
}

// Parses the row at the input's current line. Errors as the whole-document reader gave them:
// a NUL byte anywhere first, then JSON syntax, then the fields in the order below.
absl::Status ParseRow(TraceInput& in, absl::string_view source, MooncakeRow& row,
                      RowBytes& bytes) {
  const int64_t line = in.line();
  const bool parsed = json::sax_parse(bytes.begin(), RowBytes::end(), &row);
  if (!parsed || bytes.nul_column() > 0) bytes.Drain();
  if (bytes.nul_column() > 0) {
    return LineError(source, line, absl::StrCat("NUL byte at column ", bytes.nul_column()));
  }
  if (bytes.long_token_column() > 0) {
    return LineError(source, line,
                     absl::StrCat("a JSON token (or the space before one) runs past ",
                                  kMaxJsonTokenBytes, " bytes at column ",
                                  bytes.long_token_column()));
  }
  if (!parsed) {
    return LineError(source, line, absl::StrCat("not valid JSON (", row.syntax_error, ")"));
  }
  if (!row.is_object) {
    return LineError(source, line, absl::StrCat("not a JSON object: '", bytes.head(), "'"));
  }
  return absl::OkStatus();
}

// The request of a parsed row; `last_ms` is the previous row's timestamp.
absl::StatusOr<TraceRequest> RowRequest(const MooncakeRow& row, absl::string_view source,
                                        int64_t line, const TraceOptions& options, int64_t index,
                                        double& last_ms) {
  const FieldValue& ts = row.timestamp;
  if (!ts.value.has_value() || ts.value->is_null()) {
    return LineError(source, line, "field 'timestamp' is missing");
  }
  if (!ts.value->is_number()) {
    return LineError(source, line,
                     absl::StrCat("field 'timestamp' must be a number, got ", ts.dump));
  }
  const double ms = ts.value->get<double>();
  if (!std::isfinite(ms) || ms < 0) {
    return LineError(source, line, absl::StrCat("timestamp ", ts.dump, " must be >= 0"));
  }
  if (ms < last_ms) {
    return LineError(source, line,
                     absl::StrCat("timestamp ", ts.dump, " goes back (previous ", last_ms, ")"));
  }
  last_ms = ms;
  KVPAGE_ASSIGN_OR_RETURN(int32_t input_len, JsonCount(row.input_length, "input_length", source,
                                                       line));
  KVPAGE_ASSIGN_OR_RETURN(int32_t output_len, JsonCount(row.output_length, "output_length",
                                                        source, line));
  if (!row.ids_are_array) return LineError(source, line, "field 'hash_ids' must be an array");
  if (row.bad_id.value.has_value()) {
    return LineError(source, line, absl::StrCat("hash id ", row.bad_id.dump,
                                                " must be a non-negative integer"));
  }
  TraceRequest r;
  r.index = index;
  r.arrival_s = ms / 1000.0;
  r.prompt_len = input_len;
  r.output_len = output_len;
  r.vocab_size = options.vocab_size;
  // Ids past the prompt's end are dropped; tokens past the ids' end are the private tail.
  const int64_t blocks = (int64_t{input_len} + kMooncakeBlockTokens - 1) / kMooncakeBlockTokens;
  const size_t used = static_cast<size_t>(std::min<int64_t>(blocks, std::ssize(row.ids)));
  r.segments.reserve(used + 1);
  int32_t covered = 0;
  for (size_t i = 0; i < used; ++i) {
    const int32_t len = std::min(kMooncakeBlockTokens, input_len - covered);
    r.segments.push_back({StreamKey(options.seed, StreamKind::kMooncakeBlock, row.ids[i]), len});
    covered += len;
  }
  if (covered < input_len) {
    r.segments.push_back(
        {StreamKey(options.seed, StreamKind::kRequestUnique, static_cast<uint64_t>(index)),
         input_len - covered});
  }
  return r;
}

}  // namespace

absl::Status ReadMooncake(TraceInput& in, absl::string_view source, const TraceOptions& options,
                          std::vector<TraceRequest>* out) {
  double last_ms = -std::numeric_limits<double>::infinity();
  while ((options.max_requests == 0 || std::ssize(*out) < options.max_requests) &&
         in.NextLine()) {
    RowBytes bytes(in);
    MooncakeRow row(bytes);
    KVPAGE_RETURN_IF_ERROR(ParseRow(in, source, row, bytes));
    KVPAGE_ASSIGN_OR_RETURN(TraceRequest r, RowRequest(row, source, in.line(), options,
                                                       std::ssize(*out), last_ms));
    out->push_back(std::move(r));
  }
  return absl::OkStatus();
}

}  // namespace kvpage::sim
